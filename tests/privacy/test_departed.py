"""The departure rule and the departed counter (privacy.departed)."""

from __future__ import annotations

import numpy as np

from streamfilter.privacy.departed import (
    SQUARES_KAPPA,
    DepartedCounter,
    DepartureRule,
    filter_departures,
)
from streamfilter.privacy.lattice import Lattice
from streamfilter.privacy.noise import SeededRandomBits


def test_each_user_departs_once_and_pays_for_the_departing_vector() -> None:
    rng = np.random.default_rng(3)
    lattice = Lattice(2.0**-4)
    clip, budget = 2.0, 16 * 256  # full cost 1024 units, B = 4 full contributions
    full = lattice.max_cost_units(clip)
    rule = DepartureRule.of(full, 1, sigma2_units=1000)
    # the squares counter's charge is at most a quarter of a full contribution
    assert rule.shift == 0 and rule.depart_at == full + full // SQUARES_KAPPA
    n = 500
    spent = np.zeros(n, np.int64)
    retired = np.zeros(n, bool)
    departures = np.zeros(n, np.int64)
    for _ in range(40):
        x = rng.exponential(rng.uniform(0.1, 3.0, n))[:, None]
        before = budget - spent
        step = filter_departures(x, clip, lattice, spent, retired, budget, rule)
        units = np.round(np.minimum(x[:, 0], clip) / lattice.granularity).astype(np.int64)
        # the decision uses the budget before the step only
        assert np.array_equal(step.admitted, before >= full + rule.depart_at)
        live_next = before < full + rule.depart_at
        assert np.array_equal(step.departed, (before >= rule.depart_at) & live_next)
        # every vector that leaves (release or departed counter) is paid in full, and a
        # departing one also pays its squares' counter: ceil(r⁴/(κ·c)) more
        assert np.array_equal(step.cost_units[step.admitted], units[step.admitted] ** 2)
        r2 = units[step.departed] ** 2
        assert np.all(step.cost_units[step.departed] >= r2 + -(-(r2**2) // (SQUARES_KAPPA * full)))
        assert step.squares_units[0] == r2.sum()
        assert step.departed_units[0] == units[step.departed].sum()
        spent += step.cost_units
        assert np.all(spent <= budget)
        assert np.all(budget - spent[step.departed] < rule.depart_at)  # gone for good
        departures += step.departed
    assert departures.max() == 1 and departures.sum() > n // 2


def test_the_counter_releases_the_running_total_with_its_stated_noise() -> None:
    counter = DepartedCounter(first_horizon=4, dims=2, sigma2_units=9)
    state = counter.initial_state()
    bits = SeededRandomBits(1)
    inputs = [np.array([3, -1]), np.array([0, 0]), np.array([5, 2]), np.array([1, 1])] * 3
    totals, errors = np.zeros(2, np.int64), []
    for t, vec in enumerate(inputs, start=1):
        totals += vec
        value, noise, state = counter.step(state, vec, bits)
        errors.append(np.array(value) - totals)
        # one root per completed epoch plus popcount(t) nodes of the current one
        assert sum(k for _, k in noise) >= 1
        if t == 4:
            assert noise == ((counter.node_sigma2_units(1), 1),)
    assert state.epoch == 3 and counter.node_sigma2_units(2) == 4 * 9
    assert np.all(np.abs(np.concatenate(errors)) < 12 * np.sqrt(5 * 36))


def test_a_rule_for_a_fine_lattice_counts_squares_coarser_and_still_fits_the_sampler() -> None:
    """``g > 1`` only when ``L·κ·F·s²`` would pass 2^62: then each square is rounded *up* to a
    multiple of ``g`` (the variance estimate stays an upper one) and the charge stays exact."""
    full, s2 = 1 << 40, 1 << 30
    rule = DepartureRule.of(full, 3, s2)
    assert rule.shift > 0
    assert 31 * rule.squares_sigma2_units(s2) <= 1 << 62 and rule.square_max <= 1 << 30
    r = np.array([[1 << 20, 3, 0], [0, 0, 0], [5, 7, 1 << 19]], np.int64)
    u = rule.squares(r)
    g = 1 << rule.shift
    assert np.all(u * g >= r**2) and np.all(u * g < r**2 + g) and u[1].sum() == 0
    # the charge bound E holds for the largest vectors of the ball
    worst = rule.squares(np.array([[1 << 20, 0, 0], [741455, 741455, 0]], np.int64))
    assert np.all(rule.extra(worst) <= rule.extra_max)
