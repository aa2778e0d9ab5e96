"""One event dated far ahead must not hold days open, close days to come,
or pin the resume position (failed before: the 2099 line made the partition count as past every
day, so a backfill's days closed before their events were read; ``--until-end`` closed every day
up to 2099).

In-process daemon with a fake clock and a real SQLite store: the reference run has no future
line; the hostile run has one ahead of the backfill. Releases must be byte-identical.
"""

from __future__ import annotations

import datetime as dt
import json
import random

from streamfilter.engine.monitor import Engine
from streamfilter.engine.params import PrivacyParams
from streamfilter.privacy.noise import SeededRandomBits
from streamfilter.runtime.daemon import Daemon
from streamfilter.runtime.store import SQLiteStateStore
from streamfilter.testing import FakeClock, MemorySink, MemorySource
from tests.runtime.test_daemon import ListFeed

PARAMS = PrivacyParams.create(b_norm=2.0, rho=0.5, granularity=2.0**-8)
QUERY = {"query_id": "n", "kind": "sum", "features": ["n"], "clip": 1.0, "from_day": "2026-01-01"}
DAYS = [f"2026-01-0{d}" for d in range(1, 7)]
FUTURE = json.dumps({"user_id": "x", "day": "2099-01-01", "values": {"n": 1}}).encode()


def utc(day: str, hours: float = 0.0) -> float:
    d = dt.date.fromisoformat(day)
    return dt.datetime(d.year, d.month, d.day, tzinfo=dt.UTC).timestamp() + hours * 3600


def backfill(per_day: int = 200) -> list[bytes]:
    rng = random.Random(7)
    return [
        json.dumps({"user_id": f"u{rng.randrange(10**6)}", "day": day, "values": {"n": 1}}).encode()
        for day in DAYS
        for _ in range(per_day)
    ]


def run(tmp_path, name, lines, *, until_end, wall):
    clock = FakeClock(wall=wall)
    store = SQLiteStateStore(tmp_path / f"{name}.db")
    sink, rejects = MemorySink(), MemorySink()
    daemon = Daemon(
        Engine(PARAMS, SeededRandomBits(3)),
        store,
        MemorySource({"p0": list(lines)}),
        ListFeed([QUERY]),
        sink,
        rejects,
        allowed_lateness_s=7200,
        idle_timeout_s=600,
        poll_interval_s=0,
        future_slack_s=86400,
        wall_clock=clock.time,
        monotonic=clock.monotonic,
    )
    if until_end:
        daemon.run(until_end=True)
    else:  # follow mode: the backfill arrives long after its days ended
        for _ in range(3):
            daemon._poll_queries()
            daemon.intake.ingest_batches(daemon.source.poll_batches(10_000))
            daemon._close_ready()
            clock.mono += 601  # then the partition goes idle: the last day closes too
    positions = store.load().positions
    store.close()
    reasons = [json.loads(p)["reason"] for p in rejects.payloads]
    return sink.payloads, reasons, positions, daemon


def test_a_future_line_ahead_of_a_backfill_changes_no_release(tmp_path):
    lines = backfill()
    wall = utc("2026-01-08", 3)
    ref, ref_rejects, _, _ = run(tmp_path, "ref", lines, until_end=False, wall=wall)
    got, rejects, positions, daemon = run(
        tmp_path, "hostile", [FUTURE, *lines], until_end=False, wall=wall
    )
    assert [json.loads(p)["day"] for p in ref] == DAYS and ref_rejects == []
    assert got == ref  # every day read and released exactly as without the future line
    assert rejects == ["future"] and daemon.summary.rejects == {"future": 1}
    assert daemon.summary.events_accepted == len(lines)
    # the future day pins nothing: a restart resumes after the last record read
    assert positions["p0"].resume_offset == len(lines) + 1


def test_until_end_with_a_future_event_releases_only_real_days(tmp_path):
    lines = backfill(50)
    wall = utc("2026-01-06", 12)  # today is the backfill's last day
    ref, _, _, _ = run(tmp_path, "ref", lines, until_end=True, wall=wall)
    got, rejects, _, daemon = run(tmp_path, "hostile", [*lines, FUTURE], until_end=True, wall=wall)
    assert [json.loads(p)["day"] for p in got] == DAYS
    assert got == ref and rejects == ["future"]
    assert daemon.engine.last_closed_day == "2026-01-06"


def test_until_end_never_closes_a_day_after_today(tmp_path):
    """An event of tomorrow is within the slack (accepted), but its day has not ended: it stays
    open and is not released."""
    tomorrow = json.dumps({"user_id": "y", "day": "2026-01-07", "values": {"n": 1}}).encode()
    got, rejects, positions, _ = run(
        tmp_path, "t", [*backfill(20), tomorrow], until_end=True, wall=utc("2026-01-06", 12)
    )
    assert [json.loads(p)["day"] for p in got] == DAYS and rejects == []
    assert positions["p0"].resume_offset == len(DAYS) * 20  # tomorrow's event is read again
