"""Per-user daily records, built column-wise from validated events.

A user's record for a day is a sparse vector over *coordinates*: a numeric feature ``f`` sums the
user's values of ``f`` that day; a categorical value ``v`` of feature ``f`` adds 1 to coordinate
``f=v`` (docs/design.md §2 "Record"). A repeated ``event_id`` for the same user and day counts once.

Determinism: users are ordered by their 64-bit id hash (the ledger's order, so budget lookups
are one monotone walk; distinct ids with equal hashes ordered by id) and each (user, coordinate)
cell is the exact sum of its values rounded once (``engine.exact_sums``), a function of the
values alone. Every per-user computation of the day close is
row-wise and every sum is an exact integer sum, so the releases under a test seed do not depend
on the order in which events arrived, nor on the hash key.

Building the records is vectorised — no Python bytecode per event. ``DayAccumulator`` codes each
user id and coordinate as an integer on arrival (C-level ``dict.setdefault``), so the open day is
numpy columns, not Python objects per value; ``DayRecords.from_codes`` hashes each distinct user
once and sorts packed int64 keys. ``DayRecords.from_columns`` (decoded columns) gives the same
records: one hash per cell, exact grouping (cells of a group that are not the very same ``str``
object are compared by value). A day whose distinct ids share a hash is ordered by (hash, id).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, compress, count, repeat
from operator import attrgetter
from typing import Any, Literal, NamedTuple, Protocol, cast

import numpy as np

from streamfilter.engine.contract import Event
from streamfilter.engine.event_ids import (
    MAX_USER_CODE,
    EventIdIndex,
    id_bytes,
    packed_ids,
    pair_key,
    pair_keys,
    user_codes,
)
from streamfilter.engine.exact_sums import FOLD_MIN, CellSums, exact_sums_by_key, sorted_with_order
from streamfilter.engine.ingest import EventColumns
from streamfilter.engine.ledger import (
    Hasher,
    UserKeys,
    canonical_users,
    encode_ids,
    keys_in_canonical_order,
    object_ids,
    pack_ids,
    python_hash,
)
from streamfilter.engine.lines import EventIdSpans, id_list
from streamfilter.engine.native import cell_table as _cell_table  # None: NumpyCells
from streamfilter.engine.native import pair_set as _pair_set  # None: SeenEventIds' runs
from streamfilter.engine.native import user_codes as _user_codes  # None: a dict codes them

__all__ = [
    "DayAccumulator",
    "DayRecords",
    "DictUserCodes",
    "NumpyCells",
    "PairRun",
    "SeenEventIds",
    "new_cells",
    "new_seen_event_ids",
]

_USER = attrgetter("user_id")
_EVENT_ID = attrgetter("event_id")
_VALUES = attrgetter("values")
#: buffered per-event values kept in Python lists (``add``) before they move into arrays
_PENDING_MAX = 1 << 16
#: category counts are folded into cells once this many are buffered (and the buffer is at least
#: the folded cells' size, so folding costs O(1) amortised per value)
_FOLD_MIN = 1 << 20
#: a batch of at most this many schemas (features' names in order) is added one schema at a time
_SCHEMAS_MAX = 8
#: a packed category cell: the user's code above the coordinate's code (codes < 2**31 each)
_COORD_BITS = 31
_COORD_MASK = (1 << _COORD_BITS) - 1
#: codes are int32, and a user's code is the day's count of events at its first arrival; an
#: exact-sum limb (engine/exact_sums.py) takes this many additions before it could overflow


class PairRun:
    """(user code, event id) pairs sorted by their 64-bit key, packed: the keys (int64), the user
    codes (int32), each id's start (int64) and length (int32) in ``text``, the ids' UTF-8 bytes
    (``event_ids.id_bytes``) in one ``bytes`` — 24 B a pair plus the id. These are the columns
    of a spilled segment (runtime/event_ids.py), which is written from the runs as they are."""

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


#: the pairs' 64-bit keys (``engine.event_ids.pair_keys``; a module name tests can narrow)
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
    (``tests/engine/test_pair_set.py`` checks it against a ``set``;
    ``tests/runtime/test_event_id_index_contract.py`` runs the index contract on both). ``take_runs`` sorts the pairs by key into one
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


class DictUserCodes:
    """The open day's user codes in a dict — what ``engine/_user_codes.c``'s ``UserCodes`` does
    natively, with the same results (``tests/engine/test_user_codes.py``): ``codes(ids,
    first)`` gives the ids not held ``first``, ``first + 1``, ... in order of first arrival,
    ``code_of(id, code)`` is one ``setdefault``."""

    def __init__(self) -> None:
        self._code: dict[str, int] = {}

    def codes(self, ids: list[str], first: int, new_ids: list[str] | None = None) -> np.ndarray:
        """Each id's code, the ids not held taking ``first``, ``first + 1``, ... in order of
        first arrival and, with ``new_ids``, appended to it in that order."""
        codes = np.fromiter(map(self._code.get, ids, repeat(-1)), np.int64, len(ids))
        counter = count(first)

        def new_code(user_id: str) -> int:
            code = self._code.setdefault(user_id, next(counter))
            if new_ids is not None:
                new_ids.append(user_id)
            return code

        return _fill_new_codes(codes, ids, new_code)

    def code_of(self, user_id: str, code: int) -> int:
        return self._code.setdefault(user_id, code)

    def reserve(self, more: int) -> None:
        """A dict cannot be sized ahead."""

    def clear(self) -> None:
        self._code = {}

    def __len__(self) -> int:
        return len(self._code)


class _NativeUserCodes:
    """``engine/_user_codes.c``'s ``UserCodes`` with ``codes`` as an int64 array."""

    def __init__(self) -> None:
        assert _user_codes is not None
        self._table = _user_codes.UserCodes()

    def codes(self, ids: list[str], first: int, new_ids: list[str] | None = None) -> np.ndarray:
        return np.frombuffer(self._table.codes(ids, first, new_ids), np.int64)

    def code_of(self, user_id: str, code: int) -> int:
        return self._table.code_of(user_id, code)

    def reserve(self, more: int) -> None:
        self._table.reserve(more)

    def clear(self) -> None:
        self._table.clear()

    def __len__(self) -> int:
        return len(self._table)


def new_user_codes() -> DictUserCodes | _NativeUserCodes:
    """The open day's id → code table: native when the extension is built, else a dict."""
    return _NativeUserCodes() if _user_codes is not None else DictUserCodes()


class CellStore(Protocol):
    """The open day's (user, coordinate) cells and their exact sums (``NumpyCells``,
    ``NativeCells``; ``_CodedCells`` for cells given as columns): a user code is dense (an index
    into the day's users), a packed cell is ``_cell``'s."""

    def users_present(self, n: int) -> np.ndarray:
        """Which of the user codes ``0..n-1`` have a cell (a code >= n is a ValueError)."""
        ...

    def coords_present(self, n: int) -> np.ndarray:
        """Which of the coordinate codes ``0..n-1`` have a cell."""
        ...

    def records(
        self, user_rank: np.ndarray, coord_rank: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(user rank, coordinate rank, exact sum rounded once) of every cell, ordered by the
        ranks (``user_rank[code]``, ``coord_rank[code]``: dense ranks of the present codes)."""
        ...


class NumpyCells:
    """The open day's (user, coordinate) cells and their exact sums, in numpy — what
    ``engine/_cell_table.c``'s ``CellTable`` does natively, with the same records bit for bit
    (``tests/engine/test_cell_table.py``).

    A category hit adds exactly 1.0 to its cell: hits are buffered as packed cells and folded
    into sorted (cell, count) columns (counts of 1.0s are exact in any order). A numeric
    coordinate keeps each user's exact sum (``engine.exact_sums.CellSums``: the value itself
    while there is one, else a fixed-point accumulator). Buffers are folded once they hold as
    many values as there are cells (and at least ``_FOLD_MIN`` / ``FOLD_MIN``), so memory stays
    bounded by the cells, not by the values."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Drop every cell (the store is empty again)."""
        # numeric coordinate code → its exact per-user sums (values buffered, then folded)
        self._num: dict[int, CellSums] = {}
        self._cat: list[np.ndarray] = []  # category hits as packed cells (``_cell``)
        self._cat_buffered = 0
        # folded category cells: (ascending packed cells, counts)
        self._folded: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0))
        self._cells: _CodedCells | None = None  # every cell once, when gathered

    def reserve(self, cells: int) -> None:
        """Nothing to allocate ahead: the folds grow by concatenation."""

    def count(self) -> int:
        """The cells folded so far (a size hint: buffered values are not counted)."""
        return len(self._folded[0]) + sum(map(len, self._num.values()))

    def add_numbers(self, coord: int, users: np.ndarray, values: np.ndarray) -> None:
        sums = self._num.get(coord)
        if sums is None:
            sums = self._num[coord] = CellSums()
        sums.add(users, values)

    def add_hits(self, cells: np.ndarray) -> None:
        self._cat.append(cells)
        self._cat_buffered += len(cells)

    @property
    def buffered(self) -> int:
        """Numeric values waiting in the coordinates' buffers."""
        return sum(sums.buffered for sums in self._num.values())

    def maybe_fold(self) -> None:
        if self._cat_buffered >= max(_FOLD_MIN, len(self._folded[1])):
            self.fold_hits()
        if self.buffered >= max(FOLD_MIN, sum(map(len, self._num.values()))):
            for sums in self._num.values():
                sums.fold()

    def fold_hits(self) -> None:
        """Fold every buffered category hit into its cell's count: the buffer is counted alone
        (its temporaries are the buffer's, not the day's), then added to the cells held and its
        new cells inserted."""
        if not self._cat:
            return
        cells = np.concatenate(self._cat)
        self._cat, self._cat_buffered = [], 0
        unique, counts = np.unique(cells, return_counts=True)
        del cells
        f_cells, f_counts = self._folded
        at = np.searchsorted(f_cells, unique)
        found = at < len(f_cells)
        found[found] = f_cells[at[found]] == unique[found]
        f_counts[at[found]] += counts[found]
        if not found.all():
            new = ~found
            f_cells = np.insert(f_cells, at[new], unique[new])
            f_counts = np.insert(f_counts, at[new], counts[new].astype(np.float64))
        self._folded = (f_cells, f_counts)

    def _gathered(self) -> _CodedCells:
        """Every cell once (user codes, coordinate codes, exact sums); the tables are freed as
        their cells come out."""
        if self._cells is None:
            self.fold_hits()
            cells, counts = self._folded
            self._folded = (np.zeros(0, np.int64), np.zeros(0))
            users = [cells >> _COORD_BITS]
            coords = [cells & _COORD_MASK]
            values = [counts]
            del cells, counts
            for coord in list(self._num):
                codes, summed = self._num.pop(coord).sums()
                users.append(codes)
                coords.append(np.full(len(codes), coord, np.int64))
                values.append(summed)
                del codes, summed
            self._cells = _CodedCells(
                _concatenated(users), _concatenated(coords), _concatenated(values)
            )
        return self._cells

    def users_present(self, n: int) -> np.ndarray:
        return self._gathered().users_present(n)

    def coords_present(self, n: int) -> np.ndarray:
        return self._gathered().coords_present(n)

    def records(
        self, user_rank: np.ndarray, coord_rank: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._gathered().records(user_rank, coord_rank)


class NativeCells:
    """``engine/_cell_table.c``'s ``CellTable``: one exact accumulator per cell in a hash
    table, each value added as it arrives (no buffer, no fold), and the records read off it in
    canonical order by a counting sort of the users' ranks."""

    def __init__(self) -> None:
        assert _cell_table is not None
        self._table = _cell_table.CellTable()

    def reserve(self, cells: int) -> None:
        """Room for ``cells`` more cells, allocated at once."""
        self._table.reserve(cells)

    def count(self) -> int:
        return len(self._table)

    def add_numbers(self, coord: int, users: np.ndarray, values: np.ndarray) -> None:
        cells = (users.astype(np.int64) << _COORD_BITS) | coord
        self._table.add(cells, np.ascontiguousarray(values, np.float64))

    def add_hits(self, cells: np.ndarray) -> None:
        self._table.add(np.ascontiguousarray(cells, np.int64), None)

    def maybe_fold(self) -> None:
        """Nothing is buffered."""

    def users_present(self, n: int) -> np.ndarray:
        return np.frombuffer(self._table.users_present(n), np.uint8).astype(bool)

    def coords_present(self, n: int) -> np.ndarray:
        return np.frombuffer(self._table.coords_present(n), np.uint8).astype(bool)

    def records(
        self, user_rank: np.ndarray, coord_rank: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos, coord, value = self._table.records(
            np.ascontiguousarray(user_rank, np.int64), np.ascontiguousarray(coord_rank, np.int64)
        )
        return np.frombuffer(pos, np.int64), np.frombuffer(coord, np.int64), np.frombuffer(value)

    def clear(self) -> None:
        self._table.clear()


def new_cells() -> NumpyCells | NativeCells:
    """The open day's cell table: native when the extension is built, else numpy."""
    return NativeCells() if _cell_table is not None else NumpyCells()


def _present(codes: np.ndarray, n: int) -> np.ndarray:
    """Which of the codes ``0..n-1`` occur in ``codes``."""
    if len(codes) and int(codes.max()) >= n:
        raise ValueError(f"a cell's code is >= {n}")
    mark = np.zeros(n, bool)
    mark[codes] = True
    return mark


def _ranked_sums(
    users: np.ndarray,
    coords: np.ndarray,
    values: np.ndarray,
    user_rank: np.ndarray,
    coord_rank: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(user rank, coordinate rank, exact sum) of each distinct (user, coordinate) of the cells
    ``(users[i], coords[i], values[i])``, ordered by the ranks (``exact_sums_by_key``)."""
    n = int(user_rank.max()) + 1 if len(user_rank) else 0
    k = int(coord_rank.max()) + 1 if len(coord_rank) else 0
    ranks, cranks = user_rank[users], coord_rank[coords]
    if len(values) and (int(ranks.min()) < 0 or int(cranks.min()) < 0):
        raise ValueError("a cell's code has no rank")
    cell_key, summed = exact_sums_by_key(ranks * k + cranks, values, n * k)
    return cell_key // k, cell_key % k, summed


def _records_of_cells(
    day: str,
    users: Sequence[str],
    coords: Sequence[str],
    cells: CellStore,
    hasher: Hasher = python_hash,
) -> DayRecords:
    """The records of a day's cells: user code ``i`` is ``users[i]``, coordinate code ``j`` is
    ``coords[j]`` (a user or coordinate without a cell is not in the records)."""
    present = cells.users_present(len(users))
    if not present.any():
        return DayRecords.from_columns(day, _objects([]), _objects([]), np.zeros(0), hasher)
    native = (
        canonical_users(users, present) if hasher is python_hash and type(users) is list else None
    )
    if native is not None:  # the ids visited twice, in memory order (engine/_packed_ids.c)
        in_order, user_rank, keys = native
    else:
        ids = _objects(users)
        if not present.all():
            ids = ids[present]
        in_order, rank, keys = _canonical_users(ids, hasher)
        if len(ids) < len(users):
            user_rank = np.full(len(users), -1, np.int64)
            user_rank[present] = rank
        else:
            user_rank = rank
    coord_rank, coord_names = _canonical_coords(coords, cells.coords_present(len(coords)))
    user_pos, coord, value = cells.records(user_rank, coord_rank)
    return DayRecords(day, in_order, user_pos, coord, value, coord_names, keys)


def _canonical_users(ids: np.ndarray, hasher: Hasher) -> tuple[np.ndarray, np.ndarray, UserKeys]:
    """The distinct ``ids`` in canonical order (ascending hash; equal hashes by id), each id's
    rank in it, and their keys for the ledger."""
    h = np.asarray(hasher(ids), dtype=np.int64)
    hs, order = sorted_with_order(h)
    if (hs[1:] == hs[:-1]).any():  # distinct ids share a hash: canonical order (hash, id)
        order = _order_by_hash_then_id(ids, h)
        hs = h[order]
    rank = np.empty(len(ids), np.int64)
    rank[order] = np.arange(len(ids))
    # scattered, not gathered: the ids are read (and their counts raised) in memory order and
    # only the pointers land at random (``ids[order]`` touched 600,000 str objects at random)
    in_order = np.empty(len(ids), dtype=object)
    in_order[rank] = ids
    return in_order, rank, _keys_in_order(ids, rank, hs, hasher)


def _canonical_coords(coords: Sequence[str], used: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the rank of each used coordinate code among the used names sorted, -1 if unused; the
    used names sorted)."""
    names = [name for name, u in zip(coords, used.tolist(), strict=True) if u]
    by_name = sorted(range(len(names)), key=names.__getitem__)
    coord_rank = np.full(len(coords), -1, np.int64)
    coord_rank[np.flatnonzero(used)[by_name]] = np.arange(len(names))
    return coord_rank, _objects([names[i] for i in by_name])


class _CodedCells:
    """Integer-coded cells given as columns (``DayRecords.from_codes``), duplicates allowed."""

    def __init__(self, users: np.ndarray, coords: np.ndarray, values: np.ndarray) -> None:
        self._users, self._coords, self._values = users, coords, values

    def users_present(self, n: int) -> np.ndarray:
        return _present(self._users, n)

    def coords_present(self, n: int) -> np.ndarray:
        return _present(self._coords, n)

    def records(
        self, user_rank: np.ndarray, coord_rank: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _ranked_sums(self._users, self._coords, self._values, user_rank, coord_rank)


class DaySize(NamedTuple):
    """How large an open day has grown: its distinct users and its (user, coordinate) cells.
    A new day's tables are allocated for the size of the days before it at once
    (``DayAccumulator.reserve``), instead of through a chain of growths that copy and rehash
    everything held and touch fresh pages each time (docs/design.md §8.4)."""

    users: int
    cells: int


class DayAccumulator:
    """Collects one day's events as integer-coded columns (docs/design.md §2 "Record").

    Each distinct user id of the day gets an int32 code on first arrival (one ``str`` kept per
    user, in a dict), each coordinate name a code too; an event's values then become numpy
    columns with no Python object kept per value, and are folded into per-cell sums as they
    accumulate, so the open day's memory is bounded by its (user, coordinate) cells, not by its
    events. A categorical value adds exactly 1.0 to its cell (sums of 1.0 are exact in any
    order); a numeric coordinate keeps each user's exact sum (``engine.exact_sums.CellSums``:
    the value itself while there is one, else a fixed-point accumulator): a cell's value is the
    exact sum of its values rounded once, so the records are identical to summing every value at
    the end, in any order. A repeated ``event_id`` is remembered per (user code, event id).

    ``add`` takes one event (``Monitor``, the audit); ``add_many`` a batch of one day's events and
    ``add_columns`` a batch decoded as columns, without Python bytecode per event (the daemon's
    hot path).
    """

    def __init__(
        self,
        day: str,
        seen: EventIdIndex | None = None,
        cells: NumpyCells | NativeCells | None = None,
    ) -> None:
        self.day = day
        self.events = 0
        self.duplicates = 0
        self._finished = False
        #: repeated events: in memory unless the runtime passes an index (it may spill to disk)
        self._seen_event_ids: EventIdIndex = seen if seen is not None else new_seen_event_ids()
        # user id → code: dense, in order of first arrival; ``_users[code]`` is the id
        self._user_code = new_user_codes()
        self._users: list[str] = []
        self._coord_code: dict[str, int] = {}
        self._coords: list[str] = []  # code → coordinate name
        self._cat_code: dict[str, dict[str, int]] = {}  # feature → category → coordinate code
        #: feature → (a code table: category → index, the coordinate code of each index), the
        #: columns' path to ``_cat_code`` (``_category_codes``)
        self._cat_index: dict[str, tuple[DictUserCodes | _NativeUserCodes, list[int]]] = {}
        # per-event ``add``: Python lists, moved into the arrays every _PENDING_MAX values
        self._p_users: list[int] = []
        self._p_coords: list[int] = []
        self._p_values: list[float] = []
        self._p_cats: list[int] = []  # packed cells of category hits
        # the (user, coordinate) cells and their exact sums: native when built
        self._cells = cells if cells is not None else new_cells()
        self._records: DayRecords | None = None  # the day's records, once finished

    @property
    def finished(self) -> bool:
        """The records are out: the day takes no more events."""
        return self._finished

    def size(self) -> DaySize:
        """The day's distinct users and cells so far."""
        return DaySize(len(self._users), self._cells.count())

    def reserve(self, size: DaySize) -> None:
        """Room for ``size`` more users and cells, allocated at once (a hint: the day still
        grows past it; nothing else changes)."""
        self._check_open()
        self._user_code.reserve(size.users)
        self._cells.reserve(size.cells)

    def _user_code_of(self, user_id: str) -> int:
        n = len(self._users)
        if n >= MAX_USER_CODE:
            raise OverflowError(f"more than {MAX_USER_CODE} users in one day")
        code = self._user_code.code_of(user_id, n)
        if code == n:  # new: every id held has a smaller code
            self._users.append(user_id)
        return code

    def _coord_code_of(self, name: str) -> int:
        code = self._coord_code.get(name)
        if code is None:
            code = self._coord_code[name] = len(self._coords)
            self._coords.append(name)
        return code

    def _cat_code_of(self, name: str, value: str) -> int:
        of_feature = self._cat_code.setdefault(name, {})
        code = of_feature.get(value)
        if code is None:
            code = of_feature[value] = self._coord_code_of(f"{name}={value}")
        return code

    def add(self, event: Event) -> bool:
        """Add a validated event of this day; return False for a repeated ``event_id``."""
        self._check_open()
        user = self._user_code_of(event.user_id)
        if event.event_id is not None:
            key = (user, event.event_id)
            if key in self._seen_event_ids:
                self.duplicates += 1
                return False
            self._seen_event_ids.add(key)
        self.events += 1
        for name, v in event.values.items():
            if isinstance(v, str):
                self._p_cats.append((user << _COORD_BITS) | self._cat_code_of(name, v))
            else:
                self._p_users.append(user)
                self._p_coords.append(self._coord_code_of(name))
                self._p_values.append(v)
        if not event.values:
            # an event with no values still makes the user known for the day (a zero record)
            self._p_users.append(user)
            self._p_coords.append(self._coord_code_of(""))
            self._p_values.append(0.0)
        if len(self._p_users) + len(self._p_cats) >= _PENDING_MAX:
            self._flush_pending()
        return True

    def _user_codes(self, user_ids: list[str]) -> np.ndarray:
        """The code of each id (``UserCodes.codes``), the ids new to the day getting the next
        dense codes in order of first arrival."""
        n0 = len(self._users)
        if n0 + len(user_ids) > MAX_USER_CODE:
            raise OverflowError(f"more than {MAX_USER_CODE} users in one day")
        return self._user_code.codes(user_ids, n0, self._users).astype(np.int32)

    def _coordinate_codes(self, names: list[str]) -> np.ndarray:
        """The code of each numeric feature name (a dict look-up in C; new names are few)."""
        codes = np.fromiter(map(self._coord_code.get, names, repeat(-1)), np.int64, len(names))
        return _fill_new_codes(codes, names, self._coord_code_of)

    def _category_codes(self, name: str, categories: list[str]) -> np.ndarray:
        """The coordinate code of each category ``f"{name}={category}"`` of one feature: each
        category's index in the feature's code table (natively, like user ids: no Python step
        per value), then the index's coordinate code (``_cat_code_of`` once per category new to
        the table, which gives the code the per-event path gives)."""
        entry = self._cat_index.get(name)
        if entry is None:
            entry = self._cat_index[name] = (new_user_codes(), [])
        table, coords = entry
        new: list[str] = []
        index = table.codes(categories, len(coords), new)
        coords += [self._cat_code_of(name, category) for category in new]
        return np.asarray(coords, np.int64)[index]

    def add_many(self, events: Sequence[Event]) -> int:
        """``add`` of each event, in order, as column operations; returns how many were added
        (the others repeat an ``event_id``)."""
        self._check_open()
        if not events:
            return 0
        codes, keep = self._new_events(list(map(_USER, events)), list(map(_EVENT_ID, events)))
        if not keep.all():
            events = list(map(events.__getitem__, np.flatnonzero(keep).tolist()))
        self._add_values(codes[keep], list(map(_VALUES, events)))
        self._cells.maybe_fold()
        return len(events)

    def add_columns(self, batch: EventColumns) -> int:
        """``add_many`` of a batch decoded as columns (``engine.ingest.parse_columns``): one
        C-level pass per feature, no Python object per event."""
        self._check_open()
        n = len(batch)
        if n == 0:
            return 0
        codes, keep = self._new_events(batch.user_ids, batch.event_ids)
        added = int(keep.sum())
        kept = codes if added == n else codes[keep]
        mask = None if added == n else keep.tolist()
        for name, categorical, column in zip(
            batch.features, batch.categorical, batch.columns, strict=True
        ):
            if mask is None:
                values = column
            elif isinstance(column, np.ndarray):
                values = column[keep]
            else:
                values = list(compress(column, mask))
            self._add_column(kept, name, categorical, values)
        self._cells.maybe_fold()
        return added

    def _new_events(
        self, user_ids: list[str], event_ids: list[str | None] | EventIdSpans
    ) -> tuple[np.ndarray, np.ndarray]:
        """The user codes of a batch and which of its events count (not a repeated ``event_id``,
        of the day or earlier in the batch); updates the event and duplicate counts."""
        n = len(user_ids)
        codes = self._user_codes(user_ids)
        keep = np.ones(n, bool)
        without_id = event_ids.count(None)
        if without_id == 0:  # the usual batch: every event has an id
            keep = self._seen_event_ids.insert(codes, cast(list[str] | EventIdSpans, event_ids))
        elif without_id < n:
            event_ids = id_list(event_ids)  # spans: each id made a str once (ids_of)
            idx = np.flatnonzero(
                np.fromiter(map(operator.is_not, event_ids, repeat(None)), bool, n)
            )
            ids = list(map(event_ids.__getitem__, idx.tolist()))
            keep[idx] = self._seen_event_ids.insert(codes[idx], cast(list[str], ids))
        added = int(keep.sum())
        self.duplicates += n - added
        self.events += added
        return codes, keep

    def _add_values(self, codes: np.ndarray, value_maps: list[dict[str, float | str]]) -> None:
        """The cells of kept events (user codes, value maps). The usual batch — every event with
        the same features, each feature all numbers or all categories — takes one C-level pass
        per feature; any other batch one pass per value (``_add_mixed_values``)."""
        n = len(value_maps)
        features = list(value_maps[0]) if n else []
        if features and (np.fromiter(map(len, value_maps), np.int64, n) == len(features)).all():
            columns = [list(map(dict.get, value_maps, repeat(name))) for name in features]
            kinds = [set(map(type, column)) for column in columns]
            if all(kind == {str} or kind <= {float, int} for kind in kinds):
                for name, column, kind in zip(features, columns, kinds, strict=True):
                    self._add_column(codes, name, kind == {str}, column)
                return
        if n and self._add_by_schema(codes, value_maps):
            return
        self._add_mixed_values(codes, value_maps)

    def _add_by_schema(self, codes: np.ndarray, value_maps: list[dict[str, float | str]]) -> bool:
        """A batch of a few schemas (the features' names in order): each schema's events as one
        batch of their own (a cell's sum is exact and a count is a count, so the order in which
        a cell's values arrive changes nothing). False (nothing added) when the features are the
        same throughout or there are more than ``_SCHEMAS_MAX`` schemas."""
        schema_of: dict[tuple[str, ...], int] = {}
        first = np.fromiter(
            map(schema_of.setdefault, map(tuple, value_maps), count()), np.int64, len(value_maps)
        )
        if not 1 < len(schema_of) <= _SCHEMAS_MAX:
            return False
        for at in schema_of.values():
            rows = np.flatnonzero(first == at)
            self._add_values(codes[rows], list(map(value_maps.__getitem__, rows.tolist())))
        return True

    def _add_column(
        self, codes: np.ndarray, name: str, categorical: bool, column: list[Any] | np.ndarray
    ) -> None:
        """One feature's values of a batch, ``column[i]`` the value of user ``codes[i]``: all
        categories (folded into cells later) or all numbers."""
        if categorical:
            self._cells.add_hits(_cell(codes, self._category_codes(name, cast(list[str], column))))
        else:
            values = (
                column
                if isinstance(column, np.ndarray)
                else np.fromiter(column, np.float64, len(codes))
            )
            self._add_numbers(self._coord_code_of(name), codes, values)

    def _add_numbers(self, coord: int, codes: np.ndarray, values: np.ndarray) -> None:
        """``values[i]`` of user ``codes[i]`` at numeric coordinate ``coord``."""
        self._cells.add_numbers(coord, codes, values)

    def _add_mixed_values(
        self, codes: np.ndarray, value_maps: list[dict[str, float | str]]
    ) -> None:
        per_event = np.fromiter(map(len, value_maps), np.int64, count=len(value_maps))
        names = list(chain.from_iterable(value_maps))
        values = list(chain.from_iterable(map(dict.values, value_maps)))
        user_col = np.repeat(codes, per_event)
        is_cat = list(map(isinstance, values, repeat(str)))
        if any(is_cat):
            cat = np.fromiter(is_cat, bool, count=len(is_cat))
            cat_codes = np.fromiter(
                map(
                    self._cat_code_of,
                    compress(names, is_cat),
                    cast(Iterator[str], compress(values, is_cat)),
                ),
                np.int64,
                int(cat.sum()),
            )
            self._cells.add_hits(_cell(user_col[cat], cat_codes))
            is_num = list(map(operator.not_, is_cat))
            names, values = list(compress(names, is_num)), list(compress(values, is_num))
            user_col = user_col[~cat]
        if names:
            self._add_per_coordinate(
                user_col,
                self._coordinate_codes(names),
                np.fromiter(values, np.float64, len(values)),
            )
        empty = per_event == 0
        if empty.any():  # a zero record for each event with no values
            users = codes[empty]
            self._add_numbers(self._coord_code_of(""), users, np.zeros(len(users)))

    def _add_per_coordinate(
        self, users: np.ndarray, coords: np.ndarray, values: np.ndarray
    ) -> None:
        """Numeric values of mixed coordinates, split by coordinate."""
        order = np.argsort(coords, kind="stable")
        coords = coords[order]
        bounds = np.flatnonzero(np.r_[True, coords[1:] != coords[:-1], True])
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            run = order[a:b]
            self._add_numbers(int(coords[a]), users[run], values[run])

    def _flush_pending(self) -> None:
        if self._p_users:
            self._add_per_coordinate(
                np.array(self._p_users, np.int64),
                np.array(self._p_coords, np.int64),
                np.array(self._p_values, np.float64),
            )
            self._p_users, self._p_coords, self._p_values = [], [], []
        if self._p_cats:
            self._cells.add_hits(np.array(self._p_cats, np.int64))
            self._p_cats = []
        self._cells.maybe_fold()

    def finish(self) -> DayRecords:
        """The day's records (the same on every call). The day takes no more events afterwards:
        the repeated-event index and the id → code table are released first, and the cells
        once the records are out, since the close is when memory peaks."""
        if self._records is not None:
            return self._records
        self._finished = True
        self._seen_event_ids.close()
        self._user_code.clear()
        self._flush_pending()
        self._records = _records_of_cells(self.day, self._users, self._coords, self._cells)
        self._cells.clear()
        return self._records

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError(f"day {self.day} is finished: it takes no more events")


def _fill_new_codes(
    codes: np.ndarray, keys: list[str], code_of: Callable[[str], int]
) -> np.ndarray:
    """``codes`` with each -1 (a key the day had not coded) replaced by ``code_of(key)``, called
    once per distinct new key, in order of first appearance (so codes are given as one call per
    value would give them)."""
    missing = np.flatnonzero(codes < 0)
    if len(missing):
        new_keys = list(map(keys.__getitem__, missing.tolist()))
        code = {key: code_of(key) for key in dict.fromkeys(new_keys)}
        codes[missing] = np.fromiter(map(code.__getitem__, new_keys), np.int64, len(new_keys))
    return codes


def _concatenated(parts: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate(parts)``, emptying the list as it goes (the parts are freed once
    copied)."""
    out = np.concatenate(parts)
    parts.clear()
    return out


def _cell(users: np.ndarray, coords: np.ndarray) -> np.ndarray:
    """(user code, coordinate code) cells packed in one int64 each."""
    packed: np.ndarray = (users.astype(np.int64) << _COORD_BITS) | coords
    return packed


def _objects(items: Sequence[object]) -> np.ndarray:
    """A 1-d object array of ``items`` (each element as is, never unpacked; ``fromiter`` is
    about twice as fast as assigning a list to an empty array)."""
    return np.fromiter(items, dtype=object, count=len(items))


@dataclass(frozen=True)
class DayRecords:
    """Sparse (users × coordinates) day records, canonical order, duplicates summed.

    ``users``: the day's distinct user ids (object array) in canonical order — ascending hash
    (``keys.hashes``, the ledger's order), equal hashes by id; ``user_pos``/``coord``/``value``:
    one entry per non-empty (user, coordinate) cell, sorted by (user, coordinate);
    ``coord_names``: sorted coordinate names, indexed by ``coord``; ``keys``: the users' hashes
    and UTF-8 ids for the ledger (:class:`~streamfilter.engine.ledger.UserKeys`).
    """

    day: str
    users: np.ndarray
    user_pos: np.ndarray
    coord: np.ndarray
    value: np.ndarray
    coord_names: np.ndarray
    keys: UserKeys | None = None

    @property
    def user_hash(self) -> np.ndarray:
        keys = self.keys if self.keys is not None else UserKeys.of(self.users, python_hash)
        return keys.hashes

    @classmethod
    def from_columns(
        cls,
        day: str,
        users: np.ndarray,
        coords: np.ndarray,
        values: np.ndarray,
        hasher: Hasher = python_hash,
    ) -> DayRecords:
        users = np.asarray(users, dtype=object).reshape(-1)
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        n = len(users)
        if n == 0:
            empty_i = np.zeros(0, np.int64)
            return cls(
                day,
                np.array([], dtype=object),
                empty_i,
                empty_i,
                np.zeros(0),
                np.array([], dtype=object),
                UserKeys.of([], hasher),
            )
        coord, coord_names = _coordinate_codes(coords)
        h = np.asarray(hasher(users), dtype=np.int64)
        hs, order = sorted_with_order(h)
        user_start = np.r_[True, hs[1:] != hs[:-1]]
        user_start = _split_collisions(users, order, hs, user_start)
        if user_start is None:  # ids collided inside the day: canonical order (hash, id)
            order = _order_by_hash_then_id(users, h)
            hs = h[order]
            user_start = np.r_[True, (hs[1:] != hs[:-1]) | (users[order[1:]] != users[order[:-1]])]
        user_pos = np.cumsum(user_start) - 1
        first = order[user_start]  # each user's first cell, canonical order
        users_out, keys = _users_and_keys(users, first, hs[user_start], hasher)
        k = len(coord_names)
        key = np.empty(n, np.int64)
        key[order] = user_pos * k + coord[order]
        cell_key, summed = exact_sums_by_key(key, values, len(users_out) * k)
        return cls(day, users_out, cell_key // k, cell_key % k, summed, coord_names, keys)

    @classmethod
    def from_codes(
        cls,
        day: str,
        users: Sequence[str],
        coords: Sequence[str],
        cell_user: np.ndarray,
        cell_coord: np.ndarray,
        values: np.ndarray,
        hasher: Hasher = python_hash,
    ) -> DayRecords:
        """Records of integer-coded cells: cell ``i`` adds ``values[i]`` to user
        ``users[cell_user[i]]`` at coordinate ``coords[cell_coord[i]]`` (``users`` distinct,
        ``coords`` distinct). Equal to :meth:`from_columns` of the decoded columns, bit for bit;
        one hash per user instead of one per cell."""
        cells = _CodedCells(
            np.asarray(cell_user, np.int64),
            np.asarray(cell_coord, np.int64),
            np.asarray(values, dtype=np.float64),
        )
        return _records_of_cells(day, users, coords, cells, hasher)

    @property
    def n_users(self) -> int:
        return len(self.users)

    def matrix(
        self,
        coordinates: list[str],
        order: Literal["C", "F"] = "C",
        rows: tuple[int, int] | None = None,
    ) -> np.ndarray:
        """Dense (n_users × k) float64 matrix of the requested coordinates (0 where absent).

        ``order="F"`` lays it out column by column: per-user reductions over a few columns
        are then elementwise operations between columns (much faster in numpy). ``rows=(a, b)``
        builds only the rows of users ``a..b-1`` (their cells are one contiguous run).
        """
        if order not in ("C", "F"):
            raise ValueError("order must be 'C' or 'F'")
        start, stop = (0, self.n_users) if rows is None else rows
        if not 0 <= start <= stop <= self.n_users:
            raise ValueError(f"rows {rows} out of range for {self.n_users} users")
        n, k = stop - start, len(coordinates)
        out = np.zeros((n, k), dtype=np.float64, order=order)
        if n == 0 or not coordinates:
            return out
        col_of = {name: j for j, name in enumerate(coordinates)}
        lookup = np.array([col_of.get(name, -1) for name in self.coord_names], dtype=np.int64)
        if (lookup < 0).all():
            return out
        if rows is None:
            user_pos, coord, value = self.user_pos, self.coord, self.value
        else:
            lo, hi = np.searchsorted(self.user_pos, [start, stop])
            user_pos, coord, value = (
                self.user_pos[lo:hi] - start,
                self.coord[lo:hi],
                self.value[lo:hi],
            )
        cols = lookup[coord]
        flat = user_pos * k + cols if order == "C" else cols * n + user_pos
        if (lookup < 0).any():
            keep = np.flatnonzero(cols >= 0)
            flat, value = flat[keep], value[keep]
        # each (user, coordinate) cell is unique after from_columns, so plain assignment is exact
        out.reshape(-1, order="A")[flat] = value
        return out


def _coordinate_codes(coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact code of each cell's coordinate name (index into the sorted distinct names)."""
    items = coords.tolist() if isinstance(coords, np.ndarray) else list(coords)
    first_cell: dict[str, int] = {}
    # one dict lookup per cell in C: each name maps to the index of its first cell
    code = np.fromiter(
        map(first_cell.setdefault, items, itertools.count()), dtype=np.int64, count=len(items)
    )
    names = list(first_cell)
    firsts = np.fromiter(first_cell.values(), dtype=np.int64, count=len(names))  # increasing
    by_name = sorted(range(len(names)), key=names.__getitem__)
    rank = np.empty(len(names), np.int64)
    rank[by_name] = np.arange(len(names))
    coord_names = np.empty(len(names), dtype=object)
    coord_names[:] = [names[i] for i in by_name]
    return rank[np.searchsorted(firsts, code)], coord_names


def _users_and_keys(
    users: np.ndarray, first: np.ndarray, hashes: np.ndarray, hasher: Hasher
) -> tuple[np.ndarray, UserKeys]:
    """The distinct ids in canonical order and their keys (ids packed in canonical order)."""
    arrival = sorted_with_order(first)[1]  # canonical positions by first cell
    in_arrival = users[first[arrival]]
    out = np.empty(len(first), dtype=object)
    out[arrival] = in_arrival
    return out, _keys_in_order(in_arrival, arrival, hashes, hasher)


def _keys_in_order(
    ids: np.ndarray, canonical: np.ndarray, hashes: np.ndarray, hasher: Hasher
) -> UserKeys:
    """The keys of ``ids`` laid out in canonical order: ``ids[i]`` is at ``canonical[i]``,
    whose hash is ``hashes[canonical[i]]``. The ``str`` objects are read in the order given —
    the order they sit in memory — then only pointers and packed words are permuted (natively
    when the extension is built: ``ledger.keys_in_canonical_order``)."""
    native = keys_in_canonical_order(ids.tolist(), canonical, hashes, hasher)
    if native is not None:
        return native
    buffer, starts_a, lengths_a = encode_ids(ids)
    words, woff_a = pack_ids(buffer, starts_a, lengths_a)
    woff = np.empty(len(ids), np.int64)
    lengths = np.empty(len(ids), np.int64)
    woff[canonical] = woff_a
    lengths[canonical] = lengths_a
    return UserKeys(hasher, hashes, lengths, woff, words).compacted()


def _split_collisions(
    users: np.ndarray, order: np.ndarray, hs: np.ndarray, user_start: np.ndarray
) -> np.ndarray | None:
    """``user_start`` if every hash group holds one id, else None (ids collided)."""
    gid = np.cumsum(user_start) - 1
    ptr = object_ids(users)[order]
    group_first = np.flatnonzero(user_start)[gid]
    other = np.flatnonzero(ptr != ptr[group_first])  # not the group's first str object
    if len(other) == 0:
        return user_start
    equal = users[order[other]] == users[order[group_first[other]]]
    return user_start if bool(np.all(equal)) else None


def _order_by_hash_then_id(users: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Stable order by (hash, id) — only when distinct ids of the day share a hash (rare)."""
    order = np.argsort(h, kind="stable")
    hs = h[order]
    brk = np.flatnonzero(np.r_[True, hs[1:] != hs[:-1], True])
    for s, e in zip(brk[:-1].tolist(), brk[1:].tolist(), strict=True):
        if e - s > 1:
            run = order[s:e]
            order[s:e] = run[sorted(range(e - s), key=lambda j: users[run[j]])]
    return order
