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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, compress, count, repeat
from operator import attrgetter
from typing import Any, Literal, NamedTuple, cast

import numpy as np

from streamfilter.dedup.in_memory import new_seen_event_ids
from streamfilter.dedup.index import MAX_USER_CODE, EventIdIndex
from streamfilter.engine.cell_table import (
    COORD_BITS,
    CellStore,
    CodedCells,
    NativeCells,
    NumpyCells,
    new_cells,
    packed_cells,
)
from streamfilter.engine.contract import Event
from streamfilter.engine.exact_sums import exact_sums_by_key, sorted_with_order
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
from streamfilter.engine.user_codes import UserCodeTable, fill_new_codes, new_user_codes

__all__ = ["DayAccumulator", "DayRecords", "DaySize"]

_USER = attrgetter("user_id")
_EVENT_ID = attrgetter("event_id")
_VALUES = attrgetter("values")
#: buffered per-event values kept in Python lists (``add``) before they move into arrays
_PENDING_MAX = 1 << 16
#: a batch of at most this many schemas (features' names in order) is added one schema at a time
_SCHEMAS_MAX = 8
#: codes are int32, and a user's code is the day's count of events at its first arrival; an
#: exact-sum limb (engine/exact_sums.py) takes this many additions before it could overflow


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
        self._cat_index: dict[str, tuple[UserCodeTable, list[int]]] = {}
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
                self._p_cats.append((user << COORD_BITS) | self._cat_code_of(name, v))
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
        return fill_new_codes(codes, names, self._coord_code_of)

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
            self._cells.add_hits(
                packed_cells(codes, self._category_codes(name, cast(list[str], column)))
            )
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
            self._cells.add_hits(packed_cells(user_col[cat], cat_codes))
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
        cells = CodedCells(
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
