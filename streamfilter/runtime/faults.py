"""Deterministic crash points for fault tests.

Set ``STREAMFILTER_CRASH_AT=<name>[:<n>]`` and the process SIGKILLs itself the n-th time (default
the first) it reaches ``crash_point(<name>)``. Names used by the daemon: ``after_commit``,
``after_publish``, ``before_mark_sent``; by the SQLite store: ``before_mirror`` (the day is
committed, its sequence not yet mirrored to ``<state>.seq``) and ``mid_compaction`` (inside a
day's transaction, while the budget log is being folded into the budgets table). Unset
(production), a crash point is one dict lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

__all__ = ["crash_point"]

_hits: Counter[str] = Counter()


def crash_point(name: str) -> None:
    spec = os.environ.get("STREAMFILTER_CRASH_AT")
    if not spec:
        return
    target, _, nth = spec.partition(":")
    if target != name:
        return
    _hits[name] += 1
    if _hits[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
