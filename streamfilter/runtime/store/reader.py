"""A read-only view of a SQLite state, without the writer's lock (``streamfilter budget``,
``streamfilter report``): WAL readers never block the writer and see the last committed day.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from streamfilter.errors import StoreError
from streamfilter.runtime.store.base import TelemetryCharge
from streamfilter.runtime.store.schema import (
    ROW_FORMAT,
    OldRowFormatError,
    as_blob,
    checked_row,
    lookup_budget,
    read_ledger,
)


class SQLiteStateReader:
    """Read-only view of a SQLite state, **without** the writer's lock.

    Every row it returns is checked against its CRC (meta included), like the writer's.
    For ``streamfilter budget`` and ``report``, which must work while the daemon runs: it is opened
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
        if self._meta("row_format") != ROW_FORMAT:  # an older state: the writer converts it
            self.close()
            raise OldRowFormatError(self.path)

    def __enter__(self) -> SQLiteStateReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rows(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        try:
            return [tuple(row) for row in self._db.execute(sql, args)]
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read state store {self.path}: {exc}") from exc

    def _meta(self, key: str) -> str | None:
        rows = self._rows("SELECT key, value, crc FROM meta WHERE key = ?", (key,))
        return None if not rows else str(checked_row(self.path, "meta", rows[0])[1])

    def config_fingerprint(self) -> str | None:
        return self._meta("config_fingerprint")

    def last_closed_day(self) -> str | None:
        return self._meta("last_closed_day")

    def closed_days(self) -> list[str]:
        """Every committed day, oldest first (each row checked)."""
        rows = self._rows("SELECT day, seq, crc FROM days ORDER BY day")
        return [str(checked_row(self.path, "days", row)[0]) for row in rows]

    def sent_releases(self) -> list[bytes]:
        """The payloads of the releases the sink acknowledged, in publication order (checked)."""
        rows = self._rows(
            "SELECT day, query_id, ord, payload, sent, crc FROM releases WHERE sent = 1 "
            "ORDER BY day, ord"
        )
        return [as_blob(checked_row(self.path, "releases", row)[3]) for row in rows]

    def telemetry_ledger(self) -> list[TelemetryCharge]:
        """Every telemetry charge, oldest first (checked); none in a state older than the
        ledger."""
        try:
            return read_ledger(self._db, self.path)
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise StoreError(f"cannot read state store {self.path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read state store {self.path}: {exc}") from exc

    def spent_units(self, user_id: str) -> tuple[int, bool] | None:
        """``(spent_units, retired)`` of one user, or ``None`` if never charged. Sensitive."""
        return self.entries([user_id])[0]

    def entries(self, keys: Sequence[str]) -> list[tuple[int, bool] | None]:
        """``(spent_units, retired)`` of each budget entry (a user's, or an analyst's
        sub-budget entry of a user: ``privacy.quotas.analyst_key``), ``None`` if never charged.
        Sensitive. The log and the table are read in one transaction: a snapshot of one
        committed day, for every key."""
        try:
            self._db.execute("BEGIN")
            try:
                return [lookup_budget(self._db, self.path, key) for key in keys]
            finally:
                self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read state store {self.path}: {exc}") from exc

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
