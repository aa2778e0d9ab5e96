"""The open day's event-id set: the native ``PairSet`` (``engine/_pair_set.c``) is the exact set
of (user code, event id) pairs a Python ``set`` of tuples is — for batches with repeats inside
and across them, single pairs, any id text (empty, non-ASCII, lone surrogates, long), keys equal
to ``event_ids.pair_keys``, caller-given keys that collide, growth through many resizes — and a
bad batch changes nothing. In CI a missing build is a failure."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter import _native
from streamfilter.dedup.index import id_bytes, pair_key, pair_keys
from streamfilter.engine import native
from tests.support.native_build import check_built_in_ci, needs

built = needs(native.pair_set, "engine/_pair_set.c")


def test_the_native_pair_set_is_built_in_ci():
    check_built_in_ci(native.pair_set, "engine/_pair_set.c")
    assert "engine/_pair_set.c" not in _native.missing()


def new_set():
    assert native.pair_set is not None
    return native.pair_set.PairSet()


def exported(pairs):
    """The held pairs in insertion order, as (keys, [(user, id)]), the columns checked to be
    consistent (each id's bytes where the one before it ends, the text all used)."""
    keys, users, starts, lengths, text = pairs.export()
    keys = np.frombuffer(keys, np.int64)
    users = np.frombuffer(users, np.int32)
    starts = np.frombuffer(starts, np.int64)
    lengths = np.frombuffer(lengths, np.int32)
    assert len(keys) == len(users) == len(starts) == len(lengths) == len(pairs)
    assert starts.tolist() == (np.cumsum(lengths, dtype=np.int64) - lengths).tolist()
    assert int(lengths.sum(dtype=np.int64)) == len(text)
    held = [
        (u, text[s : s + n].decode("utf-8", "surrogatepass"))
        for u, s, n in zip(users.tolist(), starts.tolist(), lengths.tolist(), strict=True)
    ]
    return keys, held


def insert(pairs, batch):
    users = np.array([u for u, _ in batch], np.int32)
    got = pairs.insert(users, [i for _, i in batch])
    assert isinstance(got, bytes) and len(got) == len(batch)
    return np.frombuffer(got, np.bool_).tolist()


class Model:
    """The reference: a set of pairs and the order they became new in."""

    def __init__(self) -> None:
        self.held: set[tuple[int, str]] = set()
        self.order: list[tuple[int, str]] = []

    def insert(self, batch):
        new = []
        for pair in batch:
            new.append(pair not in self.held)
            if new[-1]:
                self.held.add(pair)
                self.order.append(pair)
        return new


ids = st.one_of(
    st.sampled_from(["e1", "e2", "", "é", "😀", "\ud800", "a\udfffb", "e" * 300, "é" * 200]),
    st.text(max_size=8),  # any code point, lone surrogates included
    st.integers(0, 50).map(lambda i: f"event-{i}"),
)
users = st.one_of(st.integers(0, 4), st.sampled_from([0, 1, 2**31 - 1, 600_000]))
pairs_ = st.tuples(users, ids)
ops = st.lists(
    st.one_of(
        # repeats inside a batch: some pairs drawn again from the batch itself
        st.tuples(
            st.just("batch"),
            st.lists(pairs_, max_size=30).flatmap(
                lambda b: st.permutations(b + b[: len(b) // 3]) if b else st.just(b)
            ),
        ),
        st.tuples(st.just("add"), pairs_),
        st.tuples(st.just("contains"), pairs_),
        st.tuples(st.just("clear"), st.none()),
    ),
    max_size=25,
)


def fresh(text: str) -> str:
    """Equal text in another str object (the set must compare text, not identity)."""
    return "".join(list(text)) if text else text


@built
@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_set_is_a_python_set_of_pairs(sequence):
    pairs, model = new_set(), Model()
    for op, arg in sequence:
        if op == "batch":
            assert insert(pairs, [(u, fresh(i)) for u, i in arg]) == model.insert(arg)
        elif op == "add":
            user, event_id = arg
            assert pairs.add(user, fresh(event_id)) == model.insert([arg])[0]
        elif op == "contains":
            user, event_id = arg
            assert pairs.contains(user, fresh(event_id)) == (arg in model.held)
            assert pairs.contains_keyed(pair_key(user, event_id), user, event_id) == (
                arg in model.held
            )
        else:
            pairs.clear()
            model = Model()
        assert len(pairs) == len(model.held)
        for pair in model.order[-3:]:
            assert pairs.contains(*pair)
    keys, held = exported(pairs)
    assert held == model.order  # the pairs, in the order they became new
    if held:
        want = pair_keys(np.array([u for u, _ in held], np.int32), [i for _, i in held])
        assert keys.tolist() == want.tolist()


@built
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**31 - 1), ids), max_size=60), st.data())
def test_keys_are_pair_keys_and_given_keys_agree(batch, data):
    batch = batch + data.draw(
        st.lists(st.sampled_from(batch), max_size=20) if batch else st.just([])
    )
    users_ = np.array([u for u, _ in batch], np.int32)
    event_ids = [i for _, i in batch]
    keys = pair_keys(users_, event_ids)
    for (u, i), k in zip(batch, keys.tolist(), strict=True):  # the one-pair path agrees
        assert pair_key(u, i) == k

    pairs, keyed = new_set(), new_set()
    new = pairs.insert(users_, event_ids)
    assert keyed.insert_keyed(keys, users_, event_ids) == new
    got_keys, held = exported(pairs)
    mask = np.frombuffer(new, np.bool_)
    assert got_keys.tolist() == keys[mask].tolist()
    assert held == [pair for pair, m in zip(batch, mask.tolist(), strict=True) if m]
    keyed_keys, keyed_held = exported(keyed)
    assert keyed_keys.tolist() == got_keys.tolist() and keyed_held == held
    for (u, i), k in zip(batch, keys.tolist(), strict=True):
        assert pairs.contains(u, i) and keyed.contains_keyed(k, u, i)


@built
def test_keys_of_non_ascii_and_surrogate_ids_are_pair_keys():
    rng = np.random.default_rng(7)
    alphabet = ["a", "Z", "é", "ß", "中", "😀", "\ud800", "\udfff", "\x00", "-"]
    event_ids = ["".join(rng.choice(alphabet, rng.integers(0, 12))) for _ in range(5000)]
    users_ = rng.integers(0, 2**31 - 1, len(event_ids), endpoint=True).astype(np.int32)
    pairs = new_set()
    new = np.frombuffer(pairs.insert(users_, event_ids), np.bool_)
    keys, held = exported(pairs)
    assert keys.tolist() == pair_keys(users_, event_ids)[new].tolist()
    text = pairs.export()[4]
    assert text == b"".join(id_bytes(i) for i, m in zip(event_ids, new.tolist(), strict=True) if m)
    assert held == [(int(u), i) for u, i, m in zip(users_, event_ids, new, strict=True) if m]


@built
@settings(max_examples=200, deadline=None)
@given(st.lists(pairs_, max_size=40), st.sampled_from([0, 1, 3]))
def test_colliding_keys_are_still_exact(batch, buckets):
    """Caller-given keys that collide — one key for every pair, or a few — change nothing."""

    def key(pair):
        return -(2**63) if buckets == 0 else len(pair[1]) % buckets + 2**63 - 4

    batch = batch + batch[::2]
    pairs, model = new_set(), Model()
    keys = np.array([key(p) for p in batch], np.int64)
    users_ = np.array([u for u, _ in batch], np.int32)
    got = pairs.insert_keyed(keys, users_, [fresh(i) for _, i in batch])
    assert np.frombuffer(got, np.bool_).tolist() == model.insert(batch)
    again = pairs.insert_keyed(keys, users_, [i for _, i in batch])
    assert not any(again)
    assert len(pairs) == len(model.held)
    assert exported(pairs)[1] == model.order
    for pair in batch:
        assert pairs.contains_keyed(key(pair), *pair)
        assert not pairs.contains_keyed(key(pair), pair[0], pair[1] + "x") or (
            (pair[0], pair[1] + "x") in model.held
        )


@built
def test_sequential_keys_and_users():
    """Keys 0, 1, 2, ... (caller-given) and one id for many sequential users (keyed here)."""
    n = 100_000
    keys, users_ = np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int32)
    pairs = new_set()
    assert all(pairs.insert_keyed(keys, users_, ["e"] * n))
    assert not any(pairs.insert_keyed(keys[::-1].copy(), users_[::-1].copy(), ["e"] * n))
    pairs = new_set()
    assert all(pairs.insert(users_, ["e"] * n))
    assert not any(pairs.insert(users_, ["e"] * n))
    assert all(pairs.insert(users_, ["f"] * n)) and len(pairs) == 2 * n


@built
def test_growth_through_many_resizes_and_clear():
    pairs = new_set()
    assert len(pairs) == 0 and pairs.nbytes == 0
    rng = np.random.default_rng(3)
    n, batch = 300_000, 30_000
    all_users = rng.integers(0, 600_000, n).astype(np.int32)
    all_ids = [f"e{u}-{i % 7}" for i, u in enumerate(all_users.tolist())]
    model = Model()
    sizes = []
    for a in range(0, n, batch):
        # the batch plus a few pairs of the batch before (repeats across batches)
        users_ = np.concatenate([all_users[a : a + batch], all_users[max(0, a - 50) : a]])
        event_ids = all_ids[a : a + batch] + all_ids[max(0, a - 50) : a]
        got = np.frombuffer(pairs.insert(users_, event_ids), np.bool_).tolist()
        assert got == model.insert(list(zip(users_.tolist(), event_ids, strict=True)))
        sizes.append(pairs.nbytes)
    assert len(pairs) == len(model.held)
    assert sizes == sorted(sizes) and sizes[-1] > 24 * len(pairs)
    keys, held = exported(pairs)
    assert held == model.order
    assert (
        keys.tolist()
        == pair_keys(np.array([u for u, _ in held], np.int32), [i for _, i in held]).tolist()
    )
    assert not any(pairs.insert(all_users, all_ids))  # everything held
    pairs.clear()
    assert len(pairs) == 0 and pairs.nbytes == 0
    assert [len(column) for column in pairs.export()] == [0] * 5
    assert not pairs.contains(int(all_users[0]), all_ids[0])
    assert all(pairs.insert(all_users[:10], all_ids[:10]))  # usable again
    assert exported(pairs)[1] == model.order[:10]


@built
def test_take_hands_over_what_export_shows_and_empties_the_set():
    """``take`` (a spill) returns ``export``'s columns and leaves the set empty, its memory
    freed, and usable again; the columns are grown to at most ~12.5% beyond the pairs."""
    pairs = new_set()
    users = np.arange(100_000, dtype=np.int32) % 977
    ids = [f"id-{i}" for i in range(100_000)]
    pairs.insert(users, ids)
    text_bytes = sum(map(len, ids))
    assert pairs.nbytes <= 1.2 * (24 * 100_000 + text_bytes) + 4 * 4 * 100_000
    shown = pairs.export()
    assert pairs.take() == shown
    assert len(pairs) == 0 and pairs.nbytes == 0 and pairs.take() == (b"",) * 5
    assert not pairs.contains(0, "id-0")
    assert all(pairs.insert(users[:5], ids[:5]))
    assert exported(pairs)[1] == list(zip(users[:5].tolist(), ids[:5], strict=True))


@built
def test_a_bad_batch_changes_nothing():
    pairs = new_set()
    pairs.insert(np.array([1, 2, 3], np.int32), ["a", "é", "\ud800"])
    before = (len(pairs), pairs.export())

    class Str(str):
        pass

    for bad in (5, b"b", None, Str("b")):
        with pytest.raises(TypeError, match="str"):
            pairs.insert(np.array([4, 5, 6], np.int32), ["x", "\udc00", bad])
        with pytest.raises(TypeError, match="str"):
            pairs.insert_keyed(
                np.zeros(2, np.int64),
                np.array([4, 5], np.int32),
                ["x", bad],
            )
        with pytest.raises(TypeError, match="str"):
            pairs.add(7, bad)
        with pytest.raises(TypeError, match="str"):
            pairs.contains(7, bad)
    with pytest.raises(TypeError):
        pairs.insert(np.array([4], np.int32), ("x",))
    with pytest.raises(ValueError, match="one user"):
        pairs.insert(np.array([4, 5], np.int32), ["x"])
    with pytest.raises(ValueError, match="one user"):
        pairs.insert_keyed(np.zeros(1, np.int64), np.array([4, 5], np.int32), ["x", "y"])
    for users_ in (
        np.array([4], np.int64),
        np.array([4], np.uint32),
        np.array([4.0], np.float32),
        np.array([[4]], np.int32),
        b"abcd",
        [4],
    ):
        with pytest.raises(TypeError):
            pairs.insert(users_, ["x"])
    with pytest.raises((TypeError, ValueError, BufferError)):  # not contiguous
        pairs.insert(np.arange(4, dtype=np.int32)[::2], ["x", "y"])
    with pytest.raises(TypeError):
        pairs.insert_keyed(np.zeros(1, np.int32), np.array([4], np.int32), ["x"])
    with pytest.raises(OverflowError):
        pairs.add(2**31, "x")
    assert (len(pairs), pairs.export()) == before
    assert pairs.insert(np.zeros(0, np.int32), []) == b""
    assert (len(pairs), pairs.export()) == before


@built
def test_other_int_buffers_of_the_right_size_are_taken():
    pairs = new_set()
    users_ = memoryview(np.array([1, 2], np.int32).tobytes()).cast("i")
    assert pairs.insert(users_, ["a", "b"]) == b"\x01\x01"
    keys = memoryview(pair_keys(np.array([3], np.int32), ["c"]).tobytes()).cast("q")
    assert pairs.insert_keyed(keys, np.array([3], np.int32), ["c"]) == b"\x01"
    assert pairs.contains(3, "c")


@built
def test_empty_ids_with_no_text_held():
    pairs = new_set()
    assert pairs.insert(np.array([1, 1, 2], np.int32), ["", "", ""]) == b"\x01\x00\x01"
    assert pairs.contains(1, "") and not pairs.contains(3, "") and not pairs.add(2, "")
    assert pairs.export()[4] == b"" and exported(pairs)[1] == [(1, ""), (2, "")]
    assert pairs.add(1, "x") and exported(pairs)[1] == [(1, ""), (2, ""), (1, "x")]


def _spans(ids_: list[str], gaps: list[int]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """A block holding ``ids_`` among filler bytes, and their spans in it."""
    block, starts = bytearray(), []
    for text, gap in zip(ids_, gaps, strict=True):
        block += b"#" * gap
        starts.append(len(block))
        block += text.encode("ascii")
    lengths = np.array([len(t) for t in ids_], np.int32)
    return bytes(block), np.array(starts, np.int64), lengths


ascii_ids = st.one_of(
    st.text(st.characters(max_codepoint=0x7F), max_size=12),
    st.integers(0, 30).map(lambda i: f"e{i}"),
)


@built
@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(users, ascii_ids, st.integers(0, 3)), max_size=25).flatmap(
            lambda b: st.permutations(b + b[: len(b) // 3]) if b else st.just(b)
        ),
        max_size=6,
    )
)
def test_spans_are_inserted_as_the_str_ids_they_hold(batches):
    """``insert_spans`` (ids read in place from a block, engine/lines.py EventIdSpans) answers
    and stores exactly what ``insert`` of the same ids as ``str`` does: the same new flags, and
    the same keys (``pair_keys``: the bytes' hash is the str's), users and text held."""
    by_str, by_span = new_set(), new_set()
    for batch in batches:
        codes = np.array([u for u, _, _ in batch], np.int32)
        texts = [t for _, t, _ in batch]
        block, starts, lengths = _spans(texts, [g for _, _, g in batch])
        want = by_str.insert(codes, [fresh(t) for t in texts])
        assert by_span.insert_spans(codes, block, starts, lengths) == want
    assert by_span.export() == by_str.export()
    keys, held = exported(by_span)
    if held:
        assert (
            keys.tolist()
            == pair_keys(np.array([u for u, _ in held], np.int32), [t for _, t in held]).tolist()
        )


@built
def test_a_bad_span_batch_changes_nothing():
    pairs = new_set()
    pairs.insert(np.array([1, 2], np.int32), ["a", "é"])
    before = (len(pairs), pairs.export())
    block = b"abc\xc3\xa9def"
    one = np.array([1], np.int32)
    for starts, lengths in (([0], [9]), ([-1], [1]), ([4], [-1]), ([8], [1]), ([2], [2])):
        # past the end, before the start, no id, past the end, not ASCII (é's bytes)
        with pytest.raises(ValueError, match=r"outside|ASCII"):
            pairs.insert_spans(one, block, np.array(starts, np.int64), np.array(lengths, np.int32))
    with pytest.raises(ValueError, match="one start"):
        pairs.insert_spans(
            np.array([1, 2], np.int32), block, np.array([0], np.int64), np.array([1], np.int32)
        )
    with pytest.raises(ValueError, match="ASCII"):  # a good span before a bad one adds nothing
        pairs.insert_spans(
            np.array([7, 7], np.int32),
            block,
            np.array([0, 2], np.int64),
            np.array([1, 2], np.int32),
        )
    for starts, lengths in (
        (np.array([0], np.int32), np.array([1], np.int32)),
        (np.array([0], np.int64), np.array([1], np.int64)),
    ):
        with pytest.raises(TypeError):
            pairs.insert_spans(one, block, starts, lengths)
    assert (len(pairs), pairs.export()) == before
    assert (
        pairs.insert_spans(np.zeros(0, np.int32), b"", np.zeros(0, np.int64), np.zeros(0, np.int32))
        == b""
    )
    assert pairs.insert_spans(one, block, np.array([5], np.int64), np.array([3], np.int32)) == (
        b"\x01"
    )
    assert pairs.contains(1, "def")
