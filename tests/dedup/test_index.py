"""Contract suite for EventIdIndex (streamfilter/dedup/index.py): every implementation runs
these tests — the in-memory ``in_memory.SeenEventIds`` (sorted runs, numpy) and its native
counterpart on ``engine/_pair_set.c`` (``in_memory.new_seen_event_ids`` picks it when built), and
the spilling ``dedup.spill.SpillingEventIds`` over either as its in-memory tier, with a
bound of a few pairs, blocks of 2 keys, merges of 2 segments and chunks of 3 pairs, so that
spills, multi-block key runs and streamed merges all happen on small inputs. The answers must be
exactly a Python ``set``'s, also when every key collides (keys cut to 2 bits: then only the
exact comparison tells pairs apart; the native set is then given the cut keys)."""

from __future__ import annotations

import gc
import logging
import os
import signal
import stat
import subprocess
import sys
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamfilter.dedup import in_memory
from streamfilter.dedup import index as event_ids
from streamfilter.dedup import spill as spilling
from streamfilter.dedup.index import EventIdIndex
from streamfilter.dedup.spill import SpillingEventIds
from streamfilter.engine import native
from streamfilter.engine.lines import EventIdSpans, id_list

#: the spilling index's bound in these tests (pairs held in memory before a spill)
TINY = 3

Pair = tuple[int, str]


def _native_built() -> None:
    """Skip a native variant where the extension is not built — except in CI."""
    if native.pair_set is None:
        if os.environ.get("CI"):
            pytest.fail("engine/_pair_set.c is not built")
        pytest.skip("engine/_pair_set.c is not built here (pip install -e .)")


@pytest.fixture(params=["memory", "memory-native", "spill-python", "spill-native"])
def make_index(request, monkeypatch, tmp_path) -> Callable[[], EventIdIndex]:
    kind, tier = request.param.split("-") if "-" in request.param else (request.param, "python")
    if tier == "native":
        _native_built()
    else:
        monkeypatch.setattr(spilling, "new_seen_event_ids", in_memory.SeenEventIds)
    if kind == "memory":
        return in_memory.new_seen_event_ids if tier == "native" else in_memory.SeenEventIds
    _small_files(monkeypatch)
    return lambda: SpillingEventIds(TINY, tmp_path)


@pytest.fixture
def python_tier(monkeypatch) -> None:
    """The spilling index's in-memory tier is ``in_memory.SeenEventIds`` (whose runs the tests
    below inspect), whether or not the native set is built."""
    monkeypatch.setattr(spilling, "new_seen_event_ids", in_memory.SeenEventIds)


def _small_files(monkeypatch) -> None:
    monkeypatch.setattr(spilling, "BLOCK_PAIRS", 2)
    monkeypatch.setattr(spilling, "MERGE_FANOUT", 2)
    monkeypatch.setattr(spilling, "MERGE_CHUNK_PAIRS", 3)
    monkeypatch.setattr(spilling, "ADDED_MAX", 2)


@pytest.fixture(params=[False, True], ids=["keys", "colliding-keys"])
def colliding(request, monkeypatch) -> bool:
    """Keys cut to 2 bits in both implementations: every key is shared by many pairs."""
    if request.param:
        memory_keys, spill_keys = in_memory._pair_keys, event_ids.pair_keys
        memory_key = in_memory._pair_key
        monkeypatch.setattr(in_memory, "_pair_keys", lambda u, ids: memory_keys(u, ids) & 3)
        monkeypatch.setattr(in_memory, "_pair_key", lambda u, i: memory_key(u, i) & 3)
        monkeypatch.setattr(event_ids, "pair_keys", lambda u, ids: spill_keys(u, ids) & 3)
        native_set = in_memory._NativeSeenEventIds  # keys its pairs in C: give it the cut keys
        monkeypatch.setattr(native_set, "insert", _insert_cut)
        monkeypatch.setattr(native_set, "__contains__", _contains_cut)
        monkeypatch.setattr(native_set, "add", _add_cut)
    return bool(request.param)


def _insert_cut(self, users: np.ndarray, ids: list[str] | EventIdSpans) -> np.ndarray:
    listed = id_list(ids)
    return self.insert_keyed(in_memory._pair_keys(users, listed), users, listed)


def _contains_cut(self, pair: Pair) -> bool:
    return self.holds_keyed(in_memory._pair_key(*pair), *pair)


def _add_cut(self, pair: Pair) -> None:
    user, event_id = pair
    key = np.array([in_memory._pair_key(user, event_id)], np.int64)
    self.insert_keyed(key, np.array([user], np.int32), [event_id])


def _insert(index: EventIdIndex, model: set[Pair], batch: list[Pair], spans: bool = False) -> None:
    """Insert ``batch``, its ids as a list or (``spans``, when they are all ASCII: what the
    scanner gives) as spans of a block (engine/lines.py ``EventIdSpans``)."""
    expected = []
    for pair in batch:
        expected.append(pair not in model)
        model.add(pair)
    users = np.array([u for u, _ in batch], np.int64)
    texts = [e for _, e in batch]
    ids: list[str] | EventIdSpans = texts
    if spans and all(t.isascii() for t in texts):
        block = ("|".join(texts)).encode("ascii")
        lengths = np.array([len(t) for t in texts], np.int32)
        starts = np.cumsum(lengths + 1, dtype=np.int64) - lengths - 1
        ids = EventIdSpans(block, starts, lengths)
    assert index.insert(users, ids).tolist() == expected


ids = st.text(st.characters(codec="utf-8"), max_size=3) | st.sampled_from(["", "é", "€x", "😀"])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.lists(st.tuples(st.integers(0, 3), ids), max_size=10), max_size=10),
    st.data(),
)
def test_the_index_is_a_set(make_index, colliding, batches, data):
    """Batches (``insert``, repeats within and across batches) and single pairs (``add`` after
    a ``not in``): membership, newness and size are exactly a Python set's."""
    index, model = make_index(), set()
    try:
        for b, batch in enumerate(batches):
            if model:  # repeat earlier pairs too, anywhere in the batch
                batch = batch + data.draw(st.lists(st.sampled_from(sorted(model)), max_size=4))
            assert [p in index for p in batch] == [p in model for p in batch]
            if b % 3 == 2:
                for pair in batch:
                    if pair not in index:
                        index.add(pair)
                    model.add(pair)
            else:
                _insert(index, model, batch, data.draw(st.booleans()))
            assert len(index) == len(model)
        probe = [p for b in batches for p in b] + [(0, "zz"), (9, ""), (3, "é")]
        assert [p in index for p in probe] == [p in model for p in probe]
        if isinstance(index, SpillingEventIds) and len(model) > TINY:
            assert index.spilled_pairs > 0  # the disk really was used
    finally:
        index.close()


def test_many_spills_and_merges_answer_like_a_set(make_index, colliding):
    """30 batches of fresh pairs, 10% of each repeating pairs of earlier batches (and of the
    batch itself): a set's answers while segments spill and merge tier after tier."""
    rng = np.random.default_rng(3)
    index, model = make_index(), set()
    held: list[Pair] = []
    n = 40 if colliding else 300
    try:
        for b in range(30):
            tail = "é" if b % 2 else "x"  # even batches: all ASCII, inserted as spans
            fresh = [
                (int(u), f"e{b}-{i}{tail}"[: 2 + i % 6])
                for i, u in enumerate(rng.integers(0, 50, n))
            ]
            again = [held[int(j)] for j in rng.integers(0, len(held), n // 10)] if held else []
            batch = fresh + again + fresh[: n // 10]
            _insert(index, model, batch, spans=b % 2 == 0)
            held += fresh
        assert len(index) == len(model)
        probe = [*held[::7], (1, "absent"), (49, "e0-0x"), (0, "")]
        assert [p in index for p in probe] == [p in model for p in probe]
        if isinstance(index, SpillingEventIds):
            assert index.segment_count >= 2 and index.spilled_pairs > len(model) // 2
            assert max(s.tier for s in index._segments) >= 2  # merged, and merged again
    finally:
        index.close()


def _decoded(
    keys: np.ndarray, users: np.ndarray, starts: np.ndarray, lengths: np.ndarray, text: bytes
) -> list[Pair]:
    """The pairs of packed columns (``in_memory.PairRun``, a segment), checking that the keys
    are sorted and are the pairs' keys."""
    pairs = [
        (u, text[a : a + n].decode("utf-8", "surrogatepass"))
        for u, a, n in zip(users.tolist(), starts.tolist(), lengths.tolist(), strict=True)
    ]
    assert (keys[1:] >= keys[:-1]).all()
    assert keys.tolist() == event_ids.pair_keys(users, [e for _, e in pairs]).tolist()
    return pairs


def _where_held(index: SpillingEventIds) -> tuple[list[Pair], list[Pair]]:
    """Every pair the index stores, with repeats: (in memory, in segment files)."""
    held_in_memory = list(index._added)
    tier = index._recent
    if isinstance(tier, in_memory.SeenEventIds):
        runs = tier._runs
    else:  # the native set's pairs, in insertion order: sorted by key as a spill would
        keys, users, starts, lengths, text = tier._set.export()
        order = np.argsort(np.frombuffer(keys, np.int64), kind="stable")
        columns = [
            np.frombuffer(c, t)[order]
            for c, t in zip((keys, users, starts, lengths), spilling._COLUMN_TYPES, strict=True)
        ]
        runs = [in_memory.PairRun(*columns, text)]
    for run in runs:
        assert run.users.dtype == np.int32 and run.lengths.dtype == np.int32
        held_in_memory += _decoded(run.keys, run.users, run.starts, run.lengths, run.text)
    on_disk = []
    for seg in index._segments:
        columns = [seg.column(i, t, 0, seg.n) for i, t in enumerate(spilling._COLUMN_TYPES)]
        text = os.pread(seg.fd, seg.text_bytes, spilling._columns_at(seg.n)[3])
        on_disk += _decoded(*columns, text)
    return held_in_memory, on_disk


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@pytest.mark.parametrize("tier", ["python", "native"])
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), ids), max_size=8), max_size=8))
def test_each_pair_is_stored_once_and_memory_holds_it_packed(
    monkeypatch, tmp_path, colliding, tier, batches
):
    """Memory and the segment files together hold each pair exactly once (not a copy in
    memory, nor in memory and on disk); memory holds fewer than ``memory_pairs`` pairs after
    each batch, in 24 bytes a pair plus the id's UTF-8 bytes (the native set: at least that,
    as allocated)."""
    if tier == "native":
        _native_built()
    else:
        monkeypatch.setattr(spilling, "new_seen_event_ids", in_memory.SeenEventIds)
    _small_files(monkeypatch)
    index, model = SpillingEventIds(TINY, tmp_path), set()
    try:
        for batch in batches:
            _insert(index, model, batch)
            held_in_memory, on_disk = _where_held(index)
            assert sorted(held_in_memory + on_disk) == sorted(model)  # each pair once
            assert len(held_in_memory) == len(index._recent) < TINY
            assert len(on_disk) == index.spilled_pairs
            id_bytes = sum(len(event_ids.id_bytes(e)) for _, e in held_in_memory)
            packed = 24 * len(held_in_memory) + id_bytes
            if isinstance(index._recent, in_memory.SeenEventIds):
                assert index._recent.nbytes == packed
            else:
                assert index._recent.nbytes >= packed
    finally:
        index.close()


def _traced_inserts(index: SpillingEventIds) -> tuple[int, int]:
    """Insert 200,000 distinct pairs in batches of 50,000 (below the index's bound); return
    what ``tracemalloc`` saw allocated meanwhile and the pairs' packed size (24 B a pair plus
    the id)."""
    batches = [
        (np.arange(a, a + 50_000, dtype=np.int32) % 7_000, [f"e{i}" for i in range(a, a + 50_000)])
        for a in range(0, 200_000, 50_000)
    ]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for users, ids in batches:
            index.insert(users, ids)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return held, 24 * 200_000 + sum(len(e) for _, ids in batches for e in ids)


def test_memory_below_the_bound_is_one_packed_copy_of_the_pairs(tmp_path, python_tier):
    """What the spilling index allocates for 200,000 pairs it keeps in memory (traced by
    ``tracemalloc``, which numpy reports to) is its runs' packed columns and text
    (``nbytes``) and the filter — no second copy of the pairs, no object per pair."""
    index = SpillingEventIds(1 << 20, tmp_path)
    held, packed = _traced_inserts(index)
    tier = index._recent
    assert len(tier) == 200_000 and index.directory is None
    assert tier.nbytes == packed
    assert held <= packed + tier._filter.nbytes + (64 << 10)
    index.close()


def test_the_native_tier_holds_the_pairs_packed_within_twice_their_size(tmp_path):
    """The native set's allocations (``PyMem``, traced by ``tracemalloc``) for 200,000 pairs are
    its ``nbytes``: the packed columns and text, at most doubled by growth, and a slot table of
    at most 4 slots (16 B) a pair — no object per pair."""
    _native_built()
    index = SpillingEventIds(1 << 20, tmp_path)
    held, packed = _traced_inserts(index)
    tier = index._recent
    assert isinstance(tier, in_memory._NativeSeenEventIds)
    assert len(tier) == 200_000 and index.directory is None
    assert packed <= tier.nbytes <= 2 * packed + 16 * 200_000
    assert held <= tier.nbytes + (64 << 10)
    index.close()


def test_an_empty_batch_is_an_empty_answer(make_index):
    index = make_index()
    assert index.insert(np.zeros(0, np.int32), []).tolist() == []
    assert len(index) == 0 and (0, "") not in index
    index.close()


def test_close_frees_the_pairs(make_index):
    index = make_index()
    index.insert(np.arange(20, dtype=np.int32), [f"e{i}" for i in range(20)])
    index.close()
    assert len(index) == 0


# ---------------------------------------------------------------------- the spilling index only
def _spilled(tmp_path, n: int = 20) -> SpillingEventIds:
    index = SpillingEventIds(4, tmp_path, label="2026-03-01")
    index.insert(np.arange(n, dtype=np.int32) % 5, [f"secret-{i}" for i in range(n)])
    return index


def _segment_fds(index: SpillingEventIds) -> list[int]:
    files = index._files
    return [] if files is None else list(files.fds.values())


def test_segment_files_are_private_nameless_and_removed_on_close(tmp_path):
    index = _spilled(tmp_path)
    where = index.directory
    assert where is not None and where.parent == tmp_path
    fds = _segment_fds(index)
    assert len(fds) == index.segment_count >= 1
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    assert list(where.iterdir()) == []  # no segment has a name: nothing outlives the process
    assert all(stat.S_IMODE(os.fstat(fd).st_mode) == 0o600 for fd in fds)
    on_disk = [os.pread(fd, os.fstat(fd).st_size, 0) for fd in fds]
    assert any(b"secret-3" in data for data in on_disk)  # the ids really are on disk
    index.close()
    assert not where.exists() and list(tmp_path.iterdir()) == []
    index.close()  # a second close does nothing


def test_a_killed_process_leaves_no_event_id_on_disk(tmp_path):
    """SIGKILL runs no finalizer: the spilled ids must still not survive on disk."""
    code = (
        "import os, signal, numpy as np\n"
        "from streamfilter.dedup.spill import SpillingEventIds\n"
        f"index = SpillingEventIds(4, {str(tmp_path)!r})\n"
        "index.insert(np.arange(200, dtype=np.int32) % 7, [f'secret-{i}' for i in range(200)])\n"
        "assert index.segment_count >= 1\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    left = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert left == []  # at most the empty private directory remains


def test_an_index_dropped_without_close_removes_its_files(tmp_path):
    """A day dropped unclosed (a rebalanced cluster worker, a stopped run) leaves no file."""
    index = _spilled(tmp_path)
    assert list(tmp_path.iterdir())
    del index
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_nothing_is_written_below_the_bound(tmp_path):
    index = SpillingEventIds(100, tmp_path)
    index.insert(np.arange(99, dtype=np.int32), [f"e{i}" for i in range(99)])
    assert index.directory is None and list(tmp_path.iterdir()) == []
    index.close()


def test_the_first_spill_is_logged_with_a_count_and_no_id(tmp_path, caplog):
    """A spill follows the batch that reaches the bound (4 pairs here, in batches of 2)."""
    index = SpillingEventIds(4, tmp_path, label="2026-03-01")
    with caplog.at_level(logging.INFO, logger="streamfilter.event_ids"):
        for i in range(0, 40, 2):
            index.insert(np.array([i, i + 1]), [f"secret-{i}", f"secret-{i + 1}"])
    assert index.segment_count >= 2
    spills = [r.getMessage() for r in caplog.records if "spilling" in r.getMessage()]
    assert len(spills) == 1, spills  # the first spill only
    assert "2026-03-01" in spills[0] and " 4 event ids" in spills[0]
    assert "secret" not in caplog.text
    index.close()


def test_user_codes_must_fit_in_int32(tmp_path):
    index = SpillingEventIds(4, tmp_path)
    with pytest.raises(ValueError, match="int32"):
        index.insert(np.array([1 << 31]), ["e"])
    index.close()


def test_a_missing_spill_directory_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError):
        _spilled(tmp_path / "absent")
    assert os.listdir(tmp_path) == []


def test_a_failed_spill_refuses_every_later_answer(tmp_path, monkeypatch):
    """A spill that fails (a full disk) may have lost pairs: the index answers nothing after."""
    index = SpillingEventIds(4, tmp_path)

    def full(fd, data, offset):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spilling, "_pwrite", full)
    with pytest.raises(OSError, match="No space"):
        index.insert(np.arange(6, dtype=np.int32), [f"e{i}" for i in range(6)])
    with pytest.raises(RuntimeError, match="failed to spill"):
        index.insert(np.arange(1, dtype=np.int32), ["e0"])
    with pytest.raises(RuntimeError, match="failed to spill"):
        assert (0, "e0") in index
    index.close()
    assert list(tmp_path.iterdir()) == []


def test_a_segment_filter_lets_about_one_absent_key_in_a_hundred_through():
    """No false negative (the contract tests' answers), and few false positives: each one
    costs a read of a block's keys."""
    rng = np.random.default_rng(5)
    held = np.sort(rng.integers(-(1 << 63), (1 << 63) - 1, 100_000, dtype=np.int64))
    absent = rng.integers(-(1 << 63), (1 << 63) - 1, 100_000, dtype=np.int64)
    bloom = spilling._Filter(len(held))
    bloom.add(held)
    assert bloom.may_hold(held, bloom.masks(held)).all()
    assert bloom.words.nbytes * 8 <= spilling.FILTER_BITS_PER_PAIR * len(held) + 64
    assert bloom.may_hold(absent, bloom.masks(absent)).mean() < 0.02
