"""Models' per-example gradient norms, Algorithms 6 and 7, and their calibration."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.learn.calibration import plan_gd
from streamfilter.learn.data import digits, one_hot, synthetic
from streamfilter.learn.gd import DEFAULT_LATTICE, AccuracyChecks, private_gd, private_gd_filtered
from streamfilter.learn.models import MLP, SoftmaxRegression, per_example_gradients
from streamfilter.privacy.accounting import epsilon_from_rho_gdp, rho_for_sigma
from streamfilter.privacy.noise import SeededRandomBits

MODELS = [SoftmaxRegression(5, 3), MLP(5, 4, 3)]


def _numeric_grad(model, params, x, y, eps=1e-6):
    g = np.zeros_like(params)
    for j in range(params.size):
        e = np.zeros_like(params)
        e[j] = eps
        g[j] = (model.losses(params + e, x, y)[0] - model.losses(params - e, x, y)[0]) / (2 * eps)
    return g


@pytest.mark.parametrize("model", MODELS, ids=["softmax", "mlp"])
def test_outer_product_norms_and_sums_equal_explicit_per_example_gradients(model):
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(7, 5)), rng.integers(0, 3, 7)
    params = model.init(rng) + 0.3 * rng.normal(size=model.n_params)
    step = model.backward(params, x, one_hot(y, 3))
    explicit = per_example_gradients(step)
    # the explicit per-example gradient is the true gradient of that example's loss
    np.testing.assert_allclose(explicit[2], _numeric_grad(model, params, x[2:3], y[2:3]), atol=1e-6)
    np.testing.assert_allclose(step.grad_norm2(), (explicit**2).sum(axis=1), rtol=1e-12)
    w = rng.random(7)
    np.testing.assert_allclose(step.weighted_gradient_sum(w), w @ explicit, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("model", MODELS, ids=["softmax", "mlp"])
def test_algorithm_7_with_b_norm_k_c2_and_k_max_k_is_algorithm_6(model):
    """The paper's remark after Algorithm 7: identical iterates under one seed."""
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(50, 5)) * 3, rng.integers(0, 3, 50)
    k, clip = 12, 0.37
    common = dict(clip=clip, sigma=0.8, learning_rate=0.5, record=True)
    a6 = private_gd(model, x, y, steps=k, bits=SeededRandomBits(9), **common)
    a7 = private_gd_filtered(
        model, x, y, b_norm=k * clip**2, k_max=k, bits=SeededRandomBits(9), **common
    )
    assert len(a6.iterates) == len(a7.iterates) == k
    for t in range(k):
        np.testing.assert_array_equal(a6.iterates[t], a7.iterates[t])
    # ... and the test can fail: one step more, or a smaller budget, changes the run
    a7b = private_gd_filtered(
        model, x, y, b_norm=(k - 1) * clip**2, k_max=k, bits=SeededRandomBits(9), **common
    )
    assert not np.array_equal(a7b.iterates[-1], a6.iterates[-1])


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31), st.floats(0.05, 3.0), st.floats(0.5, 20.0), st.integers(1, 25))
def test_filter_invariants_every_step(seed, clip, b_over_c2, k_max):
    """spent <= B_norm for every example at every step; each charge equals (bounds, within one
    lattice unit) the squared norm of the clipped gradient actually added."""
    rng = np.random.default_rng(seed)
    model = SoftmaxRegression(4, 3)
    x, y = rng.normal(size=(30, 4)) * rng.choice([0.1, 1, 5], size=(30, 1)), rng.integers(0, 3, 30)
    run = private_gd_filtered(
        model,
        x,
        y,
        clip=clip,
        sigma=1.0,
        learning_rate=0.3,
        b_norm=b_over_c2 * clip**2,
        k_max=k_max,
        bits=SeededRandomBits(seed),
        record=True,
    )
    unit = DEFAULT_LATTICE.granularity**2
    budget = run.budget_units
    spent = np.zeros(30, np.int64)
    for scale, charge, norm2 in zip(run.scales, run.charges_units, run.grad_norm2, strict=True):
        added = scale**2 * norm2 / unit  # squared norm of scale·g_i, in lattice units
        assert np.all(charge >= added * (1 - 1e-12))
        assert np.all(charge <= added * (1 + 1e-8) + 1)
        assert np.all(np.sqrt(added) <= clip / DEFAULT_LATTICE.granularity * (1 + 1e-12))
        spent += charge
        assert np.all(spent <= budget)
        assert np.all(spent * unit <= b_over_c2 * clip**2)
    np.testing.assert_array_equal(spent, run.spent_units)


def test_plan_meets_the_target_with_the_checks_paid_for():
    for eps in (0.3, 0.5, 1.0):
        plan = plan_gd(eps, 1e-5, clip=2.0, sigma=60.0, learning_rate=1.0)
        assert plan.rho_gd == rho_for_sigma(plan.gd_steps, 60.0) <= plan.rho_target
        assert plan.rho_filter + plan.rho_checks <= plan.rho_target
        assert plan.rho_checks == pytest.approx(0.1 * plan.rho_target, rel=1e-9)
        assert plan.rho_filter == rho_for_sigma(plan.b_norm, 120.0)  # Prop 5.2: B/(2σ²C²)
        assert plan.epsilon_filtered <= eps * (1 + 1e-9) and plan.epsilon_gd <= eps * (1 + 1e-9)
        assert epsilon_from_rho_gdp(plan.rho_target * 1.01, 1e-5) > eps  # calibration is tight
        assert plan.k_max == plan.base_steps + 35 and plan.base_steps == int(plan.b_norm // 4.0)
    with pytest.raises(ValueError, match="sigma"):
        plan_gd(0.3, 1e-5, clip=1.0, sigma=1.0, learning_rate=1.0)


def test_checks_are_released_noisily_and_the_best_checked_iterate_is_returned():
    ds = digits()
    model = SoftmaxRegression(64, 10)
    checks = AccuracyChecks(start=3, every=2, count=4, sigma_count=5.0)
    run = private_gd_filtered(
        model,
        ds.x_train,
        ds.y_train,
        clip=1.0,
        sigma=5.0,
        learning_rate=2.0,
        b_norm=3.0,
        k_max=9,
        bits=SeededRandomBits(3),
        checks=checks,
        record=True,
    )
    assert [t for t, _ in run.released_accuracies] == [3, 5, 7, 9]
    best_t = max(run.released_accuracies, key=lambda p: p[1])[0]
    assert run.chosen_step == best_t
    np.testing.assert_array_equal(run.params, run.iterates[best_t - 1])
    for t, released in run.released_accuracies:
        exact = np.mean(model.predict(run.iterates[t - 1], ds.x_train) == ds.y_train)
        assert released != exact and abs(released - exact) < 6 * 5.0 / ds.n_train


def test_private_gd_learns_digits_and_validates():
    ds = digits()
    model = SoftmaxRegression(64, 10)
    run = private_gd(
        model,
        ds.x_train,
        ds.y_train,
        clip=1.0,
        sigma=2.0,
        learning_rate=4.0,
        steps=30,
        bits=SeededRandomBits(0),
    )
    assert np.mean(model.predict(run.params, ds.x_test) == ds.y_test) > 0.85
    with pytest.raises(ValueError, match="clip"):
        private_gd(model, ds.x_train, ds.y_train, clip=0.0, sigma=1.0, learning_rate=1.0, steps=1)
    with pytest.raises(ValueError, match="k_max"):
        private_gd_filtered(
            model,
            ds.x_train,
            ds.y_train,
            clip=1.0,
            sigma=1.0,
            learning_rate=1.0,
            b_norm=1.0,
            k_max=5,
            checks=AccuracyChecks(start=3, every=2, count=3, sigma_count=1.0),
        )
    assert synthetic(n=100, d=7).x_train.shape[1] == 7


def test_plan_without_checks_gives_the_filter_the_whole_budget():
    plan = plan_gd(0.5, 1e-5, clip=1.0, sigma=40.0, learning_rate=1.0, checks=0)
    assert plan.rho_checks == 0.0 and plan.check_sigma == float("inf")
    assert plan.rho_filter <= plan.rho_target
    assert plan.b_norm == pytest.approx(2 * 40.0**2 * plan.rho_target, rel=1e-9)  # ≈ k·C²
    assert plan.gd_steps <= plan.b_norm < plan.gd_steps + 1
    assert plan.k_max == plan.base_steps + 35


def test_private_gd_noise_is_sigma_times_clip():
    """θ₁ − θ₀ = −η·(Σ clipped + noise)/n, so one step reveals the noise; σ₀ = σ·C from the
    configuration (Algorithm 6's N(0, σ²C²·I)). Two-sided χ² bounds (tests/support/sigma_check):
    a correct σ passes with probability 0.999, one off by √2 either way fails with probability
    >= 0.999."""
    from tests.support.sigma_check import assert_sigma

    ds = digits()
    model = SoftmaxRegression(64, 10)
    x, y = ds.x_train[:300], ds.y_train[:300]
    sigma, clip, lr = 1.5, 0.7, 0.3
    theta0 = model.init(np.random.default_rng(0))
    run = private_gd(
        model,
        x,
        y,
        clip=clip,
        sigma=sigma,
        learning_rate=lr,
        steps=1,
        params=theta0,
        record=True,
        bits=SeededRandomBits(7),
    )
    total = model.backward(theta0, x, one_hot(y, 10)).weighted_gradient_sum(run.scales[0])
    noise = -(run.iterates[0] - theta0) * x.shape[0] / lr - total
    assert_sigma(noise, sigma * clip)
