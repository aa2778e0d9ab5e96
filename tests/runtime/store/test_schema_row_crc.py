"""Row checksums (``runtime/store/schema.py``): ``row_crc`` is ``zlib.crc32`` of the row packed
as binary (``pack_row``), so that a changed byte or a value of another type changes it; the
budget rows' checksums in bulk (``budget_crcs``, the fold's ``fold_rows``) are each row's
``row_crc``. (The conversion of states written with the older ``repr`` checksums:
``tests/runtime/store/test_schema_migration.py``.)"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.runtime.store import schema
from streamfilter.runtime.store.schema import budget_crcs, pack_row, row_crc

ids = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
    st.sampled_from(["it's", 'a"b', "a\\b", "tab\there", "é", "\ud800", "", "'"]),
    st.text(max_size=5),
)
rows = st.lists(st.tuples(ids, st.integers(-(2**63), 2**63 - 1), st.booleans()), max_size=40)


def test_a_row_is_packed_with_each_value_tagged():
    assert pack_row(5, -1.5, "é", b"\x00", None) == (
        struct.pack("<cq", b"i", 5)
        + struct.pack("<cd", b"f", -1.5)
        + struct.pack("<cI", b"t", 2)
        + "é".encode()
        + struct.pack("<cI", b"b", 1)
        + b"\x00"
        + b"n"
    )
    assert row_crc("a", 1) == zlib.crc32(pack_row("a", 1))
    assert pack_row(True) == pack_row(1)  # SQLite stores a bool as the integer
    with pytest.raises(TypeError):
        pack_row([1])


def _typed(values: list) -> list[tuple[str, str]]:
    return [(type(v).__name__, repr(v)) for v in values]


@given(st.lists(st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(), ids, st.binary())))
def test_values_of_another_type_or_split_otherwise_pack_otherwise(values):
    """Packing is injective on rows: text and blob of the same bytes, an int and the float of
    its value, two values or their concatenation — all differ (each is tagged and sized)."""
    packed = pack_row(*values)
    for other in (
        [v.encode("utf-8", "surrogatepass") if isinstance(v, str) else v for v in values],
        [float(v) if isinstance(v, int) else v for v in values],
        ["".join(v for v in values if isinstance(v, str))] if len(values) > 1 else [],
    ):
        if _typed(other) != _typed(values):
            assert pack_row(*other) != packed


@given(rows)
@settings(max_examples=200, deadline=None)
def test_bulk_checksums_are_each_rows_row_crc(tmp_path_factory, batch):
    path = tmp_path_factory.getbasetemp() / "state.db"
    want = [row_crc(u, s, int(r)) for u, s, r in batch]
    assert budget_crcs(_packed(batch), path).tolist() == want


def _packed(batch) -> schema.PackedBudgets:
    users = np.empty(len(batch), dtype=object)
    users[:] = [u for u, _, _ in batch]
    return schema.PackedBudgets.of(
        users,
        np.array([s for _, s, _ in batch], np.int64),
        np.array([r for _, _, r in batch], bool),
    )


@given(
    st.lists(st.tuples(ids, st.integers(-(2**63), 2**63 - 1), st.booleans()), max_size=40).flatmap(
        lambda b: st.permutations(b + b[: len(b) // 2])  # users listed twice
    )
)
@settings(max_examples=200, deadline=None)
def test_fold_rows_are_the_sorted_rows_with_their_checksums(tmp_path_factory, batch):
    """``schema.fold_rows`` (the fold's upserts): each entry's ``(user, spent, retired,
    row_crc)``, sorted by id, a user listed twice in entry order."""
    path = tmp_path_factory.getbasetemp() / "state.db"
    want = sorted(
        ((u, s, int(r), row_crc(u, s, int(r))) for u, s, r in batch), key=lambda row: row[0]
    )
    assert list(zip(*schema.fold_rows(_packed(batch), path), strict=True)) == want


def test_fold_rows_sort_ids_as_text_across_word_and_length_boundaries(tmp_path):
    """The radix order (``PackedBudgets.id_order``) is ``str`` order where byte words tie or
    straddle: an id and the same id with NULs after it, ids of 8 and 9 bytes sharing a prefix,
    code points either side of the surrogates, and a user listed twice keeps entry order."""
    batch = [
        ("a\x00", 1, False),
        ("abcdefgh", 2, True),
        ("a", 3, False),
        ("abcdefgh\x00", 4, False),
        ("\ue000", 5, False),
        ("\ud800", 6, True),
        ("\ud7ff", 7, False),
        ("a", 8, True),
        ("abcdefghi", 9, False),
        ("", 10, False),
        ("abcdefgh", 11, False),
    ]
    want = sorted(
        ((u, s, int(r), row_crc(u, s, int(r))) for u, s, r in batch), key=lambda row: row[0]
    )
    assert list(zip(*schema.fold_rows(_packed(batch), tmp_path), strict=True)) == want
