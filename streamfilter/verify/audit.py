"""Empirical privacy audit of the real engine (docs/design.md §6 item 12).

The auditor is a black box on the code path it audits: it builds two neighbouring streams — a
fixed population with and without one *canary* user — and runs the real
:class:`~streamfilter.engine.monitor.Engine` (the day step used by ``Monitor`` and the daemon:
``DayAccumulator`` → ``prepare_day`` → ``commit_day``, noise from the OS CSPRNG through
:class:`~streamfilter.privacy.noise.SystemRandomBits`) many times on each. Only the released
values are looked at. A threshold test on a linear statistic of the releases then distinguishes
the two worlds, and its false-positive and false-negative rates give, through one-sided
Clopper–Pearson upper bounds, a lower bound on ε that holds with confidence ``1 − α``:

    ε_lb = max( log((1 − δ − FNR_ub) / FPR_ub),  log((1 − δ − FPR_ub) / FNR_ub) )

(any (ε, δ)-DP mechanism has ``TPR ≤ e^ε·FPR + δ`` and ``TNR ≤ e^ε·FNR + δ`` for every test;
each CP bound is taken at level ``α/2`` so both hold together with probability ``≥ 1 − α``).

Validity of the bound: the trials of each world are split in two halves. The statistic (its
weights and orientation) and the threshold are chosen on the first half only; the rates are then
counted on the second half, whose trials are independent of that choice. So the reported bound
is a valid lower bound on the true ε of the run, whatever the selection did.

The claim being tested, ``epsilon_claimed``, is the ε at the configured δ of the canary's
worst-case loss over the whole run, ``ρ = B/(2 s²)`` (lattice units; ``PrivacyParams.rho_effective``)
converted by the Canonne–Kamath–Steinke bound (:func:`~streamfilter.privacy.accounting.epsilon_from_rho_cks`).

The audited scenario (:class:`AuditConfig`)
-------------------------------------------
* a standing ``sum`` query ``q`` on feature ``x`` with clip ``C`` over ``days`` days, and, on the
  last day after ``q``, a one-day ``sum`` query ``big`` on feature ``y`` whose clip is larger than
  the whole budget (``big_clip² > b_norm``): a correct filter never admits any contribution of
  full norm to it;
* ``b_norm = days·C²`` by default, so the canary — whose contributions have norm exactly the clip
  on every query, every day — spends exactly its whole budget on ``q`` and is refused on ``big``;
* the canary's raw values are ``canary_scale`` times the clip: clipping brings them to exactly the
  clip, so a build that forgets to clip what it adds leaks ``canary_scale`` times more;
* a small fixed population (deterministic values, some above the clip) shares every query.

Deliberately broken builds (``bug=...``), for the power tests
-------------------------------------------------------------
They exist only inside :func:`audit`: a context manager swaps module globals of
``streamfilter.engine.day`` for the duration of the audit (in the auditing process or its
workers) and restores them. Production code is not modified and no configuration, input or API
of the product can enable them.

``sigma_halved``              the noise actually drawn has half the calibrated σ (the release
                              still reports the configured σ). ρ is four times the claim.
``check_before_add_ignored``  admission tests ``spent ≤ B`` instead of ``spent + c ≤ B``: a user
                              who still has any budget left is admitted whatever the cost, so
                              the canary, at ``spent = B`` after ``q``, enters ``big`` with norm
                              ``big_clip``.
``cost_before_clip``          the cost is computed on the clipped, rounded vector but the vector
                              added to the sum is the *unclipped* rounded one (cost ≠ ‖added‖²,
                              docs/design.md §6 item 3): the canary is charged ``C²`` per day and adds
                              ``canary_scale·C``.

Speed without a shortcut: every trial is a fresh ``Engine`` run through the same day step as
production. What is shared between trials is only what production also computes once: the parsed
events and queries (``parse_event``/``parse_query`` run once) and the ``PrivacyParams`` (σ, ``s²``,
``B`` and the CI half-width are cached properties of the configuration). The population is small
and the run short (2 days, 3 releases), so a run takes about a millisecond; ``workers`` spreads the
trials over processes. 10⁴ trials take ~10–20 s, 10⁵ a few minutes.

Coverage (docs/design.md §2.11). With ``coverage_rho`` set, the audited engine runs the coverage
tracker too: the released coverage estimates join the released values the test may use, and
the claim is ``ρ + ρ_cov``. The coverage accounting is recomputed from the tracker the engine
runs, independently of the ρ it states: for every epoch up to the 2^30-step cap, ``m`` count
streams (thresholds + 1) fed to trees of ``L_e`` levels with node variance ``s_e²`` cost one user
at most ``m·L_e/(2s_e²)``, in exact rationals; the largest must not exceed ``coverage_rho``
(a violation otherwise, whatever the trials say). ``coverage_sensitivity_ignored`` is a broken
build whose noise is calibrated for one stream instead of ``m`` (σ too small by ``sqrt(m)``).

Population (docs/design.md §2.12). With ``population_epoch_days`` set, the audited engine runs
the population estimate: users follow the departure rule, and each release's population values
(release plus the departed counter's running total) join the released values the test may use.
It costs no ρ of its own, so the claim is unchanged; instead the accounting is recomputed from
the counters the engine draws from, for every query and every epoch up to the 2^30-step cap, in
exact rationals: the departed counter's ``L_e`` nodes must cost a departing vector at most the
``‖r‖²`` it is charged, and the squares counter's at most the ``E`` its departure rule reserves
(``population["ok"]``; a violation otherwise). ``population_noise_per_node`` is a broken build
whose departed counter draws ``N_Z(0, s²)`` per node instead of ``N_Z(0, L_e·s²)``.

Run ``python -m streamfilter.verify.audit --trials 100000`` for the full audit (JSON on stdout;
``--bug all`` also audits the three broken builds).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from multiprocessing import get_context
from typing import Any, Literal

import numpy as np
import scipy.stats

import streamfilter.engine.day as day_module
from streamfilter.engine.contract import Event, Release, parse_event, parse_query
from streamfilter.engine.engine import Engine
from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.queries import AnyQuery
from streamfilter.engine.records import DayAccumulator
from streamfilter.privacy.accounting import epsilon_from_rho_cks
from streamfilter.privacy.continual import MAX_HORIZON, CounterExhausted, EpochCounter
from streamfilter.privacy.individual_filter import (
    Exhaustion,
    FilterStep,
    FilterTotals,
    filter_contributions,
    query_vectors,
    totals_of,
)
from streamfilter.privacy.lattice import Lattice, round_to_lattice
from streamfilter.privacy.noise import RandomBits, SystemRandomBits
from streamfilter.privacy.rounding import float_up
from streamfilter.telemetry.coverage import CoverageSpec, CoverageTracker
from streamfilter.telemetry.population import PopulationTracker
from streamfilter.verify.population_audit import population_accounting, population_tracker

__all__ = ["BUGS", "AuditConfig", "AuditResult", "Bug", "audit", "main"]

Bug = Literal[
    "sigma_halved",
    "check_before_add_ignored",
    "cost_before_clip",
    "coverage_sensitivity_ignored",
    "population_noise_per_node",
]
BUGS: tuple[Bug, ...] = (
    "sigma_halved",
    "check_before_add_ignored",
    "cost_before_clip",
    "coverage_sensitivity_ignored",
    "population_noise_per_node",
)
#: broken builds made in ``_build`` (their trackers), not injected into ``engine.day``
_BUILT_BUGS = ("coverage_sensitivity_ignored", "population_noise_per_node")

CANARY = "canary"


# --------------------------------------------------------------------------------------------
# configuration and result
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditConfig:
    """The audited run. Defaults: claimed ε ≈ 2.0 at δ = 0.05 (ρ ≈ 0.5, μ = sqrt(2ρ) ≈ 1).

    The default δ is large on purpose: an audit with ``n`` trials cannot observe events rarer
    than about ``1/n``, so the claim is tested at a point of its (ε, δ) curve that such trials
    can reach. ``b_norm = None`` means ``days·clip²`` (the canary spends exactly its budget).
    """

    rho: float = 0.5
    delta: float = 0.05
    b_norm: float | None = None
    granularity: float = 2.0**-4
    mechanism: str = "discrete_gaussian"
    exhaustion: str = "skip"
    days: int = 2
    clip: float = 1.0
    big_clip: float = 8.0
    population: int = 8
    canary_scale: float = 8.0
    start_day: str = "2026-01-01"
    population_seed: int = 0
    #: None: the audited run has no coverage; else its telemetry ρ (docs/design.md §2.11)
    coverage_rho: float | None = None
    coverage_levels: int = 8
    coverage_epoch_days: int = 1
    #: None: the audited run has no population estimate; else its first epoch (§2.12)
    population_epoch_days: int | None = None

    @property
    def budget_norm(self) -> float:
        return self.b_norm if self.b_norm is not None else self.days * self.clip**2

    def params(self) -> PrivacyParams:
        return PrivacyParams.create(
            b_norm=self.budget_norm,
            rho=self.rho,
            delta=self.delta,
            granularity=self.granularity,
            exhaustion=self.exhaustion,
            mechanism=self.mechanism,
        )

    def check(self) -> None:
        if self.days < 1:
            raise ValueError(f"days must be >= 1, got days={self.days}")
        if self.population < 0:
            raise ValueError(f"population must be >= 0, got population={self.population}")
        if not (self.canary_scale >= 1.0 and math.isfinite(self.canary_scale)):
            raise ValueError("canary_scale must be a finite number >= 1")
        self.params()


@dataclass(frozen=True)
class AuditResult:
    """Outcome of one audit. ``violation``: the lower bound exceeds the claim."""

    epsilon_lower_bound: float
    epsilon_claimed: float
    delta: float
    trials: int
    threshold: float
    alpha: float
    bug: str | None
    statistic: str
    weights: list[float]
    eval_trials_per_world: int
    false_positives: int
    false_negatives: int
    fpr_upper: float
    fnr_upper: float
    rho_claimed: float
    #: the recomputed coverage accounting (None when the audited run has no coverage)
    coverage: dict[str, Any] | None
    #: the recomputed population accounting (None when the audited run has none)
    population_estimate: dict[str, Any] | None
    sigma: float
    mechanism: str
    canary_spent_fraction: float
    seconds: float

    @property
    def violation(self) -> bool:
        broken = self.coverage is not None and not self.coverage["ok"]
        broken |= self.population_estimate is not None and not self.population_estimate["ok"]
        return broken or self.epsilon_lower_bound > self.epsilon_claimed

    def to_json_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["violation"] = self.violation
        return out


# --------------------------------------------------------------------------------------------
# the scenario: parsed once, reused by every trial
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scenario:
    params: PrivacyParams
    queries: list[AnyQuery]
    days: list[str]
    without: list[list[Event]]  # per day: the population's events
    with_canary: list[list[Event]]  # per day: population + canary
    relevant: np.ndarray  # per released coordinate: sign of the canary's raw vector (0: none)
    coverage: CoverageTracker | None = None  # the tracker every trial starts from (immutable)
    population: PopulationTracker | None = None  # likewise


def _day(start: str, k: int) -> str:
    return (dt.date.fromisoformat(start) + dt.timedelta(days=k)).isoformat()


def _coverage_tracker(config: AuditConfig, bug: str | None) -> CoverageTracker | None:
    if config.coverage_rho is None:
        return None
    spec = CoverageSpec(config.coverage_rho, config.coverage_levels, config.coverage_epoch_days)
    tracker = CoverageTracker.create(spec, config.params())
    if bug == "coverage_sensitivity_ignored":  # BUG: noise calibrated for 1 stream, not m
        weak = EpochCounter(spec.first_epoch_days, 1, spec.rho)
        tracker = dataclasses.replace(tracker, counter=weak)
    return tracker


def coverage_accounting(tracker: CoverageTracker, rho_claimed: float) -> dict[str, Any]:
    """Recompute what the tracker's noise costs one user, over the whole unbounded run.

    ``m`` = the count streams the day close feeds it (its thresholds + 1); epoch ``e``'s tree
    is the one ``step`` draws from. One user adds 1 to each stream once, so to one epoch per
    stream: the worst case is ``m · max_e L_e/(2 s_e²)`` (CKS 2020 Prop. 5 per node, additive
    over nodes). Exact rationals; ``ok`` iff it is at most ``rho_claimed``."""
    m = len(tracker.thresholds_units) + 1
    worst, epochs = Fraction(0), 0
    for e in range(1, MAX_HORIZON.bit_length() + 1):
        try:
            tree = tracker.counter.tree(e)
        except CounterExhausted:
            break
        epochs = e
        worst = max(worst, Fraction(m * tree.horizon.bit_length(), 2 * tree.sigma2_units))
    return {
        "streams": m,
        "epochs_checked": epochs,
        "rho_recomputed": float_up(worst),
        "rho_claimed": rho_claimed,
        "ok": worst <= Fraction(rho_claimed),
    }


def _build(config: AuditConfig, bug: str | None = None) -> _Scenario:
    config.check()
    params = config.params()
    days = [_day(config.start_day, k) for k in range(config.days)]
    queries: list[AnyQuery] = [
        parse_query(
            {
                "query_id": "q",
                "kind": "sum",
                "features": ["x"],
                "clip": config.clip,
                "from_day": days[0],
            }
        ),
        parse_query(
            {
                "query_id": "big",
                "kind": "sum",
                "features": ["y"],
                "clip": config.big_clip,
                "from_day": days[-1],
                "until_day": days[-1],
            }
        ),
    ]
    rng = np.random.default_rng(config.population_seed)  # fixed data, not noise
    xs = rng.uniform(0.0, 1.5 * config.clip, size=(config.days, config.population))
    ys = rng.uniform(0.0, 2.0, size=(config.days, config.population))
    canary_values = {
        "x": config.canary_scale * config.clip,
        "y": config.canary_scale * config.big_clip,
    }
    without: list[list[Event]] = []
    with_canary: list[list[Event]] = []
    for k, d in enumerate(days):
        lines = [
            json.dumps(
                {
                    "user_id": f"p{i:04d}",
                    "day": d,
                    "values": {"x": float(xs[k, i]), "y": float(ys[k, i])},
                    "event_id": f"e{k}-{i}",
                }
            )
            for i in range(config.population)
        ]
        pop = [parse_event(line.encode()) for line in lines]  # the real parser, once
        canary = parse_event(
            json.dumps({"user_id": CANARY, "day": d, "values": canary_values}).encode()
        )
        without.append(pop)
        with_canary.append([*pop, canary])
    relevant: list[float] = []
    for d in days:
        for query in queries:
            if not query.applies_to(d):
                continue
            vec = _raw_vector(canary_values, query)
            relevant.extend(float(np.sign(v)) for v in vec)
            if config.coverage_rho is not None:  # covered and counted users: found by the shift
                relevant.extend([0.0, 0.0])
            if config.population_epoch_days is not None:  # the canary's vector, or its departure
                relevant.extend(float(np.sign(v)) for v in vec)
    tracker = _coverage_tracker(config, bug)
    population = population_tracker(config.population_epoch_days, config.params(), bug)
    return _Scenario(
        params, queries, days, without, with_canary, np.array(relevant), tracker, population
    )


def _raw_vector(values: dict[str, float], query: AnyQuery) -> np.ndarray:
    """The canary's unclipped vector for ``query`` (numeric features only in this scenario)."""
    rec = np.array([values.get(c, 0.0) for c in query.coordinates()], dtype=np.float64)
    return query_vectors(rec[None, :], query.weights())[0]


def _run_once(sc: _Scenario, canary: bool, bits: RandomBits) -> tuple[list[float], int]:
    """One whole run on the real engine path (as ``Monitor.close_day``): released values in
    (day, query, coordinate) order, and the canary's spent budget (lattice units)."""
    engine = Engine(sc.params, bits, coverage=sc.coverage, population=sc.population)
    for query in sc.queries:
        engine.register_query(query)
    values: list[float] = []
    for day, events in zip(sc.days, sc.with_canary if canary else sc.without, strict=True):
        engine.check_day(day)
        acc = DayAccumulator(day)
        for event in events:
            acc.add(event)
        outcome = engine.prepare_day(acc)
        engine.commit_day(outcome)
        for release in outcome.releases:
            values.extend(release.value)
            if release.coverage is not None:
                values.extend([release.coverage.users, release.coverage.counted_users])
            if release.population is not None:
                values.extend(release.population.value)
    return values, engine.ledger.spent_units(CANARY)


# --------------------------------------------------------------------------------------------
# injected bugs (auditor-only; production code is never modified)
# --------------------------------------------------------------------------------------------


def _filter_check_before_add(
    x: np.ndarray,
    clip: float,
    lattice: Lattice,
    spent_units: np.ndarray,
    retired: np.ndarray,
    budget_units: int,
    policy: Exhaustion,
) -> FilterStep:
    """BUG: admits every user with ``spent ≤ B``, ignoring the cost of the current query."""
    n = x.shape[0]
    cap = np.full(n, lattice.max_cost_units(clip), dtype=np.int64)
    units, cost = round_to_lattice(x, clip, lattice.granularity, cap)
    spent = np.asarray(spent_units, dtype=np.int64)
    retired = np.asarray(retired, dtype=bool)
    fits = spent <= budget_units  # the bug: should be spent + cost <= budget
    admitted = fits & ~retired
    newly_retired = (~fits & ~retired) if policy is Exhaustion.RETIRE else np.zeros(n, bool)
    units[~admitted] = 0
    cost = np.where(admitted, cost, 0)
    return FilterStep(units=units, cost_units=cost, admitted=admitted, newly_retired=newly_retired)


def _wrap_cost_before_clip(real: Callable[..., FilterStep]) -> Callable[..., FilterStep]:
    def buggy(
        x: np.ndarray,
        clip: float,
        lattice: Lattice,
        spent_units: np.ndarray,
        retired: np.ndarray,
        budget_units: int,
        policy: Exhaustion,
    ) -> FilterStep:
        """BUG: charged the cost of the clipped vector, adds the unclipped one."""
        step = real(x, clip, lattice, spent_units, retired, budget_units, policy)
        unclipped = np.rint(np.asarray(x, dtype=np.float64) / lattice.granularity).astype(np.int64)
        units = np.where(step.admitted[:, None], unclipped, 0)
        return dataclasses.replace(step, units=units)

    return buggy


def _summed(step_of: Callable[..., FilterStep]) -> Callable[..., FilterTotals]:
    """The day close's ``filter_totals`` built on a (broken) ``filter_contributions``."""

    def totals(x: np.ndarray, *args: Any) -> FilterTotals:
        return totals_of(step_of(x, *args), x)

    return totals


def _wrap_sigma_halved(real: Callable[..., Release]) -> Callable[..., Release]:
    halved: dict[int, PrivacyParams] = {}

    def buggy(
        day: str, query: AnyQuery, total_units: np.ndarray, params: PrivacyParams, bits: Any
    ) -> Release:
        """BUG: draws noise with σ/2 (ρ four times the claim), reports the configured σ."""
        weak = halved.get(id(params))
        if weak is None:
            weak = halved[id(params)] = dataclasses.replace(params, rho=4.0 * params.rho)
        release = real(day, query, total_units, weak, bits)
        return dataclasses.replace(
            release, sigma=params.sigma_released, ci95=[params.ci95_halfwidth] * len(release.value)
        )

    return buggy


@contextlib.contextmanager
def _injected(bug: str | None) -> Iterator[None]:
    """Swap one function of ``streamfilter.engine.day`` for a broken one, then restore it."""
    if bug is None or bug in _BUILT_BUGS:  # those are built in _build
        yield
        return
    new: Callable[..., Any]
    if bug == "sigma_halved":
        name, new = "noisy_release", _wrap_sigma_halved(day_module.noisy_release)
    elif bug == "check_before_add_ignored":
        name, new = "filter_totals", _summed(_filter_check_before_add)
    elif bug == "cost_before_clip":
        name, new = "filter_totals", _summed(_wrap_cost_before_clip(filter_contributions))
    else:
        raise ValueError(f"unknown bug {bug!r}; known: {', '.join(BUGS)}")
    original = getattr(day_module, name)
    setattr(day_module, name, new)
    try:
        yield
    finally:
        setattr(day_module, name, original)


# --------------------------------------------------------------------------------------------
# trials
# --------------------------------------------------------------------------------------------


def _trials(config: AuditConfig, n: int, bug: str | None) -> tuple[np.ndarray, np.ndarray, int]:
    """``n`` runs of each world (interleaved): (releases without, releases with, canary spent)."""
    sc = _build(config, bug)
    bits = SystemRandomBits()
    k = len(sc.relevant)
    out0 = np.empty((n, k), dtype=np.float64)
    out1 = np.empty((n, k), dtype=np.float64)
    spent = 0
    with _injected(bug):
        for i in range(n):
            out0[i], _ = _run_once(sc, False, bits)
            out1[i], spent = _run_once(sc, True, bits)
    return out0, out1, spent


def _trials_star(args: tuple[AuditConfig, int, str | None]) -> tuple[np.ndarray, np.ndarray, int]:
    return _trials(*args)


# --------------------------------------------------------------------------------------------
# statistics: Clopper–Pearson and the threshold test
# --------------------------------------------------------------------------------------------


def _cp_upper(k: np.ndarray, n: int, level: float) -> np.ndarray:
    """One-sided Clopper–Pearson upper bounds on p from ``k`` successes in ``n``, each at
    confidence ``1 − level``."""
    k = np.asarray(k, dtype=np.float64)
    out = np.ones_like(k)
    inside = k < n
    out[inside] = scipy.stats.beta.ppf(1.0 - level, k[inside] + 1.0, n - k[inside])
    return out


def _epsilon_lb(
    fp: np.ndarray, n0: int, fn: np.ndarray, n1: int, delta: float, alpha: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ε lower bounds of the tests with ``fp`` false positives (of n0) and ``fn`` false
    negatives (of n1); both CP bounds at α/2 (joint confidence 1 − α)."""
    fpr_ub = _cp_upper(fp, n0, alpha / 2.0)
    fnr_ub = _cp_upper(fn, n1, alpha / 2.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fnr_ub, 0.0) / fpr_ub)
        b = np.log(np.maximum(1.0 - delta - fpr_ub, 0.0) / fnr_ub)
    return np.maximum(a, b), fpr_ub, fnr_ub


def _counts(s0: np.ndarray, s1: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Test "canary present iff statistic ≥ t": false positives in s0, false negatives in s1."""
    s0s, s1s = np.sort(s0), np.sort(s1)
    fp = len(s0s) - np.searchsorted(s0s, t, side="left")
    fn = np.searchsorted(s1s, t, side="left")
    return fp, fn


def _best_threshold(
    s0: np.ndarray, s1: np.ndarray, n0: int, n1: int, delta: float, alpha: float
) -> tuple[float, float]:
    """(threshold, predicted ε_lb) for an evaluation on ``n0``/``n1`` fresh trials, chosen from
    the selection samples ``s0``/``s1`` only.

    The predicted error rate at a threshold is the larger of the empirical rate and the rate of
    a normal fit (the statistic is a linear function of Gaussian-noised releases): the fit
    extrapolates into tails the selection half sees only a few times, and the empirical rate
    vetoes thresholds where the real tail is heavier than the fit. This is only a selection
    heuristic; the bound's validity comes from evaluating on the other half.
    """
    m0, m1 = float(np.mean(s0)), float(np.mean(s1))
    sd0 = max(float(np.std(s0, ddof=1)), 1e-12)
    sd1 = max(float(np.std(s1, ddof=1)), 1e-12)
    spread = 6.0 * max(sd0, sd1)
    values = np.unique(np.concatenate([s0, s1]))
    if len(values) > 2000:
        values = np.quantile(values, np.linspace(0.0, 1.0, 2000))
    grid = np.unique(
        np.concatenate([values, np.linspace(min(m0, m1) - spread, max(m0, m1) + spread, 2000)])
    )
    fp, fn = _counts(s0, s1, grid)
    fpr = np.maximum(fp / len(s0), scipy.stats.norm.sf(grid, m0, sd0))
    fnr = np.maximum(fn / len(s1), scipy.stats.norm.cdf(grid, m1, sd1))
    eps, _, _ = _epsilon_lb(np.round(fpr * n0), n0, np.round(fnr * n1), n1, delta, alpha)
    i = int(np.argmax(eps))
    return float(grid[i]), float(eps[i])


def _analyse(
    x0: np.ndarray, x1: np.ndarray, relevant: np.ndarray, delta: float, alpha: float
) -> dict[str, Any]:
    """Choose statistic and threshold on the first half of each world, bound ε on the second."""
    h0, h1 = len(x0) // 2, len(x1) // 2
    sel0, ev0, sel1, ev1 = x0[:h0], x0[h0:], x1[:h1], x1[h1:]
    shift = sel1.mean(axis=0) - sel0.mean(axis=0)
    candidates: dict[str, np.ndarray] = {}
    if np.any(relevant):
        candidates["sum_canary_coordinates"] = relevant.astype(np.float64)
        candidates["-sum_canary_coordinates"] = -relevant.astype(np.float64)
    candidates["linear_estimated_shift"] = shift
    best: tuple[float, str, float] | None = None
    for name, w in candidates.items():
        t, score = _best_threshold(sel0 @ w, sel1 @ w, len(ev0), len(ev1), delta, alpha)
        if best is None or score > best[0]:
            best = (score, name, t)
    assert best is not None
    _, name, t = best
    w = candidates[name]
    fp, fn = _counts(ev0 @ w, ev1 @ w, np.array([t]))
    eps, fpr_ub, fnr_ub = _epsilon_lb(fp, len(ev0), fn, len(ev1), delta, alpha)
    lb = float(eps[0])
    return {
        "epsilon_lower_bound": max(0.0, lb),
        "threshold": t,
        "statistic": name,
        "weights": [float(v) for v in w],
        "eval_trials_per_world": min(len(ev0), len(ev1)),
        "false_positives": int(fp[0]),
        "false_negatives": int(fn[0]),
        "fpr_upper": float(fpr_ub[0]),
        "fnr_upper": float(fnr_ub[0]),
    }


# --------------------------------------------------------------------------------------------
# the audit
# --------------------------------------------------------------------------------------------


def audit(
    config: AuditConfig,
    trials: int,
    alpha: float = 0.05,
    *,
    bug: Bug | None = None,
    workers: int = 1,
) -> AuditResult:
    """Run ``trials`` runs of each neighbouring stream and bound ε from below (confidence 1−α).

    ``bug`` selects a deliberately broken build (power tests; see the module doc). ``workers > 1``
    spreads the trials over spawned processes (each with its own OS CSPRNG draws).
    """
    if trials < 4:
        raise ValueError(f"trials must be >= 4, got trials={trials}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got alpha={alpha}")
    if bug is not None and bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; known: {', '.join(BUGS)}")
    if bug == "coverage_sensitivity_ignored" and config.coverage_rho is None:
        raise ValueError("bug coverage_sensitivity_ignored needs coverage_rho (coverage on)")
    if bug == "population_noise_per_node" and config.population_epoch_days is None:
        raise ValueError("bug population_noise_per_node needs population_epoch_days")
    started = time.perf_counter()
    sc = _build(config, bug)
    params = sc.params
    workers = max(1, min(workers, trials // 2))
    if workers == 1:
        x0, x1, spent = _trials(config, trials, bug)
    else:
        sizes = [trials // workers + (1 if i < trials % workers else 0) for i in range(workers)]
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            parts = list(pool.map(_trials_star, [(config, n, bug) for n in sizes]))
        x0 = np.concatenate([p[0] for p in parts])
        x1 = np.concatenate([p[1] for p in parts])
        spent = parts[0][2]
    if not (np.isfinite(x0).all() and np.isfinite(x1).all()):
        raise RuntimeError("a release value is NaN or infinite")
    stats = _analyse(x0, x1, sc.relevant, params.delta, alpha)
    rho = params.rho_effective
    coverage = None
    if sc.coverage is not None and config.coverage_rho is not None:
        coverage = coverage_accounting(sc.coverage, config.coverage_rho)
        rho = float_up(Fraction(rho) + Fraction(config.coverage_rho))  # zCDP composition
    population = None
    if sc.population is not None:  # paid inside the filter: no ρ of its own (§2.12)
        population = population_accounting(sc.population, sc.queries, params)
    return AuditResult(
        epsilon_claimed=epsilon_from_rho_cks(rho, params.delta),
        delta=params.delta,
        trials=trials,
        alpha=alpha,
        bug=bug,
        rho_claimed=rho,
        coverage=coverage,
        population_estimate=population,
        sigma=params.sigma_released,
        mechanism=params.mechanism,
        canary_spent_fraction=spent / params.budget_units,
        seconds=time.perf_counter() - started,
        **stats,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streamfilter.verify.audit",
        description="Empirical privacy audit (neighbouring streams, Clopper–Pearson ε lower bound).",
    )
    parser.add_argument("--trials", type=int, default=100_000, help="runs of each stream")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument(
        "--bug", choices=["none", *BUGS, "all"], default="none", help="audit a broken build"
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rho", type=float, default=AuditConfig.rho)
    parser.add_argument("--delta", type=float, default=AuditConfig.delta)
    parser.add_argument("--days", type=int, default=AuditConfig.days)
    parser.add_argument("--mechanism", default=AuditConfig.mechanism)
    parser.add_argument(
        "--coverage-rho", type=float, default=None, help="audit the run with coverage on"
    )
    parser.add_argument(
        "--population-epoch-days",
        type=int,
        default=None,
        help="audit the run with the population estimate on (its first epoch)",
    )
    args = parser.parse_args(argv)
    config = AuditConfig(
        rho=args.rho,
        delta=args.delta,
        days=args.days,
        mechanism=args.mechanism,
        coverage_rho=args.coverage_rho,
        population_epoch_days=args.population_epoch_days,
    )
    needs = {
        "coverage_sensitivity_ignored": args.coverage_rho,
        "population_noise_per_node": args.population_epoch_days,
    }
    known = [b for b in BUGS if needs.get(b, True)]
    bugs: list[Bug | None] = (
        [None, *known] if args.bug == "all" else [None if args.bug == "none" else args.bug]
    )
    results = [
        audit(config, args.trials, args.alpha, bug=b, workers=args.workers).to_json_dict()
        for b in bugs
    ]
    json.dump(results[0] if len(results) == 1 else results, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
