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

from streamfilter.engine import event_ids, ledger, records
from streamfilter.engine.ledger import python_hash
from tests.native_build import check_built_in_ci, needs

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
