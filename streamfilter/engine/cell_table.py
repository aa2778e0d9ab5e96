"""The open day's (user, coordinate) cells and their exact sums (``DayAccumulator``; docs/design.md
§2 "Record"): natively (``engine/_cell_table.c``) when built, else in numpy, with the same
records bit for bit. A user code is dense (an index into the day's users); a packed cell holds
the user's code above the coordinate's code.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from streamfilter.engine.exact_sums import FOLD_MIN, CellSums, exact_sums_by_key
from streamfilter.engine.native import cell_table as _cell_table  # None: NumpyCells

__all__ = [
    "COORD_BITS",
    "CellStore",
    "CodedCells",
    "NativeCells",
    "NumpyCells",
    "new_cells",
    "packed_cells",
]

#: category counts are folded into cells once this many are buffered (and the buffer is at least
#: the folded cells' size, so folding costs O(1) amortised per value)
_FOLD_MIN = 1 << 20
#: a packed category cell: the user's code above the coordinate's code (codes < 2**31 each)
COORD_BITS = 31
_COORD_MASK = (1 << COORD_BITS) - 1


class CellStore(Protocol):
    """The open day's (user, coordinate) cells and their exact sums (``NumpyCells``,
    ``NativeCells``; ``CodedCells`` for cells given as columns): a user code is dense (an index
    into the day's users), a packed cell is ``packed_cells``'s."""

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
        self._cat: list[np.ndarray] = []  # category hits as packed cells (``packed_cells``)
        self._cat_buffered = 0
        # folded category cells: (ascending packed cells, counts)
        self._folded: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0))
        self._cells: CodedCells | None = None  # every cell once, when gathered

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

    def _gathered(self) -> CodedCells:
        """Every cell once (user codes, coordinate codes, exact sums); the tables are freed as
        their cells come out."""
        if self._cells is None:
            self.fold_hits()
            cells, counts = self._folded
            self._folded = (np.zeros(0, np.int64), np.zeros(0))
            users = [cells >> COORD_BITS]
            coords = [cells & _COORD_MASK]
            values = [counts]
            del cells, counts
            for coord in list(self._num):
                codes, summed = self._num.pop(coord).sums()
                users.append(codes)
                coords.append(np.full(len(codes), coord, np.int64))
                values.append(summed)
                del codes, summed
            self._cells = CodedCells(
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
        cells = (users.astype(np.int64) << COORD_BITS) | coord
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


class CodedCells:
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


def _concatenated(parts: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate(parts)``, emptying the list as it goes (the parts are freed once
    copied)."""
    out = np.concatenate(parts)
    parts.clear()
    return out


def packed_cells(users: np.ndarray, coords: np.ndarray) -> np.ndarray:
    """(user code, coordinate code) cells packed in one int64 each."""
    packed: np.ndarray = (users.astype(np.int64) << COORD_BITS) | coords
    return packed
