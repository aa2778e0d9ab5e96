"""DP-SGD with individual accounting (Yu et al.): the ledger, its access rule, the rounding
direction, the released statistics."""

import math

import numpy as np
import pytest

from streamfilter.learn.data import digits
from streamfilter.learn.dpsgd import (
    DPSGDConfig,
    IndividualLedger,
    _grid_index,
    dpsgd_individual,
    release_epsilon_statistics,
)
from streamfilter.learn.models import SoftmaxRegression
from streamfilter.privacy.filters import ZCDPFilter
from streamfilter.privacy.noise import SeededRandomBits
from streamfilter.privacy.subsampled import epsilon_from_rdp, rdp_poisson_gaussian
from tests.support.sigma_check import assert_sigma

ORDERS = (2.0, 4.0, 8.0, 16.0, 32.0)


@pytest.fixture(scope="module")
def run():
    ds = digits()
    cfg = DPSGDConfig(
        clip=1.0,
        noise_multiplier=2.0,
        sampling_rate=256 / ds.n_train,
        steps=48,
        learning_rate=2.0,
        norm_every=6,
        orders=ORDERS,
    )
    model = SoftmaxRegression(64, 10)
    r = dpsgd_individual(
        model, ds.x_train, ds.y_train, cfg, delta=1e-5, bits=SeededRandomBits(4), exact_sample=100
    )
    return ds, cfg, model, r


def test_grid_rounds_up_and_caps_at_the_clip():
    norms = np.array([0.0, 0.001, 0.0100001, 0.5, 0.99, 1.0, 7.0])
    idx = _grid_index(norms, 1.0, 0.01)
    assert np.all(idx * 0.01 >= np.minimum(norms, 1.0) - 1e-15)  # never below the measured norm
    assert np.all(idx * 0.01 - np.minimum(norms, 1.0) < 0.01 + 1e-15)
    assert idx.tolist() == [0, 1, 2, 50, 99, 100, 100]


def test_individual_rdp_is_bounded_by_the_worst_case_and_estimates_track_exact(run):
    ds, cfg, _model, r = run
    worst_rdp = cfg.steps * rdp_poisson_gaussian(cfg.sampling_rate, cfg.noise_multiplier, ORDERS)
    eps = r.ledger.epsilons_nonprivate(public_benchmark_data=True)
    assert eps.shape == (ds.n_train,)
    assert np.all(eps <= r.worst_case_epsilon * (1 + 1e-9))
    assert r.worst_case_epsilon == pytest.approx(float(epsilon_from_rdp(worst_rdp, ORDERS, 1e-5)))
    assert eps.min() < 0.9 * r.worst_case_epsilon  # individual accounting finds smaller ε ...
    exact = np.asarray(epsilon_from_rdp(r.exact_rdp, ORDERS, 1e-5))
    assert np.corrcoef(eps[r.exact_indices], exact)[0, 1] > 0.95  # ... that track the exact ones
    # rounding up the same norms never lowers ε
    assert np.all(eps >= r.unrounded_epsilons * (1 - 1e-9))
    # rounding: at most ⌈C/r⌉ + 1 distinct evaluations for the whole run, n per refresh without
    assert r.evaluations["rounded"] <= 101
    assert r.evaluations["unrounded"] == ds.n_train * math.ceil(cfg.steps / cfg.norm_every)


def test_epsilon_is_released_to_its_owner_only(run):
    ds, _cfg, _model, r = run
    ledger = r.ledger
    with pytest.raises(PermissionError):
        ledger.epsilon_for(0, "guess")
    tokens = ledger.issue_tokens()
    with pytest.raises(RuntimeError, match="already"):
        ledger.issue_tokens()
    assert ledger.epsilon_for(5, tokens[5]) == pytest.approx(
        ledger.epsilons_nonprivate(public_benchmark_data=True)[5]
    )
    with pytest.raises(PermissionError, match="example 5"):
        ledger.epsilon_for(5, tokens[6])
    with pytest.raises(PermissionError):
        ledger.epsilon_for(ds.n_train, tokens[0])
    with pytest.raises(PermissionError, match="private"):
        ledger.epsilons_nonprivate()  # bulk access only when the caller says the data are public


def test_released_statistics_are_noisy_close_and_charged(run):
    ds, _cfg, _model, r = run
    budget = ZCDPFilter(0.05)
    true = r.ledger.epsilons_nonprivate(public_benchmark_data=True)
    stats = release_epsilon_statistics(
        r.ledger,
        budget,
        rho=0.02,
        epsilon_max=r.worst_case_epsilon,
        bins=40,
        bits=SeededRandomBits(1),
    )
    assert budget.spent == pytest.approx(0.02)
    assert stats.mean != true.mean()
    # noise sd of the mean: ε_max / sqrt(2·0.01) / n ≈ 0.03; 6 sd
    assert abs(stats.mean - true.mean()) < 6 * r.worst_case_epsilon / math.sqrt(0.02) / ds.n_train
    width = r.worst_case_epsilon / 40
    for p, v in stats.quantiles.items():
        assert abs(v - np.quantile(true, p)) < 6 * width + 0.05 * r.worst_case_epsilon
    with pytest.raises(ValueError, match="does not fit"):
        release_epsilon_statistics(r.ledger, budget, rho=0.04, epsilon_max=1.0)
    assert budget.spent == pytest.approx(0.02)  # nothing charged for the refusal


def test_ledger_and_config_validation():
    led = IndividualLedger(3, ORDERS, 1e-5)
    with pytest.raises(ValueError, match="rdp_rows"):
        led.add(-np.ones((3, len(ORDERS))))
    with pytest.raises(ValueError, match="sampling_rate"):
        DPSGDConfig(clip=1.0, noise_multiplier=1.0, sampling_rate=0.0, steps=1, learning_rate=1.0)
    with pytest.raises(ValueError, match="delta"):
        IndividualLedger(3, ORDERS, 0.0)


def test_released_statistics_name_replace_one_and_noise_matches_its_sensitivities(run):
    """The mean's and the histogram's noise against σ computed here from ρ and the replace-one
    sensitivities (sum: ε_max; histogram: √2), via σ = Δ/sqrt(2·ρ/2) (Gaussian mechanism,
    Bun & Steinke 2016, Prop. 1.6). Two-sided χ² bounds: a correct σ passes with probability
    0.999, a σ off by √2 either way fails with probability >= 0.999 (tests/support/sigma_check)."""
    ds, _cfg, _model, r = run
    rho, bins, releases = 2.0, 40, 300
    eps_max = r.worst_case_epsilon
    true = np.minimum(r.ledger.epsilons_nonprivate(public_benchmark_data=True), eps_max)
    counts, _ = np.histogram(true, bins=bins, range=(0.0, eps_max))
    budget = ZCDPFilter(rho * releases)
    bits = SeededRandomBits(11)
    sum_noise, hist_noise = [], []
    for _ in range(releases):
        stats = release_epsilon_statistics(
            r.ledger, budget, rho=rho, epsilon_max=eps_max, bins=bins, bits=bits
        )
        assert stats.adjacency == "replace-one"
        sum_noise.append(stats.mean * ds.n_train - true.sum())
        hist_noise.append(np.asarray(stats.noisy_histogram) - counts)
    # the clip of the mean to [0, ε_max] never binds here (noise sd ≈ ε_max·0.7/n of the mean)
    assert_sigma(np.array(sum_noise), eps_max / math.sqrt(2.0 * (rho / 2.0)))
    assert_sigma(np.concatenate(hist_noise), math.sqrt(2.0) / math.sqrt(2.0 * (rho / 2.0)))
