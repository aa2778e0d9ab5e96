"""Exact per-cell sums (engine/exact_sums.py): every cell's value is ``math.fsum`` of its values
(the real sum rounded once), whatever the order, grouping or folding of the values."""

import math
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.engine import cell_table, exact_sums
from streamfilter.engine.contract import Event
from streamfilter.engine.exact_sums import (
    FRACTION_BITS,
    LIMBS,
    CellSums,
    exact_sums_by_key,
    fixed_point_limbs,
    round_limbs,
)
from streamfilter.engine.records import DayAccumulator

#: values that stress the fixed point: the contract's bounds, tiny values with bits below
#: 2^-87 (kept aside), subnormals, signed zeros, decimals that are not binary fractions
EDGES = [
    1e12,
    -1e12,
    2.0**40 - 1,
    -(2.0**39),
    2.0**-87,
    3 * 2.0**-88,
    -(2.0**-86),
    1e-300,
    -5e-324,
    0.0,
    -0.0,
    0.1,
    -0.1,
    0.3,
    12.37,
    1.0,
    2.0**53 + 2,
]
floats = st.one_of(
    st.sampled_from(EDGES),
    st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False),
    st.floats(-1e-6, 1e-6, allow_nan=False, allow_infinity=False),
    st.integers(-10_000, 10_000).map(lambda c: c / 100),
)
cells = st.one_of(
    st.lists(st.tuples(st.integers(0, 6), floats), min_size=0, max_size=60),
    # distinct keys, as a day's folded cells are
    st.lists(st.tuples(st.integers(0, 6), floats), max_size=7, unique_by=lambda p: p[0]),
)


def reference(pairs: list[tuple[int, float]]) -> tuple[list[int], list[float]]:
    by_key: dict[int, list[float]] = {}
    for key, value in pairs:
        by_key.setdefault(key, []).append(value)
    keys = sorted(by_key)
    return keys, [math.fsum(by_key[k]) + 0.0 for k in keys]


def same_bits(a: np.ndarray, b: list[float]) -> bool:
    return np.array_equal(np.asarray(a, np.float64).view(np.int64), np.array(b).view(np.int64))


@settings(max_examples=400, deadline=None)
@given(cells)
def test_sums_by_key_are_fsum_of_each_keys_values(pairs):
    keys = np.array([k for k, _ in pairs], np.int64)
    values = np.array([v for _, v in pairs], np.float64)
    want_keys, want = reference(pairs)
    # sorted, or through a table of slots (the bound tight, or loose) when no key repeats
    for bound in (None, 7, 7 * exact_sums.DENSE_SLOTS_PER_KEY):
        got_keys, got = exact_sums_by_key(keys, values, bound)
        assert got_keys.tolist() == want_keys
        assert same_bits(got, want)


@settings(max_examples=300, deadline=None)
@given(
    cells,
    st.lists(st.booleans(), min_size=60, max_size=60),
    st.integers(1, 7),
    st.sampled_from([1, 2, 5, exact_sums.FOLD_STEP]),
)
def test_folding_at_any_point_gives_the_same_sums(pairs, folds, step, fold_step):
    """Whatever is buffered between folds, and however many values a fold converts at a time."""
    sums = CellSums()
    saved, exact_sums.FOLD_STEP = exact_sums.FOLD_STEP, fold_step
    try:
        for i in range(0, len(pairs), step):
            chunk = pairs[i : i + step]
            sums.add(np.array([k for k, _ in chunk], np.int64), np.array([v for _, v in chunk]))
            if folds[i]:
                sums.fold()
        got_keys, got = sums.sums()
    finally:
        exact_sums.FOLD_STEP = saved
    want_keys, want = reference(pairs)
    assert got_keys.tolist() == want_keys
    assert same_bits(got, want)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-(2**62), 2**62), min_size=LIMBS, max_size=LIMBS))
def test_rounding_the_limbs_is_the_correctly_rounded_value(limbs):
    """Any accumulator, even far from normalised, rounds like Python's exact int → float
    division (correctly rounded, ties to even)."""
    exact = sum(limb << (32 * k) for k, limb in enumerate(limbs))
    want = float(Fraction(exact, 2**FRACTION_BITS)) + 0.0
    got = round_limbs(np.array([limbs], np.int64))
    assert same_bits(got, [want])


def test_ties_and_the_sticky_bit_round_to_even_or_away_as_the_bits_below_say():
    one = 1 << FRACTION_BITS
    ulp = one >> 52  # an ulp of 1.0 in fixed point
    cases = [
        one + ulp // 2,  # exactly half an ulp above 1.0: ties to even (1.0)
        one + ulp // 2 + 1,  # a hair above half: rounds up
        one + 3 * ulp // 2,  # half above 1 + ulp: ties to even (1 + 2 ulp)
        one + ulp // 2 - 1,  # a hair below half: rounds down
    ]
    for exact in cases:
        limbs = [(exact >> (32 * k)) & 0xFFFFFFFF for k in range(LIMBS - 1)]
        limbs.append(exact >> (32 * (LIMBS - 1)))
        got = round_limbs(np.array([limbs], np.int64))
        assert same_bits(got, [float(Fraction(exact, 2**FRACTION_BITS))])


@settings(max_examples=200, deadline=None)
@given(st.lists(floats, max_size=40))
def test_values_that_fit_split_into_limbs_exactly(values):
    limbs, fits = fixed_point_limbs(np.array(values, np.float64))
    for row, fit, value in zip(limbs.tolist(), fits.tolist(), values, strict=True):
        exact = sum(limb << (32 * k) for k, limb in enumerate(row))
        if fit:
            assert Fraction(exact, 2**FRACTION_BITS) == Fraction(value)
        else:  # kept aside: only values outside the fixed point's range or resolution
            assert exact == 0
            assert abs(value) >= 2.0**40 or Fraction(value) * 2**FRACTION_BITS % 1 != 0


@settings(max_examples=150, deadline=None)
@given(cells, st.randoms(use_true_random=False))
def test_the_open_day_holds_each_cell_as_the_fsum_of_its_values_in_any_order(pairs, rnd):
    """The accumulator (folding after every batch) gives each cell ``fsum`` of its values,
    and the same bits for any arrival order."""
    events = [(f"u{k}", v, f"e{i}") for i, (k, v) in enumerate(pairs)]
    shuffled = list(events)
    rnd.shuffle(shuffled)
    records = []
    for order in (events, shuffled):
        acc = DayAccumulator("2026-01-01")
        for a in range(0, len(order), 7):
            chunk = order[a : a + 7]
            acc.add_many(
                [
                    Event(user_id=u, day="2026-01-01", values={"x": v}, event_id=e)
                    for u, v, e in chunk
                ]
            )
        records.append(acc.finish())
    a, b = records
    assert a.users.tolist() == b.users.tolist()
    assert same_bits(a.value, b.value.tolist())
    by_user = dict(zip(a.users.tolist(), a.value.tolist(), strict=True))
    keys, want = reference(pairs)
    assert same_bits(np.array([by_user[f"u{k}"] for k in keys]), want)


def test_memory_is_bounded_by_cells_the_buffer_is_folded(monkeypatch):
    """With a small fold threshold, many values for few cells never pile up in the buffer."""
    monkeypatch.setattr(exact_sums, "FOLD_MIN", 64)
    monkeypatch.setattr(cell_table, "FOLD_MIN", 64)
    cells = cell_table.NumpyCells()
    acc = DayAccumulator("2026-01-01", cells=cells)
    peak = 0
    for _ in range(200):
        acc.add_many(
            [
                Event(user_id=f"u{u}", day="2026-01-01", values={"x": 0.1, "y": 1.5})
                for u in range(10)
            ]
        )
        peak = max(peak, cells.buffered)
    assert peak <= 64 + 20  # one batch past the threshold at most, not 4,000 values
    rec = acc.finish()
    assert rec.n_users == 10
    assert same_bits(rec.value, [math.fsum([0.1] * 200), 300.0] * 10)
