import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.privacy.individual_filter import (
    Exhaustion,
    filter_contributions,
    filter_squared_norms,
)
from streamfilter.privacy.lattice import Lattice, cost_units

LAT = Lattice(2.0**-6)


def run(x, clip, spent, retired, budget, policy):
    return filter_contributions(
        np.atleast_2d(np.asarray(x, float)),
        clip,
        LAT,
        np.asarray(spent, np.int64),
        np.asarray(retired, bool),
        budget,
        policy,
    )


def test_skip_admits_iff_spent_plus_cost_fits():
    budget = 2 * 4096  # b_norm = 2 at γ = 2^-6
    s = run([[1.0], [1.0], [1.0]], 1.0, [0, 4096, 4097], [False] * 3, budget, Exhaustion.SKIP)
    assert s.admitted.tolist() == [True, True, False]
    assert s.cost_units.tolist() == [4096, 4096, 0]
    assert s.units[2].tolist() == [0]


def test_skip_lets_a_later_cheaper_query_in():
    budget = 4096
    s = run([[1.0]], 1.0, [2048], [False], budget, Exhaustion.SKIP)
    assert not s.admitted[0]
    s = run([[0.5]], 1.0, [2048], [False], budget, Exhaustion.SKIP)
    assert s.admitted[0] and s.cost_units[0] == 1024


def test_retire_never_admits_again():
    budget = 4096
    s = run([[1.0]], 1.0, [2048], [False], budget, Exhaustion.RETIRE)
    assert not s.admitted[0] and s.newly_retired[0]
    s = run([[0.1]], 1.0, [2048], [True], budget, Exhaustion.RETIRE)
    assert not s.admitted[0] and s.cost_units[0] == 0


def test_clip_policy_fits_remaining_exactly():
    budget = 4096
    s = run([[1.0, 1.0]], 2.0, [4000], [False], budget, Exhaustion.CLIP)
    assert s.admitted[0]
    assert s.cost_units[0] <= 96
    assert s.cost_units[0] == cost_units(s.units)[0]
    # close to the remaining budget: rounding loses at most sqrt(d) lattice units of norm
    assert s.cost_units[0] >= (np.sqrt(96) - np.sqrt(2)) ** 2
    s = run([[1.0]], 1.0, [4096], [False], budget, Exhaustion.CLIP)
    assert s.cost_units[0] == 0 and s.units[0].tolist() == [0]


@settings(max_examples=150, deadline=None)
@given(
    policy=st.sampled_from(list(Exhaustion)),
    b_norm=st.floats(0.05, 5.0),
    days=st.lists(
        st.tuples(
            st.floats(0.05, 3.0),  # clip
            st.lists(st.lists(st.floats(-5, 5), min_size=2, max_size=2), min_size=4, max_size=4),
        ),
        min_size=1,
        max_size=25,
    ),
)
def test_no_user_ever_exceeds_budget(policy, b_norm, days):
    budget = LAT.budget_units(b_norm)
    spent = np.zeros(4, np.int64)
    retired = np.zeros(4, bool)
    for clip, x in days:
        s = filter_contributions(np.array(x), clip, LAT, spent, retired, budget, policy)
        # the cost charged is the squared norm of exactly the vector added
        assert (s.cost_units == cost_units(s.units)).all()
        assert (s.units[~s.admitted] == 0).all()
        spent = spent + s.cost_units
        retired |= s.newly_retired
        assert (spent <= budget).all()


def test_corrupt_ledger_is_refused():
    with pytest.raises(ValueError, match="corrupt"):
        run([[1.0]], 1.0, [5000], [False], 4096, Exhaustion.SKIP)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(1, 5),
    st.integers(1, 5),
    st.data(),
)
def test_query_vectors_sums_left_to_right_without_blas(n, k, d, data):
    """Each output is ``r0·w0 + r1·w1 + …`` with one rounding per operation (no BLAS, no fused
    multiply-add): devices and the server compute the same bits whatever their BLAS."""
    from streamfilter.privacy.individual_filter import query_vectors

    fl = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=64)
    recs = np.array(
        data.draw(st.lists(st.lists(fl, min_size=k, max_size=k), min_size=n, max_size=n))
    )
    w = np.array(data.draw(st.lists(st.lists(fl, min_size=d, max_size=d), min_size=k, max_size=k)))
    got = query_vectors(recs, w)
    assert got.shape == (n, d)
    for i in range(n):
        for j in range(d):
            acc = recs[i, 0] * w[0, j]
            for t in range(1, k):
                acc = acc + recs[i, t] * w[t, j]
            assert got[i, j] == acc or (np.isnan(got[i, j]) and np.isnan(acc))


def test_query_vectors_selects_columns_for_identity_weights():
    from streamfilter.privacy.individual_filter import query_vectors

    recs = np.array([[1.5, -0.0, 3.0], [0.0, 2.0, 1e12]])
    out = query_vectors(recs, np.eye(3))
    assert np.array_equal(out, recs) and np.signbit(out[0, 1])
    with pytest.raises(ValueError, match="records"):
        query_vectors(recs, np.eye(2))


# --- admission on squared norms (rows too large to materialise) -----------------------------


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(0, 2**32),
    st.sampled_from(list(Exhaustion)),
    st.floats(0.1, 4.0),
)
def test_squared_norm_admission_bounds_what_is_added_and_follows_the_one_rule(
    d, seed, policy, clip
):
    """For explicit rows: the charge bounds the squared norm of ``scale·x`` (never below it, at
    most one unit plus slack above); admission agrees with the vector path's rule on the same
    integer costs; spent + cost <= B always."""
    rng = np.random.default_rng(seed)
    lat = Lattice(2.0**-12)
    n = 40
    x = rng.normal(size=(n, d)) * rng.choice([0.0, 0.1, 1.0, 10.0], size=(n, 1))
    budget = lat.budget_units(3.0 * clip * clip)
    spent = rng.integers(0, budget + 1, size=n)
    retired = rng.random(n) < 0.1
    step = filter_squared_norms((x * x).sum(axis=1), clip, lat, spent, retired, budget, policy)
    added = step.scale[:, None] * x
    true_units = (added * added).sum(axis=1) / lat.granularity**2
    assert np.all(step.cost_units >= true_units * (1 - 1e-12))
    assert np.all(step.cost_units <= true_units * (1 + 1e-8) + 1)
    assert np.all(spent + step.cost_units <= budget)
    assert np.all(step.scale[~step.admitted] == 0) and not step.admitted[retired].any()
    assert np.all(np.sqrt(true_units) * lat.granularity <= clip * (1 + 1e-12))
    if policy is not Exhaustion.CLIP:  # same rule as the vector path: fits iff cost <= B − spent
        full = filter_squared_norms(
            (x * x).sum(axis=1), clip, lat, np.zeros(n, np.int64), retired, budget, Exhaustion.SKIP
        )
        assert np.array_equal(step.admitted, ~retired & (full.cost_units <= budget - spent))


def test_squared_norm_admission_clips_to_the_remaining_budget():
    lat = Lattice(2.0**-10)
    norm2 = np.array([4.0, 4.0, 0.25, np.inf])
    budget = lat.budget_units(2.0)
    spent = np.array([budget - lat.budget_units(0.25), 0, 0, 0])
    step = filter_squared_norms(norm2, 1.0, lat, spent, np.zeros(4, bool), budget, Exhaustion.CLIP)
    assert step.scale[0] == pytest.approx(0.25, rel=1e-8)  # radius sqrt(0.25) for a norm of 2
    assert step.scale[1] == pytest.approx(0.5, rel=1e-8)  # radius C = 1
    assert step.scale[2] == 1.0 and step.scale[3] == 0.0 and step.cost_units[3] == 0
    with pytest.raises(ValueError, match="corrupt"):
        filter_squared_norms(
            norm2, 1.0, lat, spent + budget, np.zeros(4, bool), budget, Exhaustion.CLIP
        )
    with pytest.raises(ValueError, match="norm2"):
        filter_squared_norms(-norm2, 1.0, lat, spent, np.zeros(4, bool), budget, Exhaustion.CLIP)
