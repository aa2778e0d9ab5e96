"""The population estimate beside every release (telemetry.population, docs/design.md §2.12)."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest

from streamfilter.engine.contract import Release
from streamfilter.engine.day import close_day
from streamfilter.engine.monitor import Monitor
from streamfilter.engine.records import DayRecords
from streamfilter.telemetry.population import MODEL, PopulationSpec

USERS, DAYS, B_NORM, CLIP, RHO = 200_000, 30, 40.0, 4.0, 0.5


def _scenario(
    decline_from: int | None, every_day: bool = True, users: int = USERS
) -> list[tuple[float, Release]]:
    """A stationary population: sessions ~ Poisson(λ_i) a day with λ_i log-normal (σ = 2, mean
    0.1115: 22.3k sessions/day per 200k users); ``every_day``: every user sends a record every
    day (else only on days with a session); from day ``decline_from`` every rate falls by 30%.
    The days go through the engine's own day close (``close_day``) as records built column-wise
    (``DayRecords.from_codes``, what the accumulator builds from the same events), so 200k
    users × 30 days take seconds. Returns (exact clipped truth, release) per day."""
    rng = np.random.default_rng(2026)
    sigma_ln, mean_rate = 2.0, 0.1115
    rate = rng.lognormal(np.log(mean_rate) - sigma_ln**2 / 2, sigma_ln, users)
    ids = [f"u{i}" for i in range(users)]
    m = Monitor(b_norm=B_NORM, rho=RHO, population=PopulationSpec(), test_seed=7)
    m.add_query(
        {
            "query_id": "engaged",
            "kind": "sum",
            "features": ["sessions"],
            "clip": CLIP,
            "from_day": "2026-01-01",
        }
    )
    engine = m.engine
    out = []
    for t in range(DAYS):
        day = (dt.date(2026, 1, 1) + dt.timedelta(days=t)).isoformat()
        factor = 0.7 if decline_from is not None and t >= decline_from else 1.0
        sessions = rng.poisson(rate * factor)
        truth = float(np.minimum(sessions, CLIP).sum())
        rows = np.arange(users) if every_day else np.flatnonzero(sessions)
        records = DayRecords.from_codes(
            day,
            [ids[i] for i in rows.tolist()],
            ["sessions"],
            np.arange(len(rows)),
            np.zeros(len(rows), np.int64),
            sessions[rows].astype(np.float64),
        )
        outcome = close_day(
            records,
            engine.queries.for_day(day),
            engine.ledger,
            engine.params,
            engine.bits,
            population=engine.population,
        )
        engine.commit_day(outcome)
        (release,) = outcome.releases
        out.append((truth, release))
    return out


@pytest.fixture(scope="module")
def flat() -> list[tuple[float, Release]]:
    return _scenario(None)


def test_a_flat_truth_stays_flat_in_population_while_the_release_falls(
    flat: list[tuple[float, Release]],
) -> None:
    truths = np.array([t for t, _ in flat])
    released = np.array([r.value[0] for _, r in flat])
    pops = [r.population for _, r in flat]
    assert all(p is not None and p.model == MODEL for p in pops)
    population = np.array([p.value[0] for p in pops if p is not None])
    half = np.array([p.ci95[0] for p in pops if p is not None])
    # the truth is flat (±5% of its mean every day) ...
    assert np.all(np.abs(truths / truths.mean() - 1) < 0.05)
    # ... the release loses more than 40% ...
    assert released[-1] < 0.6 * released[0]
    # ... more than half of the value is refused by day 30 ...
    assert released[-1] < 0.5 * truths[-1]
    # ... while the population estimate stays within 10% of the truth every day
    assert np.all(np.abs(population / truths - 1) < 0.10)
    # ... its 95% interval (noise and model) covers the truth on at least 90% of the days ...
    covered = np.abs(population - truths) <= half
    assert covered.mean() >= 0.9, covered
    # ... and is no wider than it needs to be: under 10% of the truth, so no infinite interval
    # passes, and wider than the noise alone from the first departures on (the model term)
    assert np.all(half < 0.10 * truths), half / truths
    noise_only = np.array([1.96 * p.sigma for p in pops if p is not None])
    assert np.all(half[5:] > 2 * noise_only[5:]), (half, noise_only)


def test_a_real_30_percent_decline_shows_in_population() -> None:
    days = _scenario(15)
    population = np.array([r.population.value[0] for _, r in days if r.population is not None])
    truths = np.array([t for t, _ in days])
    half = max(r.population.ci95[0] for _, r in days if r.population is not None)
    before, after = population[5:15].mean(), population[20:].mean()
    # a decline far beyond the noise (the departed users' part keeps their old value: the
    # estimate falls by less than the truth, never rises)
    assert after < before - 3 * half, (before, after, half)
    assert after > truths[20:].mean() * 0.95


def test_users_active_on_some_days_only_are_not_overcounted() -> None:
    """Records only on days with a session: a user due to depart who sends nothing that day
    leaves with a zero vector, so population is not the value of a day *with* a record times
    every day (which overshoots by 15% and growing here)."""
    days = _scenario(None, every_day=False)
    truths = np.array([t for t, _ in days])
    population = np.array([r.population.value[0] for _, r in days if r.population is not None])
    released = np.array([r.value[0] for _, r in days])
    assert released[-1] < 0.5 * truths[-1]
    assert np.all(np.abs(population / truths - 1) < 0.05), population / truths


def test_population_off_leaves_the_release_format_unchanged() -> None:
    m = Monitor(b_norm=4.0, rho=0.5, test_seed=1)
    m.add_query(
        {"query_id": "a", "kind": "sum", "features": ["x"], "clip": 1.0, "from_day": "2026-01-01"}
    )
    (rel,) = m.close_day("2026-01-01", [{"user_id": "u", "day": "2026-01-01", "values": {"x": 1}}])
    assert rel.population is None and "population" not in rel.to_json()


def write_figure(png: str) -> None:
    """docs/img/population.png: the report of the flat scenario, rendered by headless Chromium
    (``python -m tests.telemetry.test_population docs/img/population.png``)."""
    import subprocess
    import tempfile
    from pathlib import Path

    from streamfilter.cli.report import ReportData, render_report
    from streamfilter.config import load_config
    from tests.cli.test_report import CHROMIUM_FLAGS

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "c.toml"
        cfg.write_text(f'[privacy]\nb_norm = {B_NORM}\nrho = {RHO}\n[queries]\nkind = "none"\n')
        releases = [r for _, r in _scenario(None)]
        days = [r.day for r in releases]
        page = Path(tmp) / "report.html"
        data = ReportData(releases, days, "tests.telemetry.test_population.py (flat truth)")
        page.write_text(render_report(load_config(cfg), data), encoding="utf-8")
        subprocess.run(
            [
                "chromium",
                *CHROMIUM_FLAGS,
                f"--user-data-dir={tmp}/profile",
                f"--screenshot={Path(png).resolve()}",
                "--window-size=1200,1500",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=180,
        )


if __name__ == "__main__":
    import sys

    write_figure(sys.argv[1])


def test_the_counters_and_the_pending_users_survive_a_restart() -> None:
    """The tracker is stored with each day: a run resumed from its JSON draws the same noise
    and releases the same estimates as one that never stopped."""
    from streamfilter.telemetry.population import PopulationTracker

    def run(restart: bool) -> list[float]:
        m = Monitor(b_norm=4.0, rho=0.5, population=PopulationSpec(4), test_seed=3)
        m.add_query(
            {
                "query_id": "q",
                "kind": "sum",
                "features": ["x"],
                "clip": 1.0,
                "from_day": "2026-01-01",
            }
        )
        out = []
        for t in range(1, 10):
            day = f"2026-01-{t:02d}"
            events = [
                {"user_id": f"u{i}", "day": day, "values": {"x": 1}}
                for i in range(30)
                if (i + t) % 3
            ]
            (rel,) = m.close_day(day, events)
            assert rel.population is not None
            out.append(rel.population.value[0])
            tracker = m.engine.population
            assert tracker is not None
            if restart:
                m.engine.population = PopulationTracker.from_json(tracker.to_json())
        return out

    assert run(True) == run(False)


def test_population_noise_is_unbiased_with_the_oracle_variance_across_epochs() -> None:
    """The population value minus the exact (release + departed) sum is the release's noise
    plus the departed tree's: one ``N_Z(0, s²)`` and, on day ``t`` of epoch 1 (``L = 3``),
    ``popcount(t)`` nodes ``N_Z(0, 3s²)``; in epoch 2 (``L = 4``) the root of epoch 1 plus
    ``popcount(t − 4)`` nodes ``N_Z(0, 4s²)`` — variances the test computes itself from the
    calibration ``s² = ceil(σ²/γ²)`` and the definition of ``N_Z`` (``oracle``), never from
    the ``sigma`` the code states. Mean and variance, two-sided χ², α = 10⁻³ shared over the 8
    days (``oracle.assert_power``: σ off by √2 either way fails with probability ≥ 0.999)."""
    from streamfilter.engine.contract import parse_query
    from streamfilter.engine.day import noisy_release
    from streamfilter.engine.params import PrivacyParams
    from streamfilter.privacy.departed import DepartureRule
    from streamfilter.privacy.noise import SystemRandomBits
    from streamfilter.telemetry.population import PopulationTracker
    from tests.support import oracle

    gamma, b_norm, rho = 2.0**-4, 4.0, 0.5
    params = PrivacyParams.create(b_norm=b_norm, rho=rho, granularity=gamma)
    s2 = math.ceil(b_norm / (2 * rho) / gamma**2)  # Corollary 4.7's σ², lattice units, up
    query = parse_query(
        {"query_id": "q", "kind": "sum", "features": ["x"], "clip": 1.0, "from_day": "2026-01-01"}
    )
    rule = DepartureRule.of(params.lattice.max_cost_units(1.0), 1, s2)
    totals = [37, 5, 0, 12, 90, 3, 44, 8]  # exact release sums (lattice units)
    departed = [4, 0, 16, 2, 0, 9, 1, 30]  # exact departing sums
    days, trials, bits = len(totals), 1000, SystemRandomBits()
    err = np.empty((trials, days))
    stated = []
    for n in range(trials):
        tracker = PopulationTracker.create(PopulationSpec(4), params)
        for t in range(days):
            day = f"2026-01-{t + 1:02d}"
            rel = noisy_release(day, query, np.array([totals[t]]), params, bits)
            rel, state, sq = tracker.step(
                rel, np.array([departed[t]]), np.array([departed[t] ** 2]), rule, params, bits
            )
            tracker = tracker.advanced({"q": state}, {"q": sq}, np.array([], dtype=object))
            assert rel.population is not None
            exact = totals[t] + sum(departed[: t + 1])
            err[n, t] = rel.population.value[0] / gamma - exact
            if n == 0:
                stated.append(rel.population.sigma / gamma)
    checks = 2 * days
    for t in range(1, days + 1):
        var = oracle.discrete_gaussian_variance(s2)
        if t <= 4:
            var += t.bit_count() * oracle.discrete_gaussian_variance(3 * s2)
        else:
            var += oracle.discrete_gaussian_variance(3 * s2)
            var += (t - 4).bit_count() * oracle.discrete_gaussian_variance(4 * s2)
        oracle.assert_mean_zero(err[:, t - 1], var, checks)
        oracle.assert_variance(err[:, t - 1], var, checks=checks)
        assert stated[t - 1] == pytest.approx(math.sqrt(var), rel=1e-6)
