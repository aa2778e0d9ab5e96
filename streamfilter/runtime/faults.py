"""Deterministic crash points for fault tests.

Set ``STREAMFILTER_CRASH_AT=<name>[:<n>]`` and the process SIGKILLs itself the n-th time (default
the first) it reaches ``crash_point(<name>)``. Names used by the daemon: ``after_commit``,
``after_publish``, ``before_mark_sent``; by a cluster worker (``runtime.cluster_worker``):
``before_partition_commit``, ``after_partition_commit``, ``after_release_insert``; by the SQLite
store: ``before_mirror`` (the day is
committed, its sequence not yet mirrored to ``<state>.seq``) and ``mid_compaction`` (inside an
upkeep step's transaction, while the budget log is being folded into the budgets table).
``STREAMFILTER_PAUSE_AT=<name>:<seconds>`` sleeps there instead, the first time (a test kills the
broker meanwhile). Unset (production), a crash point is two dict lookups.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import Counter

__all__ = ["crash_point"]

_hits: Counter[str] = Counter()
log = logging.getLogger("streamfilter.faults")


def crash_point(name: str) -> None:
    pause = os.environ.get("STREAMFILTER_PAUSE_AT")
    if pause and pause.partition(":")[0] == name and not _hits["pause:" + name]:
        _hits["pause:" + name] += 1
        seconds = float(pause.partition(":")[2] or 1)
        log.warning("pausing %gs at crash point %s (STREAMFILTER_PAUSE_AT)", seconds, name)
        time.sleep(seconds)
    spec = os.environ.get("STREAMFILTER_CRASH_AT")
    if not spec:
        return
    target, _, nth = spec.partition(":")
    if target != name:
        return
    _hits[name] += 1
    if _hits[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
