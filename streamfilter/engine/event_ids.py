"""The index of a day's ``(user code, event id)`` pairs that finds repeated events.

``DayAccumulator`` counts an event whose ``event_id`` the same user already sent that day once
(docs/design.md §2.2). What it needs from the index is :class:`EventIdIndex`; the engine's own
implementation keeps every pair in memory (``records.SeenEventIds``), the daemon's spills to disk
past a bound (``runtime/event_ids.py``), so an open day's memory does not grow with its events.
Either way the answer is exact: a key match is confirmed against the user code and the id text.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

__all__ = ["EventIdIndex", "pair_keys"]


class EventIdIndex(Protocol):
    """The exact set of one day's ``(user code, event id)`` pairs."""

    def insert(self, users: np.ndarray, event_ids: list[str]) -> np.ndarray:
        """Add each pair not already held; True where the pair is new — neither held before nor
        earlier in the batch. ``users[i]`` is the int32 code of ``event_ids[i]``'s user."""
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
