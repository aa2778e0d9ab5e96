"""The daemon loop: read events, register queries, close days, commit, relay the outbox.

Closing a day (``Daemon._close_day``) is the one ordered checkpoint:

1. prepare the day in the engine (noise drawn; nothing mutated),
2. commit debits + releases + input positions to the state store in ONE transaction,
3. apply the committed day to the in-memory engine,
4. relay the outbox: publish each unsent release, flush the sink (acknowledged / fsync'd),
   then mark it sent in the store.

A crash before 2 loses nothing (the input is re-read from the stored positions); a crash after 2
republishes the stored bytes (never new noise). If the store cannot commit, nothing is released
and the error propagates (fail closed).

When a day closes (docs/design.md §5): with ``until_end`` every open day closes once the input is
exhausted. In follow mode day ``t`` closes when (a) the UTC wall clock has passed the end of ``t``
plus ``allowed_lateness`` and (b) every partition has delivered an event of a later day or has been
idle for ``idle_timeout``. Days between the first open day and the last closable one close even
when they had no events, so releases leave on a data-independent schedule.

The daemon assembles the loop's shared parts — the reading (``runtime.intake.Intake``), the
closing schedule (``intake.last_closable_day``) and the outbox relay (``runtime.outbox``) — as
the cluster worker (``runtime.cluster_worker``) does, and adds the single process's day close.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any

from streamfilter.engine.affordability import DEFAULT_MIN_DAYS, affordability_warning, query_cost
from streamfilter.engine.contract import Reject, Release
from streamfilter.engine.engine import EngineCore
from streamfilter.errors import RetentionGapError
from streamfilter.runtime.faults import crash_point
from streamfilter.runtime.intake import (
    InputLimits,
    Intake,
    last_closable_day,
    next_day,
)
from streamfilter.runtime.io.base import BrokerSource, QueryFeed, Sink, Source
from streamfilter.runtime.observe.observer import DaemonObserver
from streamfilter.runtime.outbox import Outbox
from streamfilter.runtime.process import RunSummary, collector_for_run
from streamfilter.runtime.query_admission import admit_query
from streamfilter.runtime.store import (
    DayCommit,
    Position,
    StateStore,
    StoredState,
    StoreError,
    check_sink_not_ahead,
)

__all__ = ["Daemon", "InputLimits"]

log = logging.getLogger("streamfilter.daemon")
DAY = dt.timedelta(days=1)
_DAY = attrgetter("day")


#: the fewest budget log entries the store's upkeep folds after a batch, or when idle (a
#: fraction of a second; ``Daemon._compact_state``)
COMPACT_MIN_ENTRIES = 20_000
#: the most the upkeep folds between two days closing back to back (a backfill's releases do
#: not wait on a long fold; the input batches that follow catch up)
COMPACT_BETWEEN_CLOSES_ENTRIES = 100_000


class Daemon:
    def __init__(
        self,
        engine: EngineCore[Any],
        store: StateStore,
        source: Source,
        feed: QueryFeed,
        sink: Sink,
        reject_sink: Sink,
        *,
        allowed_lateness_s: float = 7200.0,
        idle_timeout_s: float = 600.0,
        poll_interval_s: float = 0.5,
        batch_size: int = 50_000,
        future_slack_s: float | None = None,
        limits: InputLimits | None = None,
        on_retention_gap: str = "fail",
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_day_closed: Callable[[str, list[Release]], None] | None = None,
        observer: DaemonObserver | None = None,
        state: StoredState | None = None,
        min_affordable_days: int = DEFAULT_MIN_DAYS,
    ) -> None:
        """``state``: what the store holds, loaded (and checked) once by the caller at start-up;
        loaded here when not given."""
        self.engine = engine
        self.store = store
        self.source = source
        #: the source's broker abilities (lag, gaps, partitions added, offsets mirrored), if any
        self._broker = source if isinstance(source, BrokerSource) else None
        self.feed = feed
        self.sink = sink
        self.reject_sink = reject_sink
        self.allowed_lateness_s = allowed_lateness_s
        self.idle_timeout_s = idle_timeout_s
        self.poll_interval_s = poll_interval_s
        self.batch_size = batch_size
        self.future_slack_s = future_slack_s
        self.limits = limits or InputLimits()
        self.on_retention_gap = on_retention_gap
        self.wall_clock = wall_clock
        self.monotonic = monotonic
        self.on_day_closed = on_day_closed
        self.min_affordable_days = min_affordable_days
        self.observer = observer or DaemonObserver()
        self.stop_event = threading.Event()
        self.summary = RunSummary()
        self.outbox = Outbox(store, sink, self.observer, self.summary, self.stop_event)
        #: reading: batches validated, rejected or buffered per open day (``runtime.intake``)
        self.intake = Intake(
            engine,
            reject_sink,
            self.summary,
            self.observer,
            limits=self.limits,
            wall_clock=wall_clock,
            monotonic=monotonic,
            future_slack_s=future_slack_s,
        )
        self._restore(state if state is not None else store.load())

    # ------------------------------------------------------------------ start-up
    def _restore(self, state: StoredState) -> None:
        self.engine.restore(
            budgets=state.budgets,
            queries=state.queries,
            last_closed_day=state.last_closed_day,
            releases=state.releases,
        )
        self._positions = state.positions
        self.feed.seek({p: pos.resume_offset for p, pos in state.positions.items()})
        offsets = {p: pos.resume_offset for p, pos in state.positions.items()}
        self.intake.high = {p: pos.high_offset for p, pos in state.positions.items()}
        self.source.seek(offsets)
        self._check_retention_gaps(self._broker.retention_gaps() if self._broker else {})
        for p in self.source.partitions():
            self.intake.read_offset[p] = offsets.get(p, 0)
        self.observer.partitions(len(self.intake.read_offset), [])

    def _check_retention_gaps(self, gaps: dict[str, int]) -> None:
        """Records deleted before they were read are never skipped silently: fail (exit 4)
        unless ``on_retention_gap == "skip"``, then log and count them."""
        gaps = {p: n for p, n in gaps.items() if n > 0}
        if not gaps:
            return
        named = ", ".join(f"{p}: {n} records" for p, n in sorted(gaps.items()))
        if self.on_retention_gap != "skip":
            raise RetentionGapError(
                f"input records after the stored position were deleted before they were read "
                f"(retention or delete_records) — {named}"
            )
        for p, n in gaps.items():
            self.observer.offsets_skipped(p, n)
        log.error("skipping input records deleted before they were read — %s", named)

    def _note_new_partitions(self) -> None:
        """Partitions the source added while running (read from their beginning): each holds
        every open day until it has passed it or been idle for ``idle_timeout`` from now."""
        new = [p for p in self.source.partitions() if p not in self.intake.read_offset]
        if not new:
            return
        for p in new:
            self.intake.read_offset[p] = 0
            self.intake.last_seen[p] = self.monotonic()
        log.warning(
            "input grew to %d partitions (%s added): open days wait for them",
            len(self.intake.read_offset),
            ", ".join(new),
        )
        self.observer.partitions(len(self.intake.read_offset), new)

    # ------------------------------------------------------------------ main loop
    def run(self, until_end: bool = False, through_day: str | None = None) -> RunSummary:
        """Run until stopped; with ``until_end``, close every open day (and, if given, every day
        through ``through_day``) once the input is exhausted, then return."""
        with collector_for_run():
            try:
                return self._run(until_end, through_day)
            except StoreError as exc:
                self.observer.failing_closed(str(exc))
                raise
            finally:
                self.observer.stopped()
                # days and releases only: both follow the data-independent schedule; a count of
                # records or rejects would differ between neighbouring inputs
                # (tests/system/test_side_channels.py compares logs byte for byte)
                log.info(
                    "stopped: %d days closed, %d releases published",
                    self.summary.days_closed,
                    self.summary.releases_published,
                )

    def _run(self, until_end: bool, through_day: str | None = None) -> RunSummary:
        # a stale state must not publish anything: the sink may already hold later days
        held = check_sink_not_ahead(
            getattr(self.store, "path", "(store)"),
            self.engine.last_closed_day,
            self.sink,
        )
        self.outbox.publish_lost(held)
        self.outbox.relay()
        self.observer.started()
        while not self.stop_event.is_set():
            self._poll_queries()
            # at the end of the input already: no poll (a Kafka poll would wait its timeout)
            at_end = until_end and self.source.at_end()
            records = [] if at_end else self.source.poll_batches(self.batch_size)
            self._note_new_partitions()
            self._probe_input()
            self.intake.ingest_batches(records, quiet=not records and not until_end)
            self._compact_state(sum(len(b.offsets) for b in records))
            if until_end and not records and (at_end or self.source.at_end()):
                last_open = self._last_open_day()
                if last_open is not None and self.future_slack_s is not None:
                    last_open = min(last_open, self.intake.today())  # never close a day to come
                last = max(filter(None, (last_open, through_day)), default=None)
                if self._close_through(last):
                    break
                continue
            if not until_end:
                self._close_ready()
            if not records:
                self.stop_event.wait(self.poll_interval_s)
        self.reject_sink.flush()
        self.sink.flush()
        return self.summary

    def stop(self) -> None:
        self.stop_event.set()

    # ------------------------------------------------------------------ input
    def _poll_queries(self) -> None:
        self._register_queries(self.feed.poll())

    def _register_queries(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Register queries in order; the new ones are stored in one transaction before
        anything else happens (no day closes in between), so a backlog of thousands costs one
        commit, not one each."""
        new: list[bytes] = []
        for where, raw in items:
            self._register_query(where, raw, new)
        if new:
            self.store.add_queries(new)

    def _register_query(self, where: str, raw: bytes, new: list[bytes]) -> None:
        try:
            query = admit_query(self.engine, self.limits, raw)
            if query is not None:
                self.engine.register_query(query)
                new.append(query.canonical_json().encode())
                self.summary.queries_registered += 1
                cost = query_cost(query, self.engine.params, self.engine.quotas)
                warning = affordability_warning(cost, self.engine.params, self.min_affordable_days)
                if warning is not None:
                    log.warning("%s", warning)
        except Reject as rej:
            self.intake.refuse_query(rej, raw, where)

    def _compact_state(self, n_records: int) -> None:
        """The store's upkeep (the budget log's fold, docs/design.md §5.1), paced by the work it
        follows: after each input batch as many entries as it had records (a day appends at most
        one entry per record), between days closing back to back as many as the earlier day
        appended up to ``COMPACT_BETWEEN_CLOSES_ENTRIES``; at least ``COMPACT_MIN_ENTRIES``. The
        fold keeps up with the commits and never stalls a day's close; the excess of a run's
        last commits is left to the next run."""
        self.store.compact(max(n_records, COMPACT_MIN_ENTRIES))

    # ------------------------------------------------------------------ closing days
    def _first_open_day(self) -> str | None:
        last = self.engine.last_closed_day
        if last is not None:
            return next_day(last)
        return min(self.intake.open) if self.intake.open else None

    def _last_open_day(self) -> str | None:
        return max(self.intake.open) if self.intake.open else None

    def _close_ready(self) -> None:
        target = last_closable_day(
            self._first_open_day(),
            self._last_open_day(),
            lambda day: self.intake.closable(
                day,
                self.source.partitions(),
                self.allowed_lateness_s,
                self.idle_timeout_s,
                self._broker.caught_up if self._broker is not None else None,
            ),
            self.intake.quiet_since(),
            self.allowed_lateness_s,
        )
        if target is not None:
            self._close_through(target)

    def _read_lag(self) -> None:
        try:
            lags = self._broker.lag() if self._broker is not None else {}
        except Exception as exc:
            self.intake.unavailable("could not read the input's lag", exc)
            return
        for partition, lag in lags.items():
            self.observer.partition_lag(partition, lag)
        self.intake.available()

    def _probe_input(self) -> None:
        if (
            self.intake.input_down_probe_at is not None
            and self.monotonic() >= self.intake.input_down_probe_at
        ):
            self._read_lag()

    def _partitions_unchanged(self) -> bool:
        """Ask the source for fresh partition metadata before days close: False (close
        nothing now) when partitions were added — they are read first — or when the source
        cannot tell (a broker outage: an unknown partition may hold the day's events)."""
        try:
            added = self._broker.refresh_partitions(fresh=True) if self._broker else []
        except Exception as exc:
            self.intake.unavailable("could not refresh the input's partitions; days wait", exc)
            return False
        self.intake.available()
        self._note_new_partitions()
        return not added

    def _close_through(self, last: str | None) -> bool:
        """Close every open day through ``last``; False if it must wait (see
        :meth:`_partitions_unchanged`)."""
        if last is None:
            return True
        if not self._partitions_unchanged():
            return False
        try:
            queries = self.feed.poll_all()
        except Exception as exc:  # the days wait: a query not read now would be refused later
            self.intake.unavailable("could not read the query feed to its end; days wait", exc)
            return False
        self._register_queries(queries)
        day = self._first_open_day()
        appended = 0  # budget log entries of the day just closed
        while day is not None and last is not None and day <= last and not self.stop_event.is_set():
            if appended:  # days closing back to back: the upkeep between them
                self._compact_state(min(appended, COMPACT_BETWEEN_CLOSES_ENTRIES))
            appended = self._close_day(day)
            day = next_day(day)
        return True

    def announce(self, day: str) -> list[str]:
        """Register every query known for ``day`` now (feed and policy, as at the day's close)
        and return the canonical JSON of the queries that apply to it, in registration order.

        Local mode: devices answer only announced queries; registering again at the close is a
        no-op because policies are deterministic in their inputs."""
        self.engine.check_day(day)
        self._register_queries(self.feed.poll_all())
        self._register_queries(self.feed.on_day(self.engine.history, day))
        return [q.canonical_json() for q in self.engine.queries.for_day(day)]

    def _positions_after(self, day: str) -> dict[str, Position]:
        positions: dict[str, Position] = {}
        for p, read in self.intake.read_offset.items():
            pending = [m[p] for d, m in self.intake.min_offset.items() if d > day and p in m]
            resume = min(pending) if pending else read
            positions[p] = Position(resume, max(read, self.intake.high.get(p, 0)))
        for label, offset in self.feed.positions().items():
            positions[label] = Position(offset, offset)
        for label, mark in self.source.marks().items():  # the input's identity (file source)
            positions[label] = Position(mark, mark)
        return positions

    def _close_day(self, day: str) -> int:
        """The checkpoint: prepare → commit (one transaction) → apply → relay (see module doc).
        Returns the number of budget entries the commit appended."""
        self._register_queries(self.feed.on_day(self.engine.history, day))
        acc = self.intake.open.pop(day, None) or self.engine.new_day(day)
        started = time.perf_counter()
        # 1. prepare: releases with noise drawn, debits computed; nothing mutated yet
        outcome = self.engine.prepare_day(acc)
        positions = self._positions_after(day)
        self.reject_sink.flush()
        # 2. commit debits + releases + positions in one transaction (raises: fail closed)
        commit_started = time.perf_counter()
        budget_keys, budget_spent, budget_retired = outcome.budget_rows()
        self.store.commit_day(
            DayCommit(
                day=day,
                releases=[(r.query_id, r.to_json().encode()) for r in outcome.releases],
                changed_users=budget_keys,
                spent_units=budget_spent,
                retired=budget_retired,
                positions=positions,
                active_set_state=outcome.active_set_state,
                coverage_state=outcome.coverage_state,
                population_state=outcome.population_state,
            )
        )
        self.observer.committed(time.perf_counter() - commit_started, self.store.size_bytes())
        # the day's releases wait in the outbox from now on (readiness watches how long)
        self.observer.outbox(len(self.store.unsent_releases()))
        crash_point("after_commit")
        # 2b. mirror the committed input positions to the source (lag tools); not the truth
        try:
            if self._broker is not None:
                self._broker.committed({p: pos.resume_offset for p, pos in positions.items()})
        except Exception as exc:  # the store holds the real positions
            self.intake.unavailable("could not mirror input offsets to the source", exc)
        # a metric: a broker outage here must not end the run (the day is committed)
        self._read_lag()
        # 3. apply the committed day in memory
        self.engine.commit_day(outcome)
        self.intake.min_offset.pop(day, None)
        self.intake.high.update({p: pos.high_offset for p, pos in positions.items()})
        self.summary.days_closed += 1
        close_seconds = time.perf_counter() - started
        log.info("closed day %s: %d releases in %.3fs", day, len(outcome.releases), close_seconds)
        self.observer.day_closed(day, close_seconds, outcome.releases, outcome.exact_stats)
        # 4. relay the outbox
        self.outbox.relay()
        if self.on_day_closed is not None:
            self.on_day_closed(day, outcome.releases)
        return len(outcome.changed_users)
