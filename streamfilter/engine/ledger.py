"""In-memory per-user budget state: ``user_id → (spent_units, retired)``, compact and vectorised.

Only users that were ever charged are stored: an absent user (all-zero record) costs nothing and
leaves no trace (docs/design.md §6.8). The state store is the durable source of truth; this ledger is
rebuilt from it on start and updated only after a day's transaction committed.

Layout: 27 + 8·⌈len(id)/8⌉ bytes per known user (35 B for ids of ≤ 8 bytes), no Python object
---------------------------------------------------------------------------------------------
One entry per known user, all columns sorted by a 64-bit keyed hash of the user id:

``_key``     int64   hash of the id (:func:`python_hash`: CPython's SipHash-1-3 of the ``str``,
                     keyed by the interpreter's per-process random secret)
``_spent``   int64   spent budget, lattice units
``_retired`` bool
``_len``     uint16  length of the UTF-8 id in bytes (≤ 4·MAX_ID_CHARS)
``_woff``    int64   offset of the id in ``_words``
``_words``   uint64  the ids, UTF-8, each zero-padded to whole 8-byte words, in entry order

Lookups sort the queried hashes (a day's users already come in hash order: ``DayRecords``) and
run one ``np.searchsorted`` — a monotone walk — then **compare the full ids** of the hits word by
word. A hash is only an address, never an identity: two distinct users that share a hash get two
entries with the same key, and each query finds the entry whose stored id equals its own, exactly
(:meth:`BudgetLedger._locate`). So two users never share a budget, whatever the hash function —
a weak one only makes lookups slower (tests inject one that collides on purpose). Runs of equal
keys are walked in Python; with a 64-bit hash they are rare (≈ n²/2⁶⁵ pairs).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamfilter.engine.native import packed_ids as _packed_ids  # None: the numpy path

__all__ = [
    "BudgetLedger",
    "Hasher",
    "KeyedUsers",
    "Located",
    "UserKeys",
    "canonical_users",
    "encode_ids",
    "keys_in_canonical_order",
    "object_ids",
    "pack_ids",
    "python_hash",
]

#: user ids (object array of str) → int64 hash per id
Hasher = Callable[[np.ndarray], np.ndarray]

_MAX_ID_BYTES = 2**16 - 1
#: MASK[r] keeps the first r bytes of a little-endian word (r = 0..8)
_MASK = np.array([(1 << (8 * r)) - 1 for r in range(8)] + [2**64 - 1], dtype=np.uint64)


def python_hash(users: np.ndarray | list[str]) -> np.ndarray:
    """Keyed 64-bit hash of each id: CPython's ``hash(str)`` (SipHash-1-3, per-process secret).

    The key makes collisions unpredictable from outside; collisions are handled exactly anyway
    (module docstring), so a fixed ``PYTHONHASHSEED`` costs speed at worst, never privacy.
    """
    if _packed_ids is not None:  # one read per id (a str caches its hash), no Python call
        ids = users.tolist() if isinstance(users, np.ndarray) else list(users)
        return np.frombuffer(_packed_ids.hashes(ids), np.int64)
    return np.fromiter(map(hash, users), dtype=np.int64, count=len(users))


def object_ids(objects: np.ndarray) -> np.ndarray:
    """Identity (address) of each element of an object array, without a Python call per element.

    Only used as a shortcut: equal addresses in one live array are the same object, hence equal
    strings; different addresses are then compared by value.
    """
    a = np.ascontiguousarray(objects, dtype=object)
    if len(a) == 0:
        return np.zeros(0, np.uintp)
    ptr = ctypes.cast(a.ctypes.data, ctypes.POINTER(ctypes.c_size_t))  # the PyObject* slots
    out: np.ndarray = np.ctypeslib.as_array(ptr, (len(a),)).copy()
    return out


def encode_ids(users: Sequence[str] | np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
    """UTF-8 of all ids in one buffer: ``(buffer, starts, lengths)``.

    The buffer is zero-padded to whole 8-byte words plus two more (for :func:`_id_words`).

    ``surrogatepass`` keeps the encoding injective for any ``str`` (the contract already refuses
    lone surrogates).
    """
    items = users.tolist() if isinstance(users, np.ndarray) else list(users)
    text = "".join(items)
    blob = text.encode("utf-8", "surrogatepass")
    if len(blob) == len(text):  # ASCII: byte lengths are the character lengths
        lengths = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
    else:
        parts = [u.encode("utf-8", "surrogatepass") for u in items]
        lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(items))
    if len(lengths) and int(lengths.max()) > _MAX_ID_BYTES:
        raise ValueError(f"a user id is longer than {_MAX_ID_BYTES} bytes in UTF-8")
    starts = np.cumsum(lengths) - lengths
    return blob + b"\x00" * ((-len(blob)) % 8 + 16), starts, lengths


def _id_words(buffer: bytes, starts: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """(n, width) words of ids that all span ``width`` words: UTF-8 bytes read as little-endian
    uint64, zero-padded. Two aligned reads and shifts per word (byte offsets are unaligned)."""
    aligned = np.frombuffer(buffer, dtype="<u8")
    k = np.arange(width, dtype=np.int64)
    pos = starts[:, None] + 8 * k
    q = pos >> 3
    shift = ((pos & 7) << 3).astype(np.uint64)
    low = aligned[q] >> shift
    high = (aligned[q + 1] << (np.uint64(63) - shift)) << np.uint64(1)  # 0 when shift is 0
    rest = np.minimum(lengths[:, None] - 8 * k, 8)
    out: np.ndarray = (low | high) & _MASK[rest]
    return out


def _n_words(lengths: np.ndarray) -> np.ndarray:
    return (np.asarray(lengths, dtype=np.int64) + 7) // 8


def pack_ids(
    buffer: bytes, starts: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The ids of :func:`encode_ids`, each zero-padded to whole words, one after the other:
    ``(words uint64, woff)`` with id ``i`` at ``words[woff[i] : woff[i] + ⌈lengths[i]/8⌉]``."""
    width = _n_words(lengths)
    woff = np.cumsum(width) - width
    words = np.zeros(int(width.sum()), np.uint64)
    for sel, k in _width_groups(width):
        words[woff[sel][:, None] + k] = _id_words(buffer, starts[sel], lengths[sel], len(k))
    return words, woff


def _gather_words(
    words: np.ndarray, woff: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Packed ids (``words`` at offsets ``woff``, in any order) laid out one after the other in
    the order of ``woff``: ``(words, woff)`` of the compacted copy."""
    width = _n_words(lengths)
    new_woff = np.cumsum(width) - width
    out = np.zeros(int(width.sum()), np.uint64)
    for sel, k in _width_groups(width):
        out[new_woff[sel][:, None] + k] = words[woff[sel][:, None] + k]
    return out, new_woff


def _width_groups(
    width: np.ndarray, mask: np.ndarray | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Ids grouped by their (non-zero) number of words ``w`` — ids span 0..128 words, so there
    are few groups: ``(indices with that width [and mask], arange(w))`` per group."""
    ws = width if mask is None else width[mask]
    if len(ws) == 0:
        return
    lo, hi = int(ws.min()), int(ws.max())
    present = [lo] if lo == hi else (np.flatnonzero(np.bincount(ws - lo)) + lo).tolist()
    for w in present:
        if w:
            hit = width == w
            if mask is not None:
                hit &= mask
            yield np.flatnonzero(hit), np.arange(w)


def _int64(column: np.ndarray) -> np.ndarray:
    """``column`` as a C-contiguous int64 array (a buffer of the native ledger's)."""
    return np.ascontiguousarray(column, np.int64)


def _is_sorted(a: np.ndarray) -> bool:
    return bool(len(a) < 2 or (a[1:] >= a[:-1]).all())


#: ids per step of :meth:`UserKeys.utf8` (its index arrays: 8 bytes per byte of the step's ids)
_UTF8_CHUNK_IDS = 1 << 16


@dataclass(frozen=True)
class UserKeys:
    """What the ledger needs of a batch of ids, computed once: ``hasher`` hash and UTF-8 bytes.

    ``hashes[i]`` is ``hasher`` of id ``i``; its UTF-8 (``lengths[i]`` bytes), zero-padded to
    words, is ``words[woff[i]:]`` (as :func:`pack_ids` lays it out; a subset taken with
    :meth:`take` shares the words). Build it with :meth:`of`: keys that do not describe their
    ids would misplace users.
    """

    hasher: Hasher
    hashes: np.ndarray
    lengths: np.ndarray
    woff: np.ndarray
    words: np.ndarray

    @classmethod
    def of(cls, users: Sequence[str] | np.ndarray, hasher: Hasher) -> UserKeys:
        buffer, starts, lengths = encode_ids(users)
        hashes = np.asarray(hasher(np.asarray(users, dtype=object)), dtype=np.int64)
        if hashes.shape != lengths.shape:
            raise ValueError("the hasher must return one int64 per user")
        words, woff = pack_ids(buffer, starts, lengths)
        return cls(hasher, hashes, lengths, woff, words)

    def __len__(self) -> int:
        return len(self.hashes)

    def utf8(self) -> tuple[bytes, np.ndarray]:
        """``(ids, lengths)``: the ids' UTF-8 back to back and each one's byte length — what
        :func:`encode_ids` gives, without the padding, gathered from the words (no Python per
        id, and no visit to the id objects scattered over the heap)."""
        lengths = np.asarray(self.lengths, dtype=np.int64)
        data, parts = self.words.view(np.uint8), []
        for a in range(0, len(lengths), _UTF8_CHUNK_IDS):  # bounded index arrays
            n = lengths[a : a + _UTF8_CHUNK_IDS]
            ends = np.cumsum(n)
            # byte k of the part is byte 8 * woff[i] + (k - start of id i) of the words
            shift = np.repeat(8 * self.woff[a : a + _UTF8_CHUNK_IDS] - (ends - n), n)
            parts.append(data[shift + np.arange(int(ends[-1]), dtype=np.int64)].tobytes())
        return b"".join(parts), lengths

    def take(self, idx: np.ndarray) -> UserKeys:
        return UserKeys(
            self.hasher, self.hashes[idx], self.lengths[idx], self.woff[idx], self.words
        )

    def compacted(self) -> UserKeys:
        """The same keys with their words laid out in this order (a sequential read later)."""
        words, woff = _gather_words(self.words, self.woff, self.lengths)
        return UserKeys(self.hasher, self.hashes, self.lengths, woff, words)


def keys_in_canonical_order(
    ids: list[str], canonical: np.ndarray, hashes: np.ndarray, hasher: Hasher
) -> UserKeys | None:
    """The keys of ``ids`` laid out in canonical order (``ids[i]`` at ``canonical[i]``, whose
    hash is ``hashes[canonical[i]]``), packed natively (``engine/_packed_ids.c``): the same
    arrays as :func:`encode_ids` + :func:`pack_ids` with lengths and offsets permuted, then
    :meth:`UserKeys.compacted`. None when the extension is not built or an id needs the numpy
    path (one without UTF-8 form, or too long: that path gives the error)."""
    if _packed_ids is None:
        return None
    packed = _packed_ids.pack_words(ids, np.ascontiguousarray(canonical, np.int64), _MAX_ID_BYTES)
    if packed is None:
        return None
    words, woff, lengths = packed
    return UserKeys(
        hasher,
        hashes,
        np.frombuffer(lengths, np.int64),
        np.frombuffer(woff, np.int64),
        np.frombuffer(words, np.uint64),
    )


def canonical_users(
    ids: list[str], present: np.ndarray
) -> tuple[np.ndarray, np.ndarray, UserKeys] | None:
    """The ``present`` ids in canonical order under :func:`python_hash` (ascending hash), each
    id's rank in that order (``-1`` when not present) and their keys, natively in two visits of
    the ids (``engine/_packed_ids.c``): what sorting the hashes, scattering the ids and
    :func:`keys_in_canonical_order` give. None when the extension is not built, or when the
    numpy path must decide (an id it refuses or encodes differently, or two ids sharing a hash).
    """
    if _packed_ids is None:
        return None
    present = np.ascontiguousarray(present, dtype=np.bool_)
    in_order = np.empty(int(np.count_nonzero(present)), dtype=object)
    native = _packed_ids.canonical_users(ids, present, in_order, _MAX_ID_BYTES)
    if native is None:
        return None
    rank, hashes, words, woff, lengths = native
    keys = UserKeys(
        python_hash,
        np.frombuffer(hashes, np.int64),
        np.frombuffer(lengths, np.int64),
        np.frombuffer(woff, np.int64),
        np.frombuffer(words, np.uint64),
    )
    return in_order, np.frombuffer(rank, np.int64), keys


@dataclass(frozen=True)
class Located:
    """Where a ledger found a batch of users, valid while that ledger is unchanged.

    ``entries``: each user's entry, ``-1`` for unknown users; ``slots``: where the user's hash
    goes in the sorted keys (``searchsorted``, left), i.e. where a new entry is inserted.
    """

    ledger: object  # the ledger's identity token
    version: int
    entries: np.ndarray
    slots: np.ndarray

    def take(self, idx: np.ndarray) -> Located:
        return Located(self.ledger, self.version, self.entries[idx], self.slots[idx])


class KeyedUsers(np.ndarray):
    """A read-only object array of ids that carries their :class:`UserKeys` (and, optionally,
    where the ledger found them).

    ``close_day`` returns the changed users this way so that committing the day neither hashes
    and encodes them again nor looks them up again (if the ledger did not change in between);
    any array derived from it (a slice, a copy) is a plain one again.
    """

    keys: UserKeys | None
    located: Located | None

    @staticmethod
    def wrap(users: np.ndarray, keys: UserKeys, located: Located | None = None) -> KeyedUsers:
        if len(users) != len(keys) or (located is not None and len(located.entries) != len(keys)):
            raise ValueError("one key per user is required")
        out = np.asarray(users, dtype=object).view(KeyedUsers)  # no copy
        out.keys = keys
        out.located = located
        out.flags.writeable = False
        return out

    def __array_finalize__(self, obj: Any) -> None:
        self.keys = None
        self.located = None


def _join_entries(
    users: np.ndarray, spent: np.ndarray, retired: np.ndarray, hasher: Hasher
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One entry per user: the largest spend, retired if any entry is. Entries sorted by (id
    hash, spend): each run of one hash ends with its largest spend, when the run is one id
    (checked exactly); a run of two ids (a hash collision) takes the dict path."""
    h = np.asarray(hasher(users), dtype=np.int64)
    order = np.lexsort((spent, h))
    hs, us = h[order], users[order]
    continues = np.r_[False, hs[1:] == hs[:-1]]
    if not continues.any():
        return users, spent, retired
    later = np.flatnonzero(continues)
    if bool((us[later] == us[later - 1]).all()):
        starts = np.flatnonzero(~continues)
        ends = np.r_[starts[1:], len(us)] - 1
        return us[ends], spent[order][ends], np.logical_or.reduceat(retired[order], starts)
    joined: dict[str, tuple[int, bool]] = {}
    for u, s, r in zip(users.tolist(), spent.tolist(), retired.tolist(), strict=True):
        s0, r0 = joined.get(u, (0, False))
        joined[u] = (max(s0, s), r0 or r)
    out = np.empty(len(joined), dtype=object)
    out[:] = list(joined)
    return (
        out,
        np.array([s for s, _ in joined.values()], np.int64),
        np.array([r for _, r in joined.values()], bool),
    )


class BudgetLedger:
    """Known users' ``(spent_units, retired)``, sorted by id hash, ids kept to compare exactly."""

    def __init__(self, hasher: Hasher = python_hash) -> None:
        self.hasher = hasher
        self._key = np.zeros(0, np.int64)
        self._spent = np.zeros(0, np.int64)
        self._retired = np.zeros(0, bool)
        self._len = np.zeros(0, np.uint16)
        self._woff = np.zeros(0, np.int64)
        self._words = np.zeros(0, np.uint64)
        self._token = object()
        self._version = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> BudgetLedger:
        clone = BudgetLedger(self.hasher)
        for name in ("_key", "_spent", "_retired", "_len", "_woff", "_words"):
            setattr(clone, name, getattr(self, name).copy())
        return clone

    def __len__(self) -> int:
        return len(self._key)

    @property
    def nbytes(self) -> int:
        """Bytes held by the ledger's arrays (its whole per-user state)."""
        arrays = (self._key, self._spent, self._retired, self._len, self._woff, self._words)
        return sum(a.nbytes for a in arrays)

    # ------------------------------------------------------------------ lookups
    def keys_of(self, users: np.ndarray, keys: UserKeys | None = None) -> UserKeys:
        """``keys`` if they are under this ledger's hasher, else computed."""
        if isinstance(users, KeyedUsers) and keys is None:
            keys = users.keys
        if keys is not None and keys.hasher is self.hasher:
            if len(keys) != len(users):
                raise ValueError("one key per user is required")
            return keys
        return UserKeys.of(users, self.hasher)

    def locate(self, users: np.ndarray, keys: UserKeys | None = None) -> Located:
        """Where each user is (``entries``: index or -1), for :meth:`state_at` and
        :class:`KeyedUsers`; valid until the ledger changes."""
        keys = self.keys_of(users, keys)
        users = np.asarray(users, dtype=object).reshape(-1)
        return Located(self._token, self._version, *self._locate(users, keys))

    def state_at(self, located: Located) -> tuple[np.ndarray, np.ndarray]:
        """(spent_units, retired) of located users (zeros for unknown ones)."""
        self._check_current(located)
        entries = located.entries
        known = entries >= 0
        spent = np.zeros(len(entries), dtype=np.int64)
        retired = np.zeros(len(entries), dtype=bool)
        spent[known] = self._spent[entries[known]]
        retired[known] = self._retired[entries[known]]
        return spent, retired

    def _is_current(self, located: Located | None) -> bool:
        return (
            located is not None
            and located.ledger is self._token
            and (located.version == self._version)
        )

    def _check_current(self, located: Located) -> None:
        if not self._is_current(located):
            raise ValueError("the ledger changed since these users were located")

    def _locate(self, users: np.ndarray, keys: UserKeys) -> tuple[np.ndarray, np.ndarray]:
        """(entry index or -1 for users never charged, slot) of each user; exact id comparison."""
        if len(users) == 0 or len(self._key) == 0:
            return np.full(len(users), -1, np.int64), np.zeros(len(users), np.int64)
        if _is_sorted(keys.hashes):
            return self._locate_sorted(users, keys)
        order = np.argsort(keys.hashes, kind="stable")
        entries, slots = np.empty(len(users), np.int64), np.empty(len(users), np.int64)
        entries[order], slots[order] = self._locate_sorted(users[order], keys.take(order))
        return entries, slots

    def _locate_sorted(self, users: np.ndarray, keys: UserKeys) -> tuple[np.ndarray, np.ndarray]:
        if _packed_ids is not None:  # one merge walk of the two sorted key columns
            found, pos = _packed_ids.locate_sorted(
                self._key,
                self._len,
                self._woff,
                self._words,
                _int64(keys.hashes),
                _int64(keys.lengths),
                _int64(keys.woff),
                np.ascontiguousarray(keys.words, np.uint64),
            )
            return np.frombuffer(found, np.int64), np.frombuffer(pos, np.int64)
        h = keys.hashes
        n_entries = len(self._key)
        found = np.full(len(users), -1, np.int64)
        pos = np.searchsorted(self._key, h, side="left")  # monotone walk: h is sorted
        cand = np.flatnonzero(pos < n_entries)
        cand = cand[self._key[pos[cand]] == h[cand]]
        if len(cand) == 0:
            return found, pos
        equal = self._ids_equal(pos[cand], keys.take(cand))
        found[cand[equal]] = pos[cand[equal]]
        # a hash shared by several entries: the first one was another user; walk the run
        rest = cand[~equal]
        nxt = pos[rest] + 1
        rest = rest[(nxt < n_entries) & (self._key[np.minimum(nxt, n_entries - 1)] == h[rest])]
        for i in rest.tolist():
            key, p = int(h[i]), int(pos[i]) + 1
            while p < n_entries and int(self._key[p]) == key:
                if self._id_at(p) == users[i]:
                    found[i] = p
                    break
                p += 1
        return found, pos

    def _ids_equal(self, entries: np.ndarray, keys: UserKeys) -> np.ndarray:
        """Exact: is the stored id of ``entries[i]`` the id of ``keys`` ``i``? (word by word)."""
        lengths = keys.lengths
        equal = self._len[entries].astype(np.int64) == lengths
        for sel, k in _width_groups(_n_words(lengths), equal):
            mine = keys.words[keys.woff[sel][:, None] + k]
            stored = self._words[self._woff[entries[sel]][:, None] + k]
            equal[sel] = (mine == stored).all(axis=1)
        return equal

    def _id_at(self, entry: int) -> str:
        start = int(self._woff[entry])
        raw = self._words[start : start + int(_n_words(self._len[entry]))].astype("<u8").tobytes()
        return raw[: int(self._len[entry])].decode("utf-8", "surrogatepass")

    def state(
        self, users: np.ndarray, keys: UserKeys | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(spent_units int64, retired bool) for each user id (zeros for unknown users).

        ``keys``: the ids' :class:`UserKeys` if the caller has them (``DayRecords.keys``).
        """
        return self.state_at(self.locate(users, keys))

    def spent_units(self, user_id: str) -> int:
        return int(self.state(np.array([user_id], dtype=object))[0][0])

    def retired(self, user_id: str) -> bool:
        return bool(self.state(np.array([user_id], dtype=object))[1][0])

    # ------------------------------------------------------------------ updates
    def apply(
        self,
        users: np.ndarray,
        spent_units: np.ndarray,
        retired: np.ndarray,
        keys: UserKeys | None = None,
    ) -> None:
        """Set the state of ``users`` (adding new entries); called after the day committed.

        A user listed twice gets the state of its last occurrence.
        """
        located = users.located if isinstance(users, KeyedUsers) else None
        if located is None or not self._is_current(located):
            located = None
        keys = self.keys_of(users, keys)
        users = np.asarray(users, dtype=object).reshape(-1)
        spent_units = np.asarray(spent_units, dtype=np.int64).reshape(-1)
        retired = np.asarray(retired, dtype=bool).reshape(-1)
        if not len(users) == len(spent_units) == len(retired):
            raise ValueError("users, spent_units and retired must have the same length")
        if len(users) == 0:
            return
        self._version += 1
        if not _is_sorted(keys.hashes):
            order = np.argsort(keys.hashes, kind="stable")
            users, spent_units, retired = users[order], spent_units[order], retired[order]
            keys = keys.take(order)
            located = None if located is None else located.take(order)
        if located is None:
            entries, slots = self._locate(users, keys)
        else:
            entries, slots = located.entries, located.slots
        known = entries >= 0
        self._spent[entries[known]] = spent_units[known]
        self._retired[entries[known]] = retired[known]
        new = np.flatnonzero(~known)
        if len(new):
            new = self._last_occurrences(users, keys.hashes, new)
            self._insert(keys.take(new), spent_units[new], retired[new], slots[new])

    def merge_monotone(
        self, users: np.ndarray | list[str], spent_units: np.ndarray, retired: np.ndarray
    ) -> None:
        """Raise each listed user's state to at least the one given: spent units the larger,
        retired if either is. The join of the order on states (spent never lower, retired
        never revived), so merging records in any order, each any number of times, gives the
        same ledger, and no record can lower a state another record holds (docs/design.md
        §7.4). A user listed twice counts with the larger of their entries."""
        users = np.asarray(users, dtype=object).reshape(-1)
        spent_units = np.asarray(spent_units, dtype=np.int64).reshape(-1)
        retired = np.asarray(retired, dtype=bool).reshape(-1)
        if not len(users) == len(spent_units) == len(retired):
            raise ValueError("users, spent_units and retired must have the same length")
        if len(users) == 0:
            return
        users, spent_units, retired = _join_entries(users, spent_units, retired, self.hasher)
        keys = UserKeys.of(users, self.hasher)
        spent, was_retired = self.state(users, keys)
        self.apply(users, np.maximum(spent, spent_units), was_retired | retired, keys)

    def _last_occurrences(self, users: np.ndarray, h: np.ndarray, new: np.ndarray) -> np.ndarray:
        """Drop repeated ids among new users (keep the last); only equal-hash runs can repeat."""
        hn = h[new]
        dup = np.flatnonzero(hn[1:] == hn[:-1])
        if len(dup) == 0:
            return new
        keep = np.ones(len(new), bool)
        starts = dup[np.r_[True, dup[1:] != dup[:-1] + 1]]
        for s in starts.tolist():
            e = s + 1
            while e + 1 < len(new) and hn[e + 1] == hn[s]:
                e += 1
            last: dict[Any, int] = {}
            for j in range(s, e + 1):
                last[users[new[j]]] = j
            for j in range(s, e + 1):
                keep[j] = last[users[new[j]]] == j
        # the ledger's spent/retired of a later occurrence wins, like a dict update
        return new[keep]

    def _insert(
        self, keys: UserKeys, spent: np.ndarray, retired: np.ndarray, slots: np.ndarray
    ) -> None:
        """Merge new entries (sorted by hash; ``slots``: their left insertion points) into the
        sorted columns, ids included."""
        if _packed_ids is not None:  # one merge of the sorted columns (slots are where it goes)
            columns = _packed_ids.merge_entries(
                self._key,
                self._spent,
                self._retired,
                self._len,
                self._woff,
                self._words,
                _int64(keys.hashes),
                _int64(spent),
                np.ascontiguousarray(retired, np.bool_),
                _int64(keys.lengths),
                _int64(keys.woff),
                np.ascontiguousarray(keys.words, np.uint64),
            )
            dtypes = (np.int64, np.int64, np.bool_, np.uint16, np.int64, np.uint64)
            (self._key, self._spent, self._retired, self._len, self._woff, self._words) = (
                np.frombuffer(column, dtype) for column, dtype in zip(columns, dtypes, strict=True)
            )
            return
        h, lengths = keys.hashes, keys.lengths
        n_old, n_new = len(self._key), len(h)
        at = slots.copy()
        clash = np.flatnonzero(at < n_old)
        clash = clash[self._key[at[clash]] == h[clash]]
        if len(clash):  # after the entries that have the same key
            at[clash] = np.searchsorted(self._key, h[clash], side="right")
        dest = at + np.arange(n_new)  # the new entries' places in the merged columns
        old = np.ones(n_old + n_new, bool)
        old[dest] = False

        def merged(column: np.ndarray, values: np.ndarray) -> np.ndarray:
            out = np.empty(n_old + n_new, column.dtype)
            out[dest] = values
            out[old] = column
            return out

        self._key = merged(self._key, h)
        self._spent = merged(self._spent, spent)
        self._retired = merged(self._retired, retired)
        self._len = merged(self._len, lengths.astype(np.uint16))
        all_width = _n_words(self._len)
        self._woff = np.cumsum(all_width) - all_width
        # the words: the new ids' words go to their entries' offsets, the old ones around them
        words = np.empty(int(self._woff[-1] + all_width[-1]), np.uint64)
        old_words = np.ones(len(words), bool)
        for sel, k in _width_groups(_n_words(lengths)):
            to = self._woff[dest[sel]][:, None] + k
            words[to] = keys.words[keys.woff[sel][:, None] + k]
            old_words[to] = False
        words[old_words] = self._words
        self._words = words

    # ------------------------------------------------------------------ iteration
    def items(self) -> Iterator[tuple[str, int, bool]]:
        """Every known user's ``(user_id, spent_units, retired)``, in hash order."""
        raw = self._words.astype("<u8").tobytes()
        for start, length, spent, retired in zip(
            (8 * self._woff).tolist(),
            self._len.tolist(),
            self._spent.tolist(),
            self._retired.tolist(),
            strict=True,
        ):
            yield raw[start : start + length].decode("utf-8", "surrogatepass"), spent, retired

    def max_spent_units(self) -> int:
        return int(self._spent.max()) if len(self._spent) else 0
