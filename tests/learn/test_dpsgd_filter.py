"""DP-SGD with individual Rényi filters: every example charged at every step (sampled or not),
never beyond its budget at any order, dropped only when the next charge does not fit, plain
DP-SGD's guarantee, and the noise scale σC."""

import numpy as np
import pytest

from streamfilter.learn.data import digits, one_hot
from streamfilter.learn.dpsgd_filter import dpsgd_with_individual_filters, worst_case_budgets
from streamfilter.learn.models import SoftmaxRegression
from streamfilter.privacy.noise import SeededRandomBits
from streamfilter.privacy.subsampled import epsilon_from_rdp, rdp_poisson_gaussian
from tests.support.sigma_check import assert_sigma

ORDERS = (1.5, 2.0, 4.0, 8.0, 16.0, 32.0)


@pytest.fixture(scope="module")
def data():
    return digits()


def _run(data, steps, budgets, q=0.1, sigma=2.0, seed=1, lr=2.0):
    model = SoftmaxRegression(64, 10)
    return model, dpsgd_with_individual_filters(
        model,
        data.x_train,
        data.y_train,
        clip=1.0,
        noise_multiplier=sigma,
        sampling_rate=q,
        learning_rate=lr,
        steps=steps,
        budgets=budgets,
        delta=1e-5,
        orders=ORDERS,
        bits=SeededRandomBits(seed),
    )


def test_budgets_state_plain_dpsgd_guarantee_and_nobody_drops_within_t_steps(data):
    q, sigma, t = 0.1, 2.0, 30
    budgets = worst_case_budgets(q, sigma, t, ORDERS)
    plain = t * rdp_poisson_gaussian(q, sigma, ORDERS)
    assert np.all(budgets >= plain) and np.all(budgets <= plain * (1 + 1e-6))
    _, run = _run(data, t, budgets, q, sigma)
    assert run.active == [data.n_train] * t
    eps_plain = float(epsilon_from_rdp(plain, ORDERS, 1e-5))
    assert eps_plain <= run.epsilon <= eps_plain * (1 + 1e-6)


def test_every_example_is_charged_every_step_and_dropped_only_when_the_charge_does_not_fit(data):
    q, sigma, t = 0.05, 2.0, 60
    budgets = worst_case_budgets(q, sigma, t, ORDERS)
    _, one = _run(data, 1, budgets, q, sigma)
    # after one step every example has been charged, though only ≈ 5 % were sampled
    assert np.all(one.spent > 0)
    _, run = _run(data, 3 * t // 2, budgets, q, sigma)
    assert np.all(run.spent <= budgets[None, :] * (1 + 1e-12))  # never beyond any order's budget
    dropped = run.dropped_at > 0
    assert dropped.any() and (~dropped).any()
    assert run.dropped_at[dropped].min() > t  # nobody before step T
    # a dropped example stopped because one more worst-case step would not fit at some order
    worst = rdp_poisson_gaussian(q, sigma, ORDERS)
    assert np.all(np.any(run.spent[dropped] + worst > budgets, axis=1))
    assert run.active[-1] == int((~dropped).sum())
    assert np.all(np.diff(run.active) <= 0)


def test_noise_scale_is_the_noise_multiplier_times_the_clip(data):
    """q = 1 makes the gradient sum deterministic, so θ₁ − θ₀ reveals the noise. σ₀ = σ·C from
    the configuration (DP-SGD's N(0, σ²C²·I), Abadi et al. 2016). Two-sided χ² bounds (see
    sigma_check): a correct σ passes with probability 0.999, one off by √2 either way fails with
    probability >= 0.999."""
    sigma, clip, lr = 3.0, 1.0, 0.5
    model = SoftmaxRegression(64, 10)
    x, y = data.x_train[:200], data.y_train[:200]
    theta0 = model.init(np.random.default_rng(0))
    step = model.backward(theta0, x, one_hot(y, 10))
    norms = np.sqrt(step.grad_norm2())
    total = step.weighted_gradient_sum(np.where(norms > clip, clip / norms, 1.0))
    draws = []
    for seed in range(2):
        run = dpsgd_with_individual_filters(
            model,
            x,
            y,
            clip=clip,
            noise_multiplier=sigma,
            sampling_rate=1.0,
            learning_rate=lr,
            steps=1,
            budgets=worst_case_budgets(1.0, sigma, 1, ORDERS),
            delta=1e-5,
            orders=ORDERS,
            bits=SeededRandomBits(seed),
            params=theta0,
        )
        draws.append(-(run.params - theta0) * x.shape[0] / lr - total)
    assert_sigma(np.concatenate(draws), sigma * clip)
