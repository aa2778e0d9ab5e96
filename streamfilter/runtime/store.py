"""The state store: the durable source of truth (DESIGN.md §5).

One transaction per closed day holds the budget debits, the day's releases (noise already drawn,
unique per ``(day, query_id)``) and the input positions.

Budgets are log-structured: a day's debits are one ``budget_log`` row of packed columns (ids,
spent units, retired flags), and the log is folded into the per-user ``budgets`` table, in the
transaction of the day that makes it outgrow both ``budget_log_max_rows`` and the table. A
user's state is their newest log entry, else their table row; the log never holds more rows than
the table (or the threshold), so loading and one-user lookups stay bounded.

Releases leave through the outbox: they are published from the store and marked sent only after
the sink acknowledged, so a restart republishes the stored bytes and never draws noise twice.

``StateStore`` is the interface (one contract test suite runs against every implementation);
``SQLiteStateStore`` is the embedded default (WAL, ``synchronous=FULL``, one writer enforced by an
exclusive ``flock`` on ``<path>.lock``). A planned PostgreSQL ledger implements the same methods.

Fail closed (DESIGN.md §5). Opening a SQLite state refuses, with ``StoreError``, a file SQLite
cannot read, a file whose ``PRAGMA integrity_check`` is not ``ok`` (corruption is never papered
over, and a damaged state is never replaced by an empty one) and a file it cannot write (probed
at open with a write that is rolled back, so a read-only state fails at start, not at the first
day close). A commit that fails (disk full, I/O error) raises ``StoreError`` and changes nothing.
``integrity_check`` sees only SQLite's page structure, so every row also carries a CRC-32 of its
values (``crc`` column, written with the row, checked whenever the row is read: at load, before
a release is published, for telemetry charges): a damaged budget, release, query, position or
meta value is refused instead of silently used. States written before the column existed get it
(computed from their rows as they are, after the integrity check) on the first open.

Stale copies. Every committed day increments the store's monotonic sequence ``seq``; after each
commit the sequence is mirrored *outside* the database, in ``<path>.seq`` (JSON: the state's
random ``state_id``, ``seq``, ``last_closed_day``; written to a temporary file, fsync'd, renamed,
directory fsync'd). On open: a mirror *ahead* of the store means the state is an older copy than
what was already committed (and possibly published) — ``StaleStoreError``, the daemon refuses to
start. A mirror *behind* the store is the harmless trace of a crash between the commit and the
mirror write, and is repaired. A mirror of another ``state_id`` (the state was deleted, emptied or
swapped) is refused too, unless that state never committed a day.

``SQLiteStateReader`` is a lock-free, read-only view for ``streamfilter budget`` (WAL readers never
block the writer and see the last committed day).

Telemetry (docs/odometer.md): a separate zCDP budget for statistics about the run itself. Every
charge is one row of the telemetry ledger, written only if the sum of all charges stays within
the total, checked inside the same transaction (exact rational arithmetic on the float values).
The opt-in active-set tracker state is stored with each day it changes, in the day's transaction.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import json
import math
import os
import sqlite3
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import IO

import numpy as np

from streamfilter.engine.ledger import encode_ids
from streamfilter.privacy.rounding import float_down, float_up
from streamfilter.runtime.faults import crash_point

__all__ = [
    "DayCommit",
    "Position",
    "SQLiteStateReader",
    "SQLiteStateStore",
    "StaleStoreError",
    "StateStore",
    "StoreError",
    "StoreLockedError",
    "StoredState",
    "TelemetryBalance",
    "TelemetryBudgetError",
    "TelemetryCharge",
    "check_sink_not_ahead",
]


class StoreError(RuntimeError):
    """The store cannot be read or written: the daemon fails closed."""


class StoreLockedError(StoreError):
    """Another process owns this state."""


class StaleStoreError(StoreError):
    """The state is older than what was already committed from it (a restored stale copy), or
    is not the state its sequence mirror describes: starting from it could publish a second,
    differently-noised release of a (day, query) and forget budget already spent."""


def _sqlite_error(exc: sqlite3.Error) -> str:
    """SQLite's message with its error code name and, for write failures, the likely cause."""
    name = getattr(exc, "sqlite_errorname", None)
    text = f"{exc} ({name})" if name else str(exc)
    if name is not None and (name == "SQLITE_FULL" or name.startswith("SQLITE_IOERR")):
        text += " — disk full, a file size limit, or failing storage?"
    elif name is not None and name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        text += " — the state file is damaged: restore the newest intact copy of the state"
    return text


class TelemetryBudgetError(ValueError):
    """A telemetry charge was refused: it would exceed the telemetry budget (nothing written)."""


@dataclass(frozen=True)
class TelemetryCharge:
    """One debit of the telemetry budget: ``kind`` (e.g. ``budget_stats``, ``active_set``), its
    zCDP ``rho`` and the ``record`` kept with it (the released statistics, or a description)."""

    kind: str
    rho: float
    record: bytes


@dataclass(frozen=True)
class TelemetryBalance:
    """``total`` telemetry ρ; ``spent`` (rounded up) and ``remaining`` (rounded down)."""

    total: float
    spent: float
    remaining: float


def _balance(total: float, charges: list[float]) -> TelemetryBalance:
    spent = sum((Fraction(r) for r in charges), Fraction(0))
    return TelemetryBalance(
        total=total,
        spent=float_up(spent),
        remaining=max(0.0, float_down(Fraction(total) - spent)),
    )


@dataclass(frozen=True)
class Position:
    """Where to resume one input partition.

    ``resume_offset``: seek here on start (no event of a still-open day lies before it).
    ``high_offset``: everything before it was already read; on replay, records below it that
    belong to closed days (or were rejected) are skipped silently.
    """

    resume_offset: int
    high_offset: int


@dataclass(frozen=True)
class DayCommit:
    """One closed day, written in a single transaction."""

    day: str
    releases: list[tuple[str, bytes]]  # (query_id, payload) in publication order
    changed_users: np.ndarray
    spent_units: np.ndarray
    retired: np.ndarray
    positions: dict[str, Position]
    active_set_state: bytes | None = None  # opt-in telemetry tracker after this day (sensitive)


@dataclass
class StoredState:
    config_fingerprint: str | None
    last_closed_day: str | None
    seq: int
    budgets: list[tuple[str, int, bool]] = field(default_factory=list)
    queries: list[bytes] = field(default_factory=list)  # canonical JSON, registration order
    positions: dict[str, Position] = field(default_factory=dict)
    releases: list[bytes] = field(default_factory=list)  # every stored release, day order
    active_set_state: bytes | None = None  # the opt-in active-set tracker, if ever started


class StateStore(abc.ABC):
    """Durable run state. Every method either completes or raises ``StoreError``."""

    @abc.abstractmethod
    def load(self) -> StoredState: ...

    @abc.abstractmethod
    def set_config_fingerprint(self, fingerprint: str) -> None: ...

    @abc.abstractmethod
    def add_query(self, canonical_json: bytes) -> None: ...

    @abc.abstractmethod
    def commit_day(self, commit: DayCommit) -> int:
        """Write the day atomically; return the new monotonic sequence number."""

    @abc.abstractmethod
    def save_positions(self, positions: dict[str, Position]) -> None: ...

    @abc.abstractmethod
    def unsent_releases(self) -> list[tuple[str, str, bytes]]:
        """(day, query_id, payload) not yet acknowledged, in publication order."""

    @abc.abstractmethod
    def mark_sent(self, keys: list[tuple[str, str]]) -> None:
        """Mark releases ``(day, query_id)`` as acknowledged by the sink (one transaction)."""

    @abc.abstractmethod
    def spent_units(self, user_id: str) -> tuple[int, bool] | None: ...

    def size_bytes(self) -> int | None:
        """On-disk size of the state, if the store knows it."""
        return None

    def telemetry_ledger(self) -> list[TelemetryCharge]:
        """Every telemetry charge so far, oldest first (a store without a ledger has none)."""
        return []

    def charge_telemetry(
        self, charge: TelemetryCharge, rho_total: float, *, active_set_state: bytes | None = None
    ) -> TelemetryBalance:
        """Debit ``charge`` iff all charges still sum to at most ``rho_total``; else raise
        ``TelemetryBudgetError`` and write nothing. The first charge pins ``rho_total`` for the
        state (a later, different total is refused). ``active_set_state`` is stored in the same
        transaction. Stores without a telemetry ledger refuse every charge."""
        raise StoreError(f"{type(self).__name__} keeps no telemetry ledger")

    @abc.abstractmethod
    def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL, crc INTEGER);
CREATE TABLE IF NOT EXISTS budgets (
    user_id TEXT PRIMARY KEY, spent_units INTEGER NOT NULL, retired INTEGER NOT NULL, crc INTEGER
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS queries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, query_id TEXT UNIQUE NOT NULL, payload BLOB NOT NULL,
    crc INTEGER
);
CREATE TABLE IF NOT EXISTS days (day TEXT PRIMARY KEY, seq INTEGER NOT NULL, crc INTEGER);
CREATE TABLE IF NOT EXISTS releases (
    day TEXT NOT NULL, query_id TEXT NOT NULL, ord INTEGER NOT NULL, payload BLOB NOT NULL,
    sent INTEGER NOT NULL DEFAULT 0, crc INTEGER, PRIMARY KEY (day, query_id)
);
CREATE TABLE IF NOT EXISTS positions (
    partition TEXT PRIMARY KEY, resume_offset INTEGER NOT NULL, high_offset INTEGER NOT NULL,
    crc INTEGER
);
CREATE TABLE IF NOT EXISTS budget_log (
    seq INTEGER PRIMARY KEY, n_users INTEGER NOT NULL, id_lengths BLOB NOT NULL, ids BLOB NOT NULL,
    spent_units BLOB NOT NULL, retired BLOB NOT NULL, crc INTEGER
);
CREATE TABLE IF NOT EXISTS telemetry_ledger (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, rho REAL NOT NULL,
    record BLOB NOT NULL, crc INTEGER
);
"""

#: the columns each row's ``crc`` covers, and the primary key (to backfill older states)
_CRC_COLUMNS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "meta": (("key", "value"), ("key",)),
    "budgets": (("user_id", "spent_units", "retired"), ("user_id",)),
    "budget_log": (
        ("seq", "n_users", "id_lengths", "ids", "spent_units", "retired"),
        ("seq",),
    ),
    "queries": (("seq", "query_id", "payload"), ("seq",)),
    "days": (("day", "seq"), ("day",)),
    "releases": (("day", "query_id", "ord", "payload", "sent"), ("day", "query_id")),
    "positions": (("partition", "resume_offset", "high_offset"), ("partition",)),
    "telemetry_ledger": (("seq", "kind", "rho", "record"), ("seq",)),
}


def _row_crc(*values: object) -> int:
    """CRC-32 of a row's values, each type-tagged and length-prefixed (``repr`` for numbers and
    text, raw bytes for blobs): one damaged byte, or a value of another type, changes it."""
    parts: list[bytes] = []
    for v in values:
        if isinstance(v, bytes):
            parts.append(_head(b"b", len(v)))
        else:
            v = repr(v).encode("utf-8", "surrogatepass")
            parts.append(_R_HEADS[len(v)] if len(v) < len(_R_HEADS) else _head(b"r", len(v)))
        parts.append(v)
    return zlib.crc32(b"".join(parts))


def _head(tag: bytes, length: int) -> bytes:
    return tag + length.to_bytes(8, "little")


#: ``_head(b"r", n)`` for the lengths of ids and numbers, looked up instead of built per value
_R_HEADS = [_head(b"r", n) for n in range(512)]
#: the ``retired`` value of a budget row, 0 or 1, with its head
_RETIRED = (_head(b"r", 1) + b"0", _head(b"r", 1) + b"1")


def _budget_crcs(users: list[str], spent: list[int], retired: list[bool]) -> list[int]:
    """``_row_crc(user, spent, int(retired))`` of each budget row, the same values built with
    one join and one ``zlib.crc32`` call per row (a day commit writes one row per active user)."""
    crc32, heads, tails, big = zlib.crc32, _R_HEADS, _RETIRED, len(_R_HEADS)
    out = []
    for u, s, r in zip(users, spent, retired, strict=True):
        if type(u) is not str or type(s) is not int:  # never from the engine; exact fallback
            out.append(_row_crc(u, s, int(r)))
            continue
        a = repr(u).encode("utf-8", "surrogatepass")
        b = b"%d" % s
        ha = heads[len(a)] if len(a) < big else _head(b"r", len(a))
        out.append(crc32(b"".join((ha, a, heads[len(b)], b, tails[r]))))
    return out


#: the budget log is folded into ``budgets`` once it holds more rows than this and than
#: ``budgets`` itself (``[state] budget_log_max_rows``)
BUDGET_LOG_MAX_ROWS = 1_000_000

_BUDGET_UPSERT = (
    "INSERT INTO budgets(user_id, spent_units, retired, crc) VALUES(?, ?, ?, ?) "
    "ON CONFLICT(user_id) DO UPDATE SET spent_units = excluded.spent_units, "
    "retired = excluded.retired, crc = excluded.crc"
)
_LOG_COLUMNS = "seq, n_users, id_lengths, ids, spent_units, retired, crc"


@dataclass(frozen=True)
class _PackedBudgets:
    """One day's budget changes as one ``budget_log`` row: the UTF-8 ids back to back, their
    byte lengths (``<u4``), spent units (``<i8``) and retired flags (``u1``)."""

    n_users: int
    id_lengths: bytes
    ids: bytes
    spent_units: bytes
    retired: bytes

    @classmethod
    def of(cls, users: np.ndarray, spent_units: np.ndarray, retired: np.ndarray) -> _PackedBudgets:
        buffer, _starts, lengths = encode_ids(users)
        return cls(
            len(lengths),
            lengths.astype("<u4").tobytes(),
            buffer[: int(lengths.sum())],
            np.asarray(spent_units, dtype="<i8").tobytes(),
            np.asarray(retired, dtype=bool).astype(np.uint8).tobytes(),
        )

    def values(self) -> tuple[int, bytes, bytes, bytes, bytes]:
        return self.n_users, self.id_lengths, self.ids, self.spent_units, self.retired

    def lengths(self, path: Path) -> np.ndarray:
        """The ids' byte lengths; ``StoreError`` if the columns do not fit together."""
        n = self.n_users
        if not (
            n >= 0
            and len(self.id_lengths) == 4 * n
            and len(self.spent_units) == 8 * n
            and len(self.retired) == n
        ):
            raise _CorruptRowError(path, "budget_log")
        lengths = np.frombuffer(self.id_lengths, dtype="<u4").astype(np.int64)
        if int(lengths.sum()) != len(self.ids) or bool(
            (np.frombuffer(self.retired, np.uint8) > 1).any()
        ):
            raise _CorruptRowError(path, "budget_log")
        return lengths

    def unpack(self, path: Path) -> tuple[list[str], list[int], list[bool]]:
        """``(users, spent_units, retired)``; ``StoreError`` if the columns do not decode."""
        lengths = self.lengths(path)
        try:
            ends = np.cumsum(lengths).tolist()
            starts = [0, *ends[:-1]]
            text = self.ids.decode("utf-8", "surrogatepass")
            if len(text) == len(self.ids):  # ASCII: character offsets are byte offsets
                users = [text[a:b] for a, b in zip(starts, ends, strict=True)]
            else:
                raw = self.ids
                users = [
                    raw[a:b].decode("utf-8", "surrogatepass")
                    for a, b in zip(starts, ends, strict=True)
                ]
        except ValueError:  # UnicodeDecodeError included
            raise _CorruptRowError(path, "budget_log") from None
        spent = np.frombuffer(self.spent_units, dtype="<i8").tolist()
        retired = np.frombuffer(self.retired, dtype=np.uint8).astype(bool).tolist()
        return users, spent, retired

    def find(self, user_id: str, path: Path) -> int | None:
        """Index of ``user_id`` in this row (the last one if listed twice), or None."""
        lengths = self.lengths(path)
        needle = np.frombuffer(user_id.encode("utf-8", "surrogatepass"), np.uint8)
        starts = np.cumsum(lengths) - lengths
        cand = np.flatnonzero(lengths == len(needle))
        if len(cand) and len(needle):
            data = np.frombuffer(self.ids, np.uint8)
            cand = cand[
                (data[starts[cand][:, None] + np.arange(len(needle))] == needle).all(axis=1)
            ]
        return int(cand[-1]) if len(cand) else None


def _log_rows(
    db: sqlite3.Connection, path: Path, *, newest_first: bool = False
) -> Iterator[_PackedBudgets]:
    """The budget log's rows in commit order (or newest first), each checked against its
    ``crc``."""
    order = "DESC" if newest_first else "ASC"
    for row in db.execute(f"SELECT {_LOG_COLUMNS} FROM budget_log ORDER BY seq {order}"):
        _seq, n, *blobs = _checked(path, "budget_log", row)
        yield _PackedBudgets(_int(n), *map(_blob, blobs))


def _newest_in_log(db: sqlite3.Connection, path: Path) -> dict[str, tuple[int, bool]]:
    """Each user in the budget log with their newest ``(spent_units, retired)``."""
    newest: dict[str, tuple[int, bool]] = {}
    for packed in _log_rows(db, path):
        users, spent, retired = packed.unpack(path)
        newest.update(zip(users, zip(spent, retired, strict=True), strict=True))
    return newest


def _lookup_budget(db: sqlite3.Connection, path: Path, user_id: str) -> tuple[int, bool] | None:
    """``(spent_units, retired)`` of one user: the newest log row that lists them, else their
    ``budgets`` row. Run inside one read transaction (a consistent snapshot)."""
    for packed in _log_rows(db, path, newest_first=True):
        i = packed.find(user_id, path)
        if i is not None:
            return int(np.frombuffer(packed.spent_units, "<i8")[i]), bool(packed.retired[i])
    row = db.execute(
        "SELECT user_id, spent_units, retired, crc FROM budgets WHERE user_id = ?", (user_id,)
    ).fetchone()
    if row is None:
        return None
    _user, spent_units, retired = _checked(path, "budgets", row)
    return _int(spent_units), bool(retired)


class _CorruptRowError(StoreError):
    def __init__(self, path: Path, table: str) -> None:
        super().__init__(
            f"state store {path} is corrupt: a row of table {table} does not match its checksum; "
            "refusing to use it — restore the newest intact copy of the state"
        )


def _checked(path: Path, table: str, row: tuple[object, ...]) -> tuple[object, ...]:
    """``row`` = the covered values then ``crc``; returns the values if they match."""
    *values, crc = row
    if crc != _row_crc(*values):
        raise _CorruptRowError(path, table)
    return tuple(values)


class SQLiteStateStore(StateStore):
    """SQLite in WAL mode with ``synchronous=FULL``; single writer via ``flock``."""

    def __init__(
        self, path: str | os.PathLike[str], *, budget_log_max_rows: int = BUDGET_LOG_MAX_ROWS
    ) -> None:
        if budget_log_max_rows < 0:
            raise ValueError("budget_log_max_rows must be >= 0")
        self.path = Path(path)
        self.mirror_path = self.path.with_name(self.path.name + ".seq")
        self.budget_log_max_rows = budget_log_max_rows
        self._base_rows: int | None = None  # rows of ``budgets`` (counted when first needed)
        self._lock_file: IO[bytes] | None = None
        self._acquire_lock()
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._check_integrity()
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_SCHEMA)
            self._check_writable()
            self._add_checksums()
            state_id = uuid.uuid4().hex
            self._db.execute(
                "INSERT INTO meta(key, value, crc) VALUES('state_id', ?, ?) "
                "ON CONFLICT(key) DO NOTHING",
                (state_id, _row_crc("state_id", state_id)),
            )
            self.state_id = str(self._meta("state_id"))
            self._check_mirror()
            row = self._db.execute("SELECT COALESCE(SUM(n_users), 0) FROM budget_log").fetchone()
            self._log_users = int(row[0])  # budget changes in the log, not yet in ``budgets``
        except sqlite3.Error as exc:
            self._close_on_error()
            raise StoreError(
                f"cannot open state store {self.path}: {_sqlite_error(exc)}; refusing to start"
            ) from exc
        except BaseException:
            self._close_on_error()
            raise

    def _close_on_error(self) -> None:
        db = getattr(self, "_db", None)
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()
        self._release_lock()

    # -- fail closed at open ---------------------------------------------------------------
    def _check_integrity(self) -> None:
        """Refuse a damaged database (never fall back to an empty state)."""
        rows = self._db.execute("PRAGMA integrity_check(3)")
        problems = [" ".join(str(r[0]).split()) for r in rows]
        if problems != ["ok"]:
            raise StoreError(
                f"state store {self.path} is corrupt (SQLite integrity check: "
                f"{'; '.join(problems)[:300]}); refusing to start from it — restore the newest "
                "intact copy of the state"
            )

    def _check_writable(self) -> None:
        """A write that is rolled back: SQLite opens a file it cannot write read-only without a
        word, and the first commit would fail only when the first day closes."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('write_probe', '')")
        except sqlite3.Error as exc:
            raise StoreError(
                f"state store {self.path} cannot be written ({_sqlite_error(exc)}); every closed "
                "day must be committed before it is released — make the state writable"
            ) from exc
        finally:
            db.execute("ROLLBACK")

    def _add_checksums(self) -> None:
        """A state written before rows carried a ``crc``: add the column, computed from the rows
        as they are (checked by ``integrity_check`` just before)."""
        missing = [
            table
            for table in _CRC_COLUMNS
            if "crc" not in {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
        ]
        if not missing:
            return
        with self._transaction() as db:
            for table in missing:
                columns, key = _CRC_COLUMNS[table]
                db.execute(f"ALTER TABLE {table} ADD COLUMN crc INTEGER")
                rows = db.execute(f"SELECT {', '.join(columns)} FROM {table}").fetchall()
                where = " AND ".join(f"{k} = ?" for k in key)
                db.executemany(
                    f"UPDATE {table} SET crc = ? WHERE {where}",
                    [(_row_crc(*r), *(r[columns.index(k)] for k in key)) for r in rows],
                )

    # -- the sequence mirror outside the store ---------------------------------------------
    def _check_mirror(self) -> None:
        seq = int(self._meta("seq") or 0)
        last = self._meta("last_closed_day")
        mirror = _read_mirror(self.mirror_path)
        if mirror is not None and mirror.seq > 0 and mirror.state_id != self.state_id:
            raise StaleStoreError(
                f"state store {self.path} is not the state recorded in {self.mirror_path}, which "
                f"committed {mirror.seq} days through {mirror.last_closed_day} (this state: {seq} "
                "days) — the state was deleted, emptied or replaced; restore the newest copy of "
                "the state, or start a new run with a new [state] path"
            )
        if mirror is not None and mirror.seq > seq:
            raise StaleStoreError(
                f"state store {self.path} is stale: it holds {seq} committed days (last closed "
                f"day {last or 'none'}) but {mirror.seq} days through {mirror.last_closed_day} "
                f"were already committed and may have been published ({self.mirror_path}); "
                "resuming would re-draw noise for released days and forget spent budget — "
                "restore the newest copy of the state, or start a new run with a new [state] path"
            )
        if mirror is None or mirror != _Mirror(self.state_id, seq, last):
            self._write_mirror(seq, last)  # first start, or behind after a crash: repair

    def _write_mirror(self, seq: int, last_closed_day: str | None) -> None:
        try:
            _write_mirror(self.mirror_path, _Mirror(self.state_id, seq, last_closed_day))
        except OSError as exc:
            raise StoreError(
                f"cannot write the sequence mirror {self.mirror_path}: {exc.strerror or exc}"
            ) from exc

    # -- single writer -------------------------------------------------------------------
    def _acquire_lock(self) -> None:
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            fh = open(lock_path, "a+b")  # noqa: SIM115 - held for the store's lifetime
        except OSError as exc:
            raise StoreError(f"cannot open lock file {lock_path}: {exc}") from exc
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise StoreLockedError(
                f"state store {self.path} is in use by another streamfilter process "
                f"(lock {lock_path} is held); only one writer may own a state"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n".encode())
        fh.flush()
        self._lock_file = fh

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
            raise StoreError(
                f"state store {self.path} failed to commit: {_sqlite_error(exc)}"
            ) from exc

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT key, value, crc FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(_checked(self.path, "meta", row)[1])

    # -- StateStore ----------------------------------------------------------------------
    def load(self) -> StoredState:
        """Read the whole state, every row checked against its ``crc`` (``StoreError`` if one
        does not match: a damaged state is never half-loaded)."""
        path = self.path
        try:
            db = self._db
            state = StoredState(
                config_fingerprint=self._meta("config_fingerprint"),
                last_closed_day=self._meta("last_closed_day"),
                seq=int(self._meta("seq") or 0),
            )
            db.execute("BEGIN")  # one snapshot for both budget tables
            try:
                newer = _newest_in_log(db, path)
                rows = db.execute("SELECT user_id, spent_units, retired, crc FROM budgets")
                base = [_checked(path, "budgets", row) for row in rows]
            finally:
                db.execute("COMMIT")
            self._base_rows = len(base)
            state.budgets = [(str(u), _int(s), bool(r)) for u, s, r in base if u not in newer] + [
                (u, s, r) for u, (s, r) in newer.items()
            ]
            rows = db.execute("SELECT seq, query_id, payload, crc FROM queries ORDER BY seq")
            state.queries = [_blob(_checked(path, "queries", row)[2]) for row in rows]
            rows = db.execute("SELECT partition, resume_offset, high_offset, crc FROM positions")
            positions = (_checked(path, "positions", row) for row in rows)
            state.positions = {str(p): Position(_int(r), _int(h)) for p, r, h in positions}
            rows = db.execute(
                "SELECT day, query_id, ord, payload, sent, crc FROM releases ORDER BY day, ord"
            )
            state.releases = [_blob(_checked(path, "releases", row)[3]) for row in rows]
            for row in db.execute("SELECT day, seq, crc FROM days"):
                _checked(path, "days", row)
            active_set = self._meta("active_set_state")
            state.active_set_state = None if active_set is None else active_set.encode()
            return state
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot read state store {path}: {_sqlite_error(exc)}; refusing to start"
            ) from exc

    def set_config_fingerprint(self, fingerprint: str) -> None:
        with self._transaction() as db:
            self._set_meta(db, "config_fingerprint", fingerprint)

    def add_query(self, canonical_json: bytes) -> None:
        query_id = json.loads(canonical_json)["query_id"]
        payload = bytes(canonical_json)
        with self._transaction() as db:
            cur = db.execute(
                "INSERT INTO queries(query_id, payload) VALUES(?, ?) ON CONFLICT(query_id) DO NOTHING",
                (query_id, payload),
            )
            if cur.rowcount == 1:
                seq = cur.lastrowid
                db.execute(
                    "UPDATE queries SET crc = ? WHERE seq = ?",
                    (_row_crc(seq, query_id, payload), seq),
                )

    def commit_day(self, commit: DayCommit) -> int:
        """One transaction: 1. budgets, 2. releases (unsent), 3. positions, 4. day + sequence.

        The day's budget changes are appended to the budget log as one row of packed columns
        (a few milliseconds for a million users; an upsert per user costs ~1.3 µs each). When
        the log holds more user rows than ``budget_log_max_rows`` and than ``budgets`` itself,
        it is folded into ``budgets`` in the same transaction (each user once, the newest state
        wins): the log stays at most as large as the table, so loading the state and looking up
        one user stay bounded, and users active on several days are upserted once.
        """
        base_rows, log_users = self._base_rows, self._log_users
        with self._transaction() as db:
            seq = int(self._meta("seq") or 0) + 1
            # 1. budget debits (exact integers)
            packed = _PackedBudgets.of(commit.changed_users, commit.spent_units, commit.retired)
            if packed.n_users:
                db.execute(
                    f"INSERT INTO budget_log({_LOG_COLUMNS}) VALUES(?, ?, ?, ?, ?, ?, ?)",
                    (seq, *packed.values(), _row_crc(seq, *packed.values())),
                )
                log_users += packed.n_users
                if base_rows is None:
                    base_rows = int(db.execute("SELECT count(*) FROM budgets").fetchone()[0])
                if log_users > max(self.budget_log_max_rows, base_rows):
                    base_rows, log_users = self._compact(db), 0
            # 2. releases, noise already drawn; the primary key refuses a second (day, query)
            db.executemany(
                "INSERT INTO releases(day, query_id, ord, payload, sent, crc) "
                "VALUES(?, ?, ?, ?, 0, ?)",
                [
                    (commit.day, qid, i, bytes(p), _row_crc(commit.day, qid, i, bytes(p), 0))
                    for i, (qid, p) in enumerate(commit.releases)
                ],
            )
            # 3. input positions
            self._write_positions(db, commit.positions)
            # 4. the day and the monotonic sequence
            db.execute(
                "INSERT INTO days(day, seq, crc) VALUES(?, ?, ?)",
                (commit.day, seq, _row_crc(commit.day, seq)),
            )
            for key, value in (("seq", str(seq)), ("last_closed_day", commit.day)):
                self._set_meta(db, key, value)
            # 5. the opt-in active-set tracker (exact partial counts: stored, never published)
            if commit.active_set_state is not None:
                self._set_meta(db, "active_set_state", commit.active_set_state.decode())
        self._base_rows, self._log_users = base_rows, log_users
        # 6. mirror the sequence outside the store (a crash here leaves it behind: repaired)
        crash_point("before_mirror")
        self._write_mirror(seq, commit.day)
        return seq

    def _compact(self, db: sqlite3.Connection) -> int:
        """Fold the budget log into ``budgets`` (inside the caller's transaction); returns the
        number of ``budgets`` rows after."""
        newer = _newest_in_log(db, self.path)
        crash_point("mid_compaction")
        users = list(newer)
        spent = [s for s, _ in newer.values()]
        retired = [r for _, r in newer.values()]
        db.executemany(
            _BUDGET_UPSERT,
            zip(users, spent, map(int, retired), _budget_crcs(users, spent, retired), strict=True),
        )
        db.execute("DELETE FROM budget_log")
        return int(db.execute("SELECT count(*) FROM budgets").fetchone()[0])

    @staticmethod
    def _set_meta(db: sqlite3.Connection, key: str, value: str) -> None:
        db.execute(
            "INSERT INTO meta(key, value, crc) VALUES(?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value, crc = excluded.crc",
            (key, value, _row_crc(key, value)),
        )

    @staticmethod
    def _write_positions(db: sqlite3.Connection, positions: dict[str, Position]) -> None:
        rows = [(p, pos.resume_offset, pos.high_offset) for p, pos in positions.items()]
        db.executemany(
            "INSERT INTO positions(partition, resume_offset, high_offset, crc) VALUES(?, ?, ?, ?) "
            "ON CONFLICT(partition) DO UPDATE SET resume_offset = excluded.resume_offset, "
            "high_offset = excluded.high_offset, crc = excluded.crc",
            [(*row, _row_crc(*row)) for row in rows],
        )

    def save_positions(self, positions: dict[str, Position]) -> None:
        with self._transaction() as db:
            self._write_positions(db, positions)

    def unsent_releases(self) -> list[tuple[str, str, bytes]]:
        """Checked against each row's ``crc`` right before they are published."""
        try:
            rows = self._db.execute(
                "SELECT day, query_id, ord, payload, sent, crc FROM releases WHERE sent = 0 "
                "ORDER BY day, ord"
            ).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read state store {self.path}: {_sqlite_error(exc)}") from exc
        checked = [_checked(self.path, "releases", row) for row in rows]
        return [(str(d), str(q), _blob(p)) for d, q, _ord, p, _sent in checked]

    def mark_sent(self, keys: list[tuple[str, str]]) -> None:
        with self._transaction() as db:
            for day, query_id in keys:
                row = db.execute(
                    "SELECT day, query_id, ord, payload, sent, crc FROM releases "
                    "WHERE day = ? AND query_id = ?",
                    (day, query_id),
                ).fetchone()
                if row is None:
                    continue
                _day, _qid, order, payload, _sent = _checked(self.path, "releases", row)
                db.execute(
                    "UPDATE releases SET sent = 1, crc = ? WHERE day = ? AND query_id = ?",
                    (_row_crc(day, query_id, order, payload, 1), day, query_id),
                )

    def spent_units(self, user_id: str) -> tuple[int, bool] | None:
        try:
            return _lookup_budget(self._db, self.path, user_id)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read state store {self.path}: {_sqlite_error(exc)}") from exc

    def telemetry_ledger(self) -> list[TelemetryCharge]:
        try:
            return _read_ledger(self._db, self.path)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read state store {self.path}: {_sqlite_error(exc)}") from exc

    def charge_telemetry(
        self, charge: TelemetryCharge, rho_total: float, *, active_set_state: bytes | None = None
    ) -> TelemetryBalance:
        """Check, then commit, in one ``BEGIN IMMEDIATE`` transaction (see :class:`StateStore`)."""
        if not (math.isfinite(charge.rho) and charge.rho > 0.0):
            raise TelemetryBudgetError(f"a telemetry charge must be > 0, got rho={charge.rho!r}")
        if not (math.isfinite(rho_total) and rho_total > 0.0):
            raise TelemetryBudgetError(f"telemetry.rho must be > 0, got {rho_total!r}")
        with self._transaction() as db:
            pinned = self._meta("telemetry_rho_total")
            if pinned is not None and float(pinned) != rho_total:
                raise TelemetryBudgetError(
                    f"telemetry.rho = {rho_total!r} differs from {float(pinned)!r}, the total this "
                    f"state's telemetry ledger was started with (state {self.path}); it cannot "
                    "change during a run"
                )
            charges = [c.rho for c in _read_ledger(db, self.path)]
            before = _balance(rho_total, charges)
            if sum(map(Fraction, charges), Fraction(charge.rho)) > Fraction(rho_total):
                raise TelemetryBudgetError(
                    f"telemetry budget exceeded: {charge.kind} costs rho={charge.rho!r} but only "
                    f"{before.remaining!r} of telemetry.rho={rho_total!r} remains "
                    f"({len(charges)} earlier charges); nothing was released"
                )
            if pinned is None:
                self._set_meta(db, "telemetry_rho_total", repr(float(rho_total)))
            row = (charge.kind, float(charge.rho), bytes(charge.record))
            cur = db.execute("INSERT INTO telemetry_ledger(kind, rho, record) VALUES(?, ?, ?)", row)
            db.execute(
                "UPDATE telemetry_ledger SET crc = ? WHERE seq = ?",
                (_row_crc(cur.lastrowid, *row), cur.lastrowid),
            )
            if active_set_state is not None:
                self._set_meta(db, "active_set_state", active_set_state.decode())
        return _balance(rho_total, [*charges, charge.rho])

    def size_bytes(self) -> int | None:
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(f"{self.path}{suffix}")
        return total

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        self._release_lock()


def check_sink_not_ahead(
    state_path: str | os.PathLike[str], last_closed_day: str | None, published_day: str | None
) -> None:
    """Refuse a state whose last closed day is before a day the release sink already holds: the
    published releases are a mirror of the sequence the state cannot roll back (a stale copy
    restored together with its ``.seq`` file is caught here)."""
    if published_day is not None and (last_closed_day is None or published_day > last_closed_day):
        raise StaleStoreError(
            f"state store {state_path} is stale: the release sink already holds releases of "
            f"{published_day}, after the state's last closed day ({last_closed_day or 'none'}); "
            "resuming would re-draw noise for released days and forget spent budget — restore "
            "the newest copy of the state, or start a new run with a new [state] path and sink"
        )


@dataclass(frozen=True)
class _Mirror:
    """The contents of ``<state>.seq``: which state, how many days it committed, the last one."""

    state_id: str
    seq: int
    last_closed_day: str | None


def _read_mirror(path: Path) -> _Mirror | None:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot read the sequence mirror {path}: {exc.strerror}") from exc
    try:
        obj = json.loads(text)
        mirror = _Mirror(obj["state_id"], obj["seq"], obj["last_closed_day"])
        valid = (
            isinstance(mirror.state_id, str)
            and type(mirror.seq) is int
            and mirror.seq >= 0
            and (mirror.last_closed_day is None or isinstance(mirror.last_closed_day, str))
        )
    except (ValueError, KeyError, TypeError):
        valid = False
    if not valid:
        raise StoreError(
            f"the sequence mirror {path} is unreadable, so whether the state is the newest "
            "copy cannot be checked; refusing to start — if the state is the newest copy, delete "
            f"{path} and start again"
        )
    return mirror


def _write_mirror(path: Path, mirror: _Mirror) -> None:
    """Atomically replace ``path``: temporary file, fsync, rename, fsync the directory."""
    data = json.dumps(
        {"state_id": mirror.state_id, "seq": mirror.seq, "last_closed_day": mirror.last_closed_day},
        sort_keys=True,
    ).encode()
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data + b"\n")
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _int(value: object) -> int:
    if type(value) is not int:
        raise StoreError("the state store holds a value of the wrong type where an integer belongs")
    return value


def _blob(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise StoreError("the state store holds a value of the wrong type where a blob belongs")
    return value


def _read_ledger(db: sqlite3.Connection, path: Path) -> list[TelemetryCharge]:
    rows = db.execute("SELECT seq, kind, rho, record, crc FROM telemetry_ledger ORDER BY seq")
    checked = [_checked(path, "telemetry_ledger", row) for row in rows]
    return [TelemetryCharge(str(k), float(r), _blob(p)) for _s, k, r, p in checked]  # type: ignore[arg-type]


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
                return _lookup_budget(self._db, self.path, user_id)
            finally:
                self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read state store {self.path}: {exc}") from exc

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
