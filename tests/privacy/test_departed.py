"""The departure rule and the departed counter (privacy.departed)."""

from __future__ import annotations

import numpy as np

from streamfilter.privacy.departed import DepartedCounter, filter_departures
from streamfilter.privacy.lattice import Lattice
from streamfilter.privacy.noise import SeededRandomBits


def test_each_user_departs_once_and_pays_for_the_departing_vector() -> None:
    rng = np.random.default_rng(3)
    lattice = Lattice(2.0**-4)
    clip, budget = 2.0, 16 * 256  # full cost 1024 units, B = 4 full contributions
    full = lattice.max_cost_units(clip)
    n = 500
    spent = np.zeros(n, np.int64)
    retired = np.zeros(n, bool)
    departures = np.zeros(n, np.int64)
    for _ in range(40):
        x = rng.exponential(rng.uniform(0.1, 3.0, n))[:, None]
        before = budget - spent
        step = filter_departures(x, clip, lattice, spent, retired, budget)
        units = np.round(np.minimum(x[:, 0], clip) / lattice.granularity)
        # the decision uses the budget before the step only
        assert np.array_equal(step.admitted, before >= 2 * full)
        assert np.array_equal(step.departed, (before >= full) & (before < 2 * full))
        # every vector that leaves (release or departed counter) is paid in full
        assert np.all(step.cost_units[step.admitted | step.departed] >= 0)
        assert np.all(step.cost_units[step.departed] >= units[step.departed] ** 2 - 1)
        spent += step.cost_units
        assert np.all(spent <= budget)
        assert np.all(budget - spent[step.departed] < full)  # gone for good
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
