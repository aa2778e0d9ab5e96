"""Per-user daily records, built column-wise from validated events.

A user's record for a day is a sparse vector over *coordinates*: a numeric feature ``f`` sums the
user's values of ``f`` that day; a categorical value ``v`` of feature ``f`` adds 1 to coordinate
``f=v`` (docs/design.md §2 "Record"). A repeated ``event_id`` for the same user and day counts once.

Determinism: users are ordered by their 64-bit id hash (the ledger's order, so budget lookups
are one monotone walk; distinct ids with equal hashes ordered by id) and each (user, coordinate)
group is summed in ascending value order. Every per-user computation of the day close is
row-wise and every sum is an exact integer sum, so the releases under a test seed do not depend
on the order in which events arrived, nor on the hash key.

Building the records is vectorised: one hash per cell (C-level ``map``), exact coordinate codes
(C-level ``dict.setdefault``) and sorts of packed int64 keys — no Python bytecode per event.
Grouping by hash is exact: cells of a group that are not the very same ``str`` object are
compared by value, and a day whose distinct ids share a hash is ordered by (hash, id).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, compress, count, repeat
from operator import attrgetter, itemgetter
from typing import Literal

import numpy as np

from streamfilter.engine.contract import Event
from streamfilter.engine.ledger import (
    Hasher,
    UserKeys,
    encode_ids,
    object_ids,
    pack_ids,
    python_hash,
)

__all__ = ["DayAccumulator", "DayRecords", "SeenEventIds"]


_USER = attrgetter("user_id")
_EVENT_ID = attrgetter("event_id")
_VALUES = attrgetter("values")
#: buffered per-event values kept in Python lists (``add``) before they move into arrays
_PENDING_MAX = 1 << 16
#: category counts are folded into cells once this many are buffered (and the buffer is at least
#: the folded cells' size, so folding costs O(1) amortised per value)
_FOLD_MIN = 1 << 20


class SeenEventIds:
    """The exact set of a day's (user, event id) pairs, compact.

    Recent pairs are a Python ``set`` (~100 B a pair); once it holds a third of all pairs it is
    moved into columns sorted by the pair's 64-bit ``hash``: the interned user (a pointer), and
    the event id as a slice of one ``str`` (start, length) — ~30 B plus the id's characters.
    A look-up in the columns is a binary search of the hash; a hash match (a repeated pair, or
    a 64-bit collision) is confirmed by comparing the user and the event id exactly.
    """

    COMPACT_MIN = 1 << 18

    def __init__(self) -> None:
        self._recent: set[tuple[str, str]] = set()
        self._hashes = np.zeros(0, np.int64)
        self._users = _objects([])
        self._starts = np.zeros(0, np.int64)
        self._lengths = np.zeros(0, np.int32)
        self._text = ""

    def __len__(self) -> int:
        return len(self._recent) + len(self._hashes)

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._recent or self._stored(key, hash(key))

    def contains_many(self, keys: list[tuple[str, str]]) -> np.ndarray:
        """``key in self`` for each key, without Python per key unless its hash is stored."""
        found = np.fromiter(map(self._recent.__contains__, keys), bool, count=len(keys))
        if len(self._hashes):
            h = np.fromiter(map(hash, keys), np.int64, count=len(keys))
            pos = np.minimum(np.searchsorted(self._hashes, h), len(self._hashes) - 1)
            for i in np.flatnonzero(self._hashes[pos] == h).tolist():
                found[i] |= self._stored(keys[i], int(h[i]))
        return found

    def _stored(self, key: tuple[str, str], h: int) -> bool:
        j = int(np.searchsorted(self._hashes, h))
        user, event_id = key
        while j < len(self._hashes) and int(self._hashes[j]) == h:
            start = int(self._starts[j])
            if (
                self._users[j] == user
                and self._text[start : start + int(self._lengths[j])] == event_id
            ):
                return True
            j += 1
        return False

    def add(self, key: tuple[str, str]) -> None:
        self._recent.add(key)
        self._maybe_compact()

    def update(self, keys: Iterable[tuple[str, str]]) -> None:
        self._recent.update(keys)
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        if len(self._recent) >= max(self.COMPACT_MIN, len(self._hashes) // 2):
            self.compact()

    def compact(self) -> None:
        """Move the recent pairs into the sorted columns (one sort, no Python per pair)."""
        if not self._recent:
            return
        keys = list(self._recent)
        self._recent = set()
        event_ids = list(map(itemgetter(1), keys))
        lengths = np.fromiter(map(len, event_ids), np.int32, count=len(keys))
        starts = len(self._text) + np.cumsum(lengths, dtype=np.int64) - lengths
        self._text += "".join(event_ids)
        hashes = np.concatenate([self._hashes, np.fromiter(map(hash, keys), np.int64, len(keys))])
        order = np.argsort(hashes, kind="stable")
        self._hashes = hashes[order]
        self._users = np.concatenate([self._users, _objects(list(map(itemgetter(0), keys)))])[order]
        self._starts = np.concatenate([self._starts, starts])[order]
        self._lengths = np.concatenate([self._lengths, lengths])[order]


class DayAccumulator:
    """Collects one day's events as compact columns (docs/design.md §2 "Record").

    Memory: each distinct user id and coordinate name is one ``str`` object (interned per day in
    a dict; an event's own strings are dropped), and each value is 24 bytes of numpy columns
    (two object pointers and a float64) instead of Python objects per value. A categorical value
    adds exactly 1.0 to its cell and sums of 1.0 are exact in any order, so category counts are
    folded into one (user, coordinate) cell as they accumulate — the day's records are then
    identical to summing every value at the end. Numeric values are kept one by one: a cell's sum
    is defined in ascending value order (``DayRecords.from_columns``), which a running sum cannot
    reproduce bit for bit. A repeated ``event_id`` is remembered per (user, event id).

    ``add`` takes one event (``Monitor``, the audit); ``add_many`` a batch of one day's events
    without Python per event (the daemon's hot path).
    """

    def __init__(self, day: str) -> None:
        self.day = day
        self.events = 0
        self.duplicates = 0
        self._seen_event_ids = SeenEventIds()
        self._user_names: dict[str, str] = {}
        self._coord_names: dict[str, str] = {}
        self._cat_coords: dict[tuple[str, str], str] = {}  # (name, category) → coordinate
        # per-event ``add``: Python lists, moved into the arrays every _PENDING_MAX values
        self._p_users: list[str] = []
        self._p_coords: list[str] = []
        self._p_values: list[float] = []
        self._p_cat_users: list[str] = []
        self._p_cat_coords: list[str] = []
        # numeric values (users, coordinates, values) and category hits (users, coordinates)
        self._num: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._cat: list[tuple[np.ndarray, np.ndarray]] = []
        self._cat_buffered = 0
        # folded category cells: (users, coordinates, counts)
        self._folded = (_objects([]), _objects([]), np.zeros(0))

    def add(self, event: Event) -> bool:
        """Add a validated event of this day; return False for a repeated ``event_id``."""
        user = self._user_names.setdefault(event.user_id, event.user_id)
        if event.event_id is not None:
            key = (user, event.event_id)
            if key in self._seen_event_ids:
                self.duplicates += 1
                return False
            self._seen_event_ids.add(key)
        self.events += 1
        coord_of = self._coord_names.setdefault
        for name, v in event.values.items():
            if isinstance(v, str):
                coord = f"{name}={v}"
                self._p_cat_users.append(user)
                self._p_cat_coords.append(coord_of(coord, coord))
            else:
                self._p_users.append(user)
                self._p_coords.append(coord_of(name, name))
                self._p_values.append(v)
        if not event.values:
            # an event with no values still makes the user known for the day (a zero record)
            self._p_users.append(user)
            self._p_coords.append(coord_of("", ""))
            self._p_values.append(0.0)
        if len(self._p_users) + len(self._p_cat_users) >= _PENDING_MAX:
            self._flush_pending()
        return True

    def add_many(self, events: Sequence[Event]) -> int:
        """``add`` of each event, in order, as column operations; returns how many were added
        (the others repeat an ``event_id``)."""
        n = len(events)
        if n == 0:
            return 0
        users = list(map(self._user_names.setdefault, map(_USER, events), map(_USER, events)))
        event_ids = list(map(_EVENT_ID, events))
        has_id = np.fromiter(map(operator.is_not, event_ids, repeat(None)), bool, count=n)
        keep = np.ones(n, bool)
        if has_id.any():
            idx = np.flatnonzero(has_id)
            if len(idx) == n:  # the usual batch: every event has an id
                keys = list(zip(users, event_ids, strict=True))
            else:
                keys = list(zip([users[i] for i in idx], [event_ids[i] for i in idx], strict=True))
            repeated = self._seen_event_ids.contains_many(keys)
            distinct = set(keys)
            if len(distinct) < len(keys):  # repeats inside the batch: the first one counts
                first: dict[tuple[str, str], int] = {}
                at = np.fromiter(map(first.setdefault, keys, count()), np.int64, len(keys))
                repeated |= at != np.arange(len(keys))
            if repeated.any():
                keep[idx[repeated]] = False
                self._seen_event_ids.update(compress(keys, (~repeated).tolist()))
            else:
                self._seen_event_ids.update(distinct)
        kept = np.flatnonzero(keep)
        added = len(kept)
        self.duplicates += n - added
        self.events += added
        if added < n:
            events = [events[i] for i in kept.tolist()]
            users = [users[i] for i in kept.tolist()]
        value_maps = list(map(_VALUES, events))
        per_event = np.fromiter(map(len, value_maps), np.int64, count=added)
        empty = per_event == 0
        if empty.any():  # a zero record for each event with no values
            for i in np.flatnonzero(empty).tolist():
                self._p_users.append(users[i])
                self._p_coords.append(self._coord_names.setdefault("", ""))
                self._p_values.append(0.0)
        names = _objects(list(chain.from_iterable(value_maps)))
        values = _objects(list(chain.from_iterable(map(dict.values, value_maps))))
        user_col = np.repeat(_objects(users), per_event)
        is_cat = np.fromiter(map(isinstance, values, repeat(str)), bool, count=len(values))
        coord_of = self._coord_names.setdefault
        if is_cat.any():
            cat = np.flatnonzero(is_cat)
            self._cat.append((user_col[cat], self._category_coords(names[cat], values[cat])))
            self._cat_buffered += len(cat)
        num = np.flatnonzero(~is_cat)
        if len(num):
            num_names = names[num]
            canon = _objects(list(map(coord_of, num_names, num_names)))
            self._num.append((user_col[num], canon, values[num].astype(np.float64)))
        self._maybe_fold()
        return added

    def _category_coords(self, names: np.ndarray, values: np.ndarray) -> np.ndarray:
        """The interned coordinate ``f"{name}={value}"`` of each categorical value, looked up by
        the (name, value) pair (no string built per value; one per distinct pair of the day)."""
        coords = list(map(self._cat_coords.get, zip(names.tolist(), values.tolist(), strict=True)))
        if None in coords:
            coord_of = self._coord_names.setdefault
            for i in [i for i, c in enumerate(coords) if c is None]:
                name, value = names[i], values[i]
                coord = f"{name}={value}"
                coords[i] = self._cat_coords.setdefault((name, value), coord_of(coord, coord))
        return _objects(coords)

    def _flush_pending(self) -> None:
        if self._p_users:
            self._num.append(
                (_objects(self._p_users), _objects(self._p_coords), np.array(self._p_values))
            )
            self._p_users, self._p_coords, self._p_values = [], [], []
        if self._p_cat_users:
            self._cat.append((_objects(self._p_cat_users), _objects(self._p_cat_coords)))
            self._cat_buffered += len(self._p_cat_users)
            self._p_cat_users, self._p_cat_coords = [], []
        self._maybe_fold()

    def _maybe_fold(self) -> None:
        if self._cat_buffered >= max(_FOLD_MIN, len(self._folded[2])):
            self._fold()

    def _fold(self) -> None:
        """Fold every buffered category hit into its (user, coordinate) cell's count."""
        f_users, f_coords, f_counts = self._folded
        users = np.concatenate([f_users, *(u for u, _ in self._cat)])
        coords = np.concatenate([f_coords, *(c for _, c in self._cat)])
        counts = np.concatenate([f_counts, np.ones(self._cat_buffered)])
        self._cat, self._cat_buffered = [], 0
        if len(users) == 0:
            return
        # user and coordinate strings are interned for the day: equal addresses ⇔ equal strings
        order = np.lexsort((object_ids(coords), object_ids(users)))
        u, c = object_ids(users)[order], object_ids(coords)[order]
        starts = np.flatnonzero(np.r_[True, (u[1:] != u[:-1]) | (c[1:] != c[:-1])])
        firsts = order[starts]
        self._folded = (users[firsts], coords[firsts], np.add.reduceat(counts[order], starts))

    def finish(self) -> DayRecords:
        self._flush_pending()
        self._fold()
        f_users, f_coords, f_counts = self._folded
        return DayRecords.from_columns(
            self.day,
            np.concatenate([f_users, *(u for u, _, _ in self._num)]),
            np.concatenate([f_coords, *(c for _, c, _ in self._num)]),
            np.concatenate([f_counts, *(v for _, _, v in self._num)]),
        )


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
        order = _sort_order(h)
        hs = h[order]
        user_start = np.r_[True, hs[1:] != hs[:-1]]
        user_start = _split_collisions(users, order, hs, user_start)
        if user_start is None:  # ids collided inside the day: canonical order (hash, id)
            order = _order_by_hash_then_id(users, h)
            hs = h[order]
            user_start = np.r_[True, (hs[1:] != hs[:-1]) | (users[order[1:]] != users[order[:-1]])]
        user_pos = np.cumsum(user_start) - 1
        first = order[user_start]  # each user's first cell, canonical order
        users_out, keys = _users_and_keys(users, first, hs[user_start], hasher)
        # cells by (user, coordinate, value): user order is there, sort coordinates within users
        k = len(coord_names)
        key = user_pos * k + coord[order]
        within = _sort_order(key)
        order, key = order[within], key[within]
        same = key[1:] == key[:-1]
        if same.any():  # repeated (user, coordinate): sum them in ascending value order
            order = _values_ascending_within_runs(order, key, same, values)
        starts = np.flatnonzero(np.r_[True, ~same])
        summed = np.add.reduceat(values[order], starts)
        cell_key = key[starts]
        return cls(day, users_out, cell_key // k, cell_key % k, summed, coord_names, keys)

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


def _sort_order(key: np.ndarray) -> np.ndarray:
    """Stable argsort of an int64 key, by sorting packed int64 values (much faster).

    Each value packs the key (or, when the key's range is too wide, its high bits) above the
    position; positions whose high bits tie but whose keys differ are fixed up by a stable
    argsort of the (then nearly sorted) keys.
    """
    n = len(key)
    bits = max(1, (n - 1).bit_length())
    if n == 0 or bits > 40:
        return np.argsort(key, kind="stable")
    lo, hi = int(key.min()), int(key.max())
    fits = (hi - lo).bit_length() + bits <= 63  # the whole key fits above the position
    packed = ((key - lo) << bits) if fits else ((key >> bits) << bits)
    packed |= np.arange(n, dtype=np.int64)
    packed.sort()
    order: np.ndarray = packed & ((1 << bits) - 1)
    ks = key[order]
    if not (ks[1:] >= ks[:-1]).all():
        order = order[np.argsort(ks, kind="stable")]
    return order


def _users_and_keys(
    users: np.ndarray, first: np.ndarray, hashes: np.ndarray, hasher: Hasher
) -> tuple[np.ndarray, UserKeys]:
    """The distinct ids in canonical order and their keys (ids packed in canonical order).

    The ``str`` objects are read in arrival order — the order they sit in memory — not in hash
    order: they are encoded in that order, then only pointers and packed words are permuted.
    """
    arrival = _sort_order(first)  # canonical positions by first cell
    in_arrival = users[first[arrival]]
    buffer, starts_a, lengths_a = encode_ids(in_arrival)
    words, woff_a = pack_ids(buffer, starts_a, lengths_a)
    out = np.empty(len(first), dtype=object)
    out[arrival] = in_arrival
    woff = np.empty(len(first), np.int64)
    lengths = np.empty(len(first), np.int64)
    woff[arrival] = woff_a
    lengths[arrival] = lengths_a
    return out, UserKeys(hasher, hashes, lengths, woff, words).compacted()


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


def _values_ascending_within_runs(
    order: np.ndarray, key: np.ndarray, same: np.ndarray, values: np.ndarray
) -> np.ndarray:
    """Re-order the cells of each run of equal ``key`` by ascending value (stable)."""
    in_run = np.r_[same, False] | np.r_[False, same]
    idx = np.flatnonzero(in_run)
    sub = np.lexsort((values[order[idx]], key[idx]))
    order = order.copy()
    order[idx] = order[idx[sub]]
    return order
