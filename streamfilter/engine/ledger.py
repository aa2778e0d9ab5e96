"""In-memory per-user budget state: ``user_id → (spent_units, retired)``.

Only users that were ever charged are stored: an absent user (all-zero record) costs nothing and
leaves no trace (DESIGN.md §6.8). The state store is the durable source of truth; this ledger is
rebuilt from it on start and updated only after a day's transaction committed.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["BudgetLedger"]


class BudgetLedger:
    """Dense int64/bool columns addressed through a ``user_id → row`` index."""

    def __init__(self) -> None:
        self._row: dict[str, int] = {}
        self._spent_units = np.zeros(1024, dtype=np.int64)
        self._retired = np.zeros(1024, dtype=bool)

    def __len__(self) -> int:
        return len(self._row)

    def rows(self, users: np.ndarray) -> np.ndarray:
        """Row of each user id, or -1 for users never charged."""
        get = self._row.get
        return np.fromiter((get(u, -1) for u in users), dtype=np.int64, count=len(users))

    def state(self, users: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(spent_units int64, retired bool) for each user id (zeros for unknown users)."""
        rows = self.rows(users)
        known = rows >= 0
        spent = np.zeros(len(users), dtype=np.int64)
        retired = np.zeros(len(users), dtype=bool)
        spent[known] = self._spent_units[rows[known]]
        retired[known] = self._retired[rows[known]]
        return spent, retired

    def spent_units(self, user_id: str) -> int:
        row = self._row.get(user_id)
        return 0 if row is None else int(self._spent_units[row])

    def retired(self, user_id: str) -> bool:
        row = self._row.get(user_id)
        return False if row is None else bool(self._retired[row])

    def apply(self, users: np.ndarray, spent_units: np.ndarray, retired: np.ndarray) -> None:
        """Set the state of ``users`` (adding new rows); called after the day committed."""
        rows = self.rows(users)
        new = np.flatnonzero(rows < 0)
        if len(new):
            start = len(self._row)
            self._grow(start + len(new))
            for k, i in enumerate(new):
                self._row[users[i]] = start + k
            rows[new] = np.arange(start, start + len(new))
        self._spent_units[rows] = spent_units
        self._retired[rows] = retired

    def _grow(self, size: int) -> None:
        if size <= len(self._spent_units):
            return
        cap = max(size, 2 * len(self._spent_units))
        self._spent_units = np.resize(self._spent_units, cap)
        self._retired = np.resize(self._retired, cap)
        self._spent_units[len(self._row) :] = 0
        self._retired[len(self._row) :] = False

    def items(self) -> Iterator[tuple[str, int, bool]]:
        for user, row in self._row.items():
            yield user, int(self._spent_units[row]), bool(self._retired[row])

    def max_spent_units(self) -> int:
        n = len(self._row)
        return int(self._spent_units[:n].max()) if n else 0
