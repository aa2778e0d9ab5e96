"""The open day's cell table: the native ``CellTable`` (``engine/_cell_table.c``) gives every
(user, coordinate) cell the exact sum of its values rounded once — ``math.fsum``'s value, bit for
bit, and ``cell_table.NumpyCells``' — for values across the whole fixed point (carries and borrows
through every word), values kept aside (tiny, huge, inf, nan), category hits, any batching and
growth through many resizes; its records come out in the ranks' order; a bad batch or bad ranks
change nothing. In CI a missing build is a failure."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter import _native
from streamfilter.engine import cell_table, native
from tests.support.native_build import check_built_in_ci, needs

built = needs(native.cell_table, "engine/_cell_table.c")
COORD_BITS = 31


def test_the_native_cell_table_is_built_in_ci():
    check_built_in_ci(native.cell_table, "engine/_cell_table.c")
    assert "engine/_cell_table.c" not in _native.missing()
    assert isinstance(cell_table.new_cells(), cell_table.NativeCells)


def new_table():
    assert native.cell_table is not None
    return native.cell_table.CellTable()


def fixed_values(draw_sign: bool = True):
    """Values the fixed point holds: m * 2^e, |value| < 2^40, lowest bit at least 2^-87."""
    return st.builds(
        lambda m, e, s: math.ldexp(m, e) * s,
        st.integers(0, 2**53 - 1),
        st.integers(-87, -13),
        st.sampled_from([1.0, -1.0] if draw_sign else [1.0]),
    ).filter(lambda v: abs(v) < 2.0**40)


values = st.one_of(
    fixed_values(),
    st.sampled_from([0.0, -0.0, 0.1, -0.1, 1.0, 2.0**40 - 1, -(2.0**39), 2.0**-87, 1e12]),
    st.floats(-1e12, 1e12, allow_nan=False),
    # kept aside: bits below 2^-87, subnormals, beyond 2^40
    st.sampled_from([1e-30, -3e-40, 5e-324, 2.0**41, -1e200, 1e300]),
)
special = st.sampled_from([math.inf, -math.inf, math.nan])
#: (user code, coordinate code, value or None for a category hit)
entries = st.tuples(st.integers(0, 5), st.integers(0, 3), st.one_of(values, st.none()))


def fsum_or_nan(xs: list[float]) -> float:
    try:
        return math.fsum(xs) + 0.0
    except ValueError:  # inf + -inf
        return math.nan


def reference(items) -> dict[tuple[int, int], float]:
    by_cell: dict[tuple[int, int], list[float]] = {}
    for u, c, v in items:
        by_cell.setdefault((u, c), []).append(1.0 if v is None else v)
    return {cell: fsum_or_nan(vs) for cell, vs in by_cell.items()}


def bits(x: float) -> int:
    return int(np.float64(x).view(np.int64)) if not math.isnan(x) else -1  # any nan alike


def add_items(store, items, batch: int) -> None:
    """``items`` in batches of ``batch``, numbers and hits apart, as DayAccumulator adds them;
    a size hint (``reserve``) before each batch, which must change nothing."""
    for a in range(0, len(items), batch):
        store.reserve(a % 7)
        chunk = items[a : a + batch]
        hits = [(u, c) for u, c, v in chunk if v is None]
        if hits:
            store.add_hits(np.array([(u << COORD_BITS) | c for u, c in hits], np.int64))
        for coord in range(4):
            nums = [(u, v) for u, c, v in chunk if v is not None and c == coord]
            if nums:
                store.add_numbers(
                    coord,
                    np.array([u for u, _ in nums], np.int32),
                    np.array([v for _, v in nums], np.float64),
                )


def all_records(store, n_users: int, n_coords: int, user_rank, coord_rank):
    pos, coord, value = store.records(user_rank, coord_rank)
    return pos.tolist(), coord.tolist(), [bits(v) for v in value.tolist()]


@built
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(entries, st.tuples(st.integers(0, 5), st.integers(0, 3), special))),
    st.integers(1, 9),
    st.permutations(range(6)),
    st.permutations(range(4)),
)
def test_each_cell_is_fsum_of_its_values_in_rank_order(items, batch, user_perm, coord_perm):
    native_cells, numpy_cells = cell_table.NativeCells(), cell_table.NumpyCells()
    add_items(native_cells, items, batch)
    add_items(numpy_cells, items, batch)
    want = reference(items)
    users = native_cells.users_present(6)
    coords = native_cells.coords_present(4)
    assert users.tolist() == [any(u == i for u, _ in want) for i in range(6)]
    assert coords.tolist() == [any(c == k for _, c in want) for k in range(4)]
    assert users.tolist() == numpy_cells.users_present(6).tolist()
    assert coords.tolist() == numpy_cells.coords_present(4).tolist()
    # dense ranks of the present codes, in the drawn orders
    user_rank = np.full(6, -1, np.int64)
    present_users = [u for u in user_perm if users[u]]
    user_rank[present_users] = np.arange(len(present_users))
    coord_rank = np.full(4, -1, np.int64)
    present_coords = [c for c in coord_perm if coords[c]]
    coord_rank[present_coords] = np.arange(len(present_coords))
    got = all_records(native_cells, 6, 4, user_rank, coord_rank)
    expected = sorted(
        (int(user_rank[u]), int(coord_rank[c]), bits(v)) for (u, c), v in want.items()
    )
    assert list(zip(*got, strict=True)) == expected
    assert got == all_records(numpy_cells, 6, 4, user_rank, coord_rank)


@built
@settings(max_examples=200, deadline=None)
@given(st.lists(fixed_values(), min_size=1, max_size=200))
def test_carries_and_borrows_through_every_word_are_exact(xs):
    """One cell taking many values of both signs near 2^40 and near 2^-87 at once: the sum
    crosses zero and the 64- and 128-bit word boundaries; it is the exact sum rounded once."""
    t = new_table()
    big = [2.0**39 + 2.0**-13, -(2.0**39), 2.0**39, -(2.0**-87)] * 3
    vs = np.array(big + xs + big[::-1], np.float64)
    t.add(np.zeros(len(vs), np.int64), vs)
    _, _, value = t.records(np.zeros(1, np.int64), np.zeros(1, np.int64))
    exact = sum(Fraction(v) for v in vs.tolist())
    assert bits(np.frombuffer(value)[0]) == bits(float(exact) + 0.0)


@built
def test_an_exact_zero_is_positive_and_a_single_value_is_itself():
    t = new_table()
    t.add(
        np.array([0, 0, 1 << COORD_BITS, 2 << COORD_BITS], np.int64),
        np.array([1.5, -1.5, -0.0, -7.25]),
    )
    _, _, value = t.records(np.arange(3, dtype=np.int64), np.arange(1, dtype=np.int64))
    assert [bits(v) for v in np.frombuffer(value)] == [bits(0.0), bits(0.0), bits(-7.25)]
    assert math.copysign(1.0, np.frombuffer(value)[1]) == 1.0  # -0.0 alone: +0.0, as fsum


@built
def test_growth_through_many_resizes_keeps_every_cell():
    t = new_table()
    n = 300_000
    users = np.arange(n, dtype=np.int64)
    for coord in range(3):
        t.add((users << COORD_BITS) | coord, np.full(n, 0.25))
    t.add((users[::-1] << COORD_BITS) | 1, None)  # a hit for every (user, 1), other order
    assert len(t) == 3 * n
    rank = np.random.default_rng(3).permutation(n).astype(np.int64)
    pos, coord, value = (np.frombuffer(b) for b in t.records(rank, np.arange(3, dtype=np.int64)))
    pos, coord = pos.view(np.int64), coord.view(np.int64)
    assert np.array_equal(pos, np.repeat(np.arange(n), 3))
    assert np.array_equal(coord, np.tile(np.arange(3), n))
    assert np.array_equal(value, np.tile([0.25, 1.25, 0.25], n))
    assert t.nbytes >= 3 * n * 32
    t.clear()
    assert len(t) == 0 and t.nbytes == 0


@built
def test_a_reservation_allocates_once_and_changes_nothing():
    t = new_table()
    t.reserve(100_000)
    reserved = t.nbytes
    assert reserved >= 100_000 * 32 and len(t) == 0
    users = np.arange(100_000, dtype=np.int64)
    t.add(users << COORD_BITS, np.full(len(users), 0.5))
    assert t.nbytes == reserved  # no growth: the cells fit where reserved
    with pytest.raises(ValueError):
        t.reserve(-1)
    with pytest.raises(OverflowError):
        t.reserve(2**31)
    assert len(t) == 100_000


@built
def test_a_bad_batch_changes_nothing():
    t = new_table()
    t.add(np.array([5, 6], np.int64), np.array([1.0, 2.0]))
    before = (len(t), t.records(np.arange(1, dtype=np.int64), np.arange(7, dtype=np.int64)))
    with pytest.raises(ValueError, match="negative"):
        t.add(np.array([7, -1], np.int64), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match="length"):
        t.add(np.array([7, 8], np.int64), np.array([1.0]))
    with pytest.raises(TypeError, match="int64"):
        t.add(np.array([7], np.int32), np.array([1.0]))
    with pytest.raises(TypeError, match="float64"):
        t.add(np.array([7], np.int64), np.array([1], np.int64))
    with pytest.raises(TypeError, match="1-D"):
        t.add(np.zeros((1, 1), np.int64), None)
    after = (len(t), t.records(np.arange(1, dtype=np.int64), np.arange(7, dtype=np.int64)))
    assert after == before


@built
def test_ranks_must_cover_every_cell_and_be_distinct():
    t = new_table()
    t.add(np.array([(0 << COORD_BITS) | 0, (1 << COORD_BITS) | 1], np.int64), None)
    with pytest.raises(ValueError, match="no rank"):
        t.records(np.array([0, -1], np.int64), np.array([0, 1], np.int64))
    with pytest.raises(ValueError, match="no rank"):
        t.records(np.array([0], np.int64), np.array([0, 1], np.int64))  # user 1 beyond
    with pytest.raises(ValueError, match="no rank"):
        t.records(np.array([0, 5], np.int64), np.array([0, 1], np.int64))  # rank >= n
    with pytest.raises(ValueError, match="share"):
        t.add(np.array([(0 << COORD_BITS) | 1], np.int64), None)
        t.records(np.array([0, 1], np.int64), np.array([0, 0], np.int64))
    with pytest.raises(ValueError, match=">= 1"):
        t.users_present(1)
    assert np.frombuffer(t.coords_present(3), np.uint8).tolist() == [1, 1, 0]
