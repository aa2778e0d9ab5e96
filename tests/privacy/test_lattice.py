import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamfilter.privacy.lattice import Lattice, cost_units, max_cost_units, round_to_lattice


@pytest.mark.parametrize("bad", [0.0, -1.0, 0.3, 3.0, math.inf, math.nan, 2.0**-70])
def test_granularity_must_be_power_of_two(bad):
    with pytest.raises(ValueError, match="granularity"):
        Lattice(bad)


def test_budget_is_exact_floor():
    lat = Lattice(2.0**-10)
    assert lat.budget_units(4.0) == 4 * 2**20
    # 0.1 is not a binary fraction: floor of its exact value over γ²
    assert lat.budget_units(0.1) == math.floor(Fraction(0.1) * 2**20)
    with pytest.raises(ValueError, match="b_norm"):
        lat.budget_units(2.0**-30)  # below one lattice unit


def test_refuses_settings_that_could_overflow():
    with pytest.raises(ValueError, match="2\\^61"):
        Lattice(2.0**-40).budget_units(4.0)
    with pytest.raises(ValueError, match="2\\^31"):
        max_cost_units(2.0**22, 2.0**-10)


def test_sigma2_units_rounds_up():
    lat = Lattice(2.0**-10)
    s2 = lat.sigma2_units(2.0)
    assert s2 == 4 * 2**20
    s2 = lat.sigma2_units(math.sqrt(2.0))
    assert s2 >= Fraction(math.sqrt(2.0)) ** 2 * 2**20
    assert s2 - 1 < Fraction(math.sqrt(2.0)) ** 2 * 2**20


rows = hnp.arrays(
    np.float64,
    st.tuples(st.integers(1, 20), st.integers(1, 6)),
    elements=st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
)


@settings(max_examples=300, deadline=None)
@given(
    x=rows,
    clip=st.floats(1e-3, 100.0),
    k=st.integers(-20, 4),
)
def test_rounded_norm_never_exceeds_clip_and_cost_is_exact(x, clip, k):
    gamma = 2.0**k
    try:
        cap = max_cost_units(clip, gamma)
    except ValueError:
        return
    r, cost = round_to_lattice(x, clip, gamma, np.full(len(x), cap, np.int64))
    assert r.dtype == np.int64 and cost.dtype == np.int64
    for row, c in zip(r, cost, strict=True):
        exact = sum(int(v) * int(v) for v in row)
        assert c == exact  # cost = ‖r‖² of exactly the vector returned
        # norm ≤ C, checked in exact rational arithmetic: ‖r‖²·γ² ≤ C²
        assert Fraction(exact) * Fraction(gamma) ** 2 <= Fraction(clip) ** 2


@settings(max_examples=200, deadline=None)
@given(x=rows, cap=st.integers(0, 10_000))
def test_per_row_cap_is_respected(x, cap):
    r, cost = round_to_lattice(x, 1e9, 2.0**-4, np.full(len(x), cap, np.int64))
    assert (cost <= cap).all()
    assert (cost == cost_units(r)).all()


def test_rounding_is_nearest_ties_to_even_when_it_fits():
    """Units 1.6, −2.6, ±0.5, ±1.5, 2.5: nearest gives 2, −3, 0, 0, 2, −2, 2; truncation
    (1, −2, 0, 0, 1, −1, 2), ceiling (2, −2, 1, 0, 2, −1, 3), floor (1, −3, 0, −1, 1, −2, 2) and
    ties away from zero (2, −3, 1, −1, 2, −2, 3) each differ somewhere."""
    lat = Lattice(0.25)
    x = np.array([[0.4, -0.65, 0.125, -0.125, 0.375, -0.375, 0.625]])
    r, cost = lat.to_units(x, clip=10.0)
    assert r.tolist() == [[2, -3, 0, 0, 2, -2, 2]] and cost.tolist() == [4 + 9 + 4 + 4 + 4]


def test_clip_scales_direction():
    lat = Lattice(2.0**-10)
    r, _ = lat.to_units(np.array([[3.0, 4.0]]), clip=1.0)
    v = r[0] * 2.0**-10
    assert abs(v[0] - 0.6) < 2e-3 and abs(v[1] - 0.8) < 2e-3
    assert v @ v <= 1.0


# ------------------------------------------------------------- arithmetic fixed to the bit

_finite = st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 20), st.integers(1, 9)), elements=_finite))
def test_norm2_rows_is_the_left_to_right_sum_of_squares(y):
    """One IEEE rounding per operation, columns in order: no pairwise or SIMD reassociation, so
    the server, its tests and every device get the same bits for the clipping decision."""
    from streamfilter.privacy.lattice import norm2_rows

    got = norm2_rows(y)
    for i, row in enumerate(y.tolist()):
        acc = row[0] * row[0]
        for v in row[1:]:
            acc = acc + v * v
        assert got[i] == acc  # exact, not approx


def test_a_vector_that_overflows_float64_contributes_nothing():
    """‖y‖² = inf (only reachable with absurd query weights): the row is rounded to zero at
    zero cost — never NaN cast to an integer, never a warning — and other rows are unaffected."""
    gamma = 2.0**-10
    x = np.array([[1e200, 1e200], [0.5, 0.0]])
    r, cost = round_to_lattice(x, 1.0, gamma, max_cost_units(1.0, gamma))
    assert r[0].tolist() == [0, 0] and cost[0] == 0
    assert r[1].tolist() == [512, 0] and cost[1] == 512**2
