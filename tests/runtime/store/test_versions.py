"""Schema versions (runtime/store/versions.py): a state records its schema version; opening an
older one migrates it in one transaction, a newer one is refused with one line and exit 4.
Both stores are created here from the DDL of the schema before versions were recorded (kept as
fixture files), filled with rows, and opened by today's code: real SQLite files, a real
PostgreSQL server, the real CLI.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from streamfilter.errors import ExitCode
from streamfilter.runtime.store import SQLiteStateStore
from streamfilter.runtime.store.postgres import MIGRATIONS as PG_MIGRATIONS
from streamfilter.runtime.store.schema import legacy_row_crc, row_crc
from streamfilter.runtime.store.sqlite import MIGRATIONS as SQLITE_MIGRATIONS
from streamfilter.runtime.store.versions import SchemaTooNewError, current_version
from tests.runtime.store.test_reader_stale import RUN, release_bytes, setup
from tests.support.cli import cli, error_lines

FIXTURES = Path(__file__).resolve().parents[2] / "system" / "data" / "schema_v1"
SQLITE_NOW = str(current_version(SQLITE_MIGRATIONS))
PG_NOW = str(current_version(PG_MIGRATIONS))


# -- SQLite -------------------------------------------------------------------------------------
def _v1_sqlite(path: Path) -> None:
    """A state as today's code wrote it before versions: its DDL and a few checksummed rows."""
    db = sqlite3.connect(path)
    db.executescript((FIXTURES / "sqlite_schema_v1.sql").read_text())
    # version 1 checksummed rows over their repr (legacy_row_crc)
    db.execute("INSERT INTO budgets VALUES(?, ?, ?, ?)", ("u-1", 7, 0, legacy_row_crc("u-1", 7, 0)))
    db.execute("INSERT INTO meta VALUES(?, ?, ?)", ("seq", "0", legacy_row_crc("seq", "0")))
    db.commit()
    db.close()


def _version(path: Path) -> str | None:
    db = sqlite3.connect(path)
    try:
        row = db.execute("SELECT value, crc FROM meta WHERE key = 'schema_version'").fetchone()
    finally:
        db.close()
    if row is None:
        return None
    assert row[1] == row_crc("schema_version", row[0])
    return str(row[0])


def test_sqlite_state_of_version_1_is_migrated_and_keeps_its_rows(tmp_path):
    path = tmp_path / "state.db"
    _v1_sqlite(path)
    assert _version(path) is None
    store = SQLiteStateStore(path)
    try:
        assert store.spent_units("u-1") == (7, False)
    finally:
        store.close()
    assert _version(path) == SQLITE_NOW
    db = sqlite3.connect(path)
    try:  # the rows now carry the packed checksums
        assert db.execute("SELECT crc FROM budgets WHERE user_id = 'u-1'").fetchone()[0] == (
            row_crc("u-1", 7, 0)
        )
    finally:
        db.close()


def test_sqlite_state_without_row_checksums_is_migrated(tmp_path):
    """The oldest layout (no ``crc`` column) is version 1 too: the step adds the checksums."""
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE budgets (user_id TEXT PRIMARY KEY, spent_units INTEGER NOT NULL, "
        "retired INTEGER NOT NULL) WITHOUT ROWID;"
        "INSERT INTO budgets VALUES('u-2', 11, 1);"
    )
    db.close()
    store = SQLiteStateStore(path)
    try:
        assert store.spent_units("u-2") == (11, True)
    finally:
        store.close()
    assert _version(path) == SQLITE_NOW


def test_sqlite_migration_is_one_transaction(tmp_path, monkeypatch):
    """A step that fails leaves the state exactly as it was: no version, no new table."""
    path = tmp_path / "state.db"
    _v1_sqlite(path)
    db = sqlite3.connect(path)
    db.execute("DROP TABLE telemetry_ledger")  # a table the migration's DDL creates again
    db.commit()
    db.close()

    def failing(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half_done (x INTEGER)")
        raise sqlite3.OperationalError("disk I/O error")

    import streamfilter.runtime.store.sqlite as sqlite_store

    monkeypatch.setattr(sqlite_store, "MIGRATIONS", [*sqlite_store.MIGRATIONS, failing])
    with pytest.raises(Exception, match="disk I/O error"):
        SQLiteStateStore(path)
    db = sqlite3.connect(path)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    db.close()
    assert "half_done" not in tables and "telemetry_ledger" not in tables
    assert _version(path) is None


def test_newer_sqlite_state_is_refused_with_one_line_and_exit_4(tmp_path):
    tmp = setup(tmp_path / "run")
    cli(*RUN, cwd=tmp)
    released = release_bytes(tmp)
    db = sqlite3.connect(tmp / "state.db")
    db.execute(
        "UPDATE meta SET value = '99', crc = ? WHERE key = 'schema_version'",
        (row_crc("schema_version", "99"),),
    )
    db.commit()
    db.close()
    before = (tmp / "state.db").read_bytes()
    proc = cli(*RUN, cwd=tmp, check=False)
    assert proc.returncode == ExitCode.FAIL_CLOSED == 4
    lines = error_lines(proc.stderr)  # the error alone
    assert len(lines) == 1, proc.stderr
    assert "schema version 99" in lines[0] and f"versions 1 to {SQLITE_NOW}" in lines[0]
    assert (tmp / "state.db").read_bytes() == before
    assert release_bytes(tmp) == released


# -- PostgreSQL ---------------------------------------------------------------------------------
def _v1_postgres(postgres_url: str, schema: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    ddl = (FIXTURES / "postgres_schema_v1.sql").read_text().replace("{s}", schema)
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(ddl)
        db.execute(f"INSERT INTO {schema}.budgets VALUES ('u-1', 7, false)")
        db.execute(f"UPDATE {schema}.meta SET value = '2026-01-03' WHERE key = 'released_through'")
        db.execute(f"INSERT INTO {schema}.releases VALUES ('2026-01-03', 'q', 0, 'x', true)")


def _pg_version(postgres_url: str, schema: str) -> str | None:
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as db:
        row = db.execute(f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'").fetchone()
    return None if row is None else str(row[0])


def test_postgres_schema_of_version_1_is_migrated_with_its_guards(postgres_url):
    psycopg = pytest.importorskip("psycopg")
    from streamfilter.runtime.store.cluster import ClusterLedger

    schema = f"sf_v1_{uuid.uuid4().hex[:8]}"
    _v1_postgres(postgres_url, schema)
    assert _pg_version(postgres_url, schema) is None
    ledger = ClusterLedger(postgres_url, schema=schema)
    try:
        assert ledger.spent_units("u-1") == (7, False)
    finally:
        ledger.close()
    assert _pg_version(postgres_url, schema) == PG_NOW
    with psycopg.connect(postgres_url, autocommit=True) as db:
        for statement in (
            f"UPDATE {schema}.budgets SET spent_units = 0",
            f"UPDATE {schema}.budgets SET retired = false WHERE false",  # allowed: no row
            f"DELETE FROM {schema}.budgets",
            f"TRUNCATE {schema}.releases",
            f"UPDATE {schema}.releases SET sent = false",
            f"UPDATE {schema}.releases SET payload = 'y'",
            f"UPDATE {schema}.meta SET value = '2026-01-01' WHERE key = 'released_through'",
        ):
            if "WHERE false" in statement:
                db.execute(statement)
                continue
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.execute(statement)
        db.execute(f"UPDATE {schema}.budgets SET spent_units = 9")  # raising a spend is allowed
        assert db.execute(f"SELECT spent_units FROM {schema}.budgets").fetchone()[0] == 9


def test_postgres_migration_is_one_transaction(postgres_url, monkeypatch):
    import streamfilter.runtime.store.postgres as pg
    from streamfilter.errors import StoreError

    psycopg = pytest.importorskip("psycopg")
    schema = f"sf_v1_{uuid.uuid4().hex[:8]}"
    _v1_postgres(postgres_url, schema)

    def failing(cur: object, s: str) -> None:
        raise psycopg.errors.DiskFull("could not extend file")

    monkeypatch.setattr(pg, "MIGRATIONS", [*pg.MIGRATIONS, failing])
    with pytest.raises(StoreError, match="could not extend file"):
        pg.PostgresStateStore(postgres_url, schema=schema)
    assert _pg_version(postgres_url, schema) is None
    with psycopg.connect(postgres_url, autocommit=True) as db:  # the guards were rolled back
        db.execute(f"UPDATE {schema}.budgets SET spent_units = 0")


def test_newer_postgres_schema_is_refused(postgres_url):
    psycopg = pytest.importorskip("psycopg")
    from streamfilter.runtime.store.postgres import PostgresStateStore

    schema = f"sf_new_{uuid.uuid4().hex[:8]}"
    PostgresStateStore(postgres_url, schema=schema).close()
    assert _pg_version(postgres_url, schema) == PG_NOW
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(
            f"UPDATE {schema}.meta SET value = %s WHERE key = 'schema_version'",
            (str(int(PG_NOW) + 1),),
        )
    with pytest.raises(SchemaTooNewError) as refused:
        PostgresStateStore(postgres_url, schema=schema)
    assert refused.value.exit_code == ExitCode.FAIL_CLOSED
    assert "\n" not in str(refused.value)
    assert f"schema version {int(PG_NOW) + 1}" in str(refused.value)
    assert f"versions 1 to {PG_NOW}" in str(refused.value)


def _v2_cluster(postgres_url: str, schema: str, budgets: dict[str, tuple[int, bool]]) -> None:
    """A cluster ledger as the code before partition budget records wrote it (version 2: the
    version-1 DDL and the version-1 → 2 step), three partitions pinned, one row per user."""
    psycopg = pytest.importorskip("psycopg")
    import streamfilter.runtime.store.postgres as pg

    ddl = (FIXTURES / "postgres_schema_v1.sql").read_text().replace("{s}", schema)
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(ddl)
        with db.transaction(), db.cursor() as cur:
            pg.MIGRATIONS[0](cur, schema)
            cur.execute(f"INSERT INTO {schema}.meta VALUES ('schema_version', '2')")
            cur.execute(
                f"INSERT INTO {schema}.cluster_days(day, partitions) VALUES ('2026-01-01', 3)"
            )
            cur.execute(
                f"INSERT INTO {schema}.cluster_days(day, partitions) VALUES ('2026-01-02', 3)"
            )
            cur.execute(f"SELECT {schema}.sf_set_meta('released_through', '2026-01-02')")
            cur.execute(
                f"SELECT {schema}.sf_raise_budgets(%s, %s, %s)",
                (list(budgets), [s for s, _ in budgets.values()], [r for _, r in budgets.values()]),
            )


def test_a_cluster_ledger_of_version_2_moves_its_budgets_to_partition_records(postgres_url):
    """Version 2 → 3: each partition's users' budget rows (users mapped to partitions by the
    pinned count, 3) become that partition's first record; the rebuilt budgets of every
    partition are exactly the rows of its users; the rows stay."""
    psycopg = pytest.importorskip("psycopg")
    from streamfilter.engine.partitions import key_partition
    from streamfilter.runtime.store.cluster import ClusterLedger

    schema = f"sf_v2_{uuid.uuid4().hex[:8]}"
    budgets = {f"user-{i}": (i * 3 + 1, i % 7 == 0) for i in range(60)}
    _v2_cluster(postgres_url, schema, budgets)
    assert _pg_version(postgres_url, schema) == "2"
    ledger = ClusterLedger(postgres_url, schema=schema)
    try:
        for p in range(3):
            want = {u: b for u, b in budgets.items() if key_partition(u.encode(), 3) == p}
            got = {u: (s, r) for u, s, r in ledger.partition_budgets(p, 3).items()}
            assert got == want and want
        assert ledger.spent_units("user-7") == budgets["user-7"]
        records = ledger._read(
            "SELECT partitions, partition, n_users FROM {s}.cluster_budget_records ORDER BY 2"
        )
    finally:
        ledger.close()
    assert [(n, p) for n, p, _ in records] == [(3, 0), (3, 1), (3, 2)]
    assert sum(k for _, _, k in records) == len(budgets)
    assert _pg_version(postgres_url, schema) == PG_NOW == "3"
    with psycopg.connect(postgres_url, autocommit=True) as db:
        assert db.execute(f"SELECT count(*) FROM {schema}.budgets").fetchone()[0] == len(budgets)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # records are never erased
            db.execute(f"DELETE FROM {schema}.cluster_budget_records")
