"""Native id packing (``engine/_packed_ids.c``, behind ``ledger.keys_in_canonical_order``) lays
out exactly the words, offsets and lengths of the numpy path (``encode_ids`` + ``pack_ids``,
permuted, then ``UserKeys.compacted``), and leaves every id it cannot pack to that path.

Built by the project's install (``pip install -e .``); in CI a missing build is a failure
(``test_native_scanner.py`` checks the build the same way).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.dedup import index as event_ids
from streamfilter.engine import ledger, records
from streamfilter.engine.ledger import python_hash
from tests.support.native_build import check_built_in_ci, needs

native = needs(ledger._packed_ids, "engine/_packed_ids.c")


def test_the_native_packing_is_built_in_ci():
    check_built_in_ci(ledger._packed_ids, "engine/_packed_ids.c")


def _keys(ids: list[str], canonical: np.ndarray, packed_natively: bool):
    arr = np.empty(len(ids), dtype=object)
    arr[:] = ids
    hashes = python_hash(arr)[np.argsort(canonical)]
    saved = ledger._packed_ids
    try:
        if not packed_natively:
            ledger._packed_ids = None
        return records._keys_in_order(arr, canonical, hashes, python_hash)
    finally:
        ledger._packed_ids = saved


def sorted_ids(ids: list[str], canonical: np.ndarray) -> list[str]:
    return [ids[i] for i in np.argsort(canonical)]


ids_strategy = st.lists(
    st.one_of(
        st.text(st.characters(max_codepoint=0x7F), min_size=0, max_size=40),
        st.text(min_size=1, max_size=20),  # any code point, surrogates included
        st.text(st.characters(max_codepoint=0x7F), min_size=250, max_size=300),
        st.sampled_from(["é", "😀" * 64, "user-1", "x" * 8, "y" * 9]),
    ),
    min_size=1,  # a day with no user returns before packing
    max_size=60,
)


@native
@settings(max_examples=300, deadline=None)
@given(ids_strategy, st.randoms(use_true_random=False))
def test_native_packing_is_the_numpy_path_bit_for_bit(ids, rnd):
    canonical = np.array(rnd.sample(range(len(ids)), len(ids)), dtype=np.int64)
    got = _keys(ids, canonical, True)
    want = _keys(ids, canonical, False)
    for field in ("hashes", "lengths", "woff", "words"):
        a, b = getattr(got, field), getattr(want, field)
        assert a.dtype == b.dtype and np.array_equal(a, b), field
    (text, lengths), (want_text, want_lengths) = got.utf8(), want.utf8()
    assert text == want_text == "".join(sorted_ids(ids, canonical)).encode("utf-8", "surrogatepass")
    assert np.array_equal(lengths, want_lengths)


@native
def test_ids_the_native_path_cannot_pack_go_the_numpy_way():
    canonical = np.array([1, 0], np.int64)
    # a lone surrogate has no UTF-8 form: the numpy path packs it (surrogatepass)
    assert (
        ledger.keys_in_canonical_order(["a", "\ud800"], canonical, canonical, python_hash) is None
    )
    # an id beyond the limit: the numpy path raises its error
    assert (
        ledger.keys_in_canonical_order(["a", "x" * 70_000], canonical, canonical, python_hash)
        is None
    )
    with pytest.raises(ValueError, match="longer than"):
        _keys(["a", "x" * 70_000], canonical, True)


@native
@pytest.mark.parametrize("canonical", [[0, 0], [0, 2], [-1, 0], [0]])
def test_a_canonical_order_that_is_not_a_permutation_is_refused(canonical):
    with pytest.raises(ValueError, match=r"permutation|one int64"):
        ledger._packed_ids.pack_words(["a", "b"], np.array(canonical, np.int64), 100)


@native
@settings(max_examples=300, deadline=None)
@given(ids_strategy)
def test_event_id_packing_is_the_python_path(ids):
    """``event_ids.packed_ids`` (the event-id index's runs) gives the same text and lengths
    natively as ``id_bytes`` of the joined ids does (lone surrogates go the Python way)."""
    text, lengths = event_ids.packed_ids(ids)
    assert text == "".join(ids).encode("utf-8", "surrogatepass")
    assert lengths.dtype == np.int32
    assert lengths.tolist() == [len(i.encode("utf-8", "surrogatepass")) for i in ids]
    saved = event_ids._packed_ids
    try:
        event_ids._packed_ids = None
        python_text, python_lengths = event_ids.packed_ids(ids)
    finally:
        event_ids._packed_ids = saved
    assert (text, lengths.tolist()) == (python_text, python_lengths.tolist())
    native_result = ledger._packed_ids.concat_utf8(ids)
    assert (native_result is None) == any(0xD800 <= ord(c) <= 0xDFFF for c in "".join(ids))


@native
@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=6), max_size=50))
def test_native_hashes_are_pythons_hash(ids):
    """``python_hash`` (``_packed_ids.hashes``): ``hash(id)`` of each id, for fresh and
    repeated str objects, an object array or a list."""
    fresh = ["".join(list(i)) for i in ids]
    want = [hash(i) for i in ids]
    assert python_hash(records._objects(fresh)).tolist() == want
    assert python_hash(fresh).tolist() == want


@native
def test_native_hashes_of_other_objects_follow_their_hash():
    """A str subclass whose ``__hash__`` empties the list: the ids are read from a copy made
    before any Python code ran, so every id is hashed once, in order; an unhashable id raises."""
    assert ledger._packed_ids is not None
    ids: list = ["a", "b", "c"]

    class Sneaky(str):
        def __hash__(self) -> int:
            ids.clear()
            return 7

    ids[1] = Sneaky("b")
    assert np.frombuffer(ledger._packed_ids.hashes(ids), np.int64).tolist() == [
        hash("a"),
        7,
        hash("c"),
    ]
    with pytest.raises(TypeError):
        ledger._packed_ids.hashes(["a", ["unhashable"]])
    with pytest.raises(TypeError):
        ledger._packed_ids.hashes(("a",))


def _canonical_by_numpy(ids: list[str], present: np.ndarray):
    """``records._canonical_users`` over the present ids, ranks spread back over all of them."""
    chosen = records._objects(ids)[present]
    in_order, rank, keys = records._canonical_users(chosen, python_hash)
    user_rank = np.full(len(ids), -1, np.int64)
    user_rank[present] = rank
    return in_order, user_rank, keys


def _assert_same_canonical(ids: list[str], present: np.ndarray) -> None:
    native_result = ledger.canonical_users(ids, present)
    assert native_result is not None
    in_order, user_rank, keys = native_result
    want_order, want_rank, want_keys = _canonical_by_numpy(ids, present)
    assert in_order.dtype == object and [id(u) for u in in_order] == [id(u) for u in want_order]
    assert user_rank.dtype == np.int64 and np.array_equal(user_rank, want_rank)
    for field in ("hashes", "lengths", "woff", "words"):
        a, b = getattr(keys, field), getattr(want_keys, field)
        assert a.dtype == b.dtype and np.array_equal(a, b), field


distinct_ids = st.lists(
    st.one_of(
        st.text(st.characters(max_codepoint=0x7F), max_size=40),
        st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20),
        st.text(st.characters(max_codepoint=0x7F), min_size=250, max_size=300),
    ),
    min_size=1,
    max_size=80,
    unique=True,
)


@native
@settings(max_examples=300, deadline=None)
@given(distinct_ids, st.randoms(use_true_random=False))
def test_native_canonical_order_is_the_numpy_path_bit_for_bit(ids, rnd):
    """``ledger.canonical_users`` (``_packed_ids.canonical_users``): the same ids in the same
    order — the very objects —, the same ranks (-1 for an absent id) and the same keys as
    sorting the hashes, scattering the ids and packing their words in numpy."""
    present = np.array([rnd.random() < 0.8 for _ in ids], dtype=bool)
    present[rnd.randrange(len(ids))] = True
    _assert_same_canonical(ids, present)


@native
def test_native_canonical_order_of_a_large_day_and_of_crowded_buckets():
    """200,000 ids (buckets of the hashes' top 18 bits), and 100 ids of which 40 share their
    hash's top 7 bits — one bucket above the insertion-sort size, sorted by qsort."""
    many = [f"user-{i:07d}" for i in range(200_000)]
    present = np.ones(len(many), dtype=bool)
    present[::7] = False
    _assert_same_canonical(many, present)
    candidates = [f"c{i}" for i in range(20_000)]
    crowded = [c for c in candidates if (hash(c) + 2**63) >> 57 == 0][:40]
    others = [c for c in candidates if (hash(c) + 2**63) >> 57 != 0][:60]
    assert len(crowded) == 40
    _assert_same_canonical(crowded + others, np.ones(100, dtype=bool))


@native
def test_ids_the_native_order_leaves_to_numpy_leave_in_order_untouched():
    """A repeated hash (here the same id twice: numpy orders equal hashes by id), a str
    subclass, an id without UTF-8 form and one beyond the length limit all give None with the
    output array as it was."""
    assert ledger._packed_ids is not None

    class Named(str):
        pass

    for ids in (["a", "b", "a"], ["a", Named("b")], ["a", "\ud800"], ["a", "x" * 70_000]):
        in_order = np.empty(len(ids), dtype=object)
        present = np.ones(len(ids), dtype=bool)
        assert ledger._packed_ids.canonical_users(ids, present, in_order, 65_535) is None
        assert in_order.tolist() == [None] * len(ids)
        assert ledger.canonical_users(ids, present) is None


@native
def test_native_canonical_order_checks_its_buffers_and_keeps_references_right():
    import sys

    assert ledger._packed_ids is not None
    order = ledger._packed_ids.canonical_users
    ids = ["".join(["u", str(i)]) for i in range(1000)]  # fresh objects: exact refcounts
    present = np.ones(1000, dtype=bool)
    with pytest.raises(ValueError, match="presence"):
        order(ids, present[:-1], np.empty(1000, dtype=object), 100)
    with pytest.raises(ValueError, match="one slot"):
        order(ids, present, np.empty(999, dtype=object), 100)
    taken = np.empty(1000, dtype=object)
    taken[5] = "already here"
    with pytest.raises(ValueError, match="not empty"):
        order(ids, present, taken, 100)
    before = sys.getrefcount(ids[3])
    none_before = sys.getrefcount(None)
    in_order = np.empty(1000, dtype=object)
    assert order(ids, present, in_order, 100) is not None
    held, none_after = sys.getrefcount(ids[3]), sys.getrefcount(None)
    assert held == before + 1  # held once more, by in_order
    assert abs(none_after - none_before) < 50  # the 1,000 None slots released
    del in_order
    after = sys.getrefcount(ids[3])
    assert after == before
