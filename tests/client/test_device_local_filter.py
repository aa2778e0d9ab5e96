"""The device side of local mode: announcements, records, decisions, durability, odometer."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamfilter.client import (
    Announcement,
    AnnouncementError,
    DeviceConfig,
    DeviceFleet,
    LocalFilter,
    day_record,
)
from streamfilter.engine.contract import parse_event, parse_query
from streamfilter.engine.monitor import Monitor
from streamfilter.engine.records import DayAccumulator
from streamfilter.privacy.noise import SeededRandomBits

GAMMA = 2.0**-10
SUM = {"query_id": "active", "kind": "sum", "features": ["active"], "clip": 1.0}
HIST = {
    "query_id": "plans",
    "kind": "histogram",
    "feature": "plan",
    "categories": ["free", "pro", "team"],
    "clip": 1.0,
}
LIN = {
    "query_id": "mix",
    "kind": "linear",
    "weights": {"active": [1, 0], "minutes": [0, 0.05]},
    "clip": 1.5,
}


def q(base: dict, from_day: str = "2026-01-01") -> dict:
    return {**base, "from_day": from_day}


# ----------------------------------------------------------------------------- announcements
names = st.text(st.characters(codec="utf-8", exclude_characters="="), min_size=1, max_size=6)


@st.composite
def queries(draw: st.DrawFn) -> dict:
    kind = draw(st.sampled_from(["sum", "histogram", "linear"]))
    base = {
        "query_id": draw(st.from_regex(r"[A-Za-z0-9_]{1,10}", fullmatch=True)),
        "clip": draw(st.floats(0.01, 100)),
        "from_day": "2026-01-01",
        "kind": kind,
    }
    if kind == "sum":
        base["features"] = draw(st.lists(names, min_size=1, max_size=5, unique=True))
    elif kind == "histogram":
        base["feature"] = draw(names)
        base["categories"] = draw(st.lists(names, min_size=1, max_size=5, unique=True))
    else:
        d = draw(st.integers(1, 4))
        keys = draw(st.lists(names, min_size=1, max_size=4, unique=True))
        row = st.lists(st.floats(-10, 10), min_size=d, max_size=d)
        base["weights"] = {k: draw(row) for k in keys}
    return base


@given(queries())
@settings(max_examples=200, deadline=None)
def test_announcement_reads_a_query_exactly_as_the_server_does(raw):
    server = parse_query(raw)
    device = Announcement.parse(server.canonical_json())
    assert list(device.coordinates) == server.coordinates()
    assert np.array_equal(device.weight_matrix(), server.weights())
    assert device.dim == len(server.labels())
    assert device.clip == server.clip


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        "[]",
        {**q(SUM), "clip": -1},
        {**q(SUM), "clip": float("nan")},
        {**q(SUM), "kind": "median"},
        {**q(SUM), "features": []},
        {**q(SUM), "from_day": "2026-02-30"},
        {**q(LIN), "weights": {"a": [1, 2], "b": [1]}},
        {**q(SUM), "query_id": "has space"},
    ],
)
def test_malformed_announcements_are_refused(bad):
    with pytest.raises(AnnouncementError):
        Announcement.parse(bad if isinstance(bad, str) else json.dumps(bad))


# ----------------------------------------------------------------------------- records
values = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    st.integers(-1000, 1000),
    st.sampled_from(["free", "pro", "team"]),
)


@given(
    st.lists(
        st.dictionaries(st.sampled_from(["minutes", "active", "plan"]), values, max_size=3),
        max_size=8,
    )
)
@settings(max_examples=200, deadline=None)
def test_device_record_equals_the_central_record(value_dicts):
    events = [{"user_id": "u", "day": "2026-01-01", "values": v} for v in value_dicts]
    acc = DayAccumulator("2026-01-01")
    for e in events:
        acc.add(parse_event(json.dumps(e)))
    records = acc.finish()
    device = day_record(events)
    coords = sorted(set(device) | {c for c in records.coord_names if c})
    central = records.matrix(coords)
    mine = np.array([[device.get(c, 0.0) for c in coords]])
    if records.n_users:
        assert np.array_equal(central, mine)  # bit for bit
    else:
        assert not device


# ----------------------------------------------------------------------------- decisions
def _stream(n_users: int, n_days: int, seed: int) -> dict[str, list[dict]]:
    rng = np.random.default_rng(seed)
    out: dict[str, list[dict]] = {}
    for d in range(n_days):
        day = f"2026-01-{d + 1:02d}"
        out[day] = []
        for u in range(n_users):
            if rng.random() < 0.6:
                plan = ["free", "pro", "team"][int(rng.integers(3))]
                minutes = float(rng.integers(0, 120))
                out[day].append(
                    {
                        "user_id": f"u{u}",
                        "day": day,
                        "values": {"active": 1, "minutes": minutes, "plan": plan},
                    }
                )
    return out


@pytest.mark.parametrize("exhaustion", ["skip", "retire", "clip"])
def test_devices_spend_exactly_what_the_central_filter_charges(tmp_path, exhaustion):
    stream = _stream(12, 9, seed=3)
    qs = [q(SUM), q(HIST, "2026-01-03"), q(LIN, "2026-01-02")]
    monitor = Monitor(b_norm=3.0, rho=0.5, granularity=GAMMA, exhaustion=exhaustion, test_seed=1)
    for query in qs:
        monitor.add_query(query)
    cfg = DeviceConfig.create(b_norm=3.0, granularity=GAMMA, exhaustion=exhaustion, rho=0.5)
    devices = {f"u{u}": LocalFilter(tmp_path / f"u{u}.json", cfg) for u in range(12)}
    fleet = DeviceFleet(cfg)
    announcements = [Announcement.parse(parse_query(x).canonical_json()) for x in qs]
    for dev in devices.values():
        for query in qs:
            dev.announce(parse_query(query).canonical_json())
    sums: dict[tuple[str, str], np.ndarray] = {}
    for day, events in stream.items():
        monitor.close_day(day, events)
        acc = DayAccumulator(day)
        for e in events:
            acc.add(parse_event(json.dumps(e)))
        records = acc.finish()
        todays = [a for a in announcements if a.applies_to(day)]
        ans = fleet.answer(
            day, todays, records.users, [records.matrix(list(a.coordinates)) for a in todays]
        )
        for user, dev in devices.items():
            mine = [e for e in events if e["user_id"] == user]
            for c in dev.answer_day(day, mine) if mine else []:
                key = (day, c.query_id)
                sums[key] = sums.get(key, 0) + np.array(c.units)
        for qid, block in zip(ans.query_ids, ans.units, strict=True):
            got = block.sum(axis=0)  # the fleet's sum equals the separate devices' sum
            expected = sums.get((day, qid))
            assert np.array_equal(got, expected if expected is not None else np.zeros_like(got))
    ledger = monitor.engine.ledger
    for user, dev in devices.items():
        assert dev.spent_units == ledger.spent_units(user) == fleet.spent(user)
    assert max(dev.spent_units for dev in devices.values()) <= cfg.budget_units
    assert any(dev.spent_units > 0 for dev in devices.values())


def test_an_exhausted_device_sends_nothing(tmp_path):
    cfg = DeviceConfig.create(b_norm=2.0, granularity=GAMMA, rho=0.5)
    dev = LocalFilter(tmp_path / "me.json", cfg)
    dev.announce(json.dumps(q(SUM)))
    sent = []
    for d in range(1, 8):
        day = f"2026-01-{d:02d}"
        sent.append(dev.answer_day(day, [{"values": {"active": 5}}]))
    # clip 1 → cost exactly 1 per day at γ=2^-10; budget 2 → two days, then silence
    assert [len(s) for s in sent] == [1, 1, 0, 0, 0, 0, 0]
    assert dev.spent_units == cfg.budget_units
    assert dev.remaining == 0.0


def test_zero_contributions_are_not_sent(tmp_path):
    cfg = DeviceConfig.create(b_norm=2.0, granularity=GAMMA, rho=0.5)
    dev = LocalFilter(tmp_path / "me.json", cfg)
    dev.announce(json.dumps(q(SUM)))
    assert dev.answer_day("2026-01-01", [{"values": {"minutes": 3}}]) == []
    assert dev.spent_units == 0


# ----------------------------------------------------------------------------- durability
def test_state_survives_a_restart_and_the_outbox_resends_identical_bytes(tmp_path):
    cfg = DeviceConfig.create(b_norm=4.0, granularity=GAMMA, variant="local_noise", sigma_local=2)
    path = tmp_path / "me.json"
    dev = LocalFilter(path, cfg, bits=SeededRandomBits(5))
    dev.announce(json.dumps(q(LIN)))
    out = dev.answer_day("2026-01-01", [{"values": {"active": 1, "minutes": 30}}])
    assert len(out) == 1
    again = LocalFilter(path, cfg)  # a new process: fresh CSPRNG, same persisted outbox
    assert [c.to_json() for c in again.pending()] == [c.to_json() for c in out]
    assert again.spent_units == dev.spent_units > 0
    again.mark_sent([c.nonce for c in out])
    assert LocalFilter(path, cfg).pending() == []
    with pytest.raises(ValueError, match="not after"):
        again.answer_day("2026-01-01", [])
    other = DeviceConfig.create(b_norm=5.0, granularity=GAMMA, rho=0.5)
    with pytest.raises(ValueError, match="differs"):
        LocalFilter(path, other)


def test_changed_or_late_announcements_are_refused(tmp_path):
    cfg = DeviceConfig.create(b_norm=4.0, granularity=GAMMA, rho=0.5)
    dev = LocalFilter(tmp_path / "me.json", cfg)
    assert dev.announce(json.dumps(q(SUM))) is True
    assert dev.announce(json.dumps(q(SUM))) is False
    with pytest.raises(AnnouncementError, match="another definition"):
        dev.announce(json.dumps({**q(SUM), "clip": 2.0}))
    dev.answer_day("2026-01-05", [])
    with pytest.raises(AnnouncementError, match="already answered"):
        dev.announce(json.dumps(q(HIST, "2026-01-05")))


KILL_LOOP = textwrap.dedent(
    """
    import json, sys
    from streamfilter.client import DeviceConfig, LocalFilter
    cfg = DeviceConfig.create(b_norm=1000.0, granularity=2.0**-10, rho=0.5)
    dev = LocalFilter(sys.argv[1], cfg)
    dev.announce(json.dumps({"query_id": "a", "kind": "sum", "features": ["x"], "clip": 1.0,
                             "from_day": "2000-01-01"}))
    import datetime as dt
    day = dt.date.fromisoformat(dev.last_day) if dev.last_day else dt.date(2000, 1, 1)
    dev.mark_sent([c.nonce for c in dev.pending()])  # resend what a kill left in the outbox
    print("ready", flush=True)
    while True:
        day += dt.timedelta(days=1)
        out = dev.answer_day(day.isoformat(), [{"values": {"x": 1}}])
        dev.mark_sent([c.nonce for c in out])
    """
)


def test_a_killed_device_keeps_a_consistent_state(tmp_path):
    """SIGKILL at arbitrary moments: the state always loads, and every answered day was
    charged exactly once (cost 1 per day: spent equals the number of answered days)."""
    path = tmp_path / "dev.json"
    rng = np.random.default_rng(0)
    for _ in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", KILL_LOOP, str(path)],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(float(rng.uniform(0.05, 0.4)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        state = json.loads(path.read_text())
        answered = (dt.date.fromisoformat(state["last_day"]) - dt.date(2000, 1, 1)).days
        assert state["spent_units"] == answered * 1024 * 1024  # cost ‖1/γ‖² per day
        assert len(state["outbox"]) <= 1
    leftovers = [p for p in tmp_path.iterdir() if p.name != "dev.json"]
    assert all(p.name.endswith(".tmp") for p in leftovers)


# ----------------------------------------------------------------------------- odometer
def test_the_odometer_is_the_users_own_loss(tmp_path):
    cfg = DeviceConfig.create(b_norm=2.0, granularity=GAMMA, rho=0.5, delta=1e-6)
    dev = LocalFilter(tmp_path / "me.json", cfg)
    assert dev.odometer().rho_spent == 0.0
    dev.announce(json.dumps(q(SUM)))
    dev.answer_day("2026-01-01", [{"values": {"active": 1}}])
    loss = dev.odometer()
    assert loss.spent == 1.0
    assert loss.rho_spent == pytest.approx(cfg.rho / 2, rel=1e-12)  # half the budget spent
    assert loss.epsilon_spent > 0
    dev.answer_day("2026-01-02", [{"values": {"active": 1}}])
    assert dev.odometer().rho_spent == pytest.approx(cfg.rho, rel=1e-12)
    assert cfg.rho <= 0.5  # the server's ρ: integer rounding only lowers it


@given(st.integers(1, 50), st.floats(0.5, 50))
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_local_noise_enrolment_rho_uses_the_devices_own_sigma(n, sigma_local):
    cfg = DeviceConfig.create(
        b_norm=float(n), granularity=GAMMA, variant="local_noise", sigma_local=sigma_local
    )
    assert cfg.rho <= n / (2 * sigma_local**2) * (1 + 1e-12)


def test_devices_keep_per_analyst_sub_filters_exactly_as_the_central_engine(tmp_path):
    """Enrolled with the server's analysts, each device holds a query to its analyst's
    sub-budget as well as to its own budget; its spend per analyst, and what it sends, equal
    the central engine's; the state survives a restart; a query of an analyst the enrolment
    does not know is refused."""
    shares = {"growth": 0.4, "ops": 0.35}  # of B = 3·2^20 units: 1.2 and 1.05 full sums
    stream = _stream(12, 9, seed=4)
    qs = [
        q({**SUM, "analyst": "growth"}),
        q(HIST, "2026-01-03"),
        q({**LIN, "analyst": "ops"}, "2026-01-02"),
        q({**SUM, "query_id": "active2", "analyst": "ops"}),
    ]
    monitor = Monitor(b_norm=3.0, rho=0.5, granularity=GAMMA, test_seed=1, analysts=shares)
    for query in qs:
        monitor.add_query(query)
    cfg = DeviceConfig.create(b_norm=3.0, granularity=GAMMA, rho=0.5, analysts=shares)
    devices = {f"u{u}": LocalFilter(tmp_path / f"u{u}.json", cfg) for u in range(12)}
    fleet = DeviceFleet(cfg)
    announcements = [Announcement.parse(parse_query(x).canonical_json()) for x in qs]
    for dev in devices.values():
        for query in qs:
            dev.announce(parse_query(query).canonical_json())
    for day, events in stream.items():
        monitor.close_day(day, events)
        acc = DayAccumulator(day)
        for e in events:
            acc.add(parse_event(json.dumps(e)))
        records = acc.finish()
        todays = [a for a in announcements if a.applies_to(day)]
        fleet.answer(
            day, todays, records.users, [records.matrix(list(a.coordinates)) for a in todays]
        )
        for user, dev in devices.items():
            mine = [e for e in events if e["user_id"] == user]
            if mine:
                dev.answer_day(day, mine)
    engine = monitor.engine
    for user, dev in devices.items():
        restarted = LocalFilter(tmp_path / f"{user}.json", cfg)
        assert dev.spent_by_analyst() == restarted.spent_by_analyst()
        assert dev.spent_by_analyst() == engine.analyst_spent_units(user)
        row = fleet.rows([user])[0]
        assert {a: int(v[row]) for a, v in fleet.analyst_spent.items()} == {
            a: u for a, u in dev.spent_by_analyst().items() if a != "default"
        }
    spends = [dev.spent_by_analyst() for dev in devices.values()]
    quotas = cfg.quotas
    assert max(s["growth"] for s in spends) == 2**20  # one full contribution, never two
    assert all(s[a] <= quotas.sub_budget_units[a] for s in spends for a in s)
    with pytest.raises(AnnouncementError, match="'sales' is not declared"):
        devices["u0"].announce(
            json.dumps(q({**SUM, "query_id": "s", "analyst": "sales"}, "2026-02-01"))
        )
