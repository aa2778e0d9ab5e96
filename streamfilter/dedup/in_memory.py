"""The in-memory tier of the event-id index (``dedup.index.EventIdIndex``): a day's exact
``(user code, event id)`` pairs, packed — no Python object per pair (docs/design.md §2.2).

:class:`SeenEventIds` keeps sorted runs of packed columns (:class:`PairRun`) in numpy; the native
tier (``engine/_pair_set.c``) keeps the same packed pairs in an open-addressing set, and
:func:`new_seen_event_ids` picks it when built. Both answer exactly: a key match is confirmed
against the user code and the id's bytes. ``dedup/spill.py`` spills these runs to disk.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from streamfilter.dedup.index import (
    id_bytes,
    packed_ids,
    pair_key,
    pair_keys,
    user_codes,
)
from streamfilter.engine.lines import EventIdSpans, id_list
from streamfilter.engine.native import pair_set as _pair_set  # None: SeenEventIds' runs

__all__ = ["PairRun", "SeenEventIds", "new_seen_event_ids"]


class PairRun:
    """(user code, event id) pairs sorted by their 64-bit key, packed: the keys (int64), the user
    codes (int32), each id's start (int64) and length (int32) in ``text``, the ids' UTF-8 bytes
    (``event_ids.id_bytes``) in one ``bytes`` — 24 B a pair plus the id. These are the columns
    of a spilled segment (``dedup/spill.py``), which is written from the runs as they are."""

    __slots__ = ("keys", "lengths", "starts", "text", "users")

    def __init__(
        self,
        keys: np.ndarray,
        users: np.ndarray,
        starts: np.ndarray,
        lengths: np.ndarray,
        text: bytes,
    ) -> None:
        self.keys, self.users, self.starts, self.lengths, self.text = (
            keys,
            users,
            starts,
            lengths,
            text,
        )

    @classmethod
    def of(cls, keys: np.ndarray, users: np.ndarray, event_ids: list[str]) -> PairRun:
        """The pairs ``(users[i], event_ids[i])`` with keys ``keys`` — already in key order (the
        text follows that order, so each id starts where the one before it ends)."""
        text, lengths = packed_ids(event_ids)
        starts = np.cumsum(lengths, dtype=np.int64) - lengths
        return cls(keys, np.asarray(users, np.int32), starts, lengths, text)

    @property
    def nbytes(self) -> int:
        """The memory its pairs take (the columns and the text)."""
        columns = (self.keys, self.users, self.starts, self.lengths)
        return sum(c.nbytes for c in columns) + len(self.text)

    def merged(self, other: PairRun) -> PairRun:
        keys = np.concatenate([self.keys, other.keys])
        order = np.argsort(keys, kind="stable")
        keys = keys[order]  # the unsorted copy goes now, not after the other columns' copies
        return PairRun(
            keys,
            np.concatenate([self.users, other.users])[order],
            np.concatenate([self.starts, other.starts + len(self.text)])[order],
            np.concatenate([self.lengths, other.lengths])[order],
            self.text + other.text,
        )

    def holds(self, key: int, user: int, event_id: bytes) -> bool:
        """The pair is in this run (its key located, then user and bytes compared exactly)."""
        j = int(np.searchsorted(self.keys, key))
        while j < len(self.keys) and int(self.keys[j]) == key:
            start = int(self.starts[j])
            if (
                int(self.users[j]) == user
                and self.text[start : start + int(self.lengths[j])] == event_id
            ):
                return True
            j += 1
        return False


#: the pairs' 64-bit keys (``dedup.index.pair_keys``; a module name tests can narrow)
_pair_keys = pair_keys
_pair_key = pair_key  # one pair's (the same key)


class SeenEventIds:
    """The exact set of a day's (user code, event id) pairs, with no Python object per pair.

    The pairs are kept in sorted runs of packed columns (``PairRun``, a log-structured merge):
    the 64-bit key (``_pair_keys``), the int32 user code and the id's UTF-8 bytes as a slice of
    the run's one ``bytes`` — 24 B a pair plus the id. A batch is one new run; the newest two
    runs merge while the newer is at least half the older, so there are O(log n) runs and each
    pair is merged O(log n) times. A look-up first asks a one-hash Bloom filter over all keys
    held (at least ``FILTER_BITS`` bits a pair: about one absent key in eight passes it, one
    random read each), then binary-searches each run for the keys that pass; a key match (a
    repeated pair, or a collision) is confirmed by comparing the user code and the id exactly.

    The daemon's spilling index keeps its in-memory tier in one of these: it keys each batch
    once and passes the keys (``insert_keyed``, ``holds_keyed``), and at a spill takes the runs
    (``take_runs``) and writes them as a segment.
    """

    #: pairs added one at a time (``add``) are buffered in a ``set`` up to this many
    PENDING_MAX = 1 << 12
    #: the filter's size in bits per pair held, at least (it doubles as the pairs do)
    FILTER_BITS = 8

    def __init__(self) -> None:
        self._runs: list[PairRun] = []
        self._pending: set[tuple[int, str]] = set()
        self._filter = np.zeros(1, np.uint8)  # bit (key >> _filter_shift) of every key held
        self._filter_shift = 61

    def _filter_bits(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(byte, bit mask) of each key's filter bit: its top bits, read as unsigned."""
        top = np.ascontiguousarray(keys, np.int64).view(np.uint64) >> np.uint64(self._filter_shift)
        byte = (top >> np.uint64(3)).astype(np.intp)
        return byte, np.left_shift(np.uint8(1), (top & np.uint64(7)).astype(np.uint8))

    def _may_hold_one(self, key: int) -> bool:
        """``_may_hold`` of one key, in Python ints (the per-event path: no numpy call)."""
        top = (key % (1 << 64)) >> self._filter_shift  # its top bits, read as unsigned
        return bool((int(self._filter[top >> 3]) >> (top & 7)) & 1)

    def _may_hold(self, keys: np.ndarray) -> np.ndarray:
        """False where no run holds the key (no false negatives)."""
        byte, bit = self._filter_bits(keys)
        held: np.ndarray = (self._filter[byte] & bit) != 0
        return held

    def _set_filter(self, keys: np.ndarray) -> None:
        for a in range(0, len(keys), 1 << 20):  # bounded index arrays
            byte, bit = self._filter_bits(keys[a : a + (1 << 20)])
            np.bitwise_or.at(self._filter, byte, bit)

    def _filter_add(self, keys: np.ndarray) -> None:
        """Set the bits of a new run's keys; past ``FILTER_BITS`` a pair, rebuild twice as big
        (or more) from every run, so each key is set O(1) times amortised."""
        held = sum(len(run.keys) for run in self._runs)  # the new run's included
        if held * self.FILTER_BITS <= 8 * len(self._filter):
            self._set_filter(keys)
            return
        bits = max(3, (held * self.FILTER_BITS * 2 - 1).bit_length())
        self._filter = np.zeros(1 << (bits - 3), np.uint8)
        self._filter_shift = 64 - bits
        for run in self._runs:
            self._set_filter(run.keys)

    def __len__(self) -> int:
        return len(self._pending) + sum(len(r.keys) for r in self._runs)

    @property
    def nbytes(self) -> int:
        """The memory the runs' pairs take (``PairRun.nbytes``; not the filter nor ``add``'s
        buffer)."""
        return sum(run.nbytes for run in self._runs)

    def __contains__(self, key: tuple[int, str]) -> bool:
        """One pair (the per-event path, ``Monitor``): its key and filter bit in Python ints."""
        if key in self._pending:
            return True
        if not self._runs:
            return False
        user, event_id = key
        k = _pair_key(user, event_id)
        if not self._may_hold_one(k):
            return False
        encoded = id_bytes(event_id)
        return any(run.holds(k, user, encoded) for run in self._runs)

    def holds_keyed(self, key: int, user: int, event_id: str) -> bool:
        """The runs hold the pair whose key is ``key`` (``add``'s buffer is not asked)."""
        if not self._runs or not self._may_hold(np.array([key], np.int64))[0]:
            return False
        encoded = id_bytes(event_id)
        return any(run.holds(key, user, encoded) for run in self._runs)

    def add(self, key: tuple[int, str]) -> None:
        self._pending.add(key)
        if len(self._pending) >= self.PENDING_MAX:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            users, event_ids = zip(*self._pending, strict=True)
            self._pending = set()
            self.insert(np.array(users, np.int32), list(event_ids))

    def insert(self, users: np.ndarray, event_ids: list[str] | EventIdSpans) -> np.ndarray:
        """Add each pair not already held; True where the pair is new — neither held before
        nor earlier in the batch."""
        self._flush()
        if len(event_ids) == 0:
            return np.ones(0, bool)
        users = user_codes(users)
        ids = cast(list[str], id_list(event_ids))
        return self.insert_keyed(_pair_keys(users, ids), users, ids)

    def insert_keyed(self, keys: np.ndarray, users: np.ndarray, event_ids: list[str]) -> np.ndarray:
        """``insert``, the pairs' keys given (``users``: int32 codes, as ``user_codes`` makes
        them); ``add``'s buffer is not flushed."""
        n = len(event_ids)
        if n == 0:
            return np.ones(0, bool)
        new = np.ones(n, bool)
        order = np.argsort(keys, kind="stable")
        ks = keys[order]
        tied = np.flatnonzero(ks[1:] == ks[:-1])
        if len(tied):  # equal keys inside the batch (repeats, or collisions): compared exactly
            for j in tied.tolist():
                later = int(order[j + 1])
                i = j
                while i >= 0 and ks[i] == ks[j + 1]:
                    earlier = int(order[i])
                    if users[earlier] == users[later] and event_ids[earlier] == event_ids[later]:
                        new[later] = False
                        break
                    i -= 1
        passed = np.flatnonzero(self._may_hold(ks))
        kp = ks[passed]  # sorted, like ks
        for run in self._runs:
            pos = np.minimum(np.searchsorted(run.keys, kp), len(run.keys) - 1)
            for j in passed[np.flatnonzero(run.keys[pos] == kp)].tolist():
                i = int(order[j])
                if new[i] and run.holds(int(ks[j]), int(users[i]), id_bytes(event_ids[i])):
                    new[i] = False
        kept = order if new.all() else order[new[order]]  # the new pairs, in key order
        if len(kept):
            ids = list(map(event_ids.__getitem__, kept.tolist()))
            self._push(PairRun.of(keys[kept], users[kept], ids))
        return new

    def _push(self, run: PairRun) -> None:
        self._runs.append(run)
        self._filter_add(run.keys)
        while len(self._runs) > 1 and 2 * len(self._runs[-1].keys) >= len(self._runs[-2].keys):
            newer = self._runs.pop()
            self._runs[-1] = self._runs[-1].merged(newer)

    def take_runs(self) -> list[PairRun]:
        """Every pair ``insert`` added, as the runs that hold them; the index is empty after
        (``add``'s buffer flushed first)."""
        self._flush()
        runs = self._runs
        self.close()
        return runs

    def close(self) -> None:
        """Drop every pair, freeing their memory (``EventIdIndex.close``)."""
        self._runs, self._pending = [], set()
        self._filter, self._filter_shift = np.zeros(1, np.uint8), 61


class _NativeSeenEventIds:
    """:class:`SeenEventIds`' answers from ``engine/_pair_set.c``'s ``PairSet``: an open-addressing
    set of the same packed pairs (keys, int32 user codes, the ids' UTF-8 bytes in one arena), one
    probe a pair instead of a sort, a filter and a search per run
    (``tests/engine/test_pair_set.py`` checks it against a ``set``; ``tests/dedup/test_index.py``
    runs the index contract on both). ``take_runs`` sorts the pairs by key into one
    :class:`PairRun`, the columns a spill writes."""

    def __init__(self) -> None:
        assert _pair_set is not None
        self._set = _pair_set.PairSet()

    def __len__(self) -> int:
        return len(self._set)

    @property
    def nbytes(self) -> int:
        """The memory the pairs take (their columns, text and slot table, as allocated)."""
        return self._set.nbytes

    def __contains__(self, key: tuple[int, str]) -> bool:
        user, event_id = key
        return self._set.contains(user, event_id)

    def holds_keyed(self, key: int, user: int, event_id: str) -> bool:
        return self._set.contains_keyed(key, user, event_id)

    def add(self, key: tuple[int, str]) -> None:
        self._set.add(*key)

    def insert(self, users: np.ndarray, event_ids: list[str] | EventIdSpans) -> np.ndarray:
        """Add each pair not already held; True where the pair is new — neither held before
        nor earlier in the batch. Spans are read in place (no ``str`` per id)."""
        if isinstance(event_ids, EventIdSpans):
            new = self._set.insert_spans(
                user_codes(users), event_ids.block, event_ids.starts, event_ids.lengths
            )
        else:
            new = self._set.insert(user_codes(users), event_ids)
        return np.frombuffer(new, np.bool_).copy()

    def insert_keyed(self, keys: np.ndarray, users: np.ndarray, event_ids: list[str]) -> np.ndarray:
        """``insert``, the pairs' keys given (``pair_keys``: the set keeps them as given)."""
        keys = np.ascontiguousarray(keys, np.int64)
        new = self._set.insert_keyed(keys, user_codes(users), event_ids)
        return np.frombuffer(new, np.bool_).copy()

    def take_runs(self) -> list[PairRun]:
        """Every pair held, as one run sorted by key; the index is empty after."""
        if len(self._set) == 0:
            return []
        # the set hands its columns over as it frees them, and each is replaced by its sorted
        # copy in turn: the pairs are held about once at any time, not twice
        packed: list[bytes | np.ndarray] = list(self._set.take())
        text = packed.pop()
        assert isinstance(text, bytes)
        order = np.argsort(np.frombuffer(packed[0], np.int64), kind="stable")
        for i, dtype in enumerate((np.int64, np.int32, np.int64, np.int32)):
            packed[i] = np.frombuffer(packed[i], dtype)[order]
        keys, users, starts, lengths = cast(list[np.ndarray], packed)
        return [PairRun(keys, users, starts, lengths, text)]

    def close(self) -> None:
        self._set.clear()


def new_seen_event_ids() -> SeenEventIds | _NativeSeenEventIds:
    """An empty in-memory event-id index: native when the extension is built."""
    return _NativeSeenEventIds() if _pair_set is not None else SeenEventIds()
