"""The open day's user-code table: the native ``UserCodes`` (``engine/_user_codes.c``) gives
exactly the codes of the dict it replaces (``user_codes.DictUserCodes``: ``dict.setdefault``),
for batches and single ids, equal ids from different objects, any text, and growth from an
empty table through many resizes. In CI a missing build is a failure."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.engine import user_codes
from streamfilter.engine.user_codes import DictUserCodes
from tests.support.native_build import check_built_in_ci, needs

native = needs(user_codes._user_codes, "engine/_user_codes.c")


def test_the_native_user_codes_are_built_in_ci():
    check_built_in_ci(user_codes._user_codes, "engine/_user_codes.c")
    assert isinstance(user_codes.new_user_codes(), user_codes._NativeUserCodes)


ids = st.one_of(
    st.sampled_from(["u1", "u2", "é", "😀", "", "u" * 300]),
    st.text(max_size=8),  # any code point, lone surrogates included
    st.integers(0, 3000).map(lambda i: f"user-{i}"),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("batch"), st.lists(ids, max_size=40)),
        st.tuples(st.just("one"), ids),
        st.tuples(st.just("clear"), st.none()),
        st.tuples(st.just("reserve"), st.integers(0, 5000)),  # a size hint changes no code
    ),
    max_size=30,
)


@native
@settings(max_examples=300, deadline=None)
@given(ops)
def test_native_codes_are_the_dicts(sequence):
    table, reference = user_codes._NativeUserCodes(), DictUserCodes()
    next_code = 0
    for op, arg in sequence:
        if op == "batch":
            # fresh str objects: equal text from another object must find the same code
            batch = [("".join(list(i)) if i else i) for i in arg]
            got_new: list[str] = []
            want_new: list[str] = []
            got = table.codes(batch, next_code, got_new)
            want = reference.codes(arg, next_code, want_new)
            assert got.dtype == np.int64 and got.tolist() == want.tolist()
            # the ids that took a new code, in order of first arrival: those of codes >= first
            assert (
                got_new
                == want_new
                == list(dict.fromkeys(i for i, c in zip(arg, want, strict=True) if c >= next_code))
            )
            next_code += len(arg)
        elif op == "one":
            assert table.code_of(arg, next_code) == reference.code_of(arg, next_code)
            next_code += 1
        elif op == "reserve":
            table.reserve(arg)
            reference.reserve(arg)
        else:
            table.clear()
            reference.clear()
        assert len(table) == len(reference)


@native
def test_a_table_grown_through_many_resizes_keeps_every_code():
    table = user_codes._NativeUserCodes()
    n = 200_000
    users = [f"u{i}" for i in range(n)]
    first = table.codes(users, 10)
    assert first.tolist() == list(range(10, 10 + n))
    again = table.codes([f"u{i}" for i in reversed(range(n))], 10 + n)  # other objects
    assert again.tolist() == list(reversed(range(10, 10 + n)))
    assert len(table) == n
    assert table.code_of("new", 7) == 7 and table.code_of("u5", 99) == 15


@native
def test_a_reservation_out_of_range_is_refused_and_changes_nothing():
    table = user_codes._NativeUserCodes()
    table.codes(["a", "b"], 0)
    for bad in (-1, 2**62):
        with pytest.raises(ValueError):
            table.reserve(bad)
    assert len(table) == 2 and table.codes(["b", "c"], 2).tolist() == [1, 2]


@native
def test_ids_must_be_str():
    table = user_codes._NativeUserCodes()
    with pytest.raises(TypeError, match="str"):
        table.codes(["a", 5], 0)  # type: ignore[list-item]
    assert len(table) == 0  # checked before any id is coded


@native
def test_a_hash_that_changes_the_list_does_not_change_the_batch():
    """A str subclass's ``__hash__`` is Python code: one that empties the list mid-batch
    neither crashes the table nor changes the batch it codes (it reads a copy)."""
    ids: list[str] = []

    class Emptying(str):
        def __hash__(self) -> int:
            ids.clear()
            return str.__hash__(self)

    ids.extend([Emptying("a"), "b", "c", "a"])
    table = user_codes._NativeUserCodes()
    assert table.codes(ids, 0).tolist() == [0, 1, 2, 0]
    assert len(table) == 3 and ids == []
