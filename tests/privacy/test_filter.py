"""The block filter's native twin (privacy/_filter.c) gives exactly what the numpy reference
gives: ``filter_contributions`` followed by the sum of its units (docs/design.md §8.4)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.privacy import individual_filter
from streamfilter.privacy.individual_filter import (
    Exhaustion,
    FilterTotals,
    filter_contributions,
    filter_totals,
    totals_of,
)
from streamfilter.privacy.lattice import Lattice
from tests.support.native_build import check_built_in_ci, needs

native = needs(individual_filter._filter, "privacy/_filter.c")


def reference(x, clip, lattice, spent, retired, budget, policy) -> FilterTotals:
    with np.errstate(all="ignore"):  # the edge values overflow x/γ and its squares (to inf)
        step = filter_contributions(x, clip, lattice, spent, retired, budget, policy)
    return totals_of(step, x)


def assert_same(got: FilterTotals, want: FilterTotals) -> None:
    assert got.total_units.dtype == want.total_units.dtype == np.int64
    assert got.total_units.tolist() == want.total_units.tolist()
    assert got.cost_units.tolist() == want.cost_units.tolist()
    assert got.admitted.tolist() == want.admitted.tolist()
    assert got.newly_retired.tolist() == want.newly_retired.tolist()
    assert (got.admitted_nonzero, got.refused_nonzero) == (
        want.admitted_nonzero,
        want.refused_nonzero,
    )


def test_native_filter_built_in_ci():
    check_built_in_ci(individual_filter._filter, "privacy/_filter.c")


#: values that stress each branch: zeros of both signs, halves (rounding to even), values at
#: and beyond the clip, huge values whose squares overflow, tiny ones, non-finite ones
_EDGES = [0.0, -0.0, 0.5, 1.5, -2.5, 1e-300, 5e-324, 1e154, 1e200, -1e308, np.inf, -np.inf, np.nan]


def _values(draw_edges: bool):
    plain = st.floats(-1e4, 1e4, allow_nan=False, width=64)
    return st.one_of(plain, st.sampled_from(_EDGES)) if draw_edges else plain


@native
@settings(max_examples=400, deadline=None)
@given(
    data=st.data(),
    n=st.integers(0, 40),
    d=st.integers(0, 6),
    exponent=st.integers(-12, 4),
    clip=st.one_of(st.floats(1e-3, 1e3), st.sampled_from([0.5, 1.0, 3.0, 60.0])),
    b_norm=st.floats(1e-2, 1e3),
    policy=st.sampled_from(list(Exhaustion)),
    edges=st.booleans(),
    layout=st.sampled_from(["C", "F", "strided"]),
)
def test_native_equals_the_numpy_reference(
    data, n, d, exponent, clip, b_norm, policy, edges, layout
):
    lattice = Lattice(2.0**exponent)
    try:
        budget = lattice.budget_units(b_norm)
        cap = lattice.max_cost_units(clip)
    except ValueError:  # below one unit or beyond int64: refused before any filter runs
        return
    del cap
    rows = data.draw(
        st.lists(st.lists(_values(edges), min_size=d, max_size=d), min_size=n, max_size=n)
    )
    x = np.array(rows, dtype=np.float64).reshape(n, d)
    if layout == "F":
        x = np.asfortranarray(x)
    elif layout == "strided":  # a column selection of a wider column-major block, as day.py has
        wide = np.zeros((n, 2 * d + 1), order="F")
        wide[:, 1::2] = x
        x = wide[:, 1::2]
    spent = np.array(data.draw(st.lists(st.integers(0, budget), min_size=n, max_size=n)), np.int64)
    retired = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
    before = (x.copy(), spent.copy(), retired.copy())
    got = filter_totals(x, clip, lattice, spent, retired, budget, policy)
    want = reference(x, clip, lattice, spent, retired, budget, policy)
    assert_same(got, want)
    for kept, now in zip(before, (x, spent, retired), strict=True):  # nothing is mutated
        np.testing.assert_array_equal(kept, now)


@native
@pytest.mark.parametrize("policy", list(Exhaustion))
def test_native_equals_reference_on_a_day_sized_block(policy):
    """65,536 users with mixed budgets, the day close's block size, for every policy."""
    rng = np.random.default_rng(11)
    lattice = Lattice(2.0**-10)
    n, budget = 1 << 16, lattice.budget_units(6.0)
    x = np.asfortranarray(rng.standard_t(2, size=(n, 3)) * 4.0)
    x[rng.random(n) < 0.1] = 0.0
    spent = rng.integers(0, budget + 1, n)
    retired = rng.random(n) < 0.05
    for clip in (0.25, 1.0, 2.0, 5.0, 60.0):
        got = filter_totals(x, clip, lattice, spent, retired, budget, policy)
        assert_same(got, reference(x, clip, lattice, spent, retired, budget, policy))


@native
def test_the_rounding_fallback_paths_agree():
    """Rows whose nearest rounding exceeds the cap (the radius-shrinking branch) and a cap of
    0 (a spent budget under ``clip``): both paths give the same integer vectors and costs."""
    lattice = Lattice(1.0)
    # norm exactly at the radius, every coordinate at a half: rint rounds up past the cap
    x = np.array([[1.5, 1.5, 1.5, 1.5], [2.5, 2.5, 0.5, 0.5], [0.5] * 4, [3.0, 4.0, 0.0, 0.0]])
    for clip in (1.0, 2.0, 3.0, 5.0):
        for spent in ([0] * 4, [25, 24, 20, 0]):
            args = (x, clip, lattice, np.array(spent, np.int64), np.zeros(4, bool), 25)
            for policy in Exhaustion:
                assert_same(filter_totals(*args, policy), reference(*args, policy))


@native
def test_a_corrupt_ledger_is_refused_by_both():
    args = (np.ones((2, 1)), 1.0, Lattice(1.0), np.array([0, 5], np.int64), np.zeros(2, bool), 4)
    with pytest.raises(ValueError, match="corrupt"):
        filter_totals(*args, Exhaustion.SKIP)
    with pytest.raises(ValueError, match="corrupt"):
        reference(*args, Exhaustion.SKIP)


def test_without_the_native_twin_the_reference_runs(monkeypatch):
    monkeypatch.setattr(individual_filter, "_filter", None)
    x = np.array([[3.0, 4.0], [0.0, 0.0]])
    args = (x, 1.0, Lattice(2.0**-4), np.zeros(2, np.int64), np.zeros(2, bool), 1024)
    got = filter_totals(*args, Exhaustion.SKIP)
    assert_same(got, reference(*args, Exhaustion.SKIP))
    assert got.admitted.tolist() == [True, True]  # a zero row fits (cost 0) ...
    assert (got.admitted_nonzero, got.refused_nonzero) == (1, 0)  # ... and is not counted


@native
def test_a_wide_query_gets_the_same_totals():
    """A histogram of 5,000 categories: each row's scratch is sized by the query, not fixed."""
    rng = np.random.default_rng(5)
    lattice = Lattice(2.0**-8)
    x = rng.random((50, 5_000)) * (rng.random((50, 5_000)) < 0.01)
    spent = rng.integers(0, 64, 50)
    retired = np.zeros(50, bool)
    for policy in Exhaustion:
        args = (x, 0.5, lattice, spent, retired, lattice.budget_units(1.0))
        assert_same(filter_totals(*args, policy), reference(*args, policy))


@native
def test_rounding_at_the_edges_of_the_coordinate_range():
    """Ties to even and values near ±2^31 (the largest a clipped coordinate can reach, at
    γ = 1 and C = 2^31): the native rounding is np.rint's."""
    lattice = Lattice(1.0)
    big = 2.0**31
    ties = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, big - 0.5, -(big - 0.5), 2.0**30 + 0.5, 1e9 + 0.5]
    x = np.array([[v] for v in [*ties, big, -big, big - 1.0, 0.49999999999999994, -0.0]])
    n = len(x)
    args = (x, big, lattice, np.zeros(n, np.int64), np.zeros(n, bool), 2**62)
    for policy in Exhaustion:
        assert_same(filter_totals(*args, policy), reference(*args, policy))
    got = filter_totals(*args, Exhaustion.SKIP)
    assert got.cost_units.tolist() == [int(v) ** 2 for v in np.rint(x[:, 0])]
