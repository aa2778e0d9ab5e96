"""The daemon's memory policy (``runtime/memory.py``): large arrays get a mapping of their own.

Each arm runs in its own process and reads glibc's own count of mapped bytes (``mallinfo2``)
around two allocations."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import ctypes, json, sys
import numpy as np
from streamfilter.runtime.memory import MMAP_THRESHOLD_BYTES, map_large_allocations_apart

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
mapped = lambda: libc.mallinfo2().hblkhd  # bytes in allocations glibc mapped apart
applied = map_large_allocations_apart() if sys.argv[1] == "policy" else False
np.ones(30 << 17).sum()  # a 30 MiB mapping, freed: glibc's own threshold rises to 30 MiB
before = mapped()
big = np.ones(MMAP_THRESHOLD_BYTES // 8 * 3 // 2)  # 1.5 times the threshold: 24 MiB
big_mapped = mapped() - before
small = np.ones(50_000)  # an input batch's column: 0.4 MB
small_mapped = mapped() - before - big_mapped
print(json.dumps({"applied": applied, "big": big_mapped, "small": small_mapped, "n": big.size + small.size}))
"""


def _probe(arm: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, arm], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_large_arrays_get_their_own_mapping_with_the_policy_and_not_without():
    """With the policy a 24 MiB array is mapped apart (returned to the system when freed) and
    a batch's 0.4 MB column is not; with glibc's default, once a 30 MiB mapping was freed, the
    24 MiB array comes from the heap (and its memory stays with the process when freed)."""
    policy, default = _probe("policy"), _probe("default")
    assert policy["applied"] is True
    assert policy["big"] >= 24 << 20 and policy["small"] == 0, policy
    assert default["big"] == 0 and default["small"] == 0, default


TRIM_PROBE = """
import json, sys
import numpy as np
from streamfilter.runtime.memory import map_large_allocations_apart, return_free_heap

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

map_large_allocations_apart()
trim = return_free_heap() if sys.argv[1] == "trim" else None
blocks, pins = [], []
for _ in range(400):  # 400 heap blocks of 1 MiB (below the threshold), each below a live one
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
    """400 MiB of 1 MiB arrays (heap blocks, under the mmap threshold), each below a live
    small array, freed: with ``return_free_heap``'s call their pages leave the process; without, they stay
    resident (what the daemon avoids by calling it every ``TRIM_EVERY_RECORDS`` records)."""
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
