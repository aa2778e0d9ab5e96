"""The interface of a day's ``(user code, event id)`` index that finds repeated events, and the
packing every tier shares.

``DayAccumulator`` counts an event whose ``event_id`` the same user already sent that day once
(docs/design.md §2.2). What it needs from the index is :class:`EventIdIndex`; the in-memory tier
keeps every pair in memory (``dedup/in_memory.py``), the daemon's spills to disk past a bound
(``dedup/spill.py``), so an open day's memory does not grow with its events. Either way the
answer is exact: a key match is confirmed against the user code and the id text. Both keep a
pair packed the same way (``dedup.in_memory.PairRun``): its key, its int32 user code and the id's
UTF-8 bytes (``id_bytes``) in one blob shared by many pairs — no Python object per pair.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from streamfilter.engine.native import packed_ids as _packed_ids  # None: the Python path

if TYPE_CHECKING:
    from streamfilter.engine.lines import EventIdSpans

__all__ = [
    "MAX_USER_CODE",
    "EventIdIndex",
    "id_bytes",
    "packed_ids",
    "pair_key",
    "pair_keys",
    "user_codes",
]


class EventIdIndex(Protocol):
    """The exact set of one day's ``(user code, event id)`` pairs."""

    def insert(self, users: np.ndarray, event_ids: list[str] | EventIdSpans) -> np.ndarray:
        """Add each pair not already held; True where the pair is new — neither held before nor
        earlier in the batch. ``users[i]`` is the int32 code of ``event_ids[i]``'s user; the ids
        are a list, or spans of the block a batch was scanned in (none of them missing)."""
        ...

    def __contains__(self, pair: tuple[int, str]) -> bool: ...

    def add(self, pair: tuple[int, str]) -> None:
        """Add one pair the caller found absent (``Monitor``'s per-event path)."""
        ...

    def __len__(self) -> int: ...

    def close(self) -> None:
        """Free what the index holds (memory, files); it is not used afterwards."""
        ...


_USER_MIX = np.uint64(0x9E3779B97F4A7C15)


def pair_keys(users: np.ndarray, event_ids: list[str]) -> np.ndarray:
    """A 64-bit key of each pair: the id's ``hash`` xor the user code times an odd multiplier.

    Equal pairs have equal keys; unequal pairs share one with probability ~2**-64 — every key
    match is still confirmed exactly. ``str`` hashes are salted per process, so keys are never
    compared across processes (nor stored beyond one)."""
    h = np.fromiter(map(hash, event_ids), np.int64, count=len(event_ids))
    mixed: np.ndarray = h ^ (np.asarray(users).astype(np.uint64) * _USER_MIX).view(np.int64)
    return mixed


_MASK64 = (1 << 64) - 1
_USER_MIX_INT = int(_USER_MIX)


def pair_key(user: int, event_id: str) -> int:
    """``pair_keys`` of one pair, in Python ints (the per-event path: no numpy call)."""
    mixed = (hash(event_id) & _MASK64) ^ ((user * _USER_MIX_INT) & _MASK64)
    return mixed - (1 << 64) if mixed >> 63 else mixed


#: the largest user code (codes are int32)
MAX_USER_CODE = (1 << 31) - 1


def user_codes(users: np.ndarray) -> np.ndarray:
    """``users`` as int32 codes (no copy if they are already); a code outside [0, 2**31) is a
    ``ValueError`` (it would not survive the narrowing)."""
    users = np.asarray(users)
    if len(users) and (int(users.min()) < 0 or int(users.max()) > MAX_USER_CODE):
        raise ValueError("user codes must fit in int32")
    return users.astype(np.int32, copy=False)


def id_bytes(event_id: str) -> bytes:
    """An id's bytes: UTF-8, with lone surrogates kept (``surrogatepass``: still one-to-one, so
    equal bytes are equal ids)."""
    return event_id.encode("utf-8", "surrogatepass")


def packed_ids(event_ids: list[str]) -> tuple[bytes, np.ndarray]:
    """The ids' bytes (``id_bytes``) back to back, and each id's length in bytes (int32):
    natively in one pass when the extension is built (``engine/_packed_ids.c``; an id without
    UTF-8 form takes the Python path, which keeps lone surrogates)."""
    if _packed_ids is not None and type(event_ids) is list:
        native = _packed_ids.concat_utf8(event_ids)
        if native is not None:
            return native[0], np.frombuffer(native[1], np.int32)
    blob = id_bytes("".join(event_ids))
    lengths = np.fromiter(map(len, event_ids), np.int32, count=len(event_ids))
    if len(blob) != int(lengths.sum(dtype=np.int64)):  # not all ASCII: count bytes, not chars
        lengths = np.fromiter(map(len, map(id_bytes, event_ids)), np.int32, count=len(event_ids))
    return blob, lengths
