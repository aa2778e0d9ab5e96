"""Reading the input: one part of the daemon loop that the single process (``runtime.daemon``)
and the cluster worker (``runtime.cluster_worker``) each assemble (docs/design.md §4.3, §7).

An :class:`Intake` validates each batch a source returns (``engine.parse_columns`` /
``parse_records``), rejects what must be refused — with its reason, to the reject sink, silently
when a replayed record was rejected the first time — and adds the rest to its open day's buffer
(``day_input``: one buffer per day in one process, one per (day, partition) in a worker). It
keeps what a day's close needs: each open day's first offset per partition (where a restart
resumes), the offsets read and the highest seen, each partition's latest day and when it was
last heard from (the watermark rule, :meth:`Intake.closable`, §5.6). ``screen`` and
``screen_columns`` are the cluster worker's checks of each batch (``wrong_partition``).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, ne, not_
from typing import Any

from streamfilter.engine.contract import MAX_EVENT_BYTES, Reject, RejectReason
from streamfilter.engine.engine import DayInput, EngineCore
from streamfilter.engine.ingest import EventColumns
from streamfilter.engine.lines import BlockLines
from streamfilter.engine.records import DayAccumulator
from streamfilter.runtime.io.base import DEFAULT_REJECT_RAW_BYTES, RecordBatch, Sink, reject_payload
from streamfilter.runtime.observe.observer import DaemonObserver
from streamfilter.runtime.process import RunSummary
from streamfilter.runtime.query_admission import query_id_of

__all__ = ["INPUT_PROBE_S", "InputLimits", "Intake", "day_end_utc", "last_closable_day", "next_day"]

log = logging.getLogger("streamfilter.daemon")
DAY = dt.timedelta(days=1)
_DAY = attrgetter("day")

#: seconds between probes of an input whose broker did not answer (``Daemon._probe_input``)
INPUT_PROBE_S = 2.0


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


def next_day(day: str) -> str:
    return (dt.date.fromisoformat(day) + DAY).isoformat()


def day_end_utc(day: str) -> float:
    d = dt.date.fromisoformat(day) + DAY
    return dt.datetime(d.year, d.month, d.day, tzinfo=dt.UTC).timestamp()


def _longest(values: Sequence[bytes]) -> int:
    """The longest record's length in bytes (lines held in place are not made into bytes)."""
    if isinstance(values, BlockLines):
        return int(values.lengths().max())
    return max(map(len, values))


def last_closable_day(
    first_open: str | None,
    last_open: str | None,
    closable: Callable[[str], bool],
    quiet_since: float,
    allowed_lateness_s: float,
) -> str | None:
    """The latest day that may close now (every earlier open day closes with it, in order), or
    None. A day after the last day with events closes on the same schedule when the input was
    already quiet at its deadline (end + allowed_lateness): when releases leave must not depend
    on whether anyone sent data that day (docs/design.md §6 item 7). A backfill that pauses
    never closes days it has not reached: their deadlines passed before the input went quiet."""
    day, target = first_open, None
    while (
        day is not None
        and closable(day)
        and (
            (last_open is not None and day <= last_open)
            or day_end_utc(day) + allowed_lateness_s > quiet_since
        )
    ):
        target = day
        day = next_day(day)
    return target


class Intake:
    """The input side of a daemon loop (see the module doc)."""

    def __init__(
        self,
        engine: EngineCore[Any],
        reject_sink: Sink,
        summary: RunSummary,
        observer: DaemonObserver,
        *,
        limits: InputLimits,
        wall_clock: Callable[[], float],
        monotonic: Callable[[], float],
        future_slack_s: float | None,
        day_input: Callable[[str, str, int], DayInput] | None = None,
        screen: Callable[[str, Any], Any] | None = None,
        screen_columns: Callable[[str, EventColumns], bool] | None = None,
    ) -> None:
        """``day_input(day, partition, offset)``: the buffer a run of ``day``'s events read
        from ``partition`` at ``offset`` goes to (default :meth:`day_buffer`: one per day).
        ``screen(partition, parsed)``: parsed records with a ``Reject`` in place of each it
        refuses; ``screen_columns(partition, columns)``: True when ``screen`` would refuse
        none of a batch decoded as columns (else the batch takes the per-record path)."""
        self.engine = engine
        self.reject_sink = reject_sink
        self.summary = summary
        self.observer = observer
        self.limits = limits
        self.wall_clock = wall_clock
        self.monotonic = monotonic
        self.future_slack_s = future_slack_s
        self.day_input = day_input or self.day_buffer
        self.screen = screen
        self.screen_columns = screen_columns
        #: the process's call handing freed heap pages back (``runtime.memory.return_free_heap``,
        #: set by ``streamfilter run``), made when the input goes quiet (``ingest_batches``)
        self.return_free_heap: Callable[[], object] | None = None
        self._records_since_trim = 0
        self.open: dict[str, DayInput] = {}
        self.min_offset: dict[str, dict[str, int]] = {}  # day -> partition -> first offset
        self.read_offset: dict[str, int] = {}
        self.high: dict[str, int] = {}
        self.max_day: dict[str, str] = {}
        self.last_seen: dict[str, float] = {}
        self.started = monotonic()
        self.input_down_probe_at: float | None = None  # set while the input's broker is down

    def closable(
        self,
        day: str,
        partitions: list[str],
        allowed_lateness_s: float,
        idle_timeout_s: float,
        caught_up: Callable[[str], bool] | None,
    ) -> bool:
        """The watermark rule (docs/design.md §5.6): the wall clock is past ``day``'s end plus
        the lateness, and every partition has passed ``day`` or been idle for the timeout (and
        read to its end, ``caught_up``, when the source can tell)."""
        if self.wall_clock() < day_end_utc(day) + allowed_lateness_s:
            return False
        now = self.monotonic()
        for p in partitions:
            if self.max_day.get(p, "") > day:
                continue
            idle_s = now - self.last_seen.get(p, self.started)
            if idle_s >= idle_timeout_s and (caught_up is None or caught_up(p)):
                continue
            return False
        return True

    def today(self) -> str:
        return dt.datetime.fromtimestamp(self.wall_clock(), dt.UTC).date().isoformat()

    def horizon(self) -> str | None:
        """The latest event day accepted now (``None``: no horizon): today (UTC) + the slack."""
        if self.future_slack_s is None:
            return None
        moment = dt.datetime.fromtimestamp(self.wall_clock() + self.future_slack_s, dt.UTC)
        return moment.date().isoformat()

    def reject(self, reason: RejectReason, detail: str, raw: bytes, where: str) -> None:
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

    def refuse_query(self, rej: Reject, raw: bytes, where: str) -> None:
        """A refused query is loud: one WARNING (its id, the reason) besides the reject record
        and ``streamfilter_rejects_total{reason}``; queries the operator meant never vanish."""
        log.warning("query %s refused (%s): %s", query_id_of(raw), rej.reason, rej.detail)
        self.reject(rej.reason, rej.detail, raw, where)

    def ingest(self, partition: str, offset: int, next_offset: int, raw: bytes) -> None:
        self.ingest_batches([RecordBatch(partition, [offset], [raw], next_offset)])

    def ingest_batches(self, batches: list[RecordBatch], quiet: bool = False) -> None:
        """Ingest a poll's batches; on the first quiet poll (no records, following the input)
        after some, hand the freed heap back (runtime/memory.py: while records flow, freed
        memory is kept for the next batches and days to reuse)."""
        for batch in batches:
            self.ingest_batch(batch)
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
            acc = self.day_input(days[a], partition, offsets[a])
            accepted = self._add_run(acc, columns, parsed, a, b, len(runs) > 1)
            self.summary.events_accepted += accepted
            self.summary.events_duplicate += b - a - accepted

    def ingest_batch(self, batch: RecordBatch) -> None:
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
        screened = self.screen is None or self.screen_columns is not None
        columns = self.engine.parse_columns(values) if within_limit and screened else None
        if (
            columns is not None
            and self.screen_columns is not None
            and not self.screen_columns(partition, columns)
        ):
            columns = None
        parsed: Sequence[Any] = []
        if columns is None:
            parsed = self.engine.parse_records(values)
            if not within_limit:
                too_big = Reject(RejectReason.OVERSIZED, f"event exceeds {limit} bytes")
                parsed = [
                    too_big if len(v) > limit else p for p, v in zip(parsed, values, strict=True)
                ]
            if self.screen is not None:
                parsed = self.screen(partition, parsed)
        self.summary.records_read += len(values)
        self.last_seen[partition] = self.monotonic()
        self.observer.records_read(partition, len(values))
        self.read_offset[partition] = batch.next_offset
        horizon = self.horizon()
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
                    self.reject_record(partition, offsets[i], values[i], rej.reason, rej.detail)
                self._add_runs(partition, list(compress(offsets, keep)), days, runs, None, valid)
                return
        if columns is not None:  # an event of a closed or future day: record by record
            parsed = columns.events()
        accepted = duplicates = 0
        current: str | None = None  # the day of the previous added record
        add = None
        for i, item in enumerate(parsed):
            if isinstance(item, Reject):
                self.reject_record(partition, offsets[i], values[i], item.reason, item.detail)
                continue
            day = item.day
            if day != current:
                if self.engine.is_closed(day):
                    self.reject_record(
                        partition,
                        offsets[i],
                        values[i],
                        RejectReason.LATE,
                        "event day is already closed",
                    )
                    continue
                if horizon is not None and day > horizon:
                    self.reject_record(
                        partition,
                        offsets[i],
                        values[i],
                        RejectReason.FUTURE,
                        "event day is after today (UTC) plus the future slack",
                    )
                    continue
                current = day
                add = self.day_input(day, partition, offsets[i]).add
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
        self.read_offset[batch.partition] = batch.next_offset
        for offset in batch.offsets:
            self.reject_record(
                batch.partition, offset, b"", RejectReason.UNDECODABLE_BATCH, batch.undecodable
            )

    def day_buffer(self, day: str, partition: str, offset: int) -> DayInput:
        """The open ``day``'s buffer, about to receive records of ``partition`` from ``offset``
        on (the day's first offset there is where a restart must resume while it is open)."""
        if day > self.max_day.get(partition, ""):
            self.max_day[partition] = day
        acc = self.open.get(day)
        if acc is None:
            acc = self.open[day] = self.engine.new_day(day)
        self.min_offset.setdefault(day, {}).setdefault(partition, offset)
        return acc

    def reject_record(
        self, partition: str, offset: int, raw: bytes, reason: RejectReason, detail: str
    ) -> None:
        if offset < self.high.get(partition, 0):  # replayed: rejected the first time
            self.summary.replayed_skipped += 1
        else:
            self.reject(reason, detail, raw, f"{partition}:{offset}")

    def quiet_since(self) -> float:
        """Wall-clock time of the last input record (of the start when none was read yet)."""
        last = max(self.last_seen.values(), default=self.started)
        return self.wall_clock() - (self.monotonic() - last)

    def unavailable(self, what: str, exc: BaseException) -> None:
        """A broker call of the input failed: /readyz says so until one succeeds again (the
        loop probes every ``INPUT_PROBE_S``); nothing else changes (days wait, no exit)."""
        log.warning("%s: %s", what, type(exc).__name__)
        self.observer.source_unavailable(type(exc).__name__)
        self.input_down_probe_at = self.monotonic() + INPUT_PROBE_S

    def available(self) -> None:
        if self.input_down_probe_at is not None:
            log.info("the input's broker answers again")
            self.input_down_probe_at = None
        self.observer.source_available()
