"""Per-user daily records, built column-wise from validated events.

A user's record for a day is a sparse vector over *coordinates*: a numeric feature ``f`` sums the
user's values of ``f`` that day; a categorical value ``v`` of feature ``f`` adds 1 to coordinate
``f=v`` (DESIGN.md §2 "Record"). A repeated ``event_id`` for the same user and day counts once.

Determinism: users are ordered by ``user_id`` and each (user, coordinate) group is summed in
sorted value order, so the record — and therefore every release under a test seed — does not
depend on the order in which events arrived.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamfilter.engine.contract import Event

__all__ = ["DayAccumulator", "DayRecords"]


@dataclass
class DayAccumulator:
    """Collects one day's events as columns (the only per-event Python work is this append)."""

    day: str
    _users: list[str] = field(default_factory=list)
    _coords: list[str] = field(default_factory=list)
    _values: list[float] = field(default_factory=list)
    _seen_event_ids: set[tuple[str, str]] = field(default_factory=set)
    events: int = 0
    duplicates: int = 0

    def add(self, event: Event) -> bool:
        """Add a validated event of this day; return False for a repeated ``event_id``."""
        if event.event_id is not None:
            key = (event.user_id, event.event_id)
            if key in self._seen_event_ids:
                self.duplicates += 1
                return False
            self._seen_event_ids.add(key)
        self.events += 1
        user = event.user_id
        for name, v in event.values.items():
            self._users.append(user)
            if isinstance(v, str):
                self._coords.append(f"{name}={v}")
                self._values.append(1.0)
            else:
                self._coords.append(name)
                self._values.append(v)
        if not event.values:
            # an event with no values still makes the user known for the day (a zero record)
            self._users.append(user)
            self._coords.append("")
            self._values.append(0.0)
        return True

    def finish(self) -> DayRecords:
        return DayRecords.from_columns(
            self.day,
            np.array(self._users, dtype=object),
            np.array(self._coords, dtype=object),
            np.array(self._values, dtype=np.float64),
        )


@dataclass(frozen=True)
class DayRecords:
    """Sparse (users × coordinates) day records, canonical order, duplicates summed.

    ``users``: sorted unique user ids (object array); ``user_pos``/``coord``/``value``: one entry
    per non-empty (user, coordinate) cell, sorted by (user, coordinate); ``coord_names`` indexes
    ``coord``.
    """

    day: str
    users: np.ndarray
    user_pos: np.ndarray
    coord: np.ndarray
    value: np.ndarray
    coord_names: np.ndarray

    @classmethod
    def from_columns(
        cls, day: str, users: np.ndarray, coords: np.ndarray, values: np.ndarray
    ) -> DayRecords:
        if len(users) == 0:
            empty_i = np.zeros(0, np.int64)
            return cls(
                day,
                np.array([], dtype=object),
                empty_i,
                empty_i,
                np.zeros(0),
                np.array([], dtype=object),
            )
        uniq_users, user_pos = np.unique(users, return_inverse=True)
        coord_names, coord = np.unique(coords, return_inverse=True)
        order = np.lexsort((values, coord, user_pos))
        user_pos, coord, values = user_pos[order], coord[order], values[order]
        key = user_pos.astype(np.int64) * len(coord_names) + coord
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        summed = np.add.reduceat(values, starts)
        return cls(
            day,
            uniq_users,
            user_pos[starts].astype(np.int64),
            coord[starts].astype(np.int64),
            summed,
            coord_names,
        )

    @property
    def n_users(self) -> int:
        return len(self.users)

    def matrix(self, coordinates: list[str]) -> np.ndarray:
        """Dense (n_users × k) float64 matrix of the requested coordinates (0 where absent)."""
        out = np.zeros((self.n_users, len(coordinates)), dtype=np.float64)
        if self.n_users == 0 or not coordinates:
            return out
        col_of = {name: j for j, name in enumerate(coordinates)}
        lookup = np.array([col_of.get(name, -1) for name in self.coord_names], dtype=np.int64)
        cols = lookup[self.coord]
        keep = cols >= 0
        # each (user, coordinate) cell is unique after from_columns, so plain assignment is exact
        out[self.user_pos[keep], cols[keep]] = self.value[keep]
        return out
