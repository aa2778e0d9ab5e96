"""The daemon's process memory policy (docs/design.md §8.4).

While records flow, the memory a batch or a closed day frees is kept and reused by the next
batches and days: a page handed back to the system is zeroed and faulted in again when reused,
and in the e2e benchmark those faults were a fifth of the run (~320,000 of them, ~0.8 s of
system time; DuckDB's run has ~80,000). glibc keeps it once three of its thresholds are fixed:
allocations below ``MMAP_THRESHOLD_BYTES`` come from the heap (its default maps large ones
apart and unmaps them when freed), the heap's free top is kept up to ``TRIM_THRESHOLD_BYTES``,
and the heap grows ``TOP_PAD_BYTES`` at a time. When the input goes quiet the daemon hands the
free heap back (``return_free_heap``), so a daemon at rest holds its live data only.

The cost is peak RSS: memory freed in one phase is not returned before another phase needs
memory of a different shape (a 10M-user day: +9%, 4,428 → 4,834 MiB; the e2e run: +3%;
``open_day_memory``: ×1.04 → ×1.14).
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable

__all__ = [
    "MMAP_THRESHOLD_BYTES",
    "TOP_PAD_BYTES",
    "TRIM_THRESHOLD_BYTES",
    "keep_freed_memory",
    "return_free_heap",
]

#: glibc's ``mallopt`` parameter numbers (``malloc.h``)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
#: allocations at least this large get a mapping of their own: above any one array of a
#: 10M-user day (glibc's default starts at 128 KiB and rises to 32 MiB as mappings are freed)
MMAP_THRESHOLD_BYTES = 1 << 30
#: free memory at the heap's top kept on ``free`` (glibc's default: 128 KiB)
TRIM_THRESHOLD_BYTES = 1 << 30
#: room added to each growth of the heap (glibc's default: 128 KiB)
TOP_PAD_BYTES = 64 << 20


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Fix glibc's three thresholds (module docstring); False where there is no glibc (the call
    is then a no-op) or glibc refused one."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    settings = (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        (_M_TOP_PAD, TOP_PAD_BYTES),
    )
    applied = [bool(mallopt(param, value)) for param, value in settings]  # each one, always
    return all(applied)


def return_free_heap() -> Callable[[], object] | None:
    """A call that hands the heap's free pages back to the system (glibc's ``malloc_trim(0)``,
    ~1 ms), for the daemon to make when its input goes quiet; None where there is no glibc."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    return functools.partial(trim, 0)
