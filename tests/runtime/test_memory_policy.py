"""The daemon's memory policy (``runtime/memory.py``): freed memory is kept for reuse while
records flow, and handed back on the trim call.

Each arm runs in its own process and reads glibc's own counts (``mallinfo2``) and the process's
RSS around allocations."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import ctypes, json, sys
import numpy as np
from streamfilter.runtime.memory import MMAP_THRESHOLD_BYTES, keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
mapped = lambda: libc.mallinfo2().hblkhd  # bytes in allocations glibc mapped apart
applied = keep_freed_memory() if sys.argv[1] == "policy" else False
start = mapped()
day = np.ones(200 << 17)  # a closed day's 200 MiB array, freed
rss = rss_mib()
day_mapped = mapped() - start
del day
kept_mib = rss_mib() - rss + 200  # what of it stayed resident
before = mapped()
huge = np.empty(MMAP_THRESHOLD_BYTES // 8)  # at the threshold: never touched, costs no RSS
huge_mapped = mapped() - before
print(json.dumps({"applied": applied, "day_mapped": day_mapped, "kept_mib": kept_mib,
                  "huge_mapped": huge_mapped, "n": huge.size}))
"""


def _probe(arm: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, arm], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_arrays_stay_for_reuse_with_the_policy_and_not_without():
    """With the policy a freed 200 MiB array stays in the heap, resident, for the next day to
    reuse without page faults, and only an allocation of ``MMAP_THRESHOLD_BYTES`` is mapped
    apart; with glibc's default the array is mapped apart and unmapped when freed."""
    policy, default = _probe("policy"), _probe("default")
    assert policy["applied"] is True
    assert policy["day_mapped"] == 0 and policy["kept_mib"] >= 190, policy
    assert policy["huge_mapped"] >= 1 << 30, policy
    assert default["day_mapped"] >= 200 << 20 and default["kept_mib"] <= 10, default


TRIM_PROBE = """
import json, sys
import numpy as np
from streamfilter.runtime.memory import keep_freed_memory, return_free_heap

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

keep_freed_memory()
trim = return_free_heap() if sys.argv[1] == "trim" else None
blocks, pins = [], []
for _ in range(400):  # 400 heap blocks of 1 MiB, each below a live one
    blocks.append(np.ones(1 << 17))
    pins.append(np.ones(512))  # 4 KiB, from the heap too: the freed blocks become holes
before = rss_mib()
del blocks
if trim is not None:
    trim()
print(json.dumps({"freed_mib": before - rss_mib(), "n": len(pins)}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_freed_heap_blocks_are_handed_back_only_with_the_trim():
    """400 MiB of 1 MiB arrays (heap blocks), each below a live small array, freed: with
    ``return_free_heap``'s call (the daemon's when its input goes quiet) their pages leave the
    process; without it they stay resident, for the next batches to reuse."""
    got = {}
    for arm in ("trim", "no-trim"):
        out = subprocess.run(
            [sys.executable, "-c", TRIM_PROBE, arm],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        got[arm] = json.loads(out.stdout)["freed_mib"]
    assert got["trim"] >= 350, got
    assert got["no-trim"] <= 50, got
