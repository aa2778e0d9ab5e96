"""Budget rows' checksums in bulk (``runtime/store/_row_crc.c`` behind ``schema.budget_crcs``):
each is the row's ``row_crc`` — the format stored states are verified with — for ids the native
path takes (printable ASCII without a quote or backslash) and those it leaves to Python, any
int64 spend, in any mix; a bad retired flag is refused. In CI a missing build is a failure."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.runtime.store import schema
from streamfilter.runtime.store.schema import budget_crcs, row_crc
from tests.support.native_build import check_built_in_ci, needs

built = needs(schema._row_crc, "runtime/store/_row_crc.c")


def test_the_native_row_checksums_are_built_in_ci():
    check_built_in_ci(schema._row_crc, "runtime/store/_row_crc.c")


ids = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
    st.sampled_from(["it's", 'a"b', "a\\b", "tab\there", "é", "\ud800", "", "'"]),
    st.text(max_size=5),
)
rows = st.lists(st.tuples(ids, st.integers(-(2**63), 2**63 - 1), st.booleans()), max_size=40)


@given(rows)
@settings(max_examples=400, deadline=None)
def test_bulk_checksums_are_each_rows_row_crc(batch):
    users = [u for u, _, _ in batch]
    spent = [s for _, s, _ in batch]
    retired = [r for _, _, r in batch]
    assert budget_crcs(users, spent, retired) == [row_crc(u, s, int(r)) for u, s, r in batch]


@built
def test_the_native_path_marks_the_ids_it_leaves_to_python():
    assert schema._row_crc is not None
    users = ["user-1", "it's", "back\\slash", "é", "ok"]
    got = np.frombuffer(
        schema._row_crc.budget_crcs(users, np.arange(5, dtype=np.int64), np.ones(5, np.uint8)),
        np.int64,
    ).tolist()
    assert got[0] == row_crc("user-1", 0, 1) and got[4] == row_crc("ok", 4, 1)
    assert got[1:4] == [-1, -1, -1]


@built
def test_bad_columns_are_refused():
    assert schema._row_crc is not None
    with pytest.raises(ValueError, match="retired"):
        schema._row_crc.budget_crcs(["a"], np.zeros(1, np.int64), np.array([2], np.uint8))
    with pytest.raises(ValueError, match="one int64"):
        schema._row_crc.budget_crcs(["a", "b"], np.zeros(1, np.int64), np.zeros(2, np.uint8))
    with pytest.raises(TypeError):
        schema._row_crc.budget_crcs(("a",), np.zeros(1, np.int64), np.zeros(1, np.uint8))


def test_values_the_native_path_cannot_take_go_the_exact_way():
    """A bool or a spend beyond int64 is checksummed by ``row_crc`` as before."""
    assert budget_crcs(["a", "b"], [True, 2], [False, True]) == [
        row_crc("a", True, 0),
        row_crc("b", 2, 1),
    ]
    assert budget_crcs(["a"], [2**70], [True]) == [row_crc("a", 2**70, 1)]


def _packed(batch) -> schema.PackedBudgets:
    users = np.empty(len(batch), dtype=object)
    users[:] = [u for u, _, _ in batch]
    return schema.PackedBudgets.of(
        users,
        np.array([s for _, s, _ in batch], np.int64),
        np.array([r for _, _, r in batch], bool),
    )


def _fold_rows_python(packed: schema.PackedBudgets, path) -> list:
    saved = schema._row_crc
    try:
        schema._row_crc = None  # type: ignore[assignment]
        return schema.fold_rows(packed, path)
    finally:
        schema._row_crc = saved


plain = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)


@given(
    st.lists(
        st.tuples(
            st.one_of(plain.filter(lambda u: "'" not in u and "\\" not in u), ids),
            st.integers(-(2**63), 2**63 - 1),
            st.booleans(),
        ),
        max_size=40,
    ).flatmap(lambda b: st.permutations(b + b[: len(b) // 2]))  # users listed twice
)
@settings(max_examples=400, deadline=None)
def test_fold_rows_are_the_sorted_rows_with_their_checksums(tmp_path_factory, batch):
    """``schema.fold_rows`` (the fold's upserts; natively ``_row_crc.budget_rows`` when every
    id is plain): each entry's ``(user, spent, retired, row_crc)``, sorted by id, a user listed
    twice in entry order — the same list as the Python path, native or not."""
    path = tmp_path_factory.getbasetemp() / "state.db"
    packed = _packed(batch)
    want = sorted(
        ((u, s, int(r), row_crc(u, s, int(r))) for u, s, r in batch), key=lambda row: row[0]
    )
    assert schema.fold_rows(packed, path) == want == _fold_rows_python(packed, path)


@built
def test_fold_rows_leave_odd_ids_and_bad_columns_to_the_python_path(tmp_path):
    assert schema._row_crc is not None
    budget_rows = schema._row_crc.budget_rows
    good = _packed([("b", 5, False), ("a", -1, True)])
    assert budget_rows(good.ids, good.id_lengths, good.spent_units, good.retired) == [
        ("a", -1, 1, row_crc("a", -1, 1)),
        ("b", 5, 0, row_crc("b", 5, 0)),
    ]
    for odd in ("it's", "é", "back\\slash", "tab\there"):
        p = _packed([("a", 1, False), (odd, 2, True)])
        assert budget_rows(p.ids, p.id_lengths, p.spent_units, p.retired) is None
        assert schema.fold_rows(p, tmp_path) == _fold_rows_python(p, tmp_path)
    # columns that disagree: lengths past the ids, ids left over, a retired byte of 2
    assert budget_rows(good.ids[:1], good.id_lengths, good.spent_units, good.retired) is None
    assert budget_rows(good.ids + b"x", good.id_lengths, good.spent_units, good.retired) is None
    assert budget_rows(good.ids, good.id_lengths, good.spent_units, b"\x02\x00") is None
    assert budget_rows(good.ids, good.id_lengths[:4], good.spent_units, good.retired) is None
    corrupt = schema.PackedBudgets(2, good.id_lengths, good.ids + b"x", good.spent_units, b"\0\0")
    with pytest.raises(schema.CorruptRowError):
        schema.fold_rows(corrupt, tmp_path)
