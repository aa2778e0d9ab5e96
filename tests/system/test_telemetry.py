"""Telemetry: the private active-set estimate (engine, store, daemon) and the telemetry ledger
with the private budget statistics (``budget-stats``)."""

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from streamfilter import Monitor
from streamfilter.cli.budget import budget_stats
from streamfilter.cli.main import main
from streamfilter.config import load_config
from streamfilter.engine.params import PrivacyParams
from streamfilter.errors import ConfigError
from streamfilter.privacy import budget_stats as population
from streamfilter.privacy.budget_stats import SPENT_FRACTION_SCALE, BudgetStatsMechanism
from streamfilter.privacy.noise import SeededRandomBits
from streamfilter.runtime.app import build_daemon
from streamfilter.runtime.store import (
    DayCommit,
    Position,
    SQLiteStateStore,
    StateStore,
    StoreError,
    TelemetryBudgetError,
    TelemetryCharge,
)
from streamfilter.telemetry.active_set import (
    ACTIVE_SET_QUERY_ID,
    ActiveSetSpec,
    ActiveSetTracker,
    departures,
)
from tests.support import oracle
from tests.support.run_configs import file_run

COUNT = {
    "query_id": "c",
    "kind": "sum",
    "features": ["active"],
    "clip": 1.0,
    "from_day": "2026-01-01",
}


def day(n):
    return f"2026-01-{n:02d}"


def events(d, users):
    return [{"user_id": f"u-{i}", "day": day(d), "values": {"active": 1}} for i in users]


# -- departures -----------------------------------------------------------------------------


def test_departures_counts_users_crossing_the_threshold_once():
    b, m = 10, 3  # budget 10 units; a user has left once remaining < 3, i.e. spent > 7
    before = np.array([0, 7, 8, 2, 5])
    after = np.array([8, 7, 10, 2, 5])
    retired_before = np.array([False, False, False, False, False])
    retired_after = np.array([False, False, False, True, False])
    # user 0 crosses (8 > 7), user 1 stays (remaining 3), user 2 had already left, user 3 retires
    assert departures(before, retired_before, after, retired_after, b, m) == 2
    assert departures(after, retired_after, after, retired_after, b, m) == 0
    with pytest.raises(ValueError, match="re-entered"):
        departures(after, retired_after, before, retired_before, b, m)


def test_tracker_validates_its_threshold_against_the_budget():
    params = PrivacyParams.create(b_norm=4.0, rho=0.5)
    t = ActiveSetTracker.create(
        ActiveSetSpec(rho=0.02, horizon_days=100, min_remaining=1.0), params
    )
    assert t.min_remaining_units == 2**20 and t.counter.levels == 7
    assert t.rho <= 0.02 and t.counter.sigma2_units == math.ceil(7 / 0.04)
    assert ActiveSetTracker.from_json(t.to_json()) == t
    with pytest.raises(ValueError, match="exceeds the per-user budget"):
        ActiveSetTracker.create(ActiveSetSpec(rho=0.02, min_remaining=4.5), params)


def test_the_estimate_draws_the_oracle_variance():
    """n = 2000 independent trackers over 6 days with known departures (users retire).

    The oracle, from the configuration alone: a binary tree over ``h`` days has ``L =
    bit_length(h)`` levels and ``N_Z(0, s²)`` noise per node with ``s² = ceil(L/(2ρ))`` (CKS 2020
    Prop. 5: sensitivity² L costs ``L/(2s²) <= ρ``); day t's cumulative release sums
    ``popcount(t)`` nodes (Chan, Shi & Song 2011). Two-sided χ² and mean checks at α = 10⁻³
    shared by the 12 checks: a correct estimate passes with probability ≥ 0.999, a σ off by √2
    either way fails at each day with probability ≥ 0.999."""
    params = PrivacyParams.create(b_norm=4.0, rho=0.5)
    spec = ActiveSetSpec(rho=0.3, horizon_days=16, min_remaining=1.0)
    s2 = math.ceil(Fraction((16).bit_length()) / (2 * Fraction(0.3)))
    b = params.budget_units
    users = 40
    retire_day = np.arange(users) % 7  # user i retires on day i % 7 (0: never, in 6 days)
    n, days = 2000, 6
    errors = np.empty((n, days))
    bits = SeededRandomBits(17)
    for i in range(n):
        tracker = ActiveSetTracker.create(spec, params)
        for t in range(1, days + 1):
            before, after = (
                (retire_day >= 1) & (retire_day < t),
                (retire_day >= 1) & (retire_day <= t),
            )
            spent = np.zeros(users, np.int64)
            rel, tracker = tracker.step(day(t), spent, before, spent, after, b, bits)
            assert rel is not None
            errors[i, t - 1] = rel.value[0] - int(after.sum())
    for t in range(1, days + 1):
        v = t.bit_count() * oracle.discrete_gaussian_variance(s2)
        oracle.assert_mean_zero(errors[:, t - 1], v, checks=2 * days)
        oracle.assert_variance(errors[:, t - 1], v, checks=2 * days)


# -- the estimate in the engine (Monitor) ---------------------------------------------------


def run_monitor(active_set, days=8, seed=5, exhausted_extra=False):
    m = Monitor(b_norm=3.0, rho=0.5, test_seed=seed, active_set=active_set)
    m.add_query(COUNT)
    out = []
    for d in range(1, days + 1):
        users = [i for i in range(40) if (i + d) % 2 == 0 or i < 10]
        if exhausted_extra and d == days:
            users = [*users, 0]  # user 0 is active every day: long exhausted by now
        out.append(m.close_day(day(d), events(d, sorted(set(users)))))
    return m, out


def test_the_estimate_is_off_unless_asked_for():
    _, days = run_monitor(None)
    assert all(len(rel) == 1 and rel[0].query_id == "c" for rel in days)


def test_the_estimate_releases_noisy_cumulative_departures_in_the_contract_shape():
    spec = ActiveSetSpec(rho=50.0, horizon_days=16, min_remaining=1.0)  # tiny noise: s² = 1
    m, days = run_monitor(spec)
    ledger = m.engine.ledger
    b = m.params.budget_units
    truth = sum(1 for _, s, r in ledger.items() if r or b - s < 2**20)
    last = days[-1][-1]
    assert [r.query_id for r in days[-1]] == ["c", ACTIVE_SET_QUERY_ID]
    record = json.loads(last.to_json())
    assert list(record) == [
        "day",
        "query_id",
        "labels",
        "value",
        "sigma",
        "ci95",
        "mechanism",
        "granularity",
    ]
    assert record["labels"] == ["departed_cumulative"] and record["granularity"] == 1.0
    assert record["mechanism"] == "binary_tree_discrete_gaussian"
    t = 8  # popcount(8) = 1 node
    assert record["sigma"] == pytest.approx(m.engine.active_set.counter.sigma(t))
    assert abs(record["value"][0] - truth) <= 6 * record["sigma"]
    assert truth > 0


def test_an_exhausted_user_and_an_absent_user_give_identical_releases():
    """docs/design.md §6.8 for the estimate: a user who already left adds nothing to any count."""
    spec = ActiveSetSpec(rho=0.05, horizon_days=16)
    _, a = run_monitor(spec, seed=9, exhausted_extra=False)
    _, b = run_monitor(spec, seed=9, exhausted_extra=True)
    assert [r.to_json() for rel in a for r in rel] == [r.to_json() for rel in b for r in rel]


def test_the_reserved_query_id_is_refused():
    m = Monitor(b_norm=3.0, rho=0.5)
    with pytest.raises(ValueError, match="reserved"):
        m.add_query({**COUNT, "query_id": ACTIVE_SET_QUERY_ID})


def test_after_the_horizon_nothing_more_is_released():
    _, days = run_monitor(ActiveSetSpec(rho=0.05, horizon_days=3), days=5)
    assert [len(rel) for rel in days] == [2, 2, 2, 1, 1]


# -- the store: telemetry ledger and tracker state ------------------------------------------


def test_the_telemetry_ledger_is_enforced_exactly_and_pinned(tmp_path):
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        first = store.charge_telemetry(TelemetryCharge("budget_stats", 0.1, b"{}"), 0.3)
        assert first.spent >= 0.1 and first.remaining <= 0.2 and first.total == 0.3
        store.charge_telemetry(TelemetryCharge("budget_stats", 0.1, b"{}"), 0.3)
        # 3 × float(0.1) exceeds float(0.3) by ~2.8e-17 in exact arithmetic: refused
        with pytest.raises(TelemetryBudgetError, match="exceeded"):
            store.charge_telemetry(TelemetryCharge("budget_stats", 0.1, b"{}"), 0.3)
        assert len(store.telemetry_ledger()) == 2  # nothing written
        with pytest.raises(TelemetryBudgetError, match="cannot change"):
            store.charge_telemetry(TelemetryCharge("budget_stats", 0.01, b"{}"), 0.5)
        with pytest.raises(TelemetryBudgetError):
            store.charge_telemetry(TelemetryCharge("x", 0.0, b"{}"), 0.3)
    finally:
        store.close()
    store = SQLiteStateStore(tmp_path / "state.db")  # persisted across processes/opens
    try:
        assert [c.rho for c in store.telemetry_ledger()] == [0.1, 0.1]
        store.charge_telemetry(TelemetryCharge("budget_stats", 0.05, b"{}"), 0.3)
    finally:
        store.close()


def test_exact_accounting_admits_charges_that_sum_to_the_total(tmp_path):
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        for _ in range(4):
            store.charge_telemetry(TelemetryCharge("budget_stats", 0.25, b"{}"), 1.0)
        with pytest.raises(TelemetryBudgetError):
            store.charge_telemetry(TelemetryCharge("budget_stats", 2.0**-60, b"{}"), 1.0)
        assert [c.kind for c in store.telemetry_ledger()] == ["budget_stats"] * 4
    finally:
        store.close()


def test_a_store_without_a_ledger_refuses_charges():
    class Minimal(StateStore):
        def load(self): ...
        def set_config_fingerprint(self, fingerprint): ...
        def add_queries(self, canonical_jsons): ...
        def commit_day(self, commit):
            return 0

        def save_positions(self, positions): ...
        def unsent_releases(self):
            return []

        def sent_releases_after(self, day):
            return []

        def mark_sent(self, keys): ...
        def spent_units(self, user_id):
            return None

        def close(self): ...

    s = Minimal()
    assert s.telemetry_ledger() == []
    with pytest.raises(StoreError, match="no telemetry ledger"):
        s.charge_telemetry(TelemetryCharge("budget_stats", 0.01, b"{}"), 1.0)


def test_the_tracker_state_is_committed_with_the_day(tmp_path):
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        assert store.load().active_set_state is None
        commit = DayCommit(
            day=day(1),
            releases=[],
            changed_users=np.array([], dtype=object),
            spent_units=np.array([], dtype=np.int64),
            retired=np.array([], dtype=bool),
            positions={"p0": Position(0, 0)},
            active_set_state=b'{"k": 1}',
        )
        store.commit_day(commit)
        assert store.load().active_set_state == b'{"k": 1}'
    finally:
        store.close()


# -- the daemon ------------------------------------------------------------------------------

CONFIG = file_run(
    """
[privacy]
b_norm = 3.0
rho = 0.5
[testing]
noise_seed = 4
[telemetry]
rho = 0.05
stats_rho = 0.01
active_set = true
active_set_rho = 0.02
active_set_horizon = 64
"""
)


def write_world(tmp: Path, days: range, config: str = CONFIG) -> Path:
    (tmp / "streamfilter.toml").write_text(config)
    (tmp / "queries.jsonl").write_text(json.dumps(COUNT) + "\n")
    with open(tmp / "events.jsonl", "a") as fh:
        for d in days:
            for e in events(d, range(d % 3, 60, 2)):
                fh.write(json.dumps(e) + "\n")
    return tmp / "streamfilter.toml"


def run_daemon(path: Path, **overrides):
    parts = build_daemon(load_config(path, **overrides), follow=False, allow_test_seed=True)
    try:
        parts.daemon.run(until_end=True)
        return parts.daemon.engine
    finally:
        parts.close()


def released(tmp: Path, query_id: str) -> list[dict]:
    lines = (tmp / "releases.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["query_id"] == query_id]


def test_the_daemon_releases_the_estimate_and_resumes_it_after_a_restart(tmp_path):
    cfg = write_world(tmp_path, range(1, 5))
    engine = run_daemon(cfg)
    assert engine.active_set.state.t == 4
    write_world(tmp_path, range(5, 9))
    engine = run_daemon(cfg)
    assert engine.active_set.state.t == 8  # resumed from the stored tracker, not restarted
    est = released(tmp_path, ACTIVE_SET_QUERY_ID)
    assert [r["day"] for r in est] == [day(d) for d in range(1, 9)]
    store = SQLiteStateStore(tmp_path / "state.db")
    try:  # charged once, for the whole horizon
        assert [(c.kind, c.rho) for c in store.telemetry_ledger()] == [
            ("active_set", 0.02),
            ("coverage", 0.02),  # coverage with every release, on by default
        ]
    finally:
        store.close()
    with pytest.raises(ConfigError, match="cannot change during a run"):
        run_daemon(cfg, telemetry={"active_set_horizon": 128})


def test_the_daemon_refuses_an_estimate_the_telemetry_budget_cannot_pay(tmp_path):
    cfg = write_world(tmp_path, range(1, 3))
    store = SQLiteStateStore(tmp_path / "state.db")
    try:  # earlier budget-stats calls used 0.04 of telemetry.rho = 0.05
        store.charge_telemetry(TelemetryCharge("budget_stats", 0.04, b"{}"), 0.05)
    finally:
        store.close()
    with pytest.raises(ConfigError, match=r"telemetry\.active_set_rho: telemetry budget exceeded"):
        run_daemon(cfg)
    assert not (tmp_path / "releases.jsonl").exists()


def test_config_validation_names_the_telemetry_keys(tmp_path):
    cfg = write_world(tmp_path, range(1, 2))
    with pytest.raises(ConfigError, match=r"telemetry\.stats_rho must be <= telemetry\.rho"):
        load_config(cfg, telemetry={"stats_rho": 0.5})
    with pytest.raises(ConfigError, match=r"telemetry\.active_set_horizon"):
        load_config(cfg, telemetry={"active_set_horizon": 0})
    with pytest.raises(ConfigError, match=r"telemetry\.active_min_remaining"):
        run_daemon(cfg, telemetry={"active_min_remaining": 5.0})


# -- budget-stats ----------------------------------------------------------------------------


def test_population_mechanism_sensitivity_matches_its_rho(monkeypatch):
    """Neighbouring ledgers (one user added) move the exact count by 1, the sum by <= K and one
    histogram bin by 1 — the sensitivities the stated ρ is computed from."""
    seen = []

    def zero_noise(bits, s2, size):
        seen.append(s2)
        return np.zeros(size, dtype=np.int64)

    monkeypatch.setattr(population, "discrete_gaussian", zero_noise)
    mech = BudgetStatsMechanism(rho=0.01)
    b = 1000
    base = [0, 10, 500, 999, 1000, 250]
    a = mech.release(base, b, SeededRandomBits(0))
    for extra in (0, 1, 499, 500, 1000):
        n = mech.release([*base, extra], b, SeededRandomBits(0))
        assert n.users_noisy - a.users_noisy == 1
        diff = np.array(n.histogram_noisy) - np.array(a.histogram_noisy)
        assert sorted(diff.tolist()) == [0] * 99 + [1]
    c, s, h = mech.sigma2_units
    assert 1 / (2 * c) + SPENT_FRACTION_SCALE**2 / (2 * s) + 1 / (2 * h) <= 0.01
    assert mech.rho_effective <= 0.01
    assert seen[:3] == [c, s, h]  # count, sum, then the histogram batch


def test_population_statistics_are_accurate_on_a_large_population():
    rng = np.random.default_rng(1)
    b = 1 << 20
    fractions = rng.beta(2, 5, 50_000)
    stats = BudgetStatsMechanism(rho=0.01).release(
        (fractions * b).astype(np.int64), b, SeededRandomBits(3), (0.1, 0.5, 0.9)
    )
    assert abs(stats.mean_spent_fraction - fractions.mean()) < 0.002
    for q, value in stats.quantiles.items():
        assert abs(value - np.quantile(fractions, float(q))) < 0.01 + 0.005


def test_budget_stats_charges_the_telemetry_budget_until_it_refuses(tmp_path, capsys):
    cfg = write_world(
        tmp_path,
        range(1, 4),
        CONFIG.replace("active_set = true", "active_set = false\ncoverage = false"),
    )
    run_daemon(cfg)
    settings = load_config(cfg)
    remaining = []
    for i in range(5):
        out = budget_stats(settings, SeededRandomBits(i))
        remaining.append(out["telemetry_rho_remaining"])
        assert out["rho_charged"] == 0.01 and set(out["quantiles"]) == {"0.1", "0.5", "0.9"}
    assert remaining == pytest.approx([0.04, 0.03, 0.02, 0.01, 0.0])
    with pytest.raises(TelemetryBudgetError, match="exceeded"):
        budget_stats(settings, SeededRandomBits(9))
    # the CLI: exit 5, nothing on stdout, the refusal on stderr
    capsys.readouterr()
    assert main(["budget-stats", "--config", str(cfg)]) == 5
    out, err = capsys.readouterr()
    assert out == "" and "telemetry budget exceeded" in err
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        ledger = store.telemetry_ledger()
        assert len(ledger) == 5 and all(c.kind == "budget_stats" for c in ledger)
        assert json.loads(ledger[0].record)["rho_charged"] == 0.01  # the release is kept
    finally:
        store.close()


def test_budget_stats_cli_reports_the_cost_and_refuses_a_locked_state(tmp_path, capsys):
    cfg = write_world(
        tmp_path,
        range(1, 3),
        CONFIG.replace("active_set = true", "active_set = false\ncoverage = false"),
    )
    run_daemon(cfg)
    capsys.readouterr()
    assert main(["budget-stats", "--config", str(cfg), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rho_charged"] == 0.01 and out["telemetry_rho_remaining"] == pytest.approx(0.04)
    assert main(["budget-stats", "--config", str(cfg), "--quantiles", "0.25,0.75"]) == 0
    text = capsys.readouterr().out
    assert "0.25:" in text and "cost" in text and "remaining 0.03" in text
    assert main(["budget-stats", "--config", str(cfg), "--quantiles", "0.5,1.5"]) == 2
    holder = SQLiteStateStore(tmp_path / "state.db")  # as a running daemon holds the lock
    try:
        capsys.readouterr()
        assert main(["budget-stats", "--config", str(cfg)]) == 3
        assert "in use" in capsys.readouterr().err
    finally:
        holder.close()
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        assert len(store.telemetry_ledger()) == 2  # the refused calls charged nothing
    finally:
        store.close()
