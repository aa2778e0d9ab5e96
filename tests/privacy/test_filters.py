"""Tests for streamfilter.privacy.filters (Theorem 4.3, Remark 4.4, Theorem 4.9)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.privacy.accounting import (
    rho_from_epsilon_delta_cks,
    rho_from_epsilon_delta_thm49,
)
from streamfilter.privacy.filters import (
    DPFilter,
    MultiOrderRenyiFilter,
    RenyiFilter,
    ZCDPFilter,
)

losses = st.lists(st.floats(min_value=0.0, max_value=1.0), max_size=40)


def reference_filter(budget: float, steps: list[float]) -> list[bool]:
    """Theorem 4.3 with exact rationals: CONT iff admitted sum + candidate <= B."""
    spent = Fraction(0)
    out = []
    for loss in steps:
        if spent + Fraction(loss) <= Fraction(budget):
            spent += Fraction(loss)
            out.append(True)
        else:
            out.append(False)
    return out


# ------------------------------------------------------------------------------------------------
# Theorem 4.3
# ------------------------------------------------------------------------------------------------


def test_renyi_filter_cont_iff_sum_at_most_budget() -> None:
    f = RenyiFilter(alpha=8.0, budget=1.0)
    assert (f.alpha, f.budget, f.spent, f.remaining, f.steps) == (8.0, 1.0, 0.0, 1.0, 0)
    assert f.spend(0.25)
    assert f.spend(0.75)  # sum == budget exactly: CONT
    assert f.spent == 1.0
    assert f.remaining == 0.0
    assert f.would_continue(0.0)
    assert not f.would_continue(1e-300)


def test_halt_leaves_state_unchanged_and_a_cheaper_step_may_continue() -> None:
    f = RenyiFilter(alpha=2.0, budget=1.0)
    assert f.spend(0.6)
    before = (f.spent, f.remaining, f.steps)
    assert not f.would_continue(0.5)
    assert (f.spent, f.remaining, f.steps) == before  # dry run
    assert not f.spend(0.5)
    assert (f.spent, f.remaining, f.steps) == before  # HALT commits nothing
    assert f.spend(0.4)
    assert f.steps == 2


def test_exact_comparison_where_rounded_sums_would_continue() -> None:
    """1.0 + 2^-60 rounds to 1.0 (also with math.fsum): a float comparison would say CONT."""
    tiny = 2.0**-60
    assert math.fsum([1.0, tiny]) <= 1.0  # the trap
    f = ZCDPFilter(rho_budget=1.0)
    assert f.spend(1.0)
    assert not f.would_continue(tiny)
    assert not f.spend(tiny)
    # and the reported numbers round the safe way
    g = ZCDPFilter(rho_budget=0.3)
    assert g.spend(0.1)
    assert not g.would_continue(0.2)  # exact 0.1 + 0.2 (as doubles) exceeds the double 0.3
    assert g.spend(0.125)
    exact = Fraction(0.1) + Fraction(0.125)
    assert Fraction(g.spent) >= exact
    assert Fraction(g.remaining) <= Fraction(0.3) - exact


@settings(max_examples=100, deadline=None)
@given(budget=st.floats(min_value=0.0, max_value=5.0), steps=losses)
def test_renyi_and_zcdp_filters_match_the_exact_reference(
    budget: float, steps: list[float]
) -> None:
    expected = reference_filter(budget, steps)
    for f in (RenyiFilter(alpha=3.0, budget=budget), ZCDPFilter(rho_budget=budget)):
        got = []
        for loss in steps:
            dry = f.would_continue(loss)
            got.append(f.spend(loss))
            assert dry == got[-1]
        assert got == expected
        admitted = [loss for loss, ok in zip(steps, expected, strict=True) if ok]
        assert Fraction(f.spent) >= sum((Fraction(x) for x in admitted), Fraction(0))
        assert f.spent <= budget
        assert f.remaining >= 0.0


def test_zcdp_filter_is_alpha_independent() -> None:
    """Remark 4.4: the Rényi filter at order α with budget αρ on losses αρ_t decides exactly as
    the zCDP filter with budget ρ on ρ_t (powers of two keep the scaling exact)."""
    steps = [0.125, 0.25, 0.5, 0.25, 0.125, 0.0625]
    zcdp = ZCDPFilter(rho_budget=1.0)
    expected = [zcdp.spend(x) for x in steps]
    for alpha in [1.0, 2.0, 4.0, 64.0]:
        renyi = RenyiFilter(alpha=alpha, budget=alpha * 1.0)
        assert [renyi.spend(alpha * x) for x in steps] == expected


# ------------------------------------------------------------------------------------------------
# Theorem 4.9
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("conversion", ["thm49", "cks"])
@pytest.mark.parametrize(("epsilon_g", "delta_g"), [(1.0, 1e-5), (0.5, 1e-9), (3.0, 1e-3)])
def test_dp_filter_budget_is_the_conversion(
    conversion: str, epsilon_g: float, delta_g: float
) -> None:
    f = DPFilter(epsilon_g, delta_g, conversion=conversion)  # type: ignore[arg-type]
    solver = rho_from_epsilon_delta_thm49 if conversion == "thm49" else rho_from_epsilon_delta_cks
    assert f.rho_budget == solver(epsilon_g, delta_g)
    assert (f.epsilon_g, f.delta_g, f.conversion) == (epsilon_g, delta_g, conversion)


def test_dp_filter_thm49_is_the_paper_closed_form() -> None:
    log_inv = math.log(1 / 1e-5)
    paper = (-math.sqrt(log_inv) + math.sqrt(log_inv + 1.0)) ** 2
    assert DPFilter(1.0, 1e-5).rho_budget == pytest.approx(paper, rel=1e-12)
    assert DPFilter(1.0, 1e-5).rho_budget <= paper * (1 + 1e-15)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.floats(min_value=0.0, max_value=0.2), max_size=60))
def test_dp_filter_continues_iff_half_sum_of_squares_at_most_b_star(steps: list[float]) -> None:
    for conversion in ("thm49", "cks"):
        f = DPFilter(1.0, 1e-5, conversion=conversion)
        b_star = Fraction(f.rho_budget)
        spent = Fraction(0)
        for eps in steps:
            candidate = spent + Fraction(eps) ** 2 / 2
            expected = candidate <= b_star
            assert f.spend(eps) == expected
            if expected:
                spent = candidate
        assert Fraction(f.spent) >= spent


def test_dp_filter_cks_admits_more_than_thm49() -> None:
    thm49, cks = DPFilter(1.0, 1e-5, "thm49"), DPFilter(1.0, 1e-5, "cks")
    n_thm49 = sum(thm49.spend(0.01) for _ in range(2000))
    n_cks = sum(cks.spend(0.01) for _ in range(2000))
    per_step = Fraction(0.01) ** 2 / 2
    assert n_thm49 == math.floor(Fraction(thm49.rho_budget) / per_step)
    assert n_cks == math.floor(Fraction(cks.rho_budget) / per_step)
    assert n_cks > n_thm49


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: RenyiFilter(alpha=0.5, budget=1.0),
            "alpha must be finite and >= 1, got alpha=0.5",
        ),
        (
            lambda: RenyiFilter(alpha=2.0, budget=-1.0),
            "budget must be finite and >= 0, got budget=-1.0",
        ),
        (
            lambda: RenyiFilter(alpha=2.0, budget=1.0).spend(-0.1),
            "rho_t must be finite and >= 0, got rho_t=-0.1",
        ),
        (
            lambda: RenyiFilter(alpha=2.0, budget=1.0).spend(math.nan),
            "rho_t must be finite and >= 0, got rho_t=nan",
        ),
        (
            lambda: ZCDPFilter(rho_budget=math.inf),
            "rho_budget must be finite and >= 0, got rho_budget=inf",
        ),
        (
            lambda: ZCDPFilter(rho_budget=1.0).would_continue(True),
            "rho_t must be a real number, got rho_t=True",
        ),
        (
            lambda: DPFilter(1.0, 1e-5, "gdp"),  # type: ignore[arg-type]
            "conversion must be 'thm49' or 'cks', got conversion='gdp'",
        ),
        (lambda: DPFilter(-1.0, 1e-5), "epsilon_g must be finite and >= 0, got epsilon_g=-1.0"),
        (lambda: DPFilter(1.0, 1.0), "delta_g must be in (0, 1), got delta_g=1.0"),
        (
            lambda: DPFilter(1.0, 1e-5).spend(-1.0),
            "epsilon_t must be finite and >= 0, got epsilon_t=-1.0",
        ),
    ],
)
def test_validation_messages_name_the_value(call, message: str) -> None:
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)


def test_parameters_are_read_only() -> None:
    f = RenyiFilter(alpha=2.0, budget=1.0)
    with pytest.raises(AttributeError):
        f.budget = 2.0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        DPFilter(1.0, 1e-5).rho_budget = 1.0  # type: ignore[misc]


# --- multi-order filter (Remark 4.4) -------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(0.0, 0.5, allow_nan=False), min_size=3, max_size=3),
        min_size=1,
        max_size=25,
    )
)
def test_multi_order_filter_is_every_single_order_filter_at_once(steps):
    """CONT iff each order's own RenyiFilter would continue; a HALT changes nothing anywhere."""
    orders, budgets = [2.0, 8.0, 32.0], [0.7, 1.1, 2.3]
    multi = MultiOrderRenyiFilter(orders, budgets)
    singles = [RenyiFilter(a, b) for a, b in zip(orders, budgets, strict=True)]
    for rdp_t in steps:
        expected = all(f.would_continue(x) for f, x in zip(singles, rdp_t, strict=True))
        before = multi.spent
        assert multi.would_continue(rdp_t) is expected
        assert multi.spend(rdp_t) is expected
        if expected:
            for f, x in zip(singles, rdp_t, strict=True):
                assert f.spend(x)
        else:
            assert multi.spent == before
        assert multi.spent == tuple(f.spent for f in singles)
        # the invariant of Theorem 4.3 at every order: exact sums stay within the budgets
        assert all(Fraction(sp) <= Fraction(b) for sp, b in zip(multi.spent, budgets, strict=True))


def test_multi_order_filter_halts_on_one_order_and_is_exact_at_the_boundary():
    f = MultiOrderRenyiFilter([2, 4], [0.3, 1.0])
    assert f.spend([0.1, 0.2])
    assert not f.spend([0.2, 0.2])  # exact rationals: 0.1 + 0.2 > 0.3 as binary fractions
    g = MultiOrderRenyiFilter([2, 4], [0.75, 1.0])
    assert g.spend([0.5, 0.2]) and g.spend([0.25, 0.2])  # order 2 exactly full
    assert not g.would_continue([5e-324, 0.0])  # one more ulp at order 2 halts ...
    assert g.spend([0.0, 0.6]) and g.steps == 3  # ... a step that costs nothing there does not
    assert g.orders == (2.0, 4.0) and g.budgets == (0.75, 1.0) and g.remaining[0] == 0.0


@pytest.mark.parametrize(
    ("orders", "budgets", "match"),
    [
        ([], [], "non-empty"),
        ([2, 3], [1.0], "equal length"),
        ([2, 2], [1, 1], "distinct"),
        ([0.5], [1], "alpha"),
    ],
)
def test_multi_order_filter_validation(orders, budgets, match):
    with pytest.raises(ValueError, match=match):
        MultiOrderRenyiFilter(orders, budgets)
    f = MultiOrderRenyiFilter([2, 3], [1, 1])
    with pytest.raises(ValueError, match="one value per order"):
        f.spend([0.1])
    with pytest.raises(ValueError, match="rdp_t"):
        f.spend([0.1, -1.0])


def test_individual_multi_order_filters_match_one_multi_order_filter_each():
    """On losses that are multiples of the unit, the vectorised filters decide exactly as one
    MultiOrderRenyiFilter per individual (Remark 4.4), HALT leaving the ledger unchanged."""
    from streamfilter.privacy.filters import IndividualMultiOrderFilters

    rng = np.random.default_rng(5)
    orders, budgets = [2.0, 4.0, 8.0], [1.0, 2.5, 3.0]
    n = 7
    vec = IndividualMultiOrderFilters(n, orders, budgets, unit_exponent=-10)
    refs = [MultiOrderRenyiFilter(orders, budgets) for _ in range(n)]
    for _ in range(40):
        idx = np.sort(rng.choice(n, size=rng.integers(1, n + 1), replace=False))
        losses = rng.integers(0, 200, size=(idx.size, 3)) / 1024.0
        ok = vec.spend(idx, vec.units(losses))
        assert ok.tolist() == [refs[i].spend(row) for i, row in zip(idx, losses, strict=True)]
    np.testing.assert_array_equal(vec.spent(), np.array([r.spent for r in refs]))
    # rounding: a loss just above a unit multiple is charged the next multiple
    f = IndividualMultiOrderFilters(1, [2.0], [1.0], unit_exponent=-10)
    assert f.units(np.array([[1.0 / 1024 + 1e-12]])).tolist() == [[2]]
    assert f.spend(np.array([0]), f.units(np.array([[1.0]]))).tolist() == [True]
    assert f.spend(np.array([0]), f.units(np.array([[1e-300]]))).tolist() == [False]
    with pytest.raises(ValueError, match="strictly increasing"):
        f.spend(np.array([0, 0]), f.units(np.zeros((2, 1))))
