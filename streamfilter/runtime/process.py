"""What a run of the loop needs from the process, shared by the single daemon
(``runtime/daemon.py``) and the cluster worker (``runtime/cluster_worker.py``): the cyclic
garbage collector's settings for the run, which errors are transient, and the run's summary
counts.
"""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from streamfilter.runtime.store import StoreError

__all__ = ["GC_YOUNG_THRESHOLD", "RunSummary", "collector_for_run", "is_transient"]


@dataclass
class RunSummary:
    """Operator-side counts of this process's run (input volume and reject reasons; never
    per-user or admitted/refused counts)."""

    records_read: int = 0
    events_accepted: int = 0
    events_duplicate: int = 0
    rejects: Counter[str] = field(default_factory=Counter)
    queries_registered: int = 0
    days_closed: int = 0
    releases_published: int = 0
    replayed_skipped: int = 0
    rejects_dropped: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "records_read": self.records_read,
            "events_accepted": self.events_accepted,
            "events_duplicate": self.events_duplicate,
            "rejected": sum(self.rejects.values()),
            "rejects_by_reason": dict(sorted(self.rejects.items())),
            "queries_registered": self.queries_registered,
            "days_closed": self.days_closed,
            "releases_published": self.releases_published,
        }


#: allocations between two young-generation collections during a run (CPython's default: 700)
GC_YOUNG_THRESHOLD = 30_000


@contextlib.contextmanager
def collector_for_run() -> Iterator[None]:
    """The cyclic garbage collector's settings while the daemon runs, restored afterwards.

    The loop allocates a few objects per input record (kafka-python's records, decoded events)
    that reference counting frees; none forms a cycle. With CPython's defaults the collector
    still runs a young pass every 700 allocations and, every hundred of those, a full pass over
    every tracked object — the start-up heap (modules, clients, the restored state) and the open
    days' buffers included: ~10% of the run's CPU on Kafka. So, for the run: the start-up heap
    is frozen (``gc.freeze``: it lives as long as the run; later objects are collected as
    usual) and young passes are rarer (``GC_YOUNG_THRESHOLD``), which makes full passes rarer
    too. Cycles are still collected, only later.
    """
    young, *older = gc.get_threshold()
    gc.freeze()
    if young:  # 0: automatic collection is off; leave it so
        gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), *older)
    try:
        yield
    finally:
        gc.set_threshold(young, *older)
        gc.unfreeze()


def is_transient(exc: BaseException) -> bool:
    """An error that may heal by itself: a client error marked ``retriable`` (kafka-python's
    timeouts, connection and leadership errors) or a timeout. Store errors never are."""
    if isinstance(exc, StoreError):
        return False
    return bool(getattr(exc, "retriable", False)) or isinstance(exc, TimeoutError)
