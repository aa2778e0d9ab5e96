"""Tests for streamfilter.privacy.noise.

Statistical checks use fixed thresholds computed from the target distribution:
* chi-square goodness of fit on bins with >= 50 expected counts, failing at p < 1e-7;
* z-tests (variance, mean) failing beyond 6 standard errors (two-sided ~2e-9);
* exact binomial tests failing at p < 1e-7.
Each test makes at most ~10 such checks, so a correct sampler fails a test with probability
below 1e-6. Every check is also run on a deliberately wrong sampler with the same sample size,
to show that it has the power to catch a bug. Most tests use SeededRandomBits, so that they are
reproducible; a few use the OS CSPRNG on purpose.
"""

from __future__ import annotations

import ast
import math
import os
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from streamfilter.privacy import noise, normal
from streamfilter.privacy.discrete_gaussian_moments import (
    discrete_gaussian_variance,
)
from streamfilter.privacy.noise import (
    SeededRandomBits,
    SystemRandomBits,
    bernoulli_exp_neg,
    discrete_gaussian,
    discrete_gaussian_reference,
    discrete_laplace,
    gaussian,
    uniform_below,
)

P_CUT = 1e-7
Z_CUT = 6.0
N = 200_000  # samples per goodness-of-fit check
N_REF = 30_000  # samples from the (slow) scalar reference sampler

Cdf = Callable[[np.ndarray], np.ndarray]


# --- oracles (independent of the module under test) -----------------------------------------


class DiscreteGaussianOracle:
    """Exact pmf of N_Z(0, s2) by direct normalisation; normal CDF with continuity correction
    for huge s2 (the difference is O(1/s2), far below what any sample here can see)."""

    def __init__(self, s2: float) -> None:
        self.s2 = float(s2)
        self.sigma = math.sqrt(self.s2)
        self.direct = self.s2 <= 1e7
        if self.direct:
            self.lim = int(40 * self.sigma) + 40
            y = np.arange(-self.lim, self.lim + 1, dtype=np.float64)
            w = np.exp(-(y * y) / (2 * self.s2))
            self.pmf = w / math.fsum(w.tolist())
            self.cum = np.cumsum(self.pmf)

    def cdf(self, k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.int64)
        if self.direct:
            return self.cum[np.clip(k + self.lim, 0, 2 * self.lim)]
        return stats.norm.cdf((k + 0.5) / self.sigma)

    def moments(self) -> tuple[float, float]:
        """(E Z^2, E Z^4)."""
        if not self.direct:
            return self.s2, 3 * self.s2**2
        y = np.arange(-self.lim, self.lim + 1, dtype=np.float64)
        return float(np.sum(self.pmf * y**2)), float(np.sum(self.pmf * y**4))

    def candidate_edges(self) -> np.ndarray:
        span = 6 * self.sigma + 3
        return np.unique(np.round(np.linspace(-span, span, 241))).astype(np.int64)


def make_bins(cdf: Cdf, edges: np.ndarray, n: int, min_expected: float = 50.0):
    """Merge the cells (-inf, e0], (e0, e1], ..., (e_last, inf) until each expects >= 50."""
    f = np.concatenate([[0.0], cdf(edges), [1.0]])
    cell_p = np.diff(f)
    keep, acc = [], 0.0
    for i, p in enumerate(cell_p[:-1]):
        acc += p
        if acc * n >= min_expected:
            keep.append(i)
            acc = 0.0
    if keep and (acc + cell_p[-1]) * n < min_expected:
        keep.pop()  # last bin too small: merge it into the previous one
    chosen = edges[keep]
    probs = np.diff(np.concatenate([[0.0], cdf(chosen), [1.0]]))
    return chosen, probs


def bin_counts(samples: np.ndarray, edges: np.ndarray) -> np.ndarray:
    idx = np.searchsorted(edges, np.asarray(samples), side="left")
    return np.bincount(idx, minlength=edges.size + 1)


def gof_pvalue(samples: np.ndarray, cdf: Cdf, edges: np.ndarray) -> float:
    """Pearson chi-square goodness of fit of integer samples against an exact CDF."""
    samples = np.asarray(samples)
    chosen, probs = make_bins(cdf, edges, samples.size)
    assert chosen.size >= 1
    expected = probs * samples.size
    counts = bin_counts(samples, chosen)
    stat = float(np.sum((counts - expected) ** 2 / expected))
    return float(stats.chi2.sf(stat, probs.size - 1))


def dg_gof_pvalue(samples: np.ndarray, s2: float) -> float:
    o = DiscreteGaussianOracle(s2)
    return gof_pvalue(samples, o.cdf, o.candidate_edges())


def two_sample_pvalue(a, b, s2: float) -> float:
    """Chi-square test that two integer samples share one distribution (bins from N_Z(0, s2))."""
    o = DiscreteGaussianOracle(s2)
    chosen, _ = make_bins(o.cdf, o.candidate_edges(), min(len(a), len(b)))
    table = np.array([bin_counts(np.asarray(a), chosen), bin_counts(np.asarray(b), chosen)])
    return float(stats.chi2_contingency(table).pvalue)


def variance_z(samples: np.ndarray, s2: float) -> float:
    """z-score of mean(Z^2) against the exact variance; the standard error is from E Z^4."""
    o = DiscreteGaussianOracle(s2)
    var, m4 = o.moments()
    if o.direct:
        assert var == pytest.approx(discrete_gaussian_variance(int(s2)), rel=1e-12)
    y = np.asarray(samples, dtype=np.float64)
    return (float(np.mean(y * y)) - var) / math.sqrt((m4 - var * var) / y.size)


def mean_z(samples: np.ndarray, s2: float) -> float:
    y = np.asarray(samples, dtype=np.float64)
    return float(np.mean(y)) / math.sqrt(DiscreteGaussianOracle(s2).moments()[0] / y.size)


def dlap_cdf(t: int) -> Cdf:
    q = math.exp(-1.0 / t)

    def cdf(k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        return np.where(k >= 0, 1.0 - q ** (k + 1) / (1 + q), q ** (-k) / (1 + q))

    return cdf


def uniform_cdf(n: int) -> Cdf:
    return lambda k: np.clip((np.asarray(k, dtype=np.float64) + 1) / n, 0.0, 1.0)


class ScriptedBits:
    """Returns the scripted words first, then seeded words: drives rare branches on purpose."""

    def __init__(self, words: list[int]) -> None:
        self.words = list(words)
        self.rest = SeededRandomBits(99)

    def uint64(self, size: int) -> np.ndarray:
        head, self.words = self.words[:size], self.words[size:]
        tail = self.rest.uint64(size - len(head))
        return np.concatenate([np.array(head, dtype=np.uint64), tail])


# --- the module boundary ----------------------------------------------------------------------


def _imports(path: str) -> set[str]:
    """The modules a file imports: top-level names, or the full name of a streamfilter one."""
    imported = set()
    for node in ast.walk(ast.parse(Path(path).read_text())):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        imported |= {n if n.startswith("streamfilter.") else n.split(".")[0] for n in names}
    return imported


def test_module_is_pure_numpy_and_stdlib():
    """The sampler needs numpy and the standard library, and from the project only the
    discrete Gaussian's moments (for batch sizing), which need only the normal quantile (itself
    standard library only)."""
    stdlib = {"__future__", "functools", "math", "os", "fractions", "statistics", "typing"}
    moments = "streamfilter.privacy.discrete_gaussian_moments"
    imported = _imports(noise.__file__)
    assert imported <= stdlib | {"numpy", moments}
    assert not imported & {"sqlite3", "kafka", "prometheus_client", "scipy"}
    from streamfilter.privacy import discrete_gaussian_moments

    assert _imports(discrete_gaussian_moments.__file__) <= stdlib | {
        "numpy",
        "streamfilter.privacy.normal",
    }
    assert _imports(normal.__file__) <= {"__future__", "math"}


# --- random bit sources -------------------------------------------------------------------------


def test_system_bits_shape_dtype_and_freshness():
    bits = SystemRandomBits()
    a, b = bits.uint64(16), bits.uint64(16)
    assert a.dtype == np.uint64 and a.shape == (16,) and a.flags.writeable
    assert not np.array_equal(a, b)
    assert bits.uint64(0).shape == (0,)


def test_seeded_bits_are_reproducible():
    a = discrete_gaussian(SeededRandomBits(1), 4_194_304, 1000)
    b = discrete_gaussian(SeededRandomBits(1), 4_194_304, 1000)
    c = discrete_gaussian(SeededRandomBits(2), 4_194_304, 1000)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert SeededRandomBits(1).uint64(5).tolist() == SeededRandomBits(1).uint64(5).tolist()


def _noise(bits) -> bytes:  # both the scalar (size <= 8) and the vectorised path
    return b"".join(discrete_gaussian(bits, 4_194_304, n).tobytes() for n in (8, 64))


def _draw_in_child(bits) -> tuple[bytes, bytes]:
    """(bytes drawn by a fork()ed child, bytes drawn by the parent afterwards)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            data = bits.uint64(4).tobytes() + _noise(bits)
            os.write(w, data)
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 4096):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    mine = bits.uint64(4).tobytes() + _noise(bits)
    return b"".join(chunks), mine


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_draws_different_noise():
    child, parent = _draw_in_child(SystemRandomBits())
    assert len(child) == len(parent) == 32 + 8 * (8 + 64)
    assert child[:32] != parent[:32]  # raw words
    assert child[32:] != parent[32:]  # noise
    # the hazard this guards against: a seeded PRNG's state is copied by fork()
    child, parent = _draw_in_child(SeededRandomBits(5))
    assert child == parent


# --- uniform_below --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 1000, 4097, 1_000_003, 3 * 2**28 + 1])
def test_uniform_below_small_bounds_are_uniform(n):
    # covers the 8-, 16-, 32- and 64-bit field widths
    x = uniform_below(SeededRandomBits(n), n, N)
    assert x.dtype == np.int64 and x.min() >= 0 and x.max() < n
    if n == 1:
        assert not x.any()
        return
    edges = np.unique(np.linspace(0, n - 1, 60).astype(np.int64))[:-1]
    assert gof_pvalue(x, uniform_cdf(n), edges) > P_CUT


@pytest.mark.parametrize("n", [2**62, 3 * 2**60, 2**62 - 1, 2**61 + 12345])
def test_uniform_below_huge_bounds(n):
    x = uniform_below(SeededRandomBits(7), n, N)
    assert x.min() >= 0 and x.max() < n
    # equal-width bins (with exact integer edges): fractions must be uniform
    edges = np.array([n * j // 16 - 1 for j in range(1, 16)], dtype=np.int64)
    assert gof_pvalue(x, lambda k: (np.asarray(k, dtype=np.float64) + 1) / n, edges) > P_CUT


def test_uniform_below_per_element_bounds():
    bounds = np.array([1, 2, 3, 1000, 2**40 + 1, 2**62], dtype=np.int64)
    n = np.tile(bounds, N // bounds.size)
    x = uniform_below(SeededRandomBits(3), n, n.size)
    assert np.all((x >= 0) & (x < n))
    assert not x[n == 1].any()
    assert gof_pvalue(x[n == 3], uniform_cdf(3), np.array([0, 1])) > P_CUT
    x1000 = x[n == 1000]
    assert gof_pvalue(x1000, uniform_cdf(1000), np.arange(49, 999, 50)) > P_CUT


@pytest.mark.parametrize("k", [8, 16])
def test_uniform_field_mapping_is_exactly_uniform(k):
    # exhaustive: every k-bit field once; accepted fields must hit each value equally often
    w = np.arange(2**k, dtype=np.uint64)
    for n in [*range(1, 2 ** (k - 4) + 1, 1 if k == 8 else 97), 2 ** (k - 4)]:
        for nn in (n, np.full(w.size, n, dtype=np.uint64)):  # scalar and per-element code
            val, bad = noise._fields_below(w, nn, k)
            counts = np.bincount(val[~bad].astype(np.int64), minlength=n)
            assert counts.size == n and np.all(counts == 2**k // n), (k, n)


def test_uniform_test_has_power_against_modulo_bias():
    bits = SeededRandomBits(4)
    biased = bits.uint64(N) % np.uint64(256) % np.uint64(100)  # 8-bit modulo: low values 3/256
    edges = np.arange(9, 99, 10)
    assert gof_pvalue(biased.astype(np.int64), uniform_cdf(100), edges) < P_CUT
    good = uniform_below(bits, 100, N)
    assert gof_pvalue(good, uniform_cdf(100), edges) > P_CUT


@pytest.mark.parametrize(
    ("n", "size", "exc"),
    [
        (0, 5, ValueError),
        (2**62 + 1, 5, ValueError),
        (np.array([3, 0]), 2, ValueError),
        (np.array([3, 4]), 3, ValueError),
        (np.array([1.5, 2.0]), 2, TypeError),
        (3, -1, ValueError),
    ],
)
def test_uniform_below_rejects_bad_arguments(n, size, exc):
    with pytest.raises(exc):
        uniform_below(SeededRandomBits(0), n, size)


# --- bernoulli_exp_neg --------------------------------------------------------------------


def _binom_p(hits: np.ndarray, p: float) -> float:
    return float(stats.binomtest(int(hits.sum()), hits.size, p).pvalue)


@pytest.mark.parametrize(
    ("num", "den"),
    [
        (1, 2),
        (1, 1),
        (5, 2),
        (7, 3),
        (10, 1),
        (3 * 2**60, 2**62 - 1),  # den*K overflows 2**62: the product split of Alg. 1
        (2**62, 2**61 + 1),  # x ~ 2 with a huge denominator
        (2**63 - 1, 2**62),  # x ~ 2 from the largest num
    ],
)
def test_bernoulli_exp_neg_frequency(num, den):
    p = math.exp(-num / den)
    hits = bernoulli_exp_neg(
        SeededRandomBits(num % 1000), np.full(N, num, dtype=np.uint64), np.full(N, den)
    )
    assert hits.dtype == np.bool_ and hits.shape == (N,)
    assert _binom_p(hits, p) > P_CUT


def test_bernoulli_exp_neg_zero_is_certain_and_mixed_arrays_work():
    assert bernoulli_exp_neg(SeededRandomBits(0), np.zeros(1000, dtype=np.int64), 7).all()
    num = np.tile(np.array([0, 1, 3, 9, 20]), N // 5)
    den = np.tile(np.array([5, 3, 2, 4, 5]), N // 5)
    hits = bernoulli_exp_neg(SeededRandomBits(1), num, den)
    for j in range(5):
        assert _binom_p(hits[j::5], math.exp(-num[j] / den[j])) > P_CUT
    scalar_den = bernoulli_exp_neg(SeededRandomBits(2), np.full((400, 500), 3), 2)
    assert scalar_den.shape == (400, 500)
    assert _binom_p(scalar_den.ravel(), math.exp(-1.5)) > P_CUT


def test_bernoulli_test_has_power_against_5_percent_error():
    wrong = bernoulli_exp_neg(SeededRandomBits(3), np.full(N, 21), np.full(N, 20))  # exp(-1.05)
    assert _binom_p(wrong, math.exp(-1.0)) < P_CUT


def test_exp_minus_one_rare_branches_are_exact():
    # White-box: Bernoulli(exp(-1)) reads a 32-bit field W (the low half of a word); W >= M is
    # redrawn; W = 0 < M/11! means the first 11 coins of Alg. 1 were all 1, and the loop goes on
    # at K = 12 with Bernoulli(1/K) = [uniform(K) == 0], uniform(K) from an 8-bit field f by
    # Lemire's method: value (f*K) >> 8, rejected if (f*K) mod 256 < 256 mod K.
    def one(words):
        return noise._bern_exp_neg_one(ScriptedBits(words), 1).tolist()

    assert noise._E1_N == 11
    assert one([0, 0x81]) == [False]  # uniform(12) = 6: stop at K = 12 (even)
    assert one([0, 0x01, 0x81]) == [True]  # uniform(12) = 0, uniform(13) = 6: stop at K = 13
    assert one([0xFFFF_FFFF, 0, 0x81]) == [False]  # W >= M redrawn
    assert one([0, 0x00, 0x81]) == [False]  # f = 0 rejected (0 < 256 mod 12) and redrawn
    assert one([noise._E1_M - 1]) == [False]  # W >= M/2: K* = 2
    assert one([noise._E1_M // 2 - 1]) == [True]  # M/6 <= W < M/2: K* = 3


def test_bernoulli_exp_neg_rejects_bad_arguments():
    bits = SeededRandomBits(0)
    with pytest.raises(ValueError):
        bernoulli_exp_neg(bits, np.array([-1]), np.array([1]))
    with pytest.raises(ValueError):
        bernoulli_exp_neg(bits, np.array([1]), np.array([0]))
    with pytest.raises(ValueError):
        bernoulli_exp_neg(bits, np.array([1]), 2**62 + 1)
    with pytest.raises(TypeError):
        bernoulli_exp_neg(bits, np.array([0.5]), 1)


# --- discrete Laplace -------------------------------------------------------------------------


@pytest.mark.parametrize("t", [1, 3, 2049])
def test_discrete_laplace_matches_exact_pmf(t):
    y = discrete_laplace(SeededRandomBits(t), t, N)
    assert y.dtype == np.int64 and y.shape == (N,)
    span = 12 * t + 3
    edges = np.unique(np.round(np.linspace(-span, span, 241))).astype(np.int64)
    assert gof_pvalue(y, dlap_cdf(t), edges) > P_CUT
    # power: a shift by one, and the scale of t + 1 or 1.2 t, are caught
    assert gof_pvalue(y + 1, dlap_cdf(t), edges) < P_CUT or t > 3  # (invisible at t = 2049)
    wrong = discrete_laplace(SeededRandomBits(0), max(t + 1, t * 6 // 5), N)
    assert gof_pvalue(wrong, dlap_cdf(t), edges) < P_CUT


# --- discrete Gaussian: distribution ----------------------------------------------------------


SMALL = [1, 2, 3, 50]


@pytest.mark.parametrize("s2", [*SMALL, 10**6, 4_194_304, 2**29 + 12345, 2**31 + 7])
def test_discrete_gaussian_matches_exact_pmf(s2):
    # 2**29 + 12345 mixes the direct and decomposed tiers in one batch; 2**31 + 7 is decomposed.
    z = discrete_gaussian(SeededRandomBits(s2 % 1000), s2, N)
    assert z.dtype == np.int64 and z.shape == (N,)
    assert dg_gof_pvalue(z, s2) > P_CUT
    assert abs(variance_z(z, s2)) < Z_CUT
    assert abs(mean_z(z, s2)) < Z_CUT
    # symmetric: P(Z > 0) = P(Z < 0)
    pos, neg = int(np.sum(z > 0)), int(np.sum(z < 0))
    assert stats.binomtest(pos, pos + neg, 0.5).pvalue > P_CUT


@pytest.mark.parametrize(("s2", "size"), [(2, 1), (4_194_304, 8)])
def test_small_calls_use_the_scalar_path_and_are_exact(s2, size):
    bits = SeededRandomBits(s2 + size)
    z = np.concatenate([discrete_gaussian(bits, s2, size) for _ in range(20_000 // size)])
    assert z.dtype == np.int64
    assert dg_gof_pvalue(z, s2) > P_CUT
    assert abs(variance_z(z, s2)) < Z_CUT


def test_discrete_gaussian_with_os_bits():
    z = discrete_gaussian(SystemRandomBits(), 50, N)
    assert dg_gof_pvalue(z, 50) > P_CUT


@pytest.mark.parametrize("s2", [1, 2, 50])
def test_same_checks_catch_a_shift_by_one(s2):
    z = discrete_gaussian(SeededRandomBits(11), s2, N) + 1
    assert dg_gof_pvalue(z, s2) < P_CUT
    assert abs(mean_z(z, s2)) > Z_CUT
    pos, neg = int(np.sum(z > 0)), int(np.sum(z < 0))
    assert stats.binomtest(pos, pos + neg, 0.5).pvalue < P_CUT


@pytest.mark.parametrize("s2", [1, 50, 10**6])
def test_same_checks_catch_variance_off_by_20_percent(s2):
    wrong_s2 = Fraction(6, 5) * s2
    if wrong_s2.denominator == 1:
        z = discrete_gaussian(SeededRandomBits(12), int(wrong_s2), N)
    else:
        z = np.array(discrete_gaussian_reference(SeededRandomBits(12), wrong_s2, N))
    assert dg_gof_pvalue(z, s2) < P_CUT
    assert abs(variance_z(z, s2)) > Z_CUT


def test_same_checks_catch_a_rounded_continuous_gaussian():
    # a plausible approximation (round(N(0, 1))) is not N_Z(0, 1): the tests tell them apart
    z = np.round(gaussian(SeededRandomBits(13), 1.0, N)).astype(np.int64)
    assert dg_gof_pvalue(z, 1) < P_CUT
    assert abs(variance_z(z, 1)) > Z_CUT


@pytest.mark.parametrize("s2", [1, 2, 50, 10**6])
def test_vectorised_agrees_with_reference_sampler(s2):
    ref = discrete_gaussian_reference(SeededRandomBits(21), Fraction(s2), N_REF)
    assert all(type(v) is int for v in ref)
    vec = discrete_gaussian(SeededRandomBits(22), s2, N)
    assert two_sample_pvalue(ref, vec, s2) > P_CUT
    assert dg_gof_pvalue(np.array(ref), s2) > P_CUT


def test_two_sample_check_has_power():
    ref = discrete_gaussian_reference(SeededRandomBits(23), Fraction(60), N_REF)  # 1.2 x 50
    vec = discrete_gaussian(SeededRandomBits(24), 50, N)
    assert two_sample_pvalue(ref, vec, 50) < P_CUT


@pytest.mark.parametrize("s2", [1, 2, 50, 10**6])
def test_decomposed_tier_matches_exact_pmf(monkeypatch, s2):
    # force the decomposed accept coin (and, for s2 = 1, 2, its Python-int fallback)
    monkeypatch.setattr(noise, "_DIRECT_DEN_MAX", 0)
    z = discrete_gaussian(SeededRandomBits(31), s2, N)
    assert dg_gof_pvalue(z, s2) > P_CUT
    assert abs(variance_z(z, s2)) < Z_CUT


@pytest.mark.parametrize("fold_max", [2**62, 0])
@pytest.mark.parametrize(("q", "r", "t", "s2"), [(2, 1, 2, 3), (0, 5, 7, 1), (40, 3, 4, 41)])
def test_decomposed_second_factor_is_exact(q, r, t, s2, fold_max):
    # Bernoulli(exp(-g)), g = (r/t)(2q + r/t)/(2 s2); fold_max = 0 draws every 1/K separately
    g = Fraction(r, t) * (2 * q + Fraction(r, t)) / (2 * s2)
    assert g <= 1
    u64 = np.full(N, q, dtype=np.uint64), np.full(N, r, dtype=np.uint64)
    hits = noise._bern_g(SeededRandomBits(q + r), *u64, t, s2, fold_max=fold_max)
    assert _binom_p(hits, math.exp(-float(g))) > P_CUT


def test_reference_sampler_with_rational_variance():
    s2 = Fraction(5, 2)
    z = np.array(discrete_gaussian_reference(SeededRandomBits(41), s2, N_REF))
    assert dg_gof_pvalue(z, float(s2)) > P_CUT
    tiny = discrete_gaussian_reference(SeededRandomBits(42), Fraction(1, 100), 2000)
    assert set(tiny) <= {-1, 0, 1} and tiny.count(0) > 1900  # P(|Z| = 1) ~ 4e-22


def test_huge_variance_runs_with_the_right_scale():
    s2 = 2**40
    z = discrete_gaussian(SeededRandomBits(51), s2, N)
    assert z.dtype == np.int64
    assert dg_gof_pvalue(z, s2) > P_CUT
    assert abs(variance_z(z, s2)) < Z_CUT
    assert abs(mean_z(z, s2)) < Z_CUT
    wrong = discrete_gaussian(SeededRandomBits(52), s2 + s2 // 5, N)
    assert abs(variance_z(wrong, s2)) > Z_CUT


@pytest.mark.parametrize("s2", [2**60, 2**62])
def test_largest_variances_run(s2):
    n = 20_000 if s2 <= 2**60 else 2000  # above 2**60 the scalar sampler is used
    z = discrete_gaussian(SeededRandomBits(53), s2, n)
    assert z.dtype == np.int64 and z.shape == (n,)
    assert abs(variance_z(z, s2)) < Z_CUT


def test_discrete_gaussian_sizes_and_arguments():
    bits = SeededRandomBits(0)
    assert discrete_gaussian(bits, 10, 0).shape == (0,)
    assert discrete_gaussian(bits, 10, 0).dtype == np.int64
    assert discrete_gaussian(bits, 10, 1).shape == (1,)
    assert discrete_gaussian(bits, 10, 100_000).shape == (100_000,)  # several batches
    for bad in (0, -3, 2**62 + 1):
        with pytest.raises(ValueError):
            discrete_gaussian(bits, bad, 3)
    for wrong_type in (2.0, True, Fraction(3)):
        with pytest.raises(TypeError):
            discrete_gaussian(bits, wrong_type, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        discrete_gaussian(bits, 10, -1)
    with pytest.raises(ValueError):
        discrete_gaussian_reference(bits, Fraction(0), 1)
    # tier 3 (Python integers) when |y| t would overflow 2**62: x ~ 2**81, so exp(-x) rejects
    huge = np.array([2**52, -(2**52), 2**61], dtype=np.int64)
    assert not noise._accept_alg3(bits, huge, 4_194_304, 2049).any()


# --- continuous Gaussian ------------------------------------------------------------------


def test_continuous_gaussian():
    x = gaussian(SeededRandomBits(61), 3.0, N + 1)
    assert x.dtype == np.float64 and x.shape == (N + 1,)
    assert np.array_equal(x, gaussian(SeededRandomBits(61), 3.0, N + 1))
    zs = x / 3.0
    assert abs(float(np.mean(zs * zs)) - 1.0) / math.sqrt(2.0 / zs.size) < Z_CUT
    assert stats.kstest(zs, "norm").pvalue > P_CUT
    assert stats.kstest(zs * 1.05, "norm").pvalue < P_CUT  # power
    assert not gaussian(SeededRandomBits(0), 0.0, 10).any()
    with pytest.raises(ValueError):
        gaussian(SeededRandomBits(0), math.nan, 1)
