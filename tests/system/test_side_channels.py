"""No side channels (docs/design.md §6 items 6-10): what leaves the daemon besides the noisy releases
— metrics, logs, the noise consumption, the release schedule, error messages — must not depend
on whether a user was exhausted, absent or admitted.

Everything runs the real daemon on a real SQLite store with the test seed; clocks are fakes.

(a) **Exhausted vs absent.** User X spends their whole budget on day 1. Three neighbouring
streams then differ only on days 2-5:

* ``exhausted``: X keeps sending non-zero events; the filter refuses every one;
* ``zero``: X sends the same number of events, all zero-valued (cost 0, contribution 0);
* ``absent``: X sends nothing.

Releases and logs must be byte-identical across all three. The default Prometheus exposition
must be byte-identical between ``exhausted`` and ``zero``: same input records, and the only
difference is the filter's decision, which is exactly what must not show. It cannot be identical
between ``exhausted`` and ``absent``: ``streamfilter_records_consumed_total`` counts the input
records read, and X's records *were* read. That counter describes the input stream as the broker
operator already sees it (partition offsets), not anything the filter decided, so it stays a
default metric; the test pins that it is the *only* series that differs. Exact counts of users
with a record, admitted or refused (``*_exact``) exist only with ``trusted_operator_metrics``;
the test also shows they would tell ``exhausted`` from ``zero`` apart, i.e. the comparison is
sensitive enough to catch such a leak.

``streamfilter_state_store_size_bytes`` (and the commit duration) move with the number of
budget *pages* a day's commit writes. A refusal writes nothing under ``skip`` and ``clip``, so
they cannot tell an exhausted user from an absent one. Under ``retire`` the *first* refusal
writes the retirement flag once: whether that grows the WAL depends on whether the user's page
was written that day anyway, so at page granularity the size may show that *some* retirement
happened that day (never who, never an exact count). ``test_retire_first_refusal_...`` pins that
this store-size gauge is the only default series that can differ in that case; releases and logs
stay identical.

(b) **Noise is drawn in data-independent batches.** The random-bit source is wrapped and every
request is recorded per release: the same sequence of request sizes for a run where every user
is exhausted, one where none is, and one where every user is absent; the discrete Gaussian is
asked for exactly ``d`` samples per query.

(c) **Releases leave on the day-close schedule.** The daemon in follow mode with a fake clock,
stepped hour by hour: a day where every user is exhausted, or absent, or where the whole input
is silent, releases at the same step as a day where everyone is active — the end of the day
plus ``allowed_lateness``.

(d) **Error messages never quote values** — see the hypothesis tests at the end.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import logging
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import prometheus_client.metrics as prometheus_metrics
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

import streamfilter.engine.day as day_module
import streamfilter.runtime.daemon as daemon_module
from streamfilter.engine.contract import Reject, parse_event, parse_query
from streamfilter.engine.day import SeededPerRelease
from streamfilter.engine.engine import Engine
from streamfilter.engine.params import PrivacyParams
from streamfilter.privacy.noise import SeededRandomBits
from streamfilter.runtime.daemon import Daemon
from streamfilter.runtime.io.base import QueryFeed
from streamfilter.runtime.observe.prometheus import PrometheusObserver
from streamfilter.runtime.store import SQLiteStateStore
from streamfilter.testing import FakeClock, MemorySink, MemorySource
from tests.support.run_configs import file_run

GAMMA = 2.0**-8
QUERIES = [
    {"query_id": "active", "kind": "sum", "features": ["active"], "clip": 1.0},
    {"query_id": "minutes", "kind": "sum", "features": ["minutes"], "clip": 1.0},
    {
        "query_id": "mix",
        "kind": "linear",
        "weights": {"active": [1, 0], "minutes": [0, 0.01]},
        "clip": 1.0,
    },
]
DAYS = [f"2026-01-{d:02d}" for d in range(1, 6)]
X = "uid-SECRET-X-4711"
BACKGROUND = [f"bg-{i}" for i in range(6)]


class ListFeed(QueryFeed):
    def __init__(self, queries: list[dict]) -> None:
        self.pending = [json.dumps({**q, "from_day": DAYS[0]}).encode() for q in queries]

    def poll(self) -> list[tuple[str, bytes]]:
        out, self.pending = [("queries", q) for q in self.pending], []
        return out


def ev(user: str, day: str, **values: float) -> bytes:
    return json.dumps({"user_id": user, "day": day, "values": values}).encode()


def utc(day: str, hours: float = 0.0) -> float:
    d = dt.date.fromisoformat(day)
    return dt.datetime(d.year, d.month, d.day, tzinfo=dt.UTC).timestamp() + hours * 3600


def neighbour_stream(variant: str) -> list[bytes]:
    """Background users every day; X exhausts the budget on day 1, then ``variant``."""
    lines = []
    for i, day in enumerate(DAYS):
        for u in BACKGROUND:
            lines.append(ev(u, day, active=0.1, minutes=0.05))
        if i == 0:
            # active and minutes each cost exactly 1.0 (clipped, on the lattice): the whole budget
            lines.append(ev(X, day, active=1.0, minutes=100.0))
        elif variant == "exhausted":
            lines.append(ev(X, day, active=1.0, minutes=100.0))  # refused by the filter
        elif variant == "zero":
            lines.append(ev(X, day, active=0.0, minutes=0.0))  # contributes and costs 0
        else:
            assert variant == "absent"
    return lines


class FrozenTimer:
    """``time.perf_counter`` for the daemon: advances by a fixed step per call, so durations
    (pure timing) are the same in every run with the same sequence of calls."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        self.now += 0.125
        return self.now


def run_observed(tmp: Path, lines: list[bytes], exhaustion: str, *, trusted: bool = False):
    """One ``until_end`` run: (release payloads, reject payloads, exposition, log text, budgets)."""
    params = PrivacyParams.create(b_norm=2.0, rho=0.5, granularity=GAMMA, exhaustion=exhaustion)
    clock = FakeClock(wall=utc("2026-01-09"))
    registry = CollectorRegistry()
    observer = PrometheusObserver(
        registry,
        params,
        trusted_operator_metrics=trusted,
        allowed_lateness_s=7200,
        wall_clock=clock.time,
    )
    logger = logging.getLogger("streamfilter")
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    store = SQLiteStateStore(tmp / "state.db")
    sink, rejects = MemorySink(), MemorySink()
    try:
        daemon = Daemon(
            Engine(params, SeededPerRelease(11)),
            store,
            MemorySource({"p0": list(lines)}),
            ListFeed(QUERIES),
            sink,
            rejects,
            poll_interval_s=0,
            wall_clock=clock.time,
            monotonic=clock.monotonic,
            observer=observer,
        )
        summary = daemon.run(until_end=True)
        budgets = sorted(store.load().budgets)
    finally:
        store.close()
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    return SimpleNamespace(
        releases=sink.payloads,
        rejects=rejects.payloads,
        exposition=generate_latest(registry),
        logs=buffer.getvalue(),
        budgets=budgets,
        summary=summary.as_dict(),
    )


def differing_series(a: bytes, b: bytes) -> set[str]:
    """Names of the metric families whose sample lines differ between two expositions."""
    lines_a, lines_b = set(a.decode().splitlines()), set(b.decode().splitlines())
    return {line.split("{")[0].split(" ")[0] for line in lines_a ^ lines_b}


class _FrozenWallClock:
    """``prometheus_client.metrics``' view of the ``time`` module with ``time()`` frozen: the
    ``*_created`` samples (when a series was created: pure timing) are then equal in every run."""

    def __init__(self, real: object) -> None:
        self._real = real

    def time(self) -> float:
        return 1_767_225_600.0

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)


@pytest.fixture
def frozen_timer(monkeypatch):
    timer = FrozenTimer()
    monkeypatch.setattr(daemon_module, "time", SimpleNamespace(perf_counter=timer.perf_counter))
    monkeypatch.setattr(prometheus_metrics, "time", _FrozenWallClock(time))
    return timer


@pytest.mark.parametrize("exhaustion", ["skip", "clip", "retire"])
def test_exhausted_and_absent_user_are_indistinguishable(tmp_path, frozen_timer, exhaustion):
    runs = {}
    for variant in ("exhausted", "zero", "absent"):
        (tmp_path / variant).mkdir()
        runs[variant] = run_observed(tmp_path / variant, neighbour_stream(variant), exhaustion)
    ex, zero, absent = runs["exhausted"], runs["zero"], runs["absent"]

    # X really was exhausted: the filter refused X's later, non-zero events
    assert len(ex.releases) == len(DAYS) * len(QUERIES)
    assert "closed day" in ex.logs  # the logs are captured (INFO and DEBUG)
    for other in (zero, absent):
        assert other.releases == ex.releases  # byte-identical releases
        assert other.rejects == ex.rejects == []
        assert other.logs == ex.logs  # byte-identical logs
    assert zero.budgets == absent.budgets == ex.budgets  # X: spent everything on day 1
    assert (X, 2 * 2**16, exhaustion == "retire") in ex.budgets

    # default metrics: identical for the same input records
    assert zero.exposition == ex.exposition
    # absent: the only difference is how many input records were read
    assert differing_series(absent.exposition, ex.exposition) == {
        "streamfilter_records_consumed_total"
    }
    assert "_exact" not in ex.exposition.decode()


def test_the_comparison_would_catch_exact_counts(tmp_path, frozen_timer):
    """With ``trusted_operator_metrics`` the exact refused-user count tells the neighbours
    apart — which is why it is not exported by default."""
    runs = {}
    for variant in ("exhausted", "zero"):
        (tmp_path / variant).mkdir()
        runs[variant] = run_observed(
            tmp_path / variant, neighbour_stream(variant), "skip", trusted=True
        )
    assert runs["exhausted"].releases == runs["zero"].releases
    assert differing_series(runs["exhausted"].exposition, runs["zero"].exposition) == {
        "streamfilter_query_refused_users_exact"
    }


CLI_CONFIG = file_run(
    """
[privacy]
b_norm = 2.0
rho = 0.5
granularity = 0.00390625
[metrics]
enabled = false  # served by default: an ephemeral port would differ between the runs
[testing]
noise_seed = 11
"""
)

_TIMING = [
    (re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3} ", re.M), "<asctime> "),
    (re.compile(r" in \d+\.\d{3}s"), " in <seconds>s"),
]


def test_cli_logs_of_exhausted_and_absent_user_are_identical(tmp_path):
    """The operator's view: ``streamfilter -v run`` stderr. Only pure timing (the log record's
    time and a day close's duration) and the run's directory are normalised."""
    out = {}
    for variant in ("exhausted", "zero", "absent"):
        work = tmp_path / variant
        work.mkdir()
        (work / "streamfilter.toml").write_text(CLI_CONFIG)
        (work / "queries.jsonl").write_text(
            "".join(json.dumps({**q, "from_day": DAYS[0]}) + "\n" for q in QUERIES)
        )
        (work / "events.jsonl").write_bytes(b"\n".join(neighbour_stream(variant)) + b"\n")
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "streamfilter",
                "-v",
                "run",
                "--config",
                "streamfilter.toml",
                "--until-end",
                "--testing",
            ],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        # the start-up line names the configured paths, which differ by the run's directory
        text = proc.stderr.replace(str(work), "<work>")
        for pattern, repl in _TIMING:
            text = pattern.sub(repl, text)
        *logs, summary = text.strip().splitlines()
        out[variant] = (
            logs,
            json.loads(summary)["summary"],
            (work / "releases.jsonl").read_bytes(),
        )
    ex_logs, ex_summary, ex_releases = out["exhausted"]
    assert any("closed day" in line for line in ex_logs)
    assert X not in "".join(ex_logs)
    for variant in ("zero", "absent"):
        logs, summary, releases = out[variant]
        assert logs == ex_logs and releases == ex_releases
    assert out["zero"][1] == ex_summary
    # the run summary counts input records (the broker's view), never users or refusals
    diff = {k for k in ex_summary if out["absent"][1][k] != ex_summary[k]}
    assert diff == {"records_read", "events_accepted"}


# ------------------------------------------------------------------------ (b) noise batches


class RecordingBits(SeededPerRelease):
    """The test seed's per-release bits, recording the size of every request per release."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.requests: dict[tuple[str, str], list[int]] = {}

    def for_release(self, day: str, query_id: str):
        inner = super().for_release(day, query_id)
        log = self.requests.setdefault((day, query_id), [])

        class Recorder:
            def uint64(self, size: int) -> np.ndarray:
                log.append(size)
                return inner.uint64(size)

        return Recorder()


class RecordingStream:
    """One shared stream of bits (the production path: no per-release seeding)."""

    def __init__(self, seed: int) -> None:
        self.inner = SeededRandomBits(seed)
        self.requests: list[int] = []

    def uint64(self, size: int) -> np.ndarray:
        self.requests.append(size)
        return self.inner.uint64(size)


def dataset(kind: str) -> list[bytes]:
    users = [f"user-{i}" for i in range(40)]
    lines = []
    for i, day in enumerate(DAYS):
        for u in users:
            if kind == "none_exhausted":
                lines.append(ev(u, day, active=0.05, minutes=1.0))
            elif kind == "all_exhausted":
                lines.append(ev(u, day, active=1.0, minutes=500.0))
            elif kind == "all_absent" and i in (0, len(DAYS) - 1):
                lines.append(ev(u, day, active=1.0, minutes=500.0))  # only the first/last day
    return lines


def run_bits(tmp: Path, lines: list[bytes], bits) -> list[bytes]:
    params = PrivacyParams.create(b_norm=2.0, rho=0.5, granularity=GAMMA)
    store = SQLiteStateStore(tmp / "state.db")
    sink = MemorySink()
    try:
        Daemon(
            Engine(params, bits),
            store,
            MemorySource({"p0": lines}),
            ListFeed(QUERIES),
            sink,
            MemorySink(),
            poll_interval_s=0,
        ).run(until_end=True)
    finally:
        store.close()
    return sink.payloads


def test_noise_is_drawn_in_data_independent_batches(tmp_path, monkeypatch):
    samples: list[tuple[int, int]] = []
    real = day_module.discrete_gaussian

    def recording_discrete_gaussian(bits, sigma2_units, size):
        samples.append((sigma2_units, size))
        return real(bits, sigma2_units, size)

    monkeypatch.setattr(day_module, "discrete_gaussian", recording_discrete_gaussian)
    per_release, stream, asked = {}, {}, {}
    for kind in ("none_exhausted", "all_exhausted", "all_absent"):
        samples.clear()
        bits = RecordingBits(5)
        (tmp_path / kind).mkdir()
        releases = run_bits(tmp_path / kind, dataset(kind), bits)
        assert len(releases) == len(DAYS) * len(QUERIES)  # every day released, even empty ones
        per_release[kind] = bits.requests
        asked[kind] = list(samples)
        shared = RecordingStream(5)
        (tmp_path / f"{kind}-stream").mkdir()
        run_bits(tmp_path / f"{kind}-stream", dataset(kind), shared)
        stream[kind] = shared.requests

    # the discrete Gaussian is asked for exactly d samples per query, every day
    dims = {"active": 1, "minutes": 1, "mix": 2}
    params = PrivacyParams.create(b_norm=2.0, rho=0.5, granularity=GAMMA)
    want = [(params.sigma2_units, dims[q["query_id"]]) for _ in DAYS for q in QUERIES]
    assert asked["none_exhausted"] == asked["all_exhausted"] == asked["all_absent"] == want
    # and the random bits are requested in the same sizes, in the same order, whatever the data
    assert list(per_release["none_exhausted"]) == [
        (d, q["query_id"]) for d in DAYS for q in QUERIES
    ]
    assert (
        per_release["none_exhausted"] == per_release["all_exhausted"] == per_release["all_absent"]
    )
    assert stream["none_exhausted"] == stream["all_exhausted"] == stream["all_absent"]
    assert len(stream["none_exhausted"]) >= len(want)


# ------------------------------------------------------------------------ (c) the schedule

LATENESS_H = 2


def schedule_stream(kind: str) -> dict[str, list[tuple[int, bytes]]]:
    """Events per day, each tagged with the hour of that day it arrives at."""
    users = [f"s-{i}" for i in range(8)]
    out: dict[str, list[tuple[int, bytes]]] = {}
    for i, day in enumerate(DAYS):
        rows = []
        for h, u in enumerate(users, start=1):
            if kind == "active" or i == 0:
                rows.append((h, ev(u, day, active=0.05, minutes=1.0)))
            elif kind == "exhausted":
                rows.append((h, ev(u, day, active=1.0, minutes=500.0)))
            elif kind == "gap" and i not in (2, 3):  # days 3 and 4: nobody at all
                rows.append((h, ev(u, day, active=0.05, minutes=1.0)))
            # "silent": nobody after day 1, the input falls silent
        if kind == "exhausted" and i == 0:
            rows = [(h, ev(u, day, active=1.0, minutes=500.0)) for h, u in enumerate(users, 1)]
        out[day] = rows
    return out


def stepped_schedule(tmp: Path, kind: str) -> list[tuple[float, int, list[str]]]:
    """Advance a fake clock hour by hour; after each step: (time, #releases, days released)."""
    params = PrivacyParams.create(b_norm=2.0, rho=0.5, granularity=GAMMA)
    clock = FakeClock(wall=utc(DAYS[0]), mono=0.0)
    source = MemorySource({"p0": []})
    sink = MemorySink()
    store = SQLiteStateStore(tmp / "state.db")
    events = schedule_stream(kind)
    trace = []
    try:
        daemon = Daemon(
            Engine(params, SeededPerRelease(3)),
            store,
            source,
            ListFeed(QUERIES),
            sink,
            MemorySink(),
            allowed_lateness_s=LATENESS_H * 3600,
            idle_timeout_s=600,
            poll_interval_s=0,
            wall_clock=clock.time,
            monotonic=clock.monotonic,
        )
        hours = (len(DAYS) + 2) * 24
        for step in range(hours):
            day = (dt.date.fromisoformat(DAYS[0]) + dt.timedelta(days=step // 24)).isoformat()
            for hour, line in events.get(day, []):
                if hour == step % 24:
                    source.append("p0", line)
            clock.advance(3600)
            daemon._poll_queries()
            for rec in source.poll(1000):
                daemon.intake.ingest(rec.partition, rec.offset, rec.next_offset, rec.value)
            daemon._close_ready()
            released = sorted({json.loads(p)["day"] for p in sink.payloads})
            trace.append((clock.wall, len(sink.payloads), released))
    finally:
        store.close()
    return trace


def test_releases_leave_at_the_day_close_whatever_the_data(tmp_path):
    traces = {}
    for kind in ("active", "exhausted", "gap", "silent"):
        (tmp_path / kind).mkdir()
        traces[kind] = stepped_schedule(tmp_path / kind, kind)
    # day d is released at the first step at or after its end + allowed_lateness, in every run
    # (standing queries: the days after the input ends are days too)
    closed_any = False
    for now, count, days in traces["active"]:
        due, d = [], dt.date.fromisoformat(DAYS[0])
        while utc(d.isoformat()) + 86400 + LATENESS_H * 3600 <= now:
            due.append(d.isoformat())
            d += dt.timedelta(days=1)
        assert days == due, now
        assert count == len(due) * len(QUERIES)
        closed_any |= len(due) > len(DAYS)
    assert closed_any
    for kind in ("exhausted", "gap", "silent"):
        assert traces[kind] == traces["active"], kind


def test_retire_first_refusal_changes_at_most_the_store_size(tmp_path, frozen_timer, monkeypatch):
    """``retire``, and X's first refusal happens on day 2 (only the two queries X exhausts
    exactly on day 1): the retirement is written to the store in ``exhausted`` only."""
    monkeypatch.setattr(sys.modules[__name__], "QUERIES", QUERIES[:2])
    runs = {}
    for variant in ("exhausted", "zero", "absent"):
        (tmp_path / variant).mkdir()
        runs[variant] = run_observed(tmp_path / variant, neighbour_stream(variant), "retire")
    ex = runs["exhausted"]
    assert (X, 2 * 2**16, True) in ex.budgets and (X, 2 * 2**16, False) in runs["zero"].budgets
    for variant in ("zero", "absent"):
        assert runs[variant].releases == ex.releases and runs[variant].logs == ex.logs
    assert differing_series(runs["zero"].exposition, ex.exposition) <= {
        "streamfilter_state_store_size_bytes"
    }
    assert differing_series(runs["absent"].exposition, ex.exposition) <= {
        "streamfilter_state_store_size_bytes",
        "streamfilter_records_consumed_total",
    }


def test_a_pausing_backfill_never_closes_days_it_has_not_read(tmp_path):
    """The flip side of (c): days are closed on the schedule only while the input was quiet at
    their deadline. A backfill (wall clock long after the data) that pauses for longer than
    ``idle_timeout`` closes the days it has read, never the ones it has not reached."""
    params = PrivacyParams.create(b_norm=2.0, rho=0.5, granularity=GAMMA)
    clock = FakeClock(wall=utc("2026-03-01"), mono=0.0)
    source = MemorySource({"p0": [ev("a", DAYS[0], active=1.0), ev("a", DAYS[1], active=1.0)]})
    sink, rejects = MemorySink(), MemorySink()
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        daemon = Daemon(
            Engine(params, SeededPerRelease(3)),
            store,
            source,
            ListFeed(QUERIES),
            sink,
            rejects,
            allowed_lateness_s=7200,
            idle_timeout_s=600,
            poll_interval_s=0,
            wall_clock=clock.time,
            monotonic=clock.monotonic,
        )

        def step() -> None:
            daemon._poll_queries()
            for rec in source.poll(1000):
                daemon.intake.ingest(rec.partition, rec.offset, rec.next_offset, rec.value)
            daemon._close_ready()

        step()
        clock.advance(3600)  # the backfill pauses for an hour
        step()
        assert sorted({json.loads(p)["day"] for p in sink.payloads}) == DAYS[:2]
        source.append("p0", ev("a", DAYS[2], active=1.0))  # it resumes: not late
        step()
        clock.advance(3600)
        step()
        assert sorted({json.loads(p)["day"] for p in sink.payloads}) == DAYS[:3]
        assert rejects.payloads == []
    finally:
        store.close()


# ------------------------------------------------------------------------ (d) error messages
#
# Property: a reject's reason and detail, and the CLI's error messages, name the field/key and
# the rule that was broken, never the offending value. Every value the strategies below put into
# an event, a query or a configuration carries a canary — a ``ZQX<n>Q`` marker in text, or a
# distinctive 8+ digit number — and no message may contain one. Names are not values: feature
# names, unknown field names and configuration keys may be named (they are the schema), so the
# strategies keep them canary-free. Also not covered, on purpose: a well-formed setting whose
# *target* is missing or unreachable (a file path, a Kafka topic, a broker or listen address) is
# named in its error, because the operator must know which one; those are locations, never data.

_CANARY_RE = re.compile(r"ZQX\d+Q")


@st.composite
def canary_text(draw, long: bool = False) -> str:
    tag = f"ZQX{draw(st.integers(0, 10**6))}Q"
    noise = st.text(st.characters(blacklist_categories=("Cs",)), max_size=4)  # valid Unicode
    return tag * (40 if long else 1) + draw(noise)


#: limits that error messages may state (public): a canary must not be a substring of one
_PUBLIC_CONSTANTS = ("1000000000000", "2147483648", "4294967296", "9007199254740992")
canary_numbers = st.integers(10**7, 10**8 - 1).filter(
    lambda n: len(set(str(n))) >= 3 and not any(str(n) in c for c in _PUBLIC_CONSTANTS)
)


def _canary_values(obj: object) -> list[str]:
    """Every canary in a generated value, as it could appear in a message."""
    found: list[str] = []
    if isinstance(obj, str):
        found += _CANARY_RE.findall(obj)
    elif isinstance(obj, bool):
        pass
    elif isinstance(obj, int):
        found += [str(abs(obj))] if abs(obj) >= 10**7 else []
    elif isinstance(obj, float):
        found += [str(int(abs(obj)))] if math.isfinite(obj) and abs(obj) >= 10**7 else []
    elif isinstance(obj, dict):
        for v in obj.values():
            found += _canary_values(v)
    elif isinstance(obj, list):
        for v in obj:
            found += _canary_values(v)
    return found


def _assert_quotes_none(message: str, values: object) -> None:
    for canary in _canary_values(values):
        assert canary not in message, (canary, message)
    assert not _CANARY_RE.search(message), message


def _bad_value(long_text: bool = True) -> st.SearchStrategy:
    """A value of the wrong type, out of range or too long — each carrying a canary."""
    return st.one_of(
        canary_text(long=long_text),
        canary_numbers,
        canary_numbers.map(lambda n: n * 10**6),  # beyond |x| <= 1e12
        canary_numbers.map(lambda n: n + 0.5),
        canary_numbers.map(lambda n: -n),
        st.lists(st.one_of(canary_text(), canary_numbers), min_size=1, max_size=2),
        st.dictionaries(st.sampled_from(["k", "v"]), canary_text(), min_size=1, max_size=2),
    )


bad_days = st.one_of(
    canary_text(),
    canary_numbers,
    canary_numbers.map(lambda n: f"{n % 9000 + 1000}-02-30ZQX{n}Q"),
    canary_numbers.map(lambda n: f"ZQX{n}Q-01-01"),
)


@st.composite
def bad_events(draw) -> dict:
    """A valid event with one or two fields made bad (so every check of the parser is reached)."""
    obj: dict = {"user_id": "u-1", "day": "2026-01-01", "values": {"active": 1.0, "plan": "pro"}}
    for field in draw(st.lists(st.sampled_from(_EVENT_FAULTS), min_size=1, max_size=2)):
        if field in ("user_id", "event_id"):
            obj[field] = draw(_bad_value())
        elif field == "day":
            obj["day"] = draw(bad_days)
        elif field == "values":
            obj["values"] = draw(_bad_value())
        elif field == "value" and isinstance(obj["values"], dict):
            obj["values"][draw(st.sampled_from(["active", "plan", "minutes"]))] = draw(_bad_value())
        elif field == "bogus":
            obj["bogus"] = draw(_bad_value(long_text=False))
        elif field == "oversized" and isinstance(obj["values"], dict):
            obj["values"]["note"] = draw(canary_text(long=True)) * 100  # > 64 KiB
    return obj


_EVENT_FAULTS = ["user_id", "event_id", "day", "values", "value", "value", "bogus", "oversized"]


@settings(max_examples=300, deadline=None)
@given(bad_events())
def test_event_rejects_never_quote_the_offending_value(event_obj):
    raw = json.dumps(event_obj).encode()
    try:
        parse_event(raw)
    except Reject as rej:
        _assert_quotes_none(f"{rej.reason} {rej.detail} {rej}", event_obj)
    try:
        parse_event(event_obj)
    except Reject as rej:
        _assert_quotes_none(f"{rej.reason} {rej.detail} {rej}", event_obj)


_GOOD_QUERY = {
    "query_id": "q1",
    "kind": "linear",
    "weights": {"active": [1.0, 0.0], "minutes": [0.0, 0.01]},
    "labels": ["a", "b"],
    "clip": 1.0,
    "from_day": "2026-01-01",
    "until_day": "2026-01-05",
}
_QUERY_BAD = {
    "query_id": st.one_of(canary_text(), canary_text(long=True), _bad_value()),
    "kind": _bad_value(long_text=False),
    "clip": _bad_value(),
    "from_day": bad_days,
    "until_day": bad_days,
    "features": st.one_of(
        st.lists(canary_text(long=True), min_size=1, max_size=2),
        canary_text().map(lambda c: [c, c]),  # duplicates
        _bad_value(),
    ),
    "feature": st.one_of(canary_text(long=True), _bad_value()),
    "categories": st.one_of(
        st.lists(canary_text(long=True).map(lambda c: c * 2), min_size=1, max_size=2),
        canary_text().map(lambda c: [c, c]),
        _bad_value(),
    ),
    "weights": st.one_of(
        st.dictionaries(
            st.sampled_from(["active", "minutes"]),
            st.lists(_bad_value(), min_size=1, max_size=2),
            min_size=1,
            max_size=2,
        ),
        _bad_value(),
    ),
    "labels": st.one_of(st.lists(canary_text(long=True), min_size=1, max_size=2), _bad_value()),
    "bogus": _bad_value(),
}


@st.composite
def bad_queries(draw) -> dict:
    kind = draw(st.sampled_from(["sum", "histogram", "linear"]))
    q = dict(_GOOD_QUERY, kind=kind)
    if kind == "sum":
        q.pop("weights"), q.pop("labels")
        q["features"] = ["active"]
    elif kind == "histogram":
        q.pop("weights"), q.pop("labels")
        q.update(feature="plan", categories=["free", "pro"])
    for key in draw(st.sets(st.sampled_from(sorted(_QUERY_BAD)), min_size=1, max_size=3)):
        q[key] = draw(_QUERY_BAD[key])
    return q


@settings(max_examples=300, deadline=None)
@given(bad_queries())
def test_query_rejects_never_quote_the_offending_value(query_obj):
    for raw in (json.dumps(query_obj).encode(), query_obj):
        try:
            parse_query(raw)
        except Reject as rej:
            _assert_quotes_none(f"{rej.reason} {rej.detail} {rej}", query_obj)


def _toml_value(value: object) -> str:
    """A TOML inline value: basic strings (non-ASCII as escapes), numbers, arrays, tables."""
    if isinstance(value, str):
        chars = (
            c if 0x20 <= ord(c) < 0x7F and c not in '"\\' else f"\\U{ord(c):08x}" for c in value
        )
        return '"' + "".join(chars) + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


_CONFIG_BAD = {
    ("privacy", "b_norm"): _bad_value(),
    ("privacy", "rho"): _bad_value(),
    ("privacy", "epsilon"): _bad_value(),
    ("privacy", "delta"): _bad_value(),
    ("privacy", "granularity"): st.one_of(_bad_value(), canary_numbers.map(lambda n: n + 0.5)),
    ("privacy", "exhaustion"): _bad_value(),
    ("privacy", "mechanism"): _bad_value(),
    ("window", "allowed_lateness"): _bad_value(),
    ("window", "idle_timeout"): _bad_value(),
    ("source", "kind"): _bad_value(),
    ("source", "topic"): _bad_value(long_text=False).filter(lambda v: not isinstance(v, str)),
    ("queries", "kind"): _bad_value(),
    ("queries", "policy"): _bad_value(long_text=False).filter(lambda v: not isinstance(v, str)),
    ("sink", "kind"): _bad_value(),
    ("kafka", "bootstrap_servers"): _bad_value().filter(lambda v: not isinstance(v, str)),
    ("kafka", "sasl_plain_password"): _bad_value().filter(lambda v: not isinstance(v, str)),
    ("kafka", "security_protocol"): _bad_value(),
    ("metrics", "port"): _bad_value(),
    ("metrics", "host"): _bad_value().filter(lambda v: not isinstance(v, str)),
    ("testing", "noise_seed"): _bad_value().filter(lambda v: not isinstance(v, int)),
    ("telemetry", "rho"): _bad_value(),
    ("telemetry", "stats_rho"): _bad_value(),
}


@st.composite
def bad_configs(draw) -> tuple[str, list[object]]:
    sections: dict[str, dict[str, object]] = {"privacy": {"b_norm": 4.0, "rho": 0.5}}
    used = []
    for key in draw(st.sets(st.sampled_from(sorted(_CONFIG_BAD)), min_size=1, max_size=3)):
        value = draw(_CONFIG_BAD[key])
        sections.setdefault(key[0], {})[key[1]] = value
        used.append(value)
    text = "".join(
        f"[{name}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in body.items())
        for name, body in sections.items()
    )
    return text, used


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(bad_configs())
def test_cli_config_errors_never_quote_the_offending_value(tmp_path, monkeypatch, config):
    from streamfilter.cli.main import main

    for key in list(os.environ):
        if key.upper().startswith("STREAMFILTER_"):
            monkeypatch.delenv(key)
    text, values = config
    path = tmp_path / "streamfilter.toml"
    path.write_text(text)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["guarantee", "--config", str(path)])
    if code == 0:
        return  # every value happened to be acceptable
    assert code == 2, err.getvalue()
    _assert_quotes_none(err.getvalue(), values)


# values that pass the schema and fail only the derived checks of [privacy] (the lattice, the
# 64-bit budget, the calibration): the messages built from PrivacyParams' errors
privacy_only = st.one_of(
    canary_numbers.map(lambda n: {"granularity": n + 0.5}),  # not a power of two
    canary_numbers.map(lambda n: {"b_norm": float(n) * 10**6}),  # overflows 64-bit budgets
    canary_numbers.map(lambda n: {"b_norm": 1.0 / n, "granularity": 0.5}),  # below one unit
    canary_numbers.map(lambda n: {"rho": None, "epsilon": float(n), "delta": 1e-300}),
)


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(privacy_only)
def test_cli_privacy_errors_never_quote_the_offending_value(tmp_path, monkeypatch, bad):
    from streamfilter.cli.main import main

    for key in list(os.environ):
        if key.upper().startswith("STREAMFILTER_"):
            monkeypatch.delenv(key)
    body = {k: v for k, v in {"b_norm": 4.0, "rho": 0.5, **bad}.items() if v is not None}
    path = tmp_path / "streamfilter.toml"
    path.write_text("[privacy]\n" + "".join(f"{k} = {v!r}\n" for k, v in body.items()))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["guarantee", "--config", str(path)])
    if code == 0:
        return
    assert code == 2, err.getvalue()
    assert "privacy" in err.getvalue()
    for value in bad.values():
        if isinstance(value, float):
            texts = {repr(value), str(int(value))} if value >= 10**7 else {repr(value)}
            for text in texts:
                assert text not in err.getvalue(), (text, err.getvalue())
