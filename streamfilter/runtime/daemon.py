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
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, ne, not_
from typing import Any, Generic

from streamfilter.engine.affordability import DEFAULT_MIN_DAYS, affordability_warning, query_cost
from streamfilter.engine.contract import MAX_EVENT_BYTES, Reject, RejectReason, Release
from streamfilter.engine.engine import DayInput, DayT, EngineCore
from streamfilter.engine.ingest import EventColumns
from streamfilter.engine.lines import BlockLines
from streamfilter.engine.records import DayAccumulator
from streamfilter.errors import RetentionGapError
from streamfilter.runtime.faults import crash_point
from streamfilter.runtime.io.base import (
    DEFAULT_REJECT_RAW_BYTES,
    BrokerSource,
    QueryFeed,
    RecordBatch,
    Sink,
    Source,
    reject_payload,
)
from streamfilter.runtime.observe.observer import DaemonObserver
from streamfilter.runtime.process import RunSummary, collector_for_run, is_transient
from streamfilter.runtime.query_admission import admit_query, query_id_of
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


@dataclass(frozen=True)
class InputLimits:
    """What one input record may make the daemon hold (``[limits]``, ``[rejects]``); over a
    limit the record is rejected with its reason before anything is built for it."""

    max_event_bytes: int = MAX_EVENT_BYTES
    max_query_bytes: int = 1 << 20
    max_query_memory_bytes: int = 2 << 30
    expected_users: int = 100_000
    max_live_queries: int = 1000
    max_reject_raw_bytes: int = DEFAULT_REJECT_RAW_BYTES


#: first and longest wait between two attempts to relay the outbox (seconds)
RELAY_BACKOFF_S = (1.0, 30.0)

#: the fewest budget log entries the store's upkeep folds after a batch, or when idle (a
#: fraction of a second; ``Daemon._compact_state``)
COMPACT_MIN_ENTRIES = 20_000
#: the most the upkeep folds between two days closing back to back (a backfill's releases do
#: not wait on a long fold; the input batches that follow catch up)
COMPACT_BETWEEN_CLOSES_ENTRIES = 100_000


#: seconds between probes of an input whose broker did not answer (see ``_probe_input``)
INPUT_PROBE_S = 2.0


def _next_day(day: str) -> str:
    return (dt.date.fromisoformat(day) + DAY).isoformat()


def _day_end_utc(day: str) -> float:
    d = dt.date.fromisoformat(day) + DAY
    return dt.datetime(d.year, d.month, d.day, tzinfo=dt.UTC).timestamp()


def _longest(values: Sequence[bytes]) -> int:
    """The longest record's length in bytes (lines held in place are not made into bytes)."""
    if isinstance(values, BlockLines):
        return int(values.lengths().max())
    return max(map(len, values))


class Daemon(Generic[DayT]):
    def __init__(
        self,
        engine: EngineCore[DayT],
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
        #: the process's call handing freed heap pages back (``runtime.memory.return_free_heap``,
        #: set by ``streamfilter run``), made when the input goes quiet (``_ingest_batches``)
        self.return_free_heap: Callable[[], object] | None = None
        self._records_since_trim = 0
        self.min_affordable_days = min_affordable_days
        self.observer = observer or DaemonObserver()
        self.stop_event = threading.Event()
        self.summary = RunSummary()
        self._open: dict[str, DayT] = {}
        self._min_offset: dict[str, dict[str, int]] = {}  # day -> partition -> first offset
        self._read_offset: dict[str, int] = {}
        self._high: dict[str, int] = {}
        self._max_day: dict[str, str] = {}
        self._last_seen: dict[str, float] = {}
        self._started = monotonic()
        self._input_down_probe_at: float | None = None  # set while the input's broker is down
        #: a subclass's check of each parsed batch (partition, parsed) → parsed, a ``Reject`` in
        #: place of each record it refuses (cluster mode: ``wrong_partition``); None: no check
        self._screen: Callable[[str, Any], Any] | None = None
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
        self._high = {p: pos.high_offset for p, pos in state.positions.items()}
        self.source.seek(offsets)
        self._check_retention_gaps(self._broker.retention_gaps() if self._broker else {})
        for p in self.source.partitions():
            self._read_offset[p] = offsets.get(p, 0)
        self.observer.partitions(len(self._read_offset), [])

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
        new = [p for p in self.source.partitions() if p not in self._read_offset]
        if not new:
            return
        for p in new:
            self._read_offset[p] = 0
            self._last_seen[p] = self.monotonic()
        log.warning(
            "input grew to %d partitions (%s added): open days wait for them",
            len(self._read_offset),
            ", ".join(new),
        )
        self.observer.partitions(len(self._read_offset), new)

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
        self._publish_lost(held)
        self._relay_outbox()
        self.observer.started()
        while not self.stop_event.is_set():
            self._poll_queries()
            # at the end of the input already: no poll (a Kafka poll would wait its timeout)
            at_end = until_end and self.source.at_end()
            records = [] if at_end else self.source.poll_batches(self.batch_size)
            self._note_new_partitions()
            self._probe_input()
            self._ingest_batches(records, quiet=not records and not until_end)
            self._compact_state(sum(len(b.offsets) for b in records))
            if until_end and not records and (at_end or self.source.at_end()):
                last_open = self._last_open_day()
                if last_open is not None and self.future_slack_s is not None:
                    last_open = min(last_open, self._today())  # never close a day to come
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
    def _today(self) -> str:
        return dt.datetime.fromtimestamp(self.wall_clock(), dt.UTC).date().isoformat()

    def _horizon(self) -> str | None:
        """The latest event day accepted now (``None``: no horizon): today (UTC) + the slack."""
        if self.future_slack_s is None:
            return None
        moment = dt.datetime.fromtimestamp(self.wall_clock() + self.future_slack_s, dt.UTC)
        return moment.date().isoformat()

    def _reject(self, reason: RejectReason, detail: str, raw: bytes, where: str) -> None:
        """Count the reject and hand it (bounded: ``max_reject_raw_bytes``) to the reject sink.
        A reject the sink still refuses is counted, logged once and skipped: the run goes on."""
        self.summary.rejects[reason] += 1
        self.observer.rejected(reason)
        payload = reject_payload(reason, detail, raw, where, self.limits.max_reject_raw_bytes)
        try:
            self.reject_sink.publish(where, payload)
        except Exception as exc:  # the reject is lost, the record was refused all the same
            self.summary.rejects_dropped += 1
            self.observer.reject_dropped()
            if self.summary.rejects_dropped == 1:
                log.error(
                    "the reject sink refused a reject record (%s at %s); skipped, and later ones "
                    "are counted in streamfilter_rejects_dropped_total",
                    type(exc).__name__,
                    where,
                )

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
                cost = query_cost(query, self.engine.params)
                warning = affordability_warning(cost, self.engine.params, self.min_affordable_days)
                if warning is not None:
                    log.warning("%s", warning)
        except Reject as rej:
            self._refuse_query(rej, raw, where)

    def _refuse_query(self, rej: Reject, raw: bytes, where: str) -> None:
        """A refused query is loud: one WARNING (its id, the reason) besides the reject record
        and ``streamfilter_rejects_total{reason}``; queries the operator meant never vanish."""
        log.warning("query %s refused (%s): %s", query_id_of(raw), rej.reason, rej.detail)
        self._reject(rej.reason, rej.detail, raw, where)

    def _ingest(self, partition: str, offset: int, next_offset: int, raw: bytes) -> None:
        self._ingest_batches([RecordBatch(partition, [offset], [raw], next_offset)])

    def _compact_state(self, n_records: int) -> None:
        """The store's upkeep (the budget log's fold, docs/design.md §5.1), paced by the work it
        follows: after each input batch as many entries as it had records (a day appends at most
        one entry per record), between days closing back to back as many as the earlier day
        appended up to ``COMPACT_BETWEEN_CLOSES_ENTRIES``; at least ``COMPACT_MIN_ENTRIES``. The
        fold keeps up with the commits and never stalls a day's close; the excess of a run's
        last commits is left to the next run."""
        self.store.compact(max(n_records, COMPACT_MIN_ENTRIES))

    def _ingest_batches(self, batches: list[RecordBatch], quiet: bool = False) -> None:
        """Ingest a poll's batches; on the first quiet poll (no records, following the input)
        after some, hand the freed heap back (runtime/memory.py: while records flow, freed
        memory is kept for the next batches and days to reuse)."""
        for batch in batches:
            self._ingest_batch(batch)
            self._records_since_trim += len(batch.values)
        if quiet and self.return_free_heap is not None and self._records_since_trim:
            self._records_since_trim = 0
            self.return_free_heap()

    @staticmethod
    def _add_run(
        acc: DayInput,
        columns: EventColumns | None,
        parsed: Sequence[Any],
        a: int,
        b: int,
        part: bool,
    ) -> int:
        """Add events ``a..b`` of a batch to one day's input, as columns when the batch was
        decoded as columns, else as a batch of records (``part``: the run is not the whole
        batch)."""
        if columns is not None:
            # only an engine that parses events decodes columns, and its days are accumulators
            assert isinstance(acc, DayAccumulator)
            return acc.add_columns(columns.slice(a, b) if part else columns)
        return acc.add_many(parsed[a:b] if part else parsed)

    def _open_runs(self, days: list[str], horizon: str | None) -> list[tuple[int, int]] | None:
        """The runs of consecutive events of one day (one run but at a day's boundary), when
        every run's day is open and within the horizon; else None (then record by record)."""
        if days.count(days[0]) == len(days):
            cuts = [0]
        else:
            cuts = [0, *compress(range(1, len(days)), map(ne, days, days[1:]))]
        runs = list(zip(cuts, [*cuts[1:], len(days)], strict=True))
        if all(
            not self.engine.is_closed(days[a]) and (horizon is None or days[a] <= horizon)
            for a, _ in runs
        ):
            return runs
        return None

    def _add_runs(
        self,
        partition: str,
        offsets: Sequence[int],
        days: list[str],
        runs: list[tuple[int, int]],
        columns: EventColumns | None,
        parsed: Sequence[Any],
    ) -> None:
        """Add each run of valid events (``_open_runs``) to its open day's input at once."""
        for a, b in runs:
            acc = self._day_input(days[a], partition, offsets[a])
            accepted = self._add_run(acc, columns, parsed, a, b, len(runs) > 1)
            self.summary.events_accepted += accepted
            self.summary.events_duplicate += b - a - accepted

    def _ingest_batch(self, batch: RecordBatch) -> None:
        """Validate one partition's batch at once (``engine.parse_records``), then add it to its
        open day in one pass per run of one day's records when every valid record is of an open
        day (the usual batch: one run; two at a day's boundary), each invalid one rejected on
        its own (with its reason; silently when replayed); otherwise per record: reject it (with
        its reason, or ``late``) or add it to its open day (looked up when the day changes from
        one record to the next).
        An event dated after the horizon (today + ``future_slack_s``) is rejected as ``future``
        before it touches any day: it moves no watermark and no resume position.
        """
        values = batch.values
        if not values:
            return
        partition, offsets = batch.partition, batch.offsets
        if batch.undecodable:
            self._reject_undecodable(batch)
            return
        limit = self.limits.max_event_bytes
        within_limit = limit >= MAX_EVENT_BYTES or _longest(values) <= limit
        # the usual batch: valid events of one schema, decoded as columns (no object per event)
        columns = (
            self.engine.parse_columns(values) if within_limit and self._screen is None else None
        )
        parsed: Sequence[Any] = []
        if columns is None:
            parsed = self.engine.parse_records(values)
            if not within_limit:
                too_big = Reject(RejectReason.OVERSIZED, f"event exceeds {limit} bytes")
                parsed = [
                    too_big if len(v) > limit else p for p, v in zip(parsed, values, strict=True)
                ]
            if self._screen is not None:
                parsed = self._screen(partition, parsed)
        self.summary.records_read += len(values)
        self._last_seen[partition] = self.monotonic()
        self.observer.records_read(partition, len(values))
        self._read_offset[partition] = batch.next_offset
        horizon = self._horizon()
        if columns is not None or not any(issubclass(t, Reject) for t in set(map(type, parsed))):
            days = columns.days if columns is not None else list(map(_DAY, parsed))
            runs = self._open_runs(days, horizon)
            if runs is not None:
                self._add_runs(partition, offsets, days, runs, columns, parsed)
                return
        else:  # the valid events in runs as above, each reject on its own (they touch no day)
            keep = [not isinstance(item, Reject) for item in parsed]
            valid = list(compress(parsed, keep))
            days = list(map(_DAY, valid))
            runs = self._open_runs(days, horizon) if valid else None
            if runs is not None:
                for i in compress(range(len(parsed)), map(not_, keep)):
                    rej = parsed[i]
                    self._reject_record(partition, offsets[i], values[i], rej.reason, rej.detail)
                self._add_runs(partition, list(compress(offsets, keep)), days, runs, None, valid)
                return
        if columns is not None:  # an event of a closed or future day: record by record
            parsed = columns.events()
        accepted = duplicates = 0
        current: str | None = None  # the day of the previous added record
        add = None
        for i, item in enumerate(parsed):
            if isinstance(item, Reject):
                self._reject_record(partition, offsets[i], values[i], item.reason, item.detail)
                continue
            day = item.day
            if day != current:
                if self.engine.is_closed(day):
                    self._reject_record(
                        partition,
                        offsets[i],
                        values[i],
                        RejectReason.LATE,
                        "event day is already closed",
                    )
                    continue
                if horizon is not None and day > horizon:
                    self._reject_record(
                        partition,
                        offsets[i],
                        values[i],
                        RejectReason.FUTURE,
                        "event day is after today (UTC) plus the future slack",
                    )
                    continue
                current = day
                add = self._day_input(day, partition, offsets[i]).add
            assert add is not None
            if add(item):
                accepted += 1
            else:
                duplicates += 1
        self.summary.events_accepted += accepted
        self.summary.events_duplicate += duplicates

    def _reject_undecodable(self, batch: RecordBatch) -> None:
        """Records the source could not decode: each is a reject, and the run goes on."""
        self.summary.records_read += len(batch.offsets)
        self._read_offset[batch.partition] = batch.next_offset
        for offset in batch.offsets:
            self._reject_record(
                batch.partition, offset, b"", RejectReason.UNDECODABLE_BATCH, batch.undecodable
            )

    def _day_input(self, day: str, partition: str, offset: int) -> DayT:
        """The open ``day``'s buffer, about to receive records of ``partition`` from ``offset``
        on (the day's first offset there is where a restart must resume while it is open)."""
        if day > self._max_day.get(partition, ""):
            self._max_day[partition] = day
        acc = self._open.get(day)
        if acc is None:
            acc = self._open[day] = self.engine.new_day(day)
        self._min_offset.setdefault(day, {}).setdefault(partition, offset)
        return acc

    def _reject_record(
        self, partition: str, offset: int, raw: bytes, reason: RejectReason, detail: str
    ) -> None:
        if offset < self._high.get(partition, 0):  # replayed: rejected the first time
            self.summary.replayed_skipped += 1
        else:
            self._reject(reason, detail, raw, f"{partition}:{offset}")

    # ------------------------------------------------------------------ closing days
    def _first_open_day(self) -> str | None:
        last = self.engine.last_closed_day
        if last is not None:
            return _next_day(last)
        return min(self._open) if self._open else None

    def _last_open_day(self) -> str | None:
        return max(self._open) if self._open else None

    def _closable(self, day: str) -> bool:
        if self.wall_clock() < _day_end_utc(day) + self.allowed_lateness_s:
            return False
        now = self.monotonic()
        for p in self.source.partitions():
            if self._max_day.get(p, "") > day:
                continue
            idle_s = now - self._last_seen.get(p, self._started)
            if idle_s >= self.idle_timeout_s and (
                self._broker is None or self._broker.caught_up(p)
            ):
                continue
            return False
        return True

    def _close_ready(self) -> None:
        last_open = self._last_open_day()
        quiet_since = self._input_quiet_since()
        day = self._first_open_day()
        target = None
        # the latest day that may close; every earlier day then closes too (in order). A day
        # after the last day with events closes on the same schedule when the input was already
        # quiet at its deadline (end + allowed_lateness): when releases leave must not depend on
        # whether anyone sent data that day (docs/design.md §6 item 7). A backfill that pauses never
        # closes days it has not reached: their deadlines passed before the input went quiet.
        while (
            day is not None
            and self._closable(day)
            and (
                (last_open is not None and day <= last_open)
                or _day_end_utc(day) + self.allowed_lateness_s > quiet_since
            )
        ):
            target = day
            day = _next_day(day)
        if target is not None:
            self._close_through(target)

    def _read_lag(self) -> None:
        try:
            lags = self._broker.lag() if self._broker is not None else {}
        except Exception as exc:
            self._input_unavailable("could not read the input's lag", exc)
            return
        for partition, lag in lags.items():
            self.observer.partition_lag(partition, lag)
        self._input_available()

    def _input_unavailable(self, what: str, exc: BaseException) -> None:
        """A broker call of the input failed: /readyz says so until one succeeds again (the
        loop probes every ``INPUT_PROBE_S``); nothing else changes (days wait, no exit)."""
        log.warning("%s: %s", what, type(exc).__name__)
        self.observer.source_unavailable(type(exc).__name__)
        self._input_down_probe_at = self.monotonic() + INPUT_PROBE_S

    def _input_available(self) -> None:
        if self._input_down_probe_at is not None:
            log.info("the input's broker answers again")
            self._input_down_probe_at = None
        self.observer.source_available()

    def _probe_input(self) -> None:
        if self._input_down_probe_at is not None and self.monotonic() >= self._input_down_probe_at:
            self._read_lag()

    def _input_quiet_since(self) -> float:
        """Wall-clock time of the last input record (of the start when none was read yet)."""
        last = max(self._last_seen.values(), default=self._started)
        return self.wall_clock() - (self.monotonic() - last)

    def _partitions_unchanged(self) -> bool:
        """Ask the source for fresh partition metadata before days close: False (close
        nothing now) when partitions were added — they are read first — or when the source
        cannot tell (a broker outage: an unknown partition may hold the day's events)."""
        try:
            added = self._broker.refresh_partitions(fresh=True) if self._broker else []
        except Exception as exc:
            self._input_unavailable("could not refresh the input's partitions; days wait", exc)
            return False
        self._input_available()
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
            self._input_unavailable("could not read the query feed to its end; days wait", exc)
            return False
        self._register_queries(queries)
        day = self._first_open_day()
        appended = 0  # budget log entries of the day just closed
        while day is not None and last is not None and day <= last and not self.stop_event.is_set():
            if appended:  # days closing back to back: the upkeep between them
                self._compact_state(min(appended, COMPACT_BETWEEN_CLOSES_ENTRIES))
            appended = self._close_day(day)
            day = _next_day(day)
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
        for p, read in self._read_offset.items():
            pending = [m[p] for d, m in self._min_offset.items() if d > day and p in m]
            resume = min(pending) if pending else read
            positions[p] = Position(resume, max(read, self._high.get(p, 0)))
        for label, offset in self.feed.positions().items():
            positions[label] = Position(offset, offset)
        for label, mark in self.source.marks().items():  # the input's identity (file source)
            positions[label] = Position(mark, mark)
        return positions

    def _close_day(self, day: str) -> int:
        """The checkpoint: prepare → commit (one transaction) → apply → relay (see module doc).
        Returns the number of budget entries the commit appended."""
        self._register_queries(self.feed.on_day(self.engine.history, day))
        acc = self._open.pop(day, None) or self.engine.new_day(day)
        started = time.perf_counter()
        # 1. prepare: releases with noise drawn, debits computed; nothing mutated yet
        outcome = self.engine.prepare_day(acc)
        positions = self._positions_after(day)
        self.reject_sink.flush()
        # 2. commit debits + releases + positions in one transaction (raises: fail closed)
        commit_started = time.perf_counter()
        self.store.commit_day(
            DayCommit(
                day=day,
                releases=[(r.query_id, r.to_json().encode()) for r in outcome.releases],
                changed_users=outcome.changed_users,
                spent_units=outcome.spent_units,
                retired=outcome.retired,
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
            self._input_unavailable("could not mirror input offsets to the source", exc)
        # a metric: a broker outage here must not end the run (the day is committed)
        self._read_lag()
        # 3. apply the committed day in memory
        self.engine.commit_day(outcome)
        self._min_offset.pop(day, None)
        self._high.update({p: pos.high_offset for p, pos in positions.items()})
        self.summary.days_closed += 1
        close_seconds = time.perf_counter() - started
        log.info("closed day %s: %d releases in %.3fs", day, len(outcome.releases), close_seconds)
        self.observer.day_closed(day, close_seconds, outcome.releases, outcome.exact_stats)
        # 4. relay the outbox
        self._relay_outbox()
        if self.on_day_closed is not None:
            self.on_day_closed(day, outcome.releases)
        return len(outcome.changed_users)

    def _relay_outbox(self) -> None:
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

    def _publish_lost(self, held_through: str | None) -> None:
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
