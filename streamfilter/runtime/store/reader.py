"""A read-only view of a SQLite state, without the writer's lock (``streamfilter budget``,
``streamfilter report``): WAL readers never block the writer and see the last committed day.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from streamfilter.errors import StoreError
from streamfilter.runtime.store.schema import lookup_budget


class SQLiteStateReader:
    """Read-only view of a SQLite state, **without** the writer's lock.

    For ``streamfilter budget``, which must work while the daemon runs: the connection is opened
    with ``mode=ro`` and ``PRAGMA query_only`` (it can never write), and in WAL mode a reader
    neither blocks the writer nor sees a half-written day — each query reads the last committed
    transaction. A missing state is an error (never created here).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise StoreError(f"no state store at {self.path}")
        try:
            self._db = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False
            )
            self._db.execute("PRAGMA query_only=1")
            self._db.execute("SELECT count(*) FROM meta").fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open state store {self.path} read-only: {exc}") from exc

    def __enter__(self) -> SQLiteStateReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _one(self, sql: str, args: tuple[object, ...]) -> tuple[object, ...] | None:
        try:
            row = self._db.execute(sql, args).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read state store {self.path}: {exc}") from exc
        return None if row is None else tuple(row)

    def config_fingerprint(self) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key = ?", ("config_fingerprint",))
        return None if row is None else str(row[0])

    def last_closed_day(self) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key = ?", ("last_closed_day",))
        return None if row is None else str(row[0])

    def spent_units(self, user_id: str) -> tuple[int, bool] | None:
        """``(spent_units, retired)`` of one user, or ``None`` if never charged. Sensitive.

        The log and the table are read in one transaction: a snapshot of one committed day."""
        try:
            self._db.execute("BEGIN")
            try:
                return lookup_budget(self._db, self.path, user_id)
            finally:
                self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read state store {self.path}: {exc}") from exc

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
