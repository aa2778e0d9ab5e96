"""Hooks the daemon calls as it works; the default observer does nothing.

``streamfilter.runtime.observe.prometheus`` implements them for Prometheus. Arguments marked *exact* are
data-dependent counts: an observer must not export them unless the operator opted into
``trusted_operator_metrics`` (docs/design.md §6.9).
"""

from __future__ import annotations

from collections.abc import Sequence

from streamfilter.engine.contract import Release
from streamfilter.engine.day import ExactDayStats

__all__ = ["DaemonObserver"]


class DaemonObserver:
    def restore(
        self,
        last_closed_day: str | None,
        releases: Sequence[Release] = (),
        store_bytes: int | None = None,
    ) -> None:
        """The stored state: its last closed day (a cluster worker calls it again whenever the
        cluster released a day), that day's releases, the store's size."""

    def started(self) -> None:
        """The store is open and the source seeked: the daemon is ready."""

    def records_read(self, partition: str, count: int) -> None:
        """``count`` input records consumed from ``partition`` (exact; input volume)."""

    def rejected(self, reason: str) -> None:
        """One record refused with ``reason`` (before any accounting)."""

    def partitions(self, count: int, added: list[str]) -> None:
        """The input has ``count`` partitions; ``added`` were added while running."""

    def partitions_owned(self, owned: int) -> None:
        """Cluster mode: this worker owns ``owned`` partitions of the events topic now."""

    def outbox(self, pending: int) -> None:
        """The outbox holds ``pending`` committed releases not yet acknowledged."""

    def sink_unavailable(self, reason: str) -> None:
        """Publishing failed with a transient error; the relay retries (not ready meanwhile)."""

    def sink_available(self) -> None:
        """The outbox relay succeeded (ready again after an outage)."""

    def source_unavailable(self, reason: str) -> None:
        """The input's broker could not be asked (metadata, end offsets): days wait."""

    def source_available(self) -> None:
        """The input's broker answered again."""

    def offsets_skipped(self, partition: str, count: int) -> None:
        """``count`` records of ``partition`` were deleted before they were read (skipped)."""

    def reject_dropped(self) -> None:
        """The reject sink refused a reject record; it was skipped."""

    def day_closed(
        self,
        day: str,
        close_seconds: float,
        releases: Sequence[Release],
        exact_stats: ExactDayStats,
    ) -> None:
        """A day was committed; ``exact_stats`` is exact and sensitive."""

    def committed(self, commit_seconds: float, store_bytes: int | None) -> None:
        """The state store committed one day in ``commit_seconds``."""

    def published(self, count: int) -> None:
        """``count`` releases acknowledged by the sink."""

    def failing_closed(self, message: str) -> None:
        """The store could not commit: nothing more will be released; the daemon exits."""

    def partition_lag(self, partition: str, lag_records: int) -> None:
        """Records behind the end of ``partition`` (sources that know their end)."""

    def stopped(self) -> None:
        """The daemon is draining / has stopped."""
