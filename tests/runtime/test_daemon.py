"""The daemon loop with in-memory source/sink, a fake clock and a real SQLite store."""

import datetime as dt
import itertools
import json
import threading
from functools import partial

import pytest

from streamfilter.engine.engine import Engine
from streamfilter.engine.params import PrivacyParams
from streamfilter.privacy.noise import SeededRandomBits
from streamfilter.runtime.daemon import Daemon
from streamfilter.runtime.io.base import QueryFeed
from streamfilter.runtime.store import SQLiteStateStore
from streamfilter.testing import FakeClock, MemorySink, MemorySource

PARAMS = PrivacyParams.create(b_norm=2.0, rho=0.5, granularity=2.0**-8)
Q = {
    "query_id": "active",
    "kind": "sum",
    "features": ["active"],
    "clip": 1.0,
    "from_day": "2026-01-01",
}


class ListFeed(QueryFeed):
    def __init__(self, queries):
        self.pending = [json.dumps(q).encode() for q in queries]

    def poll(self):
        out, self.pending = [("test", q) for q in self.pending], []
        return out


def event(user, day, **values):
    return json.dumps({"user_id": user, "day": day, "values": values or {"active": 1}}).encode()


def utc(day, hours=0.0):
    d = dt.date.fromisoformat(day)
    return dt.datetime(d.year, d.month, d.day, tzinfo=dt.UTC).timestamp() + hours * 3600


@pytest.fixture
def world(tmp_path):
    clock = FakeClock(wall=utc("2026-01-01", 1))
    parts = {}

    def make(source=None, queries=(Q,), seed=1):
        store = SQLiteStateStore(tmp_path / "state.db")
        src = source or MemorySource({"p0": [], "p1": []})
        sink, rejects = MemorySink(), MemorySink()
        d = Daemon(
            Engine(PARAMS, SeededRandomBits(seed)),
            store,
            src,
            ListFeed(queries),
            sink,
            rejects,
            allowed_lateness_s=7200,
            idle_timeout_s=600,
            poll_interval_s=0,
            wall_clock=clock.time,
            monotonic=clock.monotonic,
        )
        parts.update(store=store, source=src, sink=sink, rejects=rejects, daemon=d)
        return d

    yield make, clock, parts
    if "store" in parts:
        parts["store"].close()


def step(daemon):
    """One loop iteration without waiting."""
    daemon._poll_queries()
    for rec in daemon.source.poll(1000):
        daemon.intake.ingest(rec.partition, rec.offset, rec.next_offset, rec.value)
    daemon._close_ready()


def days_of(sink):
    return [json.loads(p)["day"] for p in sink.payloads]


def test_day_closes_only_after_lateness_and_when_every_partition_moved_on(world):
    make, clock, parts = world
    d = make()
    src = parts["source"]
    src.append("p0", event("a", "2026-01-01"))
    src.append("p1", event("b", "2026-01-01"))
    step(d)
    clock.wall = utc("2026-01-02", 1.9)  # within allowed lateness (2h)
    src.append("p0", event("a", "2026-01-02"))
    step(d)
    assert parts["sink"].payloads == []
    clock.wall = utc("2026-01-02", 2.1)  # lateness passed, but p1 has not moved past day 1
    clock.mono += 60
    step(d)
    assert parts["sink"].payloads == []
    src.append("p1", event("b", "2026-01-02"))  # p1 moves on
    step(d)
    assert days_of(parts["sink"]) == ["2026-01-01"]


def test_idle_partition_stops_holding_the_watermark(world):
    make, clock, parts = world
    d = make()
    src = parts["source"]
    src.append("p0", event("a", "2026-01-01"))
    src.append("p1", event("b", "2026-01-01"))
    step(d)
    src.append("p0", event("a", "2026-01-02"))
    clock.wall = utc("2026-01-02", 3)
    step(d)
    assert parts["sink"].payloads == []
    clock.mono += 601  # p1 idle longer than idle_timeout
    step(d)
    assert days_of(parts["sink"]) == ["2026-01-01"]


def test_backfill_does_not_close_a_day_before_its_events_were_read(world):
    make, clock, parts = world
    clock.wall = utc("2026-03-01")  # long after the days in the input
    d = make()
    src = parts["source"]
    src.append("p0", event("a", "2026-01-01"))
    src.append("p1", event("b", "2026-01-01"))
    step(d)
    assert parts["sink"].payloads == []  # neither partition has moved past day 1 yet
    src.append("p0", event("a", "2026-01-03"))
    src.append("p1", event("b", "2026-01-02"))
    step(d)
    # days 1 closes; day 2 waits for p0? p0 is at day 3, p1 at day 2 → only day 1 is past everywhere
    assert days_of(parts["sink"]) == ["2026-01-01"]


def test_late_events_are_rejected_and_gap_days_still_release(world):
    make, clock, parts = world
    clock.wall = utc("2026-03-01")
    d = make(source=MemorySource({"p0": []}))
    src = parts["source"]
    src.append("p0", event("a", "2026-01-01"))
    src.append("p0", event("a", "2026-01-04"))
    step(d)
    assert days_of(parts["sink"]) == ["2026-01-01", "2026-01-02", "2026-01-03"]
    src.append("p0", event("z", "2026-01-02"))
    step(d)
    rejects = [json.loads(p) for p in parts["rejects"].payloads]
    assert [r["reason"] for r in rejects] == ["late"]
    assert json.loads(rejects[0]["raw"])["user_id"] == "z"


def test_until_end_closes_everything_and_bad_input_goes_to_rejects(world):
    make, _clock, parts = world
    src = MemorySource(
        {
            "p0": [
                event("a", "2026-01-01"),
                b"{broken",
                event("a", "2026-01-02"),
                b'{"user_id": "", "day": "2026-01-02", "values": {}}',
            ]
        }
    )
    d = make(source=src, queries=(Q, {"query_id": "bad", "kind": "nope"}))
    summary = d.run(until_end=True)
    assert days_of(parts["sink"]) == ["2026-01-01", "2026-01-02"]
    assert summary.rejects == {"malformed_json": 1, "invalid_user_id": 1, "unknown_query_kind": 1}
    reasons = sorted(json.loads(p)["reason"] for p in parts["rejects"].payloads)
    assert reasons == ["invalid_user_id", "malformed_json", "unknown_query_kind"]


def test_poll_batches_are_polls_records_as_columns(tmp_path):
    """The default ``poll_batches`` (file source here): the records ``poll`` would return, in
    order, one batch per run of one partition, offsets and resume position kept."""
    from streamfilter.runtime.io.files import FileSource

    lines = [event("a", "2026-01-01"), b"", event("b", "2026-01-01"), b"{broken", b"x" * 10]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    plain, batched = FileSource(path), FileSource(path)
    plain.seek({})
    batched.seek({})
    records = plain.poll(3)
    (batch,) = batched.poll_batches(3)
    assert batch.partition == records[0].partition
    assert batch.offsets == [r.offset for r in records]
    assert batch.values == [r.value for r in records]
    assert batch.next_offset == records[-1].next_offset
    assert [r.value for r in plain.poll(10)] == batched.poll_batches(10)[0].values
    assert plain.poll(10) == [] and batched.poll_batches(10) == []
    plain.close()
    batched.close()

    src = MemorySource({"p0": [b"1", b"2"], "p1": [b"3"]})
    src.seek({"p0": 1})
    assert [(b.partition, b.offsets, b.values, b.next_offset) for b in src.poll_batches(10)] == [
        ("p0", [1], [b"2"], 2),
        ("p1", [0], [b"3"], 1),
    ]


def test_batched_ingest_rejects_exactly_what_record_ingest_rejects(world):
    """Rejects (reason, raw bytes, position) and accepted events are the same whether records
    arrive one at a time or in one batch."""
    make, _clock, parts = world
    values = [
        event("a", "2026-01-01"),
        b"{broken",
        event("b", "2026-01-02"),
        b"",
        event("a", "2026-01-01"),
        b'{"user_id": "", "day": "2026-01-01", "values": {}}',
    ]
    d = make(source=MemorySource({"p0": values}))
    d.run(until_end=True)
    one_batch = [json.loads(p) for p in parts["rejects"].payloads]
    assert [(r["reason"], r["raw"]) for r in one_batch] == [
        ("malformed_json", "{broken"),
        ("malformed_json", ""),
        ("invalid_user_id", '{"user_id": "", "day": "2026-01-01", "values": {}}'),
    ]
    assert d.summary.events_accepted == 3
    parts["store"].close()

    (parts["store"].path).unlink()
    parts["store"].mirror_path.unlink()
    d2 = make(source=MemorySource({"p0": values}))
    for i, raw in enumerate(values):
        d2.intake.ingest("p0", i, i + 1, raw)
    assert [json.loads(p) for p in parts["rejects"].payloads] == one_batch
    assert d2.summary.events_accepted == 3


def test_the_run_restores_the_collector_settings(world):
    import gc

    from streamfilter.runtime import process

    make, _clock, _parts = world
    before = gc.get_threshold()
    seen = {}

    def spy(_day, _releases):
        seen["threshold"] = gc.get_threshold()
        seen["frozen"] = gc.get_freeze_count()

    d = make(source=MemorySource({"p0": [event("a", "2026-01-01")]}))
    d.on_day_closed = spy
    d.run(until_end=True)
    assert seen["threshold"][0] == max(before[0], process.GC_YOUNG_THRESHOLD)
    assert seen["frozen"] > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_batch_of_one_open_day_counts_like_record_by_record(world):
    """The one-pass path (every record valid, one open day): the same accepted and duplicate
    counts and the same releases as feeding the records one at a time; a batch of a closed day
    still goes through the per-record path and is rejected as late."""

    def with_id(user, event_id):
        return json.dumps(
            {"user_id": user, "day": "2026-01-01", "values": {"active": 1}, "event_id": event_id}
        ).encode()

    values = [with_id("a", "e1"), with_id("b", "e1"), with_id("a", "e1"), with_id("a", "e2")]
    make, _clock, parts = world
    results = []
    for one_by_one in (False, True):
        d = make(source=MemorySource({"p0": [] if one_by_one else values}))
        for i, raw in enumerate(values if one_by_one else []):
            d.intake.ingest("p0", i, i + 1, raw)
        d.run(until_end=True)
        results.append(
            (d.summary.events_accepted, d.summary.events_duplicate, parts["sink"].payloads)
        )
        if not one_by_one:
            d.source.append("p0", with_id("c", "e9"))  # 2026-01-01 is closed now
            d.run(until_end=True)
            assert [json.loads(p)["reason"] for p in parts["rejects"].payloads] == ["late"]
        parts["store"].close()
        parts["store"].path.unlink()
        parts["store"].mirror_path.unlink()
    assert results[0] == results[1]
    assert results[0][:2] == (3, 1)


def test_a_batch_across_a_day_boundary_is_added_per_day_run_like_record_by_record(world):
    """A batch of valid events of two open days (the batch at a day's boundary) goes to each
    day in runs; the days' records, duplicates and resume positions equal those of the same
    events added one by one."""
    from streamfilter.runtime.io.base import RecordBatch

    def line(user, day, eid, v):
        return json.dumps(
            {"user_id": user, "day": day, "event_id": eid, "values": {"active": v, "c": "x"}}
        ).encode()

    values = [
        line("a", "2026-01-01", "e1", 1),
        line("b", "2026-01-01", "e1", 2),
        line("a", "2026-01-01", "e1", 5),  # a repeat: counted once
        line("a", "2026-01-02", "e1", 3),  # same id, another day: counted
        line("c", "2026-01-02", "e2", 4),
        line("a", "2026-01-01", "e3", 7),  # back to the first day: a third run
    ]
    make, _clock, _parts = world
    daemon = make()
    daemon.intake.ingest_batch(RecordBatch("p0", list(range(10, 16)), values, 16))
    for day, acc in daemon.intake.open.items():
        one_by_one = daemon.engine.new_day(day)
        for raw in values:
            parsed = daemon.engine.parse_records([raw])[0]
            if parsed.day == day:
                one_by_one.add(parsed)
        got, want = acc.finish(), one_by_one.finish()
        assert got.users.tolist() == want.users.tolist()
        assert (
            got.value.tolist() == want.value.tolist() and got.coord.tolist() == want.coord.tolist()
        )
    assert sorted(daemon.intake.open) == ["2026-01-01", "2026-01-02"]
    assert daemon.intake.min_offset == {"2026-01-01": {"p0": 10}, "2026-01-02": {"p0": 13}}
    assert (daemon.summary.events_accepted, daemon.summary.events_duplicate) == (5, 1)


class RecordingStore(SQLiteStateStore):
    """The real SQLite store, noting (log entries, table rows) around each commit and upkeep."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, int, tuple[int, int], tuple[int, int]]] = []

    def sizes(self) -> tuple[int, int]:
        log = self._db.execute("SELECT COALESCE(SUM(n_users), 0) FROM budget_log").fetchone()[0]
        table = self._db.execute("SELECT count(*) FROM budgets").fetchone()[0]
        return log - self._folded_entries(), table

    def commit_day(self, commit):
        before = self.sizes()
        seq = super().commit_day(commit)
        self.calls.append(("commit", len(commit.changed_users), before, self.sizes()))
        return seq

    def compact(self, max_entries):
        before = self.sizes()
        left = super().compact(max_entries)
        self.calls.append(("compact", max_entries, before, self.sizes()))
        return left


def daemon_over(store, records, sink, *, batch_size):
    """A daemon over ``records`` (one partition) with the test seed."""
    return Daemon(
        Engine(PARAMS, SeededRandomBits(3)),
        store,
        MemorySource({"p0": list(records)}),
        ListFeed((Q,)),
        sink,
        MemorySink(),
        poll_interval_s=0,
        batch_size=batch_size,
    )


def run_until_end(store, records, sink, *, batch_size):
    """A daemon over ``records`` (one partition) with the test seed, run to the input's end."""
    daemon_over(store, records, sink, batch_size=batch_size).run(until_end=True)


def test_the_budget_log_is_folded_between_batches_and_never_inside_a_close(tmp_path):
    """Upkeep (docs/design.md §5.1): a day's commit only appends its entries; the fold runs in
    steps after input batches and between days closing back to back, keeps pace (no excess is
    left but the last commit's) and changes no release: the same bytes as a store that never
    folds."""
    records = [event(f"u{d}-{i % 23}", f"2026-01-0{d}") for d in range(1, 7) for i in range(40)]
    payloads = []
    for max_rows in (0, 10**6):
        store = RecordingStore(tmp_path / f"state-{max_rows}.db", budget_log_max_rows=max_rows)
        sink = MemorySink()
        try:
            run_until_end(store, records, sink, batch_size=25)
            commits = [c for c in store.calls if c[0] == "commit"]
            assert len(commits) == 6 and all(c[1] == 23 for c in commits)
            for _, appended, (log, table), after in commits:
                assert after == (log + appended, table)  # appended, nothing folded
            if max_rows == 0:
                after_upkeep = [
                    b[3] for a, b in itertools.pairwise(store.calls) if a[0] == "commit"
                ]
                assert len(after_upkeep) == 5  # between the 6 back-to-back closes
                assert all(log <= table for log, table in after_upkeep)  # caught up each time
                assert sum(c[2][0] - c[3][0] for c in store.calls if c[0] == "compact") > 0
                assert store.excess_log_entries() <= 23  # at most the last day's, for next run
            else:
                assert store.sizes() == (6 * 23, 0)
            payloads.append(sink.payloads)
        finally:
            store.close()
    assert payloads[0] == payloads[1] and len(payloads[0]) == 6


def test_the_upkeep_between_back_to_back_closes_is_bounded(tmp_path, monkeypatch):
    """Between two days closing back to back the upkeep folds at most
    ``COMPACT_BETWEEN_CLOSES_ENTRIES`` (here 10 of a day's 23 entries): a backfill's releases do
    not wait on a long fold; the budgets are those of a store that never folds."""
    import streamfilter.runtime.daemon as daemon_module

    monkeypatch.setattr(daemon_module, "COMPACT_MIN_ENTRIES", 1)
    monkeypatch.setattr(daemon_module, "COMPACT_BETWEEN_CLOSES_ENTRIES", 10)
    records = [event(f"u{d}-{i % 23}", f"2026-01-0{d}") for d in range(1, 5) for i in range(23)]
    budgets = []
    for max_rows in (0, 10**6):
        store = RecordingStore(tmp_path / f"state-{max_rows}.db", budget_log_max_rows=max_rows)
        try:
            run_until_end(store, records, MemorySink(), batch_size=1000)
            between = [b for a, b in itertools.pairwise(store.calls) if a[0] == "commit"]
            assert len(between) == 3 and all(c[:2] == ("compact", 10) for c in between)
            folded = [c[2][0] - c[3][0] for c in between]
            assert folded == ([10, 10, 10] if max_rows == 0 else [0, 0, 0])
            budgets.append(sorted(store.load().budgets))
        finally:
            store.close()
    assert budgets[0] == budgets[1] and len(budgets[0]) == 4 * 23


def _note_records_read(calls: list[int], daemon: Daemon) -> None:
    calls.append(daemon.summary.records_read)


def test_freed_heap_is_handed_back_once_the_input_goes_quiet(tmp_path):
    """While records flow the daemon keeps freed memory for reuse (runtime/memory.py); it makes
    ``return_free_heap``'s call on the first poll that brings nothing after some records, once
    per quiet spell, never in a run to the input's end, and releases the same either way."""
    records = [event(f"u{i}", "2026-01-01") for i in range(60)] + [
        event(f"u{i}", "2026-01-02") for i in range(40)
    ]
    calls: list[int] = []
    store = SQLiteStateStore(tmp_path / "follow.db")
    daemon = daemon_over(store, records, MemorySink(), batch_size=10)
    daemon.intake.return_free_heap = partial(_note_records_read, calls, daemon)
    stopper = threading.Timer(0.5, daemon.stop)  # ~thousands of quiet polls (interval 0)
    stopper.start()
    try:
        daemon.run(until_end=False)
    finally:
        stopper.cancel()
        store.close()
    assert calls == [100]  # after the last batch, not per batch, and once
    payloads = []
    for trim in (True, False):
        store = SQLiteStateStore(tmp_path / f"state-{trim}.db")
        sink, calls = MemorySink(), []
        daemon = daemon_over(store, records, sink, batch_size=10)
        if trim:
            daemon.intake.return_free_heap = partial(_note_records_read, calls, daemon)
        daemon.run(until_end=True)
        store.close()
        payloads.append(sink.payloads)
        assert calls == []  # the input never goes quiet: it ends
    assert payloads[0] == payloads[1] and payloads[0]
