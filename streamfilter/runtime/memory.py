"""The daemon's process memory policy (docs/design.md §8.4).

glibc serves a large ``malloc`` with its own mapping only while the request is above a
threshold that it raises each time such a mapping is freed (up to 32 MiB); numpy's arrays for
a fold or a day close then come from the heap, which small long-lived objects pin, so their
memory stays with the process after they are freed — the peak RSS of an open day grew with its
events for no live data. Fixing the threshold keeps every array of at least
``MMAP_THRESHOLD_BYTES`` in a mapping of its own, returned to the system when freed.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable

__all__ = ["MMAP_THRESHOLD_BYTES", "map_large_allocations_apart", "return_free_heap"]

#: glibc's ``mallopt`` parameter number for the mmap threshold (``malloc.h``)
_M_MMAP_THRESHOLD = -3
#: allocations at least this large get a mapping of their own (glibc starts at 128 KiB and rises
#: to 32 MiB): far above an input batch's arrays (50,000 values: 0.4-1.6 MB), which stay on the
#: heap and are reused. A fresh mapping is faulted in page by page, so a lower threshold costs
#: system time: at 4 MiB the e2e benchmark's day closes (arrays of 2-15 MB) took ~0.5 s more
#: of it (~550,000 page faults against ~330,000), for the same open-day peak RSS ratio
MMAP_THRESHOLD_BYTES = 16 << 20


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def map_large_allocations_apart() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD_BYTES``; False where there is no glibc
    (the call is then a no-op)."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def return_free_heap() -> Callable[[], object] | None:
    """A call that hands the heap's free pages back to the system (glibc's ``malloc_trim(0)``,
    ~1 ms), for the daemon to make every ``TRIM_EVERY_RECORDS`` input records; None where there
    is no glibc.

    Arrays below the mmap threshold come from the heap, and the blocks a batch frees (its
    columns, a fold's buffers, a growing table's old copy) stay resident while anything above
    them lives: without it an open day of 10 events a user peaked ~25 MiB higher on the
    ``open_day_memory`` benchmark, for no live data."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    return functools.partial(trim, 0)
