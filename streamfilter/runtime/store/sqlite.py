"""The embedded state store: SQLite in WAL mode, ``synchronous=FULL``, one writer.

One writer is enforced by an exclusive ``flock`` on ``<path>.lock``. Budgets are log-structured:
a day's debits are one ``budget_log`` row (schema.py), appended by the day's commit, whose cost
therefore scales with the users changed that day and nothing else. The entries by which the log
exceeds both ``budget_log_max_rows`` and the per-user ``budgets`` table are folded into the table,
oldest first, by ``compact`` — maintenance steps of their own transactions that the daemon runs
between input batches (docs/design.md §5.1), so no fold ever stalls a day's close.

Fail closed (docs/design.md §5). Opening refuses, with ``StoreError``, a file SQLite cannot read,
a file whose ``PRAGMA integrity_check`` is not ``ok`` (a damaged state is never replaced by an
empty one) and a file it cannot write (probed at open with a write that is rolled back). A commit
that fails (disk full, I/O error) raises ``StoreError`` and changes nothing. Every row is checked
against its CRC when read (schema.py); states written before the column existed get it on the
first open (a schema migration, versions.py: a state records its schema version; an older one
is migrated in one transaction, a newer one refused). A mirror of the sequence outside the store (mirror.py) detects restored stale copies
and swapped states.

Telemetry (docs/odometer.md): a separate zCDP budget for statistics about the run itself. Every
charge is one row of the telemetry ledger, written only if the sum of all charges stays within
the total, checked inside the same transaction (exact rational arithmetic on the float values).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

import numpy as np

from streamfilter.errors import StaleStoreError, StoreError, StoreLockedError
from streamfilter.runtime.faults import crash_point
from streamfilter.runtime.private_files import create_private, open_private
from streamfilter.runtime.store.base import (
    DayCommit,
    Position,
    StateStore,
    StoredState,
    TelemetryBalance,
    TelemetryCharge,
    check_telemetry_arguments,
    check_telemetry_charge,
    telemetry_balance,
)
from streamfilter.runtime.store.mirror import SequenceMirror, read_mirror, write_mirror
from streamfilter.runtime.store.schema import (
    BUDGET_UPSERT,
    CRC_COLUMNS,
    LOG_COLUMNS,
    ROW_FORMAT,
    SCHEMA,
    CorruptRowError,
    PackedBudgets,
    as_blob,
    as_int,
    checked_row,
    fold_rows,
    legacy_row_crc,
    lookup_budget,
    newest_in_log,
    read_ledger,
    row_crc,
    sqlite_error_text,
)
from streamfilter.runtime.store.versions import (
    SCHEMA_VERSION_KEY,
    current_version,
    parse_version,
    pending_steps,
)

#: the budget log's entries beyond this and beyond the rows of ``budgets`` are folded into
#: ``budgets`` (``[state] budget_log_max_rows``)
BUDGET_LOG_MAX_ROWS = 1_000_000
#: the most log entries one ``compact`` transaction folds (under a second at 1M users)
FOLD_STEP_ENTRIES = 100_000
#: SQLite page size of a new state file (the largest SQLite allows)
PAGE_BYTES = 65536


def _add_row_checksums(db: sqlite3.Connection) -> None:
    """Version 1 → 2: a state written before rows carried a ``crc`` gets the column, computed
    from the rows as they are (checked by ``integrity_check`` just before) in the checksum format
    of its time (``legacy_row_crc``, over ``repr``); tables that already have it are left alone."""
    for table, (columns, key) in CRC_COLUMNS.items():
        if "crc" in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
            continue
        db.execute(f"ALTER TABLE {table} ADD COLUMN crc INTEGER")
        rows = db.execute(f"SELECT {', '.join(columns)} FROM {table}").fetchall()
        where = " AND ".join(f"{k} = ?" for k in key)
        db.executemany(
            f"UPDATE {table} SET crc = ? WHERE {where}",
            [(legacy_row_crc(*r), *(r[columns.index(k)] for k in key)) for r in rows],
        )


def _pack_row_checksums(db: sqlite3.Connection) -> None:
    """Version 2 → 3: checksums over ``repr`` become ``zlib.crc32`` of the packed row
    (``schema.row_crc``). Every row is first checked against its old checksum: a damaged row is
    refused (the whole migration rolls back), never re-checksummed."""
    if db.execute("SELECT 1 FROM meta WHERE key = 'row_format'").fetchone() is not None:
        return  # written with packed checksums already
    path = Path(str(db.execute("PRAGMA database_list").fetchone()[2]))
    for table, (columns, key) in CRC_COLUMNS.items():
        where = " AND ".join(f"{k} = ?" for k in key)
        updates = []
        for *values, crc in db.execute(f"SELECT {', '.join(columns)}, crc FROM {table}"):
            if crc != legacy_row_crc(*values):
                raise CorruptRowError(path, table)
            updates.append((row_crc(*values), *(values[columns.index(k)] for k in key)))
        db.executemany(f"UPDATE {table} SET crc = ? WHERE {where}", updates)
    _record_row_format(db)


def _record_row_format(db: sqlite3.Connection) -> None:
    """The row format in meta: the read-only reader refuses a state without it."""
    db.execute(
        "INSERT INTO meta(key, value, crc) VALUES('row_format', ?, ?) ON CONFLICT(key) DO NOTHING",
        (ROW_FORMAT, row_crc("row_format", ROW_FORMAT)),
    )


def _analyst_sub_budgets(db: sqlite3.Connection) -> None:
    """Version 3 → 4: budget rows may hold analysts' sub-budget entries (docs/design.md §2.13),
    keyed ``analyst`` U+001F ``user id`` (``privacy.quotas.analyst_key``) beside the users' own.
    Nothing is rewritten: a state from before analysts holds only users' entries, and all their
    spend is the default analyst's (its spend is the global one minus the named analysts').
    The new version keeps an older streamfilter, which would read such entries as users, from
    opening the state. A stored id holding U+001F (never written: the contract refuses control
    characters in user ids) would be misread as an analyst's entry, so it is refused."""
    path = Path(str(db.execute("PRAGMA database_list").fetchone()[2]))
    in_table = db.execute("SELECT 1 FROM budgets WHERE instr(user_id, char(31)) > 0 LIMIT 1")
    in_log = db.execute("SELECT 1 FROM budget_log WHERE instr(ids, X'1f') > 0 LIMIT 1")
    if in_table.fetchone() is not None or in_log.fetchone() is not None:
        raise StoreError(
            f"state store {path} holds a user id with the control character U+001F, which "
            "analysts' entries use as their separator; refusing to upgrade it"
        )


#: the state's migration steps in order: ``MIGRATIONS[i]`` turns schema version ``i + 1`` into
#: ``i + 2`` inside the opening transaction (versions.py); version 1 is any state written before
#: versions were recorded
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _add_row_checksums,
    _pack_row_checksums,
    _analyst_sub_budgets,
]


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
        self._oldest_row: tuple[int, PackedBudgets, np.ndarray] | None = None  # _oldest_log_row
        self._lock_file: IO[bytes] | None = None
        self._acquire_lock()
        try:
            create_private(self.path)  # before SQLite: its -wal and -shm take the file's mode
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._check_integrity()
            self._identity = self._file_identity()
            # a new file only (an existing one keeps its page size): a day's commit writes
            # megabytes of packed debits, in 16 times fewer pages and system calls than 4 KiB
            self._db.execute(f"PRAGMA page_size={PAGE_BYTES}")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
            self._check_writable()
            state_id = uuid.uuid4().hex
            self._db.execute(
                "INSERT INTO meta(key, value, crc) VALUES('state_id', ?, ?) "
                "ON CONFLICT(key) DO NOTHING",
                (state_id, row_crc("state_id", state_id)),
            )
            self.state_id = str(self._meta("state_id"))
            self._check_mirror()
            row = self._db.execute("SELECT COALESCE(SUM(n_users), 0) FROM budget_log").fetchone()
            # budget changes in the log, not yet in ``budgets``
            self._log_users = int(row[0]) - self._folded_entries()
        except sqlite3.Error as exc:
            self._close_on_error()
            raise StoreError(
                f"cannot open state store {self.path}: {sqlite_error_text(exc)}; refusing to start"
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
                f"state store {self.path} cannot be written ({sqlite_error_text(exc)}); every closed "
                "day must be committed before it is released — make the state writable"
            ) from exc
        finally:
            db.execute("ROLLBACK")

    def _migrate(self) -> None:
        """Bring the state to this code's schema version (versions.py) in one transaction: a
        new file is created at it; an older state gets its missing tables and the migration
        steps it lacks; a newer state is refused before anything is written."""
        db = self._db
        has_meta = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        if has_meta:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (SCHEMA_VERSION_KEY,))
            found = parse_version(next((str(r[0]) for r in row), None), str(self.path))
            steps = pending_steps(found, MIGRATIONS, str(self.path))
            if not steps:
                return
        else:
            steps = []  # a new state: created at the current version, nothing to migrate
        with self._transaction() as db:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            for step in steps:
                step(db)
            if not has_meta:
                _record_row_format(db)
            self._set_meta(db, SCHEMA_VERSION_KEY, str(current_version(MIGRATIONS)))

    # -- the sequence mirror outside the store ---------------------------------------------
    def _check_mirror(self) -> None:
        seq = int(self._meta("seq") or 0)
        last = self._meta("last_closed_day")
        mirror = read_mirror(self.mirror_path)
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
        if mirror is None or mirror != SequenceMirror(self.state_id, seq, last):
            self._write_mirror(seq, last)  # first start, or behind after a crash: repair

    def _write_mirror(self, seq: int, last_closed_day: str | None) -> None:
        try:
            write_mirror(self.mirror_path, SequenceMirror(self.state_id, seq, last_closed_day))
        except OSError as exc:
            raise StoreError(
                f"cannot write the sequence mirror {self.mirror_path}: {exc.strerror or exc}"
            ) from exc

    # -- single writer -------------------------------------------------------------------
    def _acquire_lock(self) -> None:
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            fh = os.fdopen(open_private(lock_path, os.O_RDWR | os.O_APPEND), "a+b")
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
        self._check_same_file()
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
                f"state store {self.path} failed to commit: {sqlite_error_text(exc)}"
            ) from exc

    def _file_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def _check_same_file(self) -> None:
        """Before every write: the state's path still names the file this process opened
        (device and inode). A state deleted or replaced while the daemon runs would take the
        commits into an unlinked file and lose them at exit: fail closed instead."""
        if self._file_identity() != self._identity:
            raise StoreError(
                f"state store {self.path} is no longer the file this process opened (deleted, "
                "moved or replaced while running); refusing to commit to it"
            )

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT key, value, crc FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(checked_row(self.path, "meta", row)[1])

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
                newer = newest_in_log(db, path)
                rows = db.execute("SELECT user_id, spent_units, retired, crc FROM budgets")
                base = [checked_row(path, "budgets", row) for row in rows]
            finally:
                db.execute("COMMIT")
            self._base_rows = len(base)
            state.budgets = [(str(u), as_int(s), bool(r)) for u, s, r in base if u not in newer] + [
                (u, s, r) for u, (s, r) in newer.items()
            ]
            rows = db.execute("SELECT seq, query_id, payload, crc FROM queries ORDER BY seq")
            state.queries = [as_blob(checked_row(path, "queries", row)[2]) for row in rows]
            rows = db.execute("SELECT partition, resume_offset, high_offset, crc FROM positions")
            positions = (checked_row(path, "positions", row) for row in rows)
            state.positions = {str(p): Position(as_int(r), as_int(h)) for p, r, h in positions}
            rows = db.execute(
                "SELECT day, query_id, ord, payload, sent, crc FROM releases ORDER BY day, ord"
            )
            state.releases = [as_blob(checked_row(path, "releases", row)[3]) for row in rows]
            for row in db.execute("SELECT day, seq, crc FROM days"):
                checked_row(path, "days", row)
            active_set = self._meta("active_set_state")
            state.active_set_state = None if active_set is None else active_set.encode()
            coverage = self._meta("coverage_state")
            state.coverage_state = None if coverage is None else coverage.encode()
            population = self._meta("population_state")
            state.population_state = None if population is None else population.encode()
            return state
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot read state store {path}: {sqlite_error_text(exc)}; refusing to start"
            ) from exc

    def set_config_fingerprint(self, fingerprint: str) -> None:
        with self._transaction() as db:
            self._set_meta(db, "config_fingerprint", fingerprint)

    def add_queries(self, canonical_jsons: Sequence[bytes]) -> None:
        with self._transaction() as db:
            for canonical_json in canonical_jsons:
                query_id = json.loads(canonical_json)["query_id"]
                payload = bytes(canonical_json)
                cur = db.execute(
                    "INSERT INTO queries(query_id, payload) VALUES(?, ?) "
                    "ON CONFLICT(query_id) DO NOTHING",
                    (query_id, payload),
                )
                if cur.rowcount == 1:
                    seq = cur.lastrowid
                    db.execute(
                        "UPDATE queries SET crc = ? WHERE seq = ?",
                        (row_crc(seq, query_id, payload), seq),
                    )

    def commit_day(self, commit: DayCommit) -> int:
        """One transaction: 1. budgets, 2. releases (unsent), 3. positions, 4. day + sequence.

        The day's budget changes are appended to the budget log as one row of packed columns
        (a few milliseconds for a million users; an upsert per user costs several µs each,
        checksum included). Nothing is folded here: ``compact`` does that between batches.
        """
        log_users = self._log_users
        with self._transaction() as db:
            seq = int(self._meta("seq") or 0) + 1
            # 1. budget debits (exact integers)
            packed = PackedBudgets.of(commit.changed_users, commit.spent_units, commit.retired)
            if packed.n_users:
                db.execute(
                    f"INSERT INTO budget_log({LOG_COLUMNS}) VALUES(?, ?, ?, ?, ?, ?, ?)",
                    (seq, *packed.values(), row_crc(seq, *packed.values())),
                )
                log_users += packed.n_users
            # 2. releases, noise already drawn; the primary key refuses a second (day, query)
            db.executemany(
                "INSERT INTO releases(day, query_id, ord, payload, sent, crc) "
                "VALUES(?, ?, ?, ?, 0, ?)",
                [
                    (commit.day, qid, i, bytes(p), row_crc(commit.day, qid, i, bytes(p), 0))
                    for i, (qid, p) in enumerate(commit.releases)
                ],
            )
            # 3. input positions
            self._write_positions(db, commit.positions)
            # 4. the day and the monotonic sequence
            db.execute(
                "INSERT INTO days(day, seq, crc) VALUES(?, ?, ?)",
                (commit.day, seq, row_crc(commit.day, seq)),
            )
            for key, value in (("seq", str(seq)), ("last_closed_day", commit.day)):
                self._set_meta(db, key, value)
            # 5. the opt-in active-set tracker (exact partial counts: stored, never published)
            if commit.active_set_state is not None:
                self._set_meta(db, "active_set_state", commit.active_set_state.decode())
            if commit.coverage_state is not None:
                self._set_meta(db, "coverage_state", commit.coverage_state.decode())
            if commit.population_state is not None:
                self._set_meta(db, "population_state", commit.population_state.decode())
        self._log_users = log_users
        # 6. mirror the sequence outside the store (a crash here leaves it behind: repaired)
        crash_point("before_mirror")
        self._write_mirror(seq, commit.day)
        return seq

    def excess_log_entries(self) -> int:
        """Budget log entries beyond both ``budget_log_max_rows`` and the ``budgets`` table:
        what ``compact`` has left to fold."""
        if self._base_rows is None:
            row = self._db.execute("SELECT count(*) FROM budgets").fetchone()
            self._base_rows = int(row[0])
        return max(0, self._log_users - max(self.budget_log_max_rows, self._base_rows))

    def compact(self, max_entries: int) -> int:
        """Fold at most ``max_entries`` of the excess log entries into ``budgets``, oldest first,
        in transactions of at most ``FOLD_STEP_ENTRIES`` entries each (a crash loses at most the
        step under way, which the next step redoes); return the excess left. Loads and lookups
        see the same budgets before, during and after (a user's newest entry wins)."""
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        try:
            left = max_entries
            while left > 0 and (excess := self.excess_log_entries()) > 0:
                step = min(left, excess, FOLD_STEP_ENTRIES)
                with self._transaction() as db:
                    self._fold_oldest(db, step)
                # new users added table rows: counted again when next needed
                self._base_rows, self._log_users = None, self._log_users - step
                left -= step
            excess = self.excess_log_entries()
            if excess == 0:
                self._oldest_row = None  # nothing left to fold: do not keep a big row in memory
            return excess
        except sqlite3.Error as exc:
            raise StoreError(
                f"state store {self.path} failed to fold its budget log: {sqlite_error_text(exc)}"
            ) from exc

    def _fold_oldest(self, db: sqlite3.Connection, n_entries: int) -> None:
        """Fold the budget log's ``n_entries`` oldest unfolded entries into ``budgets`` (inside
        the caller's transaction). A log row is deleted once all its entries are folded; of the
        oldest row, meta ``budget_log_folded`` counts those already folded (rewriting the row
        would cost as much as the fold). A user's state stays their newest log entry, else
        their table row."""
        folded = self._folded_entries()
        while n_entries > 0:
            oldest = self._oldest_log_row(db)
            if oldest is None or not 0 <= folded < oldest[1].n_users:
                raise StoreError(
                    f"state store {self.path} is corrupt: the budget log does not match its "
                    "folded-entries count; refusing to use it — restore the newest intact copy"
                )
            seq, packed, offsets = oldest
            stop = min(folded + n_entries, packed.n_users)
            part = packed.entries(folded, stop, self.path, offsets)
            users, spent, retired, crcs = fold_rows(part, self.path)  # in key order
            db.executemany(BUDGET_UPSERT, zip(users, spent, retired, crcs, strict=True))
            crash_point("mid_compaction")
            n_entries -= stop - folded
            folded = stop
            if folded == packed.n_users:
                db.execute("DELETE FROM budget_log WHERE seq = ?", (seq,))
                folded = 0
        self._set_meta(db, "budget_log_folded", str(folded))

    def _oldest_log_row(
        self, db: sqlite3.Connection
    ) -> tuple[int, PackedBudgets, np.ndarray] | None:
        """The oldest budget log row, checked against its ``crc``, and its ids' offsets (None:
        the log is empty). Kept from one upkeep step to the next: a log row never changes once
        written (it is only deleted), and a row of 10M entries is 250 MB to read and check again
        for every step."""
        first = db.execute("SELECT seq FROM budget_log ORDER BY seq LIMIT 1").fetchone()
        if first is None:
            return None
        if self._oldest_row is None or self._oldest_row[0] != first[0]:
            self._oldest_row = None  # a 250 MB row is not held twice while the next is read
            row = db.execute(
                f"SELECT {LOG_COLUMNS} FROM budget_log WHERE seq = ?", (first[0],)
            ).fetchone()
            seq, n, *blobs = checked_row(self.path, "budget_log", row)
            packed = PackedBudgets(as_int(n), *map(as_blob, blobs))
            self._oldest_row = (as_int(seq), packed, packed.offsets(self.path))
        return self._oldest_row

    def _folded_entries(self) -> int:
        """Entries of the oldest budget log row already folded into ``budgets``."""
        return int(self._meta("budget_log_folded") or 0)

    @staticmethod
    def _set_meta(db: sqlite3.Connection, key: str, value: str) -> None:
        db.execute(
            "INSERT INTO meta(key, value, crc) VALUES(?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value, crc = excluded.crc",
            (key, value, row_crc(key, value)),
        )

    @staticmethod
    def _write_positions(db: sqlite3.Connection, positions: dict[str, Position]) -> None:
        rows = [(p, pos.resume_offset, pos.high_offset) for p, pos in positions.items()]
        db.executemany(
            "INSERT INTO positions(partition, resume_offset, high_offset, crc) VALUES(?, ?, ?, ?) "
            "ON CONFLICT(partition) DO UPDATE SET resume_offset = excluded.resume_offset, "
            "high_offset = excluded.high_offset, crc = excluded.crc",
            [(*row, row_crc(*row)) for row in rows],
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
            raise StoreError(
                f"cannot read state store {self.path}: {sqlite_error_text(exc)}"
            ) from exc
        checked = [checked_row(self.path, "releases", row) for row in rows]
        return [(str(d), str(q), as_blob(p)) for d, q, _ord, p, _sent in checked]

    def sent_releases_after(self, day: str | None) -> list[tuple[str, str, bytes]]:
        try:
            rows = self._db.execute(
                "SELECT day, query_id, ord, payload, sent, crc FROM releases "
                "WHERE sent = 1 AND day > ? ORDER BY day, ord",
                (day or "",),
            ).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot read state store {self.path}: {sqlite_error_text(exc)}"
            ) from exc
        checked = [checked_row(self.path, "releases", row) for row in rows]
        return [(str(d), str(q), as_blob(p)) for d, q, _ord, p, _sent in checked]

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
                _day, _qid, order, payload, _sent = checked_row(self.path, "releases", row)
                db.execute(
                    "UPDATE releases SET sent = 1, crc = ? WHERE day = ? AND query_id = ?",
                    (row_crc(day, query_id, order, payload, 1), day, query_id),
                )

    def spent_units(self, user_id: str) -> tuple[int, bool] | None:
        try:
            return lookup_budget(self._db, self.path, user_id)
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot read state store {self.path}: {sqlite_error_text(exc)}"
            ) from exc

    def telemetry_ledger(self) -> list[TelemetryCharge]:
        try:
            return read_ledger(self._db, self.path)
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot read state store {self.path}: {sqlite_error_text(exc)}"
            ) from exc

    def charge_telemetry(
        self,
        charge: TelemetryCharge,
        rho_total: float,
        *,
        active_set_state: bytes | None = None,
        coverage_state: bytes | None = None,
    ) -> TelemetryBalance:
        """Check, then commit, in one ``BEGIN IMMEDIATE`` transaction (see :class:`StateStore`)."""
        check_telemetry_arguments(charge, rho_total)
        with self._transaction() as db:
            pinned = self._meta("telemetry_rho_total")
            charges = [c.rho for c in read_ledger(db, self.path)]
            check_telemetry_charge(charge, rho_total, pinned, charges, str(self.path))
            if pinned is None:
                self._set_meta(db, "telemetry_rho_total", repr(float(rho_total)))
            row = (charge.kind, float(charge.rho), bytes(charge.record))
            cur = db.execute("INSERT INTO telemetry_ledger(kind, rho, record) VALUES(?, ?, ?)", row)
            db.execute(
                "UPDATE telemetry_ledger SET crc = ? WHERE seq = ?",
                (row_crc(cur.lastrowid, *row), cur.lastrowid),
            )
            if active_set_state is not None:
                self._set_meta(db, "active_set_state", active_set_state.decode())
            if coverage_state is not None:
                self._set_meta(db, "coverage_state", coverage_state.decode())
        return telemetry_balance(rho_total, [*charges, charge.rho])

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
