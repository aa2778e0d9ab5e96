"""The binary-tree counter: exact structure, sensitivity (hence ρ), check-then-commit, and a
statistical test that the released error matches the stated σ (and that a wrong σ is caught)."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.privacy import continual
from streamfilter.privacy.continual import (
    BinaryTreeCounter,
    CounterExhausted,
    CounterState,
    discrete_gaussian_sum_halfwidth,
)
from streamfilter.privacy.discrete_gaussian_moments import (
    discrete_gaussian_halfwidth,
    discrete_gaussian_variance,
)
from streamfilter.privacy.noise import (
    SeededRandomBits,
    SystemRandomBits,
)


class ScriptedNoise:
    """Stands in for ``discrete_gaussian``: returns scripted integers and counts the draws."""

    def __init__(self, values=None):
        self.values = list(values) if values is not None else None
        self.calls = 0

    def __call__(self, bits, sigma2_units, size):
        assert size == 1
        self.calls += 1
        if self.values is None:
            return np.zeros(1, dtype=np.int64)
        return np.array([self.values.pop(0)], dtype=np.int64)


def run(counter, counts, bits=None):
    state = counter.initial_state()
    steps = []
    for x in counts:
        step = counter.step(state, x, bits or SeededRandomBits(0))
        steps.append(step)
        state = step.state
    return steps


@pytest.mark.parametrize("horizon", [1, 2, 3, 7, 8, 13, 64])
def test_without_noise_the_release_is_the_exact_prefix_sum(monkeypatch, horizon):
    noise = ScriptedNoise()
    monkeypatch.setattr(continual, "discrete_gaussian", noise)
    counter = BinaryTreeCounter(horizon=horizon, sigma2_units=9)
    counts = [(7 * t + 3) % 5 for t in range(horizon)]
    steps = run(counter, counts)
    assert [s.value for s in steps] == list(itertools.accumulate(counts))
    assert noise.calls == horizon  # exactly one node completes (and is noised) per step
    assert [s.nodes for s in steps] == [(t + 1).bit_count() for t in range(horizon)]


def test_the_error_is_the_sum_of_the_noise_of_the_nodes_in_the_decomposition(monkeypatch):
    # node noises 1, 10, 100, ... in completion order: node completing at step t gets 10^(t-1)
    horizon = 12
    monkeypatch.setattr(continual, "discrete_gaussian", ScriptedNoise([10**i for i in range(12)]))
    steps = run(BinaryTreeCounter(horizon=horizon, sigma2_units=4), [0] * horizon)
    for t, step in enumerate(steps, start=1):
        # decomposition of [1, t]: for each set bit of t, the node completing at t with lower bits cleared
        nodes = [(t >> i) << i for i in range(t.bit_length()) if (t >> i) & 1]
        assert step.value == sum(10 ** (end - 1) for end in nodes), t


@pytest.mark.parametrize("horizon", [4, 8, 11, 16, 32])
def test_one_departure_changes_at_most_levels_nodes_by_one(monkeypatch, horizon):
    """The sensitivity behind ρ = L/(2s²): neighbouring inputs (one extra unit at one step) give
    node values that differ in at most L = horizon.bit_length() nodes, each by exactly 1."""
    counter = BinaryTreeCounter(horizon=horizon, sigma2_units=4)
    rng = np.random.default_rng(horizon)
    base = [int(x) for x in rng.integers(0, 4, horizon)]
    noise = [int(x) for x in rng.integers(-9, 10, horizon)]

    def node_values(counts):
        monkeypatch.setattr(continual, "discrete_gaussian", ScriptedNoise(noise))
        out = {}
        for t, step in enumerate(run(counter, counts), start=1):
            i = (t & -t).bit_length() - 1
            out[(i, t)] = step.state.noisy[i]
        return out

    reference = node_values(base)
    worst = 0
    for leaf in range(horizon):
        neighbour = list(base)
        neighbour[leaf] += 1
        other = node_values(neighbour)
        diffs = [other[k] - reference[k] for k in reference if other[k] != reference[k]]
        assert all(d == 1 for d in diffs)
        assert len(diffs) <= counter.levels
        worst = max(worst, len(diffs))
    if horizon & (horizon - 1) == 0:
        assert worst == counter.levels  # a full tree: the bound is attained


@pytest.mark.parametrize("horizon", [1, 5, 16, 1000, 2**20])
@pytest.mark.parametrize("rho", [1e-4, 0.02, 0.5, 3.0])
def test_for_rho_takes_the_least_noise_that_gives_rho(horizon, rho):
    c = BinaryTreeCounter.for_rho(horizon, rho)
    exact = Fraction(c.levels, 2 * c.sigma2_units)
    assert exact <= Fraction(rho)
    assert c.rho >= float(exact) and c.rho <= rho
    if c.sigma2_units > 1:
        assert Fraction(c.levels, 2 * (c.sigma2_units - 1)) > Fraction(rho)


def test_check_then_commit_draws_nothing_on_invalid_steps(monkeypatch):
    noise = ScriptedNoise()
    monkeypatch.setattr(continual, "discrete_gaussian", noise)
    c = BinaryTreeCounter(horizon=2, sigma2_units=4)
    s0 = c.initial_state()
    for bad in (-1, 1.5, True, 2**60):
        with pytest.raises(ValueError, match="count"):
            c.step(s0, bad, SeededRandomBits(0))
    s2 = c.step(c.step(s0, 1, SeededRandomBits(0)).state, 2, SeededRandomBits(0)).state
    assert noise.calls == 2
    with pytest.raises(CounterExhausted):
        c.step(s2, 0, SeededRandomBits(0))
    assert noise.calls == 2 and s0 == c.initial_state()  # states are immutable values
    with pytest.raises(ValueError, match="levels"):
        BinaryTreeCounter(horizon=8, sigma2_units=4).step(s2, 0, SeededRandomBits(0))


def test_state_round_trips_and_inconsistent_states_are_refused():
    c = BinaryTreeCounter(horizon=16, sigma2_units=25)
    steps = run(c, [3, 0, 2, 5, 1])
    state = steps[-1].state
    again = CounterState.from_json(state.to_json())
    assert again == state
    c.check_state(again)
    with pytest.raises(ValueError, match="bit"):  # t = 5 = 0b101: level 1 must be empty
        c.check_state(CounterState(t=5, exact=(1, 4, 2, 0, 0), noisy=(1, 4, 2, 0, 0)))
    for bad in ('{"t": 1}', '{"t": 1, "exact": [1.5], "noisy": [1]}', "[]"):
        with pytest.raises(ValueError):
            CounterState.from_json(bad)
    with pytest.raises(ValueError, match="horizon"):
        BinaryTreeCounter(horizon=0, sigma2_units=1)
    with pytest.raises(ValueError, match="rho"):
        BinaryTreeCounter.for_rho(8, 0.0)


@pytest.mark.parametrize("s2", [1, 4, 50, 1000])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_sum_halfwidth_is_the_smallest_covering_integer(s2, k):
    h = discrete_gaussian_sum_halfwidth(s2, k)
    if k == 1:
        assert h == discrete_gaussian_halfwidth(s2)
    m = math.isqrt(2 * s2 * 60) + 2
    z = np.arange(-m, m + 1)
    one = np.exp(-(z * z) / (2.0 * s2))
    one /= one.sum()
    pmf = one
    for _ in range(k - 1):
        pmf = np.convolve(pmf, one)
    centre = (len(pmf) - 1) // 2

    def cover(x):
        return pmf[centre - x : centre + x + 1].sum()

    assert cover(h) >= 0.95
    assert h == 0 or cover(h - 1) < 0.95


def test_sum_halfwidth_large_sigma_matches_the_normal_approximation():
    s2 = 10**6
    for k in (2, 4):
        h = discrete_gaussian_sum_halfwidth(s2, k)
        assert abs(h - 1.959964 * math.sqrt(k * s2)) <= 2


# -- the released error matches the stated σ ------------------------------------------------

HORIZON = 16
RUNS = 1200
S2 = 50  # per-node variance (σ ≈ 7.07): DG moments equal the Gaussian's to ~e^-987
ALPHA = 1e-7  # per-side, per-statistic tail: total false-alarm probability < 1e-6


def _errors(bits):
    counter = BinaryTreeCounter(horizon=HORIZON, sigma2_units=S2)
    rng = np.random.default_rng(12345)
    errors = np.zeros((RUNS, HORIZON))
    for r in range(RUNS):
        state = counter.initial_state()
        cum = 0
        for t in range(HORIZON):
            x = int(rng.poisson(3.0))
            step = counter.step(state, x, bits)
            state = step.state
            cum += x
            errors[r, t] = step.value - cum
    sigmas = np.array([counter.sigma(t) for t in range(1, HORIZON + 1)])
    halfwidths = np.array([counter.halfwidth(t) for t in range(1, HORIZON + 1)])
    return counter, errors, sigmas, halfwidths


def _covariance(v):
    """Cov of the release errors: releases t and u share the nodes common to both
    decompositions, each of variance v."""

    def nodes(t):
        return {((t >> i) << i, i) for i in range(t.bit_length()) if (t >> i) & 1}

    dec = [nodes(t) for t in range(1, HORIZON + 1)]
    return np.array([[v * len(a & b) for b in dec] for a in dec])


def _per_day_statistic(errors, sigmas):
    """max over days of |Σ_r z² − R| / sqrt(2R): each day's sum is χ²_R under a correct σ."""
    s = ((errors / sigmas) ** 2).sum(axis=0)
    lo, hi = scipy.stats.chi2.ppf([ALPHA / HORIZON, 1 - ALPHA / HORIZON], RUNS)
    return s, lo, hi


def _pooled_statistic(errors, cov):
    """Σ_r e_rᵀ Σ⁻¹ e_r ~ χ²_{R·T} under the mechanism's covariance (the days are correlated
    through shared nodes, so they are whitened)."""
    inv = np.linalg.inv(cov)
    q = float(np.einsum("rt,tu,ru->", errors, inv, errors))
    lo, hi = scipy.stats.chi2.ppf([ALPHA, 1 - ALPHA], RUNS * HORIZON)
    return q, lo, hi


@pytest.fixture(scope="module")
def observed():
    return _errors(SystemRandomBits())


def test_released_error_matches_the_stated_sigma(observed):
    _, errors, sigmas, halfwidths = observed
    v = discrete_gaussian_variance(S2)
    cov = _covariance(v)
    np.testing.assert_allclose(sigmas**2, np.diag(cov), rtol=1e-12)  # stated σ = mechanism's
    s, lo, hi = _per_day_statistic(errors, sigmas)
    assert ((lo <= s) & (s <= hi)).all(), (s / RUNS, lo / RUNS, hi / RUNS)
    q, lo, hi = _pooled_statistic(errors, cov)
    assert lo <= q <= hi, (q / (RUNS * HORIZON), lo, hi)
    assert abs(errors.mean()) < 6 * math.sqrt(cov.sum()) / HORIZON / math.sqrt(RUNS)
    coverage = (np.abs(errors) <= halfwidths).mean()
    assert 0.95 - 6 * math.sqrt(0.05 * 0.95 / RUNS) <= coverage <= 0.975


def test_a_wrong_sigma_is_detected(observed):
    _, errors, _, _ = observed
    v = discrete_gaussian_variance(S2)
    # 1. a plausible bug: stating one node's σ for every release, whatever popcount(t)
    s, lo, hi = _per_day_statistic(errors, np.full(HORIZON, math.sqrt(v)))
    assert not ((lo <= s) & (s <= hi)).all()
    # 2. σ off by 10% either way (e.g. a calibration slip): the pooled test rejects both
    for scale in (0.9, 1.1):
        q, lo, hi = _pooled_statistic(errors, _covariance(v * scale**2))
        assert not lo <= q <= hi, scale


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2000), st.integers(1, 2000), st.integers(0, 2**32 - 1))
def test_fft_convolve_is_the_convolution(n, m, seed):
    """``fft_convolve`` is the direct convolution to round-off (``np.convolve``, exact sums
    of products up to rounding): within 1e-12 of the largest term."""
    rng = np.random.default_rng(seed)
    a, b = rng.random(n), rng.random(m)
    direct = np.convolve(a, b)
    got = continual.fft_convolve(a, b)
    assert got.shape == direct.shape
    assert np.abs(got - direct).max() <= 1e-12 * direct.max()


def test_the_half_widths_are_those_of_scipy_fftconvolve():
    """The published half-widths (integers read off the convolved pmf) are those computed with
    ``scipy.signal.fftconvolve``, on σ² from 1 to 10^6 (exact and normal branches), 2 to 16
    releases summed and three coverages — a different FFT moves them only at a tie within
    ~1e-15 of the coverage."""
    import scipy.signal

    rng = np.random.default_rng(11)
    sigma2 = [1, 2, 5, 50, 1000, 10**5, *rng.integers(1, 10**5, 6).tolist()]
    cases = [(int(s2), k, c) for s2 in sigma2 for k in (2, 3, 5, 16) for c in (0.9, 0.95, 0.99)]
    ours = []
    for s2, k, c in cases:
        continual.discrete_gaussian_sum_halfwidth.cache_clear()
        ours.append(continual.discrete_gaussian_sum_halfwidth(s2, k, c))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(continual, "fft_convolve", scipy.signal.fftconvolve)
        for (s2, k, c), h in zip(cases, ours, strict=True):
            continual.discrete_gaussian_sum_halfwidth.cache_clear()
            assert continual.discrete_gaussian_sum_halfwidth(s2, k, c) == h, (s2, k, c)
    continual.discrete_gaussian_sum_halfwidth.cache_clear()
