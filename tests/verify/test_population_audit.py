"""The population estimate in the empirical audit (verify.population_audit, docs/design.md
§2.12): its accounting recomputed, its values among those the test may use, and a broken build
caught."""

import os

import pytest

from streamfilter.verify.audit import AuditConfig, audit

WORKERS = 2 if (os.cpu_count() or 1) >= 2 else 1
CONFIG = AuditConfig()
#: B = 3.25c: the canary is live on days 1 and 2 (R = 3.25c, 2.25c >= c + D = 2.25c) and departs
#: on day 3 with its vector (D = 1.25c <= R < 2.25c), paying the rest of its budget
POPULATION = AuditConfig(population_epoch_days=4, days=3, b_norm=3.25)


def test_audit_with_population_recomputes_its_accounting_and_keeps_the_claim():
    """The audited engine runs the population estimate: users follow the departure rule, each
    release's population values join the values the test may use, and the accounting is
    recomputed over every query and epoch in exact rationals. It costs no ρ of its own: the
    claim is the plain run's."""
    r = audit(POPULATION, 400, workers=1)
    acc = r.population_estimate
    assert acc is not None and acc["ok"] is True and acc["queries"] == 2
    assert acc["epochs_checked"] == 29  # 4·2^28 steps = the 2^30 cap
    assert acc["departed_loss_per_charged_unit"] == 1.0  # L_e nodes of L_e·s²: exactly paid
    assert 0 < acc["squares_loss_per_reserved_unit"] <= 1.0
    assert r.rho_claimed == POPULATION.params().rho_effective
    # two live contributions, then the departure's 1 + 1/4: the whole budget
    assert r.canary_spent_fraction == 1.0
    assert len(r.weights) == 2 * 4  # q on 3 days and big on the last, each with its population
    assert not r.violation, r.to_json_dict()


def test_audit_catches_population_noise_without_the_level_factor():
    """A departed counter drawing N_Z(0, s²) per node instead of N_Z(0, L_e·s²): the recomputed
    loss per charged unit is L_e, above 1 — a violation with certainty."""
    r = audit(POPULATION, 40, bug="population_noise_per_node", workers=1)
    acc = r.population_estimate
    assert acc is not None and acc["ok"] is False
    assert acc["departed_loss_per_charged_unit"] == 31.0  # the largest epoch's L_e
    assert r.violation
    with pytest.raises(ValueError, match="needs population_epoch_days"):
        audit(CONFIG, 40, bug="population_noise_per_node")


@pytest.mark.slow
def test_audit_of_the_build_with_population_never_exceeds_the_claim():
    r = audit(POPULATION, 10_000, workers=WORKERS)
    assert not r.violation, r.to_json_dict()
    # and it sees the canary (ε_lb ≈ 0.43 measured with 10,000 trials: one of its three
    # contributions is behind the departed counter's L_e-fold node noise)
    assert r.epsilon_lower_bound > 0.2, r.to_json_dict()
