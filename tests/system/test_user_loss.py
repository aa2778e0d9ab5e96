"""One formula for a user's realized loss, so every report of it agrees.

Every place that reports a user's ρ — ``streamfilter budget``, the device odometer, the run's
effective guarantee — goes through ``privacy.odometer.rho_of_units`` with the variance of the
noise *actually drawn*. Here the exact loss is computed independently, from what each sampler
draws, and no reported value may be below it (nor above it by more than one rounding).
"""

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.cli.budget import user_budget
from streamfilter.client import DeviceConfig
from streamfilter.client.device import LocalFilter
from streamfilter.config import load_config
from streamfilter.engine.params import PrivacyParams
from streamfilter.privacy.odometer import user_loss
from tests.cli.test_budget import make_state


def exact_variance_drawn(mechanism: str, sigma: float, granularity: float) -> Fraction:
    """What each sampler draws, in lattice units: the discrete Gaussian's integer variance
    ``ceil(σ²/γ²)``; the continuous Gaussian's ``σ²`` in data units, i.e. ``σ²/γ²``."""
    ratio = Fraction(sigma) ** 2 / Fraction(granularity) ** 2
    return Fraction(math.ceil(ratio)) if mechanism == "discrete_gaussian" else ratio


def assert_upper_bound(reported: float, exact: Fraction) -> None:
    assert Fraction(reported) >= exact
    assert Fraction(math.nextafter(reported, 0.0)) < exact or exact == 0


MECHANISMS = st.sampled_from(["discrete_gaussian", "gaussian"])


@settings(max_examples=150, deadline=None)
@given(
    mechanism=MECHANISMS,
    b_norm=st.floats(0.5, 50.0),
    rho=st.floats(0.01, 5.0),
    k=st.integers(2, 12),
    spent_fraction=st.fractions(0, 1),
)
def test_user_loss_and_rho_effective_are_never_below_the_exact_loss(
    mechanism, b_norm, rho, k, spent_fraction
):
    params = PrivacyParams.create(
        b_norm=b_norm, rho=rho, granularity=2.0**-k, mechanism=mechanism, delta=1e-6
    )
    variance = exact_variance_drawn(mechanism, params.sigma, params.granularity)
    spent = int(spent_fraction * params.budget_units)
    loss = user_loss(spent, params.granularity, params.noise_variance_units, 1e-6, mechanism)
    assert_upper_bound(loss.rho_spent, Fraction(spent) / (2 * variance))
    assert_upper_bound(params.rho_effective, Fraction(params.budget_units) / (2 * variance))
    assert params.rho_effective <= rho * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(
    mechanism=MECHANISMS,
    b_norm=st.floats(0.5, 50.0),
    rho=st.floats(0.01, 5.0),
    spent_fraction=st.fractions(0, 1),
)
def test_the_device_odometer_reports_the_same_loss(
    tmp_path_factory, mechanism, b_norm, rho, spent_fraction
):
    config = DeviceConfig.create(b_norm=b_norm, rho=rho, mechanism=mechanism, granularity=2.0**-10)
    device = LocalFilter(tmp_path_factory.mktemp("device") / "state.json", config)
    device.spent_units = int(spent_fraction * config.budget_units)
    variance = exact_variance_drawn(mechanism, config.sigma, config.granularity)
    odometer = device.odometer()
    assert_upper_bound(odometer.rho_spent, Fraction(device.spent_units) / (2 * variance))
    params = PrivacyParams.create(
        b_norm=b_norm, rho=rho, granularity=2.0**-10, mechanism=mechanism, delta=config.delta
    )
    server = user_loss(
        device.spent_units, params.granularity, params.noise_variance_units, config.delta, mechanism
    )
    assert (odometer.rho_spent, odometer.epsilon_spent) == (server.rho_spent, server.epsilon_spent)
    assert config.rho == params.rho_effective


@pytest.mark.parametrize("mechanism", ["discrete_gaussian", "gaussian"])
def test_the_budget_command_reports_the_same_loss(tmp_path, mechanism):
    settings_ = load_config(make_state(tmp_path, mechanism=mechanism))
    params = settings_.privacy_params()
    b = user_budget(settings_, "u-1")
    variance = exact_variance_drawn(mechanism, params.sigma, params.granularity)
    assert_upper_bound(b["rho_spent"], Fraction(b["spent_units"]) / (2 * variance))
    config = DeviceConfig.create(
        b_norm=params.b_norm,
        rho=params.rho,
        mechanism=mechanism,
        granularity=params.granularity,
        delta=params.delta,
    )
    device = LocalFilter(tmp_path / "device.json", config)
    device.spent_units = b["spent_units"]
    assert (b["rho_spent"], b["epsilon_spent"]) == (
        device.odometer().rho_spent,
        device.odometer().epsilon_spent,
    )
