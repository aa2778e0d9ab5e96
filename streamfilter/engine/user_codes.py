"""The open day's user codes: each distinct user id of the day gets an integer code on first
arrival (``DayAccumulator``), natively (``engine/_user_codes.c``) when built, else in a dict,
with the same codes either way.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import count, repeat

import numpy as np

from streamfilter.engine.native import user_codes as _user_codes  # None: a dict codes them

__all__ = ["DictUserCodes", "UserCodeTable", "fill_new_codes", "new_user_codes"]


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

        return fill_new_codes(codes, ids, new_code)

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


#: an id → code table, either kind
UserCodeTable = DictUserCodes | _NativeUserCodes


def new_user_codes() -> UserCodeTable:
    """The open day's id → code table: native when the extension is built, else a dict."""
    return _NativeUserCodes() if _user_codes is not None else DictUserCodes()


def fill_new_codes(codes: np.ndarray, keys: list[str], code_of: Callable[[str], int]) -> np.ndarray:
    """``codes`` with each -1 (a key the day had not coded) replaced by ``code_of(key)``, called
    once per distinct new key, in order of first appearance (so codes are given as one call per
    value would give them)."""
    missing = np.flatnonzero(codes < 0)
    if len(missing):
        new_keys = list(map(keys.__getitem__, missing.tolist()))
        code = {key: code_of(key) for key in dict.fromkeys(new_keys)}
        codes[missing] = np.fromiter(map(code.__getitem__, new_keys), np.int64, len(new_keys))
    return codes
