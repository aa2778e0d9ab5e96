"""A cluster worker: the daemon loop over the partitions Kafka's group assigns it, with the
shared ledger in PostgreSQL (docs/design.md §7).

Every worker runs the same ``streamfilter run --config cluster.toml`` (``[cluster] enabled``).
It is assembled from the single process's parts — the reading (``runtime.intake``), the closing
schedule and the outbox relay (``runtime.outbox``) — not derived from its daemon. What differs
from the single process (``runtime.daemon``):

* **Input.** The consumer group assigns the partitions (``KafkaGroupSource``). On every
  assignment the worker claims them in the ledger (each partition's epoch incremented), drops
  whatever it buffered, and resumes each partition at its stored position.
* **One filter per user and day.** Each day's partition count is pinned in the ledger when the
  day is first seen; an event whose ``user_id`` does not map to the partition it was read from
  (Kafka's murmur2 partitioner over that count, ``engine.partitions``) is rejected as
  ``wrong_partition`` before it reaches any buffer; a batch decoded as columns is checked whole
  (one native call). A worker keeps one buffer per (day, partition).
* **Queries.** Registered only in the ledger, in one serialised order; the first worker to close
  a day reads its feed to the end, runs the policy on the published history and freezes the
  day's queries. Every worker evaluates the ledger's queries in the ledger's order.
* **Day close.** A worker closes day ``t`` for its partitions once the watermark rule holds
  for them (as in one process) and day ``t − 1`` is released (the day barrier): per partition the
  filter against its users' budgets held in memory, exact integer partial sums and one packed
  budget record, all in one transaction that checks the partitions' epochs
  (``ClusterLedger.commit_partitions``). A fenced commit writes nothing; the worker drops its
  buffers and budgets and waits for its next assignment.
* **Budgets** (docs/design.md §7.4). Each owned partition's users' budgets live in memory,
  rebuilt from the partition's records on assignment (a monotone merge) and advanced by each of
  the worker's own commits; no per-user row is read or written in PostgreSQL.
* **Release.** The worker holding the releaser lease (a row in the ledger, renewed every loop,
  taken over when it expires) sums the partials of a day every
  partition committed, draws the noise once with ``engine.day.release_partials`` (the single
  process's code) and stores the releases in the same transaction; it alone owns the
  transactional release producer and relays the outbox.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from kafka.errors import KafkaError

from streamfilter.engine.contract import Reject, RejectReason, Release
from streamfilter.engine.day import (
    coverage_counts_of,
    exact_stats_of,
    partial_day,
    release_partials,
)
from streamfilter.engine.engine import DayInput, Engine
from streamfilter.engine.ingest import EventColumns
from streamfilter.engine.ledger import BudgetLedger
from streamfilter.engine.partitions import key_partition, partitions_of
from streamfilter.engine.records import DayAccumulator
from streamfilter.errors import PublisherFencedError, PublishError, StoreError
from streamfilter.runtime.faults import crash_point
from streamfilter.runtime.intake import InputLimits, Intake, last_closable_day
from streamfilter.runtime.io.base import QueryFeed, RecordBatch, Sink
from streamfilter.runtime.io.kafka import KafkaGroupSource
from streamfilter.runtime.observe.observer import DaemonObserver
from streamfilter.runtime.outbox import Outbox
from streamfilter.runtime.process import RunSummary, collector_for_run, is_transient
from streamfilter.runtime.query_admission import admit_query
from streamfilter.runtime.store import Position, check_sink_not_ahead
from streamfilter.runtime.store.cluster import (
    ClusterLedger,
    PartitionFencedError,
    ReleaserFencedError,
)
from streamfilter.telemetry.coverage import CoverageTracker

__all__ = ["ClusterWorker", "NoSink", "worker_name"]

log = logging.getLogger("streamfilter.cluster")

#: seconds no worker takes the releaser role after the releaser found its releases topic gone
SINK_RETRY_S = 30.0


def worker_name() -> str:
    """This worker's name in the ledger (host, pid and a random suffix: never reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class NoSink(Sink):
    """The release sink of a worker that is not the releaser: it publishes nothing."""

    def publish(self, key: str, payload: bytes) -> None:
        raise RuntimeError("only the releaser publishes releases")

    def flush(self) -> None:
        pass


def _partition_number(label: str) -> int:
    return int(label.rsplit(":", 1)[1])


class ClusterWorker:
    """One worker of a cluster (see the module doc), assembled from the single process's parts:
    the same reading (``runtime.intake.Intake``, with one buffer per (day, partition) and the
    partition check), the same closing schedule (``intake.last_closable_day``), the same outbox
    relay (``runtime.outbox.Outbox``, the releaser's), and its own ledger steps."""

    def __init__(
        self,
        engine: Engine,
        ledger: ClusterLedger,
        source: KafkaGroupSource,
        feed: QueryFeed,
        sink_factory: Callable[[], Sink],
        reject_sink: Sink,
        *,
        lease_s: float = 30.0,
        allowed_lateness_s: float = 7200.0,
        idle_timeout_s: float = 600.0,
        poll_interval_s: float = 0.5,
        batch_size: int = 50_000,
        future_slack_s: float | None = None,
        limits: InputLimits | None = None,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_day_closed: Callable[[str, list[Release]], None] | None = None,
        observer: DaemonObserver | None = None,
    ) -> None:
        self.engine = engine
        self.store = ledger
        self.source = source
        self.feed = feed
        self.sink: Sink = NoSink()
        self.reject_sink = reject_sink
        self.allowed_lateness_s = allowed_lateness_s
        self.idle_timeout_s = idle_timeout_s
        self.poll_interval_s = poll_interval_s
        self.batch_size = batch_size
        self.limits = limits or InputLimits()
        self.monotonic = monotonic
        self.on_day_closed = on_day_closed
        self.observer = observer or DaemonObserver()
        self.stop_event = threading.Event()
        self.summary = RunSummary()
        self.worker = source.member_name  # its consumer's client id carries it (io.kafka_group)
        self._sink_factory = sink_factory
        self._lease_token: int | None = None
        self.lease_s = lease_s
        self._epochs: dict[int, int] = {}
        self._committed: dict[int, str | None] = {}
        self._parts: dict[tuple[str, int], DayAccumulator] = {}
        self._pinned: dict[str, int] = {}
        self._reset_pending = False
        self._assign_error: StoreError | None = None  # a claim that failed inside the poll
        self._fenced = False
        self._queries_seen = 0
        self._first_day: str | None = None
        self._released_seen: str | None = None
        self._claimed: dict[str, Position] = {}
        #: per owned partition, its users' budgets and the partition count they are keyed by
        #: (rebuilt from the ledger's records on assignment; advanced by each own commit)
        self._budgets: dict[int, tuple[int, BudgetLedger]] = {}
        self.outbox = Outbox(ledger, self.sink, self.observer, self.summary, self.stop_event)
        self.intake = Intake(
            engine,
            reject_sink,
            self.summary,
            self.observer,
            limits=self.limits,
            wall_clock=wall_clock,
            monotonic=monotonic,
            future_slack_s=future_slack_s,
            day_input=self._day_input,
            screen=self._screen_records,
            screen_columns=self._columns_pass,
        )
        self._restore()
        source.on_assign = self._on_assign

    def stop(self) -> None:
        self.stop_event.set()

    # ------------------------------------------------------------------ start-up
    def _restore(self) -> None:
        """Nothing per user is loaded: each partition's budgets are rebuilt when it is
        assigned."""
        view = self.store.view()
        self.engine.last_closed_day = view.released_through
        self._refresh_queries()
        self.feed.seek({})

    def _refresh_queries(self) -> None:
        """Append the ledger's queries this worker has not seen, in the ledger's order."""
        new = self.store.queries_after(self._queries_seen)
        for payload in new:
            self.engine.queries.register(self.engine.parse_query(payload), None)
        self._queries_seen += len(new)

    # ------------------------------------------------------------------ assignment
    def _on_assign(self, labels: list[str]) -> dict[str, int]:
        """Called inside the consumer's poll: claim the partitions, return where to resume
        (none assigned — a revocation, or the consumer closing —: nothing to claim, this worker
        idles until the next rebalance).

        kafka-python logs and swallows a listener's exception, and the consumer would then
        fetch from the group's offsets with the old claims in force: a ledger error here is
        kept instead, the worker claims nothing, and the main loop fails closed with it
        (:meth:`_note_new_partitions`)."""
        try:
            claims = (
                self.store.claim([_partition_number(label) for label in labels], self.worker)
                if labels
                else {}
            )
        except StoreError as exc:
            self._assign_error = exc
            claims = {}
        topic = self.source.topic
        self._epochs = {p: c.epoch for p, c in claims.items()}
        self._committed = {p: c.committed_day for p, c in claims.items()}
        self._claimed = {f"{topic}:{p}": c.position for p, c in claims.items()}
        self._reset_pending = True
        self._fenced = False
        if labels:
            log.info(
                "assigned partition(s) %s",
                ", ".join(f"{p} (epoch {e})" for p, e in sorted(self._epochs.items())),
            )
        return {label: pos.resume_offset for label, pos in self._claimed.items()}

    def _note_new_partitions(self) -> None:
        """After a poll that rebalanced: drop every buffer, restart from the claimed positions
        (only what was committed counts; the open days are read again)."""
        if self._assign_error is not None:
            raise self._assign_error
        if not self._reset_pending:
            return
        self._reset_pending = False
        self._drop_buffers()
        self._budgets.clear()
        claimed = self._claimed
        self.intake.read_offset = {label: pos.resume_offset for label, pos in claimed.items()}
        self.intake.high = {label: pos.high_offset for label, pos in claimed.items()}
        now = self.monotonic()
        self.intake.last_seen = dict.fromkeys(claimed, now)
        self.observer.partitions(self.source.partition_count(), [])
        self.observer.partitions_owned(len(claimed))
        count = self.source.partition_count()
        for p in sorted(self._epochs):  # the day's pinned count may differ: then again at close
            self._ledger_of(p, count)

    def _ledger_of(self, partition: int, partitions: int) -> BudgetLedger:
        """The budgets of ``partition``'s users under ``partitions``: kept in memory while this
        worker owns the partition, rebuilt from the ledger's records when it was just assigned
        or the day's pinned partition count differs (docs/design.md §7.4)."""
        held = self._budgets.get(partition)
        if held is not None and held[0] == partitions:
            return held[1]
        started = time.perf_counter()
        ledger = self.store.partition_budgets(partition, partitions)
        self._budgets[partition] = (partitions, ledger)
        log.info(
            "rebuilt the budgets of partition %d (of %d) from the ledger in %.3fs",
            partition,
            partitions,
            time.perf_counter() - started,
        )
        return ledger

    def _drop_buffers(self) -> None:
        self.intake.open.clear()
        self._parts.clear()
        self.intake.min_offset.clear()
        self.intake.max_day.clear()

    # ------------------------------------------------------------------ input
    def _pinned_count(self, day: str) -> int:
        n = self._pinned.get(day)
        if n is None:
            n = self._pinned[day] = self.store.pin_day(day, self.source.partition_count())
        return n

    def _columns_pass(self, partition: str, columns: EventColumns) -> bool:
        """Whether :meth:`_screen_records` refuses none of a batch's events, from its columns
        whole: each distinct day open and within the horizon, and every user id's partition
        (``partitions_of``: one native call, no Python step per event) the one read from."""
        p = _partition_number(partition)
        committed = self._committed.get(p)
        horizon = self.intake.horizon()
        days = set(columns.days)
        for day in days:
            if (
                (committed is not None and day <= committed)
                or (self._first_day is not None and day < self._first_day)
                or (horizon is not None and day > horizon)
            ):
                return False
        counts = {self._pinned_count(day) for day in days}
        if len(counts) != 1:  # a day's boundary where the topic grew: record by record
            return False
        return bool((partitions_of(columns.user_ids, counts.pop()) == p).all())

    def _screen_records(self, partition: str, parsed: Sequence[Any]) -> Sequence[Any]:
        """Refuse events read from a partition their user does not map to (``wrong_partition``)
        and events of a day this partition already committed (``late``)."""
        p = _partition_number(partition)
        committed = self._committed.get(p)
        horizon = self.intake.horizon()
        out = list(parsed)
        for i, item in enumerate(parsed):
            if isinstance(item, Reject):
                continue
            day = item.day
            if (committed is not None and day <= committed) or (
                self._first_day is not None and day < self._first_day
            ):
                out[i] = Reject(RejectReason.LATE, "event day is already closed")
            elif (horizon is None or day <= horizon) and (
                key_partition(item.user_id.encode(), self._pinned_count(day)) != p
            ):
                out[i] = Reject(
                    RejectReason.WRONG_PARTITION,
                    "the event's user_id maps to another partition of the events topic "
                    "(produce events with key = user_id)",
                )
        return out

    def _day_input(self, day: str, partition: str, offset: int) -> DayInput:
        if day > self.intake.max_day.get(partition, ""):
            self.intake.max_day[partition] = day
        key = (day, _partition_number(partition))
        acc = self._parts.get(key)
        if acc is None:
            acc = self._parts[key] = self.engine.new_day(day)
            self.intake.open.setdefault(day, acc)
        self.intake.min_offset.setdefault(day, {}).setdefault(partition, offset)
        return acc

    # ------------------------------------------------------------------ main loop
    def run(self, until_end: bool = False, through_day: str | None = None) -> RunSummary:
        if until_end:  # refused by the wiring already (a configuration error)
            raise ValueError("cluster workers run in follow mode (--until-end is not available)")
        with collector_for_run():
            try:
                self.observer.started()
                log.info("cluster worker %s started", self.worker)
                while not self.stop_event.is_set():
                    records = self._poll()
                    self._note_new_partitions()
                    self.intake.ingest_batches(records, quiet=not records)
                    self._release_and_relay()
                    self._close_ready()
                    if not records:
                        self.stop_event.wait(self.poll_interval_s)
                self.reject_sink.flush()
                return self.summary
            finally:
                self.observer.stopped()
                log.info(
                    "stopped: %d days closed, %d releases published",
                    self.summary.days_closed,
                    self.summary.releases_published,
                )

    def _poll(self) -> list[RecordBatch]:
        """The next records of this worker's partitions; none while the broker is away: the
        group consumer's poll raises a retriable error when it cannot find the group's
        coordinator (a broker outage). The worker stays, /readyz says why, and the group
        re-forms when the broker is back (docs/cluster.md, "What happens when…")."""
        try:
            records = self.source.poll_batches(self.batch_size)
        except Exception as exc:
            if not is_transient(exc):
                raise
            self.intake.unavailable("could not poll the events topic's consumer group", exc)
            return []
        if self.intake.input_down_probe_at is not None:
            self.intake.available()
        return records

    def _close_ready(self) -> None:
        """Close what the watermark rule allows (the single process's schedule,
        ``intake.last_closable_day``, over this worker's partitions)."""
        target = last_closable_day(
            self._first_open_day(),
            self._last_open_day(),
            lambda day: self.intake.closable(
                day,
                self.source.partitions(),
                self.allowed_lateness_s,
                self.idle_timeout_s,
                self.source.caught_up,
            ),
            self.intake.quiet_since(),
            self.allowed_lateness_s,
        )
        if target is not None:
            self._close_through(target)

    def _first_open_day(self) -> str | None:
        """The day the cluster closes next; before the first freeze, the earliest day seen."""
        view = self.store.view()
        self._first_day = view.first_day
        if view.released_through != self._released_seen:  # every worker shows the cluster's
            self._released_seen = view.released_through  # last closed day (alerts, §7.3)
            self.observer.restore(view.released_through)
        return view.next_day() or min(
            filter(None, (view.first_seen, min(self.intake.open, default=None))), default=None
        )

    def _last_open_day(self) -> str | None:
        view = self.store.view()
        return max(filter(None, (view.last_day, max(self.intake.open, default=None))), default=None)

    def _close_through(self, last: str | None) -> bool:
        """Commit, day after day through ``last``, this worker's partitions that have not
        committed the day yet; stop at the day barrier."""
        if last is None or not self._epochs or self._fenced or self._reset_pending:
            return True
        while not self.stop_event.is_set():
            view = self.store.view()
            self.engine.last_closed_day = view.released_through
            day = self._first_open_day()
            if day is None or day > last:
                return True
            self._drop_days_before(day)
            todo = sorted(p for p in self._epochs if (self._committed.get(p) or "") < day)
            if not todo:
                return True  # committed; the day waits for the other partitions' commits
            if not self._freeze(day, view.frozen_through):
                continue  # another worker froze another first day: start again from it
            if not self._commit_partitions(day, todo):
                return True
            self._release_and_relay()
        return True

    def _drop_days_before(self, day: str) -> None:
        """Buffers of days before the cluster's next day: closed before this worker could
        count them (only possible for days before the cluster's first day, which another
        worker pinned): dropped, like late events."""
        early = sorted({d for d, _ in self._parts if d < day})
        for d in early:
            for key in [k for k in self._parts if k[0] == d]:
                del self._parts[key]
            self.intake.open.pop(d, None)
            self.intake.min_offset.pop(d, None)
            log.warning("events of %s arrived after the cluster closed that day; dropped", d)

    def _freeze(self, day: str, frozen_through: str | None) -> bool:
        """Register the day's queries (the feed read to its end, then the policy on the
        published history) and freeze them in the ledger: the first worker to close the day
        does it; later ones find it done."""
        self._pinned_count(day)
        if frozen_through is None or frozen_through < day:
            self._refresh_queries()
            self._register_queries(self.feed.poll_all())
            history = [Release.from_json(p) for p in self.store.release_history()]
            self._register_queries(self.feed.on_day(history, day))
            if not self.store.freeze_day(day):
                return False
        self._refresh_queries()
        return True

    def _register_queries(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Validate each query and add it to the ledger at once, in its own transaction (never
        to this worker's book directly: every worker's book is the ledger's, in the ledger's
        order)."""
        for where, raw in items:
            try:
                query = admit_query(self.engine, self.limits, raw)
                if query is not None:
                    self.store.add_query(query.canonical_json().encode())
                    self.summary.queries_registered += 1
            except Reject as rej:
                self.intake.refuse_query(rej, raw, where)

    def _commit_partitions(self, day: str, todo: list[int]) -> bool:
        """Partials of ``todo`` for ``day`` in one ledger transaction; False if fenced."""
        queries = self.engine.queries.for_day(day)
        params = self.engine.params
        coverage = self.engine.coverage  # public thresholds only; the releaser keeps the counts
        thresholds = None if coverage is None else coverage.thresholds_units
        started = time.perf_counter()
        count = self._pinned_count(day)
        parts = {}
        for p in todo:
            acc = self._parts.pop((day, p), None) or self.engine.new_day(day)
            records = acc.finish()
            ledger = self._ledger_of(p, count)
            parts[p] = partial_day(records, queries, ledger, params, thresholds)
        positions = self._positions_for(day, todo)
        self.reject_sink.flush()
        crash_point("before_partition_commit")
        commit_started = time.perf_counter()
        try:
            self.store.commit_partitions(day, self.worker, self._epochs, parts, positions, count)
        except PartitionFencedError as exc:
            log.warning("%s; dropping this worker's open days until its next assignment", exc)
            self._fenced = True
            self._drop_buffers()
            self._budgets.clear()
            return False
        self.observer.committed(time.perf_counter() - commit_started, None)
        crash_point("after_partition_commit")
        for p in todo:
            self._committed[p] = day
            part = parts[p]
            self._budgets[p][1].apply(part.changed_users, part.spent_units, part.retired)
        if not any(d == day for d, _ in self._parts):
            self.intake.open.pop(day, None)
            self.intake.min_offset.pop(day, None)
        self.intake.high.update(
            {
                label: max(self.intake.high.get(label, 0), off)
                for label, off in self.intake.read_offset.items()
            }
        )
        self.summary.days_closed += 1
        log.info(
            "committed day %s for partition(s) %s in %.3fs",
            day,
            ", ".join(map(str, todo)),
            time.perf_counter() - started,
        )
        try:
            topic = self.source.topic
            self.source.committed({f"{topic}:{p}": positions[p].resume_offset for p in todo})
        except Exception as exc:  # the ledger holds the real positions
            log.warning("could not mirror input offsets to the group: %s", type(exc).__name__)
        return True

    def _positions_for(self, day: str, todo: list[int]) -> dict[int, Position]:
        out: dict[int, Position] = {}
        topic = self.source.topic
        for p in todo:
            label = f"{topic}:{p}"
            read = self.intake.read_offset.get(label, 0)
            pending = [
                m[label] for d, m in self.intake.min_offset.items() if d > day and label in m
            ]
            resume = min(pending) if pending else read
            out[p] = Position(resume, max(read, self.intake.high.get(label, 0)))
        return out

    # ------------------------------------------------------------------ release
    def _release_and_relay(self) -> None:
        """The releaser (holder of the ledger's releaser lease) releases every day all
        partitions committed, then relays the outbox; other workers take the lease once it
        expired, or at once when its holder has left the consumer group (``io.kafka_group``).
        A releaser whose lease moved on (it was stopped, or left the group) steps down: its
        release transactions are refused and its producer is fenced by the new releaser's. A
        releaser whose releases topic is gone fails closed: it steps down and holds every
        worker off the role for ``SINK_RETRY_S`` (``ClusterLedger.hold_off_releasers``)."""
        token = self.store.hold_releaser_lease(
            self.worker, self._lease_token, self.lease_s, self.source.membership.has_left
        )
        if token is None or token != self._lease_token:
            self._step_down("the releaser lease expired or moved to another worker")
        if token is None:
            return
        held: tuple[str | None] | None = None
        if self._lease_token is None:
            sink: Sink | None = None
            try:
                sink = self._sink_factory()  # fences no one: the check reads the topic first
                # a stale ledger is refused (StaleStoreError) before this worker fences the
                # topic's publisher, and checked again once it has
                held = (
                    check_sink_not_ahead(
                        self.store.where, self.store.view().released_through, sink
                    ),
                )
            except (KafkaError, PublishError) as exc:  # the broker unreachable, the topic gone
                if sink is not None:
                    with contextlib.suppress(Exception):
                        sink.close()
                if isinstance(exc, PublishError):
                    self._sink_gone(token, exc)
                else:  # no releaser until the broker is back
                    log.warning("cannot open the release sink (%s); the lease is retried", exc)
                return
            self._lease_token = token
            self.sink = self.outbox.sink = sink
            log.info("this worker is the releaser")
        try:
            if held is not None:
                self.outbox.publish_lost(held[0])
            while not self.stop_event.is_set():
                day = self.store.view().next_day()
                if day is None or not self._release(day):
                    break
            self.outbox.relay()
        except (ReleaserFencedError, PublisherFencedError) as exc:
            self._step_down(str(exc))
        except PublishError as exc:  # the releases topic was deleted under this releaser
            self._sink_gone(token, exc)

    def _sink_gone(self, token: int, exc: PublishError) -> None:
        """Fail closed on a releases topic that is gone: publish nothing (the releases wait in
        the ledger's outbox), step down, and keep every worker off the role for
        ``SINK_RETRY_S``; one line, no exit (a restarted worker could do no more)."""
        log.error("%s; the next releaser tries the topic in %.0f s", exc, SINK_RETRY_S)
        self.observer.sink_unavailable(type(exc).__name__)
        self._lease_token = None
        sink, self.sink = self.sink, NoSink()
        self.outbox.sink = self.sink
        with contextlib.suppress(Exception):  # nothing can be delivered: nothing is lost
            sink.close()
        self.store.hold_off_releasers(self.worker, token, SINK_RETRY_S)

    def _step_down(self, reason: str) -> None:
        if self._lease_token is None:
            return
        log.warning("%s; stepping down as the releaser", reason)
        self._lease_token = None
        sink, self.sink = self.sink, NoSink()
        self.outbox.sink = self.sink
        with contextlib.suppress(Exception):  # a fenced producer's flush fails: nothing is lost
            sink.close()

    def _release(self, day: str) -> bool:
        self._refresh_queries()
        queries = self.engine.queries.for_day(day)
        made: list[Release] = []
        stats: dict[str, int] = {}

        def make(
            sums: dict[str, np.ndarray], counters: dict[str, int], coverage_state: bytes | None
        ) -> tuple[list[tuple[str, bytes]], bytes | None]:
            zeros = {q.query_id: np.zeros(q.weights().shape[1], np.int64) for q in queries}
            coverage = None
            if self.engine.coverage is not None:  # the ledger's tracker, stepped once per day
                if coverage_state is None:
                    raise StoreError(f"{self.store.where} holds no coverage tracker")
                tracker = CoverageTracker.from_json(coverage_state)
                counts = coverage_counts_of(counters, len(tracker.thresholds_units))
                coverage = (tracker, counts)
            made[:], after = release_partials(
                day, queries, {**zeros, **sums}, self.engine.params, self.engine.bits, coverage
            )
            stats.update(counters)
            payloads = [(r.query_id, r.to_json().encode()) for r in made]
            return payloads, None if after is None else after.to_json().encode()

        assert self._lease_token is not None
        if not self.store.release_day(day, make, lease=(self.worker, self._lease_token)):
            return False
        crash_point("after_release_insert")
        self.engine.last_closed_day = day
        log.info("released day %s: %d releases", day, len(made))
        self.observer.day_closed(day, 0.0, made, exact_stats_of(stats, queries))
        if self.on_day_closed is not None:
            self.on_day_closed(day, made)
        return True

    def close_sink(self) -> None:
        self.sink.close()
