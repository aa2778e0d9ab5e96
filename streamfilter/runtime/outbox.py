"""The outbox relay (docs/design.md §5.1): publish each release the store holds unsent, flush
the sink, then mark it sent; and publish again, with their stored noise, releases the sink lost.
One part of the daemon loop that the single process (``runtime.daemon``) and the cluster's
releaser (``runtime.cluster_worker``) each assemble."""

from __future__ import annotations

import logging
import threading

from streamfilter.runtime.faults import crash_point
from streamfilter.runtime.io.base import Sink
from streamfilter.runtime.observe.observer import DaemonObserver
from streamfilter.runtime.process import RunSummary, is_transient
from streamfilter.runtime.store import StateStore

__all__ = ["RELAY_BACKOFF_S", "Outbox"]

log = logging.getLogger("streamfilter.daemon")

#: first and longest wait between two attempts to relay the outbox (seconds)
RELAY_BACKOFF_S = (1.0, 30.0)


class Outbox:
    """The store's unsent releases, relayed to ``sink`` (which its owner may replace)."""

    def __init__(
        self,
        store: StateStore,
        sink: Sink,
        observer: DaemonObserver,
        summary: RunSummary,
        stop_event: threading.Event,
    ) -> None:
        self.store = store
        self.sink = sink
        self.observer = observer
        self.summary = summary
        self.stop_event = stop_event

    def relay(self) -> None:
        """Relay until the sink acknowledged every unsent release. A transient sink error (one
        that says it is ``retriable``: a broker outage, a timeout) is retried with exponential
        backoff (``RELAY_BACKOFF_S``) while ``/readyz`` reports the outage; the store stays the
        source of truth (nothing is marked sent before it was acknowledged, nothing is drawn
        again). Any other error ends the run."""
        delay = RELAY_BACKOFF_S[0]
        while True:
            try:
                self._relay_once()
            except Exception as exc:
                if not is_transient(exc) or self.stop_event.is_set():
                    raise
                self.observer.sink_unavailable(type(exc).__name__)
                log.warning(
                    "publishing releases failed (%s: %s); retrying in %.0f s",
                    type(exc).__name__,
                    exc,
                    delay,
                )
                self.stop_event.wait(delay)
                delay = min(delay * 2, RELAY_BACKOFF_S[1])
                continue
            self.observer.sink_available()
            return

    def publish_lost(self, held_through: str | None) -> None:
        """Publish again, with their stored noise, the releases the state recorded as sent of
        days after the latest one the sink holds (``held_through``): the sink lost them (a
        releases topic deleted and created again, a release file cut short). Never new noise."""
        lost = self.store.sent_releases_after(held_through)
        if not lost:
            return
        log.warning(
            "the release sink holds no release after %s, but the state recorded %d releases "
            "through %s as published (was the releases topic deleted or recreated?): "
            "publishing them again with their stored noise",
            held_through or "(none)",
            len(lost),
            lost[-1][0],
        )
        for day, query_id, payload in lost:
            self.sink.publish(f"{day}/{query_id}", payload)
        self.sink.flush()

    def _relay_once(self) -> None:
        unsent = self.store.unsent_releases()
        self.observer.outbox(len(unsent))
        if not unsent:
            return
        for day, query_id, payload in unsent:
            self.sink.publish(f"{day}/{query_id}", payload)
        crash_point("after_publish")
        self.sink.flush()
        crash_point("before_mark_sent")
        self.store.mark_sent([(day, query_id) for day, query_id, _ in unsent])
        self.summary.releases_published += len(unsent)
        self.observer.outbox(0)
        self.observer.published(len(unsent))
