"""A state store in PostgreSQL: the same interface and guarantees as the SQLite default.

The durable source of truth may live in a PostgreSQL server instead of a local file (``[state]
kind = "postgres"``; docs/design.md §5, §7). Each state is one PostgreSQL *schema* (default
``streamfilter``), so one database can hold several independent runs.

Guarantees, as for SQLite (``tests/runtime/store/test_store_contract.py`` runs against both):

* **One transaction per closed day** (``commit_day``): budget debits, releases (primary key
  ``(day, query_id)``: a second noise draw for a stored release is refused, and the whole day with
  it), input positions, the day and the monotonic sequence. ``SERIALIZABLE`` isolation; a failure
  rolls everything back and raises ``StoreError``.
* **One writer per state**: a session-level advisory lock (``pg_try_advisory_lock`` on the
  schema's name) held on the store's own connection for its lifetime; a second writer gets
  ``StoreLockedError``. The server releases the lock when the session ends, so a writer that dies
  never leaves a stale lock behind.
* **Fail closed**: any driver error is a ``StoreError`` naming the state, never a silent retry.
* **Schema versions** (versions.py): ``meta`` records the schema's version; an older schema is
  migrated in the opening transaction, a newer one refused (exit 4).
* **A worker cannot rewrite the state**: the tables belong to an administrator, who creates and
  migrates them (``setup.py``) and grants the worker role reads, appends and four
  ``SECURITY DEFINER`` write functions (``grant_worker``); triggers refuse, whoever writes, a
  lower spend, an erased or rewritten release, budget or day, and a ``meta`` day moved back.

Integrity of the stored values relies on PostgreSQL itself (WAL, ``fsync``, and page checksums
when the cluster was initialised with them) rather than on per-row CRCs: the server is a
separately administered system whose backups and replicas keep their own checks. Restoring an
old backup of the server is the operator's decision; the release sink's high-water check
(``check_sink_not_ahead``) still refuses a state that is behind what was already published.

The connection URL may carry no password: ``password`` (from an environment variable or a file,
resolved by the configuration) is passed to the driver separately and never appears in an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from streamfilter.errors import StoreError, StoreLockedError
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
from streamfilter.runtime.store.budget_records import (
    APPEND_FUNCTION,
    APPEND_SIGNATURE,
    RECORDS_TABLE,
    budgets_to_records,
)
from streamfilter.runtime.store.versions import (
    SCHEMA_VERSION_KEY,
    current_version,
    parse_version,
    pending_steps,
)

__all__ = ["PostgresStateStore", "StoreUnreachableError"]

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

_TABLES = """
CREATE TABLE IF NOT EXISTS {s}.meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.budgets (
    user_id TEXT PRIMARY KEY, spent_units BIGINT NOT NULL CHECK (spent_units >= 0),
    retired BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.queries (
    seq BIGSERIAL PRIMARY KEY, query_id TEXT UNIQUE NOT NULL, payload BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.days (day TEXT PRIMARY KEY, seq BIGINT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.releases (
    day TEXT NOT NULL, query_id TEXT NOT NULL, ord INTEGER NOT NULL, payload BYTEA NOT NULL,
    sent BOOLEAN NOT NULL DEFAULT FALSE, PRIMARY KEY (day, query_id)
);
CREATE TABLE IF NOT EXISTS {s}.positions (
    partition TEXT PRIMARY KEY, resume_offset BIGINT NOT NULL, high_offset BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.telemetry_ledger (
    seq BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, rho DOUBLE PRECISION NOT NULL,
    record BYTEA NOT NULL
);
"""

#: guards on the tables (a trigger's refusal is an exception: the whole transaction is rolled
#: back): a user's spend is never lowered, a retired user never revived, a budget row, a day, a
#: release, a registered query and a cluster partial never deleted, and a stored release never
#: rewritten (only its ``sent`` flag set); ``seq``, ``last_closed_day``, ``frozen_through`` and
#: ``released_through`` only move forward, and a cluster day once frozen or released stays so.
#: Statement-level on ``budgets`` (one set-based check per day's upsert).
_GUARDS = """
CREATE OR REPLACE FUNCTION {s}.refuse_erase() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'streamfilter: % on %.% refused: committed state is never erased',
        TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE OR REPLACE FUNCTION {s}.refuse_lower_budget() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM old_rows o LEFT JOIN new_rows n USING (user_id)
               WHERE n.user_id IS NULL OR n.spent_units < o.spent_units
                  OR (o.retired AND NOT n.retired)) THEN
        RAISE EXCEPTION 'streamfilter: a budget of %.budgets would be lowered: refused',
            TG_TABLE_SCHEMA USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION {s}.refuse_rewrite_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.day, NEW.query_id, NEW.ord, NEW.payload) IS DISTINCT FROM
       (OLD.day, OLD.query_id, OLD.ord, OLD.payload) OR (OLD.sent AND NOT NEW.sent) THEN
        RAISE EXCEPTION 'streamfilter: a stored release of %.releases would be rewritten: refused',
            TG_TABLE_SCHEMA USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE FUNCTION {s}.refuse_meta_back() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.key IS DISTINCT FROM OLD.key
       OR (OLD.key IN ('released_through', 'last_closed_day', 'frozen_through')
           AND NEW.value < OLD.value)
       OR (OLD.key = 'seq' AND NEW.value::bigint < OLD.value::bigint) THEN
        RAISE EXCEPTION 'streamfilter: % of %.meta would move back: refused',
            OLD.key, TG_TABLE_SCHEMA USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE FUNCTION {s}.refuse_day_back() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.day, NEW.partitions) IS DISTINCT FROM (OLD.day, OLD.partitions)
       OR (OLD.frozen AND NOT NEW.frozen) OR (OLD.released AND NOT NEW.released) THEN
        RAISE EXCEPTION 'streamfilter: day % of %.cluster_days would move back: refused',
            OLD.day, TG_TABLE_SCHEMA USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS budgets_never_lowered ON {s}.budgets;
CREATE TRIGGER budgets_never_lowered AFTER UPDATE ON {s}.budgets
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_lower_budget();
DROP TRIGGER IF EXISTS releases_never_rewritten ON {s}.releases;
CREATE TRIGGER releases_never_rewritten BEFORE UPDATE ON {s}.releases
    FOR EACH ROW EXECUTE FUNCTION {s}.refuse_rewrite_release();
DROP TRIGGER IF EXISTS meta_never_back ON {s}.meta;
CREATE TRIGGER meta_never_back BEFORE UPDATE ON {s}.meta
    FOR EACH ROW EXECUTE FUNCTION {s}.refuse_meta_back();
"""

#: the only writes a worker makes to tables it may not update (budgets, meta, releases): each a
#: ``SECURITY DEFINER`` function running as the schema's owner with a fixed ``search_path``,
#: whose writes the guards above check like any other. ``sf_set_meta`` writes only the keys the
#: runtime keeps (never ``schema_version``); ``sf_meta_for_update`` reads a ``meta`` value and
#: locks its row for the caller's transaction.
_WRITE_FUNCTIONS = """
CREATE OR REPLACE FUNCTION {s}.sf_raise_budgets(users TEXT[], spent BIGINT[], retired BOOLEAN[])
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO {s}.budgets(user_id, spent_units, retired)
    SELECT * FROM unnest(users, spent, retired)
    ON CONFLICT (user_id) DO UPDATE SET spent_units = excluded.spent_units,
        retired = excluded.retired
$$;
CREATE OR REPLACE FUNCTION {s}.sf_set_meta(k TEXT, v TEXT)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF k NOT IN ({keys}) THEN
        RAISE EXCEPTION 'streamfilter: meta key % is not written by a worker', k
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO {s}.meta(key, value) VALUES (k, v)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
END $$;
CREATE OR REPLACE FUNCTION {s}.sf_meta_for_update(k TEXT)
RETURNS TEXT LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT value FROM {s}.meta WHERE key = k FOR UPDATE
$$;
CREATE OR REPLACE FUNCTION {s}.sf_mark_sent(days TEXT[], query_ids TEXT[])
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE {s}.releases r SET sent = TRUE FROM unnest(days, query_ids) AS k(day, query_id)
    WHERE r.day = k.day AND r.query_id = k.query_id
$$;
REVOKE ALL ON FUNCTION {s}.sf_raise_budgets(TEXT[], BIGINT[], BOOLEAN[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.sf_set_meta(TEXT, TEXT) FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.sf_meta_for_update(TEXT) FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.sf_mark_sent(TEXT[], TEXT[]) FROM PUBLIC;
"""

#: a day's exact sums over its partitions, per query, for the releaser to noise: only for a day
#: that is frozen, not released, and committed by every pinned partition (else no rows). The
#: per-partition partial sums themselves are readable by no worker.
_DAY_SUMS = """
CREATE OR REPLACE FUNCTION {s}.sf_day_sums(d TEXT)
RETURNS TABLE (query_id TEXT, sums NUMERIC[]) LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    WITH ready AS (
        SELECT 1 FROM {s}.cluster_days c
        WHERE c.day = d AND c.frozen AND NOT c.released
          AND (SELECT count(*) FROM {s}.cluster_commits m
               WHERE m.day = d AND m.partition < c.partitions) >= c.partitions
    ), totals AS (
        SELECT p.query_id, u.i, sum(u.v) AS total
        FROM {s}.cluster_partials p, unnest(p.sums) WITH ORDINALITY AS u(v, i)
        WHERE p.day = d AND EXISTS (SELECT 1 FROM ready)
        GROUP BY p.query_id, u.i
    )
    SELECT q.query_id, coalesce(
        (SELECT array_agg(t.total ORDER BY t.i) FROM totals t WHERE t.query_id = q.query_id),
        '{{}}')
    FROM (SELECT DISTINCT p.query_id FROM {s}.cluster_partials p
          WHERE p.day = d AND EXISTS (SELECT 1 FROM ready)) q
$$;
REVOKE ALL ON FUNCTION {s}.sf_day_sums(TEXT) FROM PUBLIC;
"""

#: the ``meta`` keys the runtime writes (``sf_set_meta``)
_WORKER_META_KEYS = (
    "config_fingerprint",
    "seq",
    "last_closed_day",
    "active_set_state",
    "coverage_state",
    "population_state",
    "telemetry_rho_total",
    "first_day",
    "frozen_through",
    "released_through",
)

#: rows never deleted (nor the table truncated), when the table exists; the written-once
#: tables' rows are never updated either
_NEVER_ERASED = ("budgets", "releases", "meta", "queries", "cluster_days")
_WRITTEN_ONCE = (
    "days",
    "telemetry_ledger",
    "cluster_commits",
    "cluster_partials",
    "cluster_budget_records",
)


def _add_guards(cur: Any, s: str) -> None:
    """Create (or replace) the guards and write functions on the schema's tables."""
    cur.execute(_GUARDS.format(s=s))
    keys = ", ".join(f"'{k}'" for k in _WORKER_META_KEYS)
    cur.execute(_WRITE_FUNCTIONS.format(s=s, keys=keys))
    cur.execute("SELECT to_regclass(%s)", (f"{s}.cluster_budget_records",))
    if cur.fetchone()[0] is not None:
        cur.execute(APPEND_FUNCTION.format(s=s))
    for table in (*_NEVER_ERASED, *_WRITTEN_ONCE):
        cur.execute("SELECT to_regclass(%s)", (f"{s}.{table}",))
        if cur.fetchone()[0] is None:
            continue
        ops = "UPDATE OR DELETE" if table in _WRITTEN_ONCE else "DELETE"
        erase = f"{s}.refuse_erase()"
        _trigger(
            cur, "never_erased", f"BEFORE {ops}", f"{s}.{table}", f"ROW EXECUTE FUNCTION {erase}"
        )
        _trigger(
            cur,
            "never_truncated",
            "BEFORE TRUNCATE",
            f"{s}.{table}",
            f"STATEMENT EXECUTE FUNCTION {erase}",
        )
    cur.execute("SELECT to_regclass(%s)", (f"{s}.cluster_days",))
    if cur.fetchone()[0] is not None:
        cur.execute(_DAY_SUMS.format(s=s))
        _trigger(
            cur,
            "days_never_back",
            "BEFORE UPDATE",
            f"{s}.cluster_days",
            f"ROW EXECUTE FUNCTION {s}.refuse_day_back()",
        )


def _trigger(cur: Any, name: str, when: str, table: str, action: str) -> None:
    """Create or replace a trigger (``CREATE OR REPLACE TRIGGER`` needs PostgreSQL 14)."""
    cur.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
    cur.execute(f"CREATE TRIGGER {name} {when} ON {table} FOR EACH {action}")


#: what a worker role may do on each table, granted by :func:`grant_worker`: read, append,
#: and update only the tables that hold no budget, partial sum, release or ``meta`` (positions,
#: partition epochs, the releaser lease, the days' flags — their guards keep the flags from
#: moving back). The partial sums are write-only: the releaser reads a day's totals through
#: ``sf_day_sums``. ``telemetry_ledger``'s UPDATE is for ``LOCK TABLE``: its guard refuses any
#: update. Every other write goes through the functions of ``_WRITE_FUNCTIONS``.
_WORKER_TABLE_RIGHTS = {
    "meta": "SELECT",
    "budgets": "SELECT, INSERT",
    "queries": "SELECT, INSERT",
    "days": "SELECT, INSERT",
    "releases": "SELECT, INSERT",
    "positions": "SELECT, INSERT, UPDATE",
    "telemetry_ledger": "SELECT, INSERT, UPDATE",
    "cluster_partitions": "SELECT, INSERT, UPDATE",
    "cluster_days": "SELECT, INSERT, UPDATE",
    "cluster_commits": "SELECT, INSERT",
    "cluster_partials": "INSERT",
    "cluster_budget_records": "SELECT",
    "cluster_releaser": "SELECT, INSERT, UPDATE",
}


def grant_worker(cur: Any, s: str, role: str) -> None:
    """Give the worker ``role`` exactly the rights it needs on schema ``s`` (run by the
    schema's owner, after the schema is created or migrated): usage of the schema, the table
    rights of ``_WORKER_TABLE_RIGHTS``, the write functions, the id sequences; nothing else
    (no CREATE in the schema, no ownership)."""
    if not _SCHEMA_NAME.fullmatch(role):
        raise StoreError(f"a worker role must match {_SCHEMA_NAME.pattern}")
    cur.execute(f"REVOKE ALL ON SCHEMA {s} FROM {role}")
    cur.execute(f"GRANT USAGE ON SCHEMA {s} TO {role}")
    for table, rights in _WORKER_TABLE_RIGHTS.items():
        cur.execute("SELECT to_regclass(%s)", (f"{s}.{table}",))
        if cur.fetchone()[0] is not None:
            cur.execute(f"REVOKE ALL ON {s}.{table} FROM {role}")
            cur.execute(f"GRANT {rights} ON {s}.{table} TO {role}")
    cur.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {role}")
    for signature in (
        "sf_raise_budgets(TEXT[], BIGINT[], BOOLEAN[])",
        "sf_set_meta(TEXT, TEXT)",
        "sf_meta_for_update(TEXT)",
        "sf_mark_sent(TEXT[], TEXT[])",
    ):
        cur.execute(f"GRANT EXECUTE ON FUNCTION {s}.{signature} TO {role}")
    cur.execute("SELECT to_regprocedure(%s)", (f"{s}.sf_day_sums(text)",))
    if cur.fetchone()[0] is not None:
        cur.execute(f"GRANT EXECUTE ON FUNCTION {s}.sf_day_sums(TEXT) TO {role}")
    cur.execute("SELECT to_regprocedure(%s)", (f"{s}.{APPEND_SIGNATURE}",))
    if cur.fetchone()[0] is not None:
        cur.execute(f"GRANT EXECUTE ON FUNCTION {s}.{APPEND_SIGNATURE} TO {role}")


def _version_2_guards(cur: Any, s: str) -> None:
    """Version 1 → 2: the guards and write functions (``_GUARDS``, ``_WRITE_FUNCTIONS``)."""
    _add_guards(cur, s)


def _version_3_partition_budgets(cur: Any, s: str) -> None:
    """Version 2 → 3: a cluster ledger keeps its budgets as per-(partition, day) records
    (``_BUDGET_RECORDS``) instead of one row per user. Each partition's users' ``budgets`` rows
    (users mapped to partitions by the latest pinned partition count, as Kafka's partitioner
    maps keys; one record of all users when no day is pinned yet) become that partition's first
    record; the rows themselves stay (never erased),
    read by no worker from now on. A state without cluster tables only gets the guards."""
    cur.execute("SELECT to_regclass(%s)", (f"{s}.cluster_days",))
    if cur.fetchone()[0] is not None:
        cur.execute(RECORDS_TABLE.format(s=s))
        budgets_to_records(cur, s)
    _add_guards(cur, s)


#: the schema's migration steps in order: ``MIGRATIONS[i]`` turns version ``i + 1`` into
#: ``i + 2`` inside the opening transaction (versions.py); version 1 is any schema written
#: before versions were recorded (tests/system/data/schema_v1/postgres_schema_v1.sql)
MIGRATIONS: list[Callable[[Any, str], None]] = [_version_2_guards, _version_3_partition_budgets]


def _driver() -> Any:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the cluster extra is in every test install
        raise StoreError(
            "[state] kind = 'postgres' needs the PostgreSQL driver: pip install 'streamfilter[cluster]'"
        ) from None
    return psycopg


#: what the server answers when it is up but refuses these settings (no retry helps)
_CONNECT_REFUSALS = (
    "authentication failed",
    "no password supplied",
    "does not exist",
    "permission denied",
    "pg_hba.conf",
    "does not support SSL",
)


class StoreUnreachableError(StoreError):
    """The database did not answer (refused, timed out, not resolved, starting up): a state of
    the network or the server, retried at start-up rather than taken for a configuration."""


class PostgresStateStore(StateStore):
    """A state in one schema of a PostgreSQL database; single writer by advisory lock."""

    #: False in a subclass whose writers share the state (the cluster ledger, ``store.cluster``)
    single_writer = True

    def __init__(self, url: str, *, schema: str = "streamfilter", password: str | None = None):
        if not _SCHEMA_NAME.fullmatch(schema):
            raise StoreError(
                f"state.schema must match {_SCHEMA_NAME.pattern}, got a different name"
            )
        self.schema = schema
        self.where = f"postgres schema {schema}"
        self._psycopg = _driver()
        try:
            kwargs = {"password": password} if password is not None else {}
            self._db = self._psycopg.connect(url, autocommit=True, connect_timeout=30, **kwargs)
        except self._psycopg.Error as exc:
            text = _first_line(exc)
            unreachable = isinstance(exc, self._psycopg.OperationalError) and not any(
                refusal in text for refusal in _CONNECT_REFUSALS
            )
            what = f"cannot connect to the state store ({self.where}): {type(exc).__name__}: {text}"
            if unreachable:
                raise StoreUnreachableError(what) from None
            raise StoreError(f"{what}; refusing to start") from None
        try:
            locked = (
                not self.single_writer
                or self._db.execute(
                    "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                    (f"streamfilter:{schema}",),
                ).fetchone()[0]
            )
            if not locked:
                raise StoreLockedError(
                    f"state store {self.where} is in use by another streamfilter process (its "
                    "advisory lock is held); only one writer may own a state"
                )
            # concurrent CREATE ... IF NOT EXISTS can collide: one creator at a time. The lock
            # is taken before the transaction: a serializable transaction's snapshot is taken at
            # its first statement, so one that waited for the lock inside it would not see the
            # schema its predecessor created (and would create it again: DuplicateSchema)
            ddl_lock = (f"streamfilter-ddl:{schema}",)
            self._db.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", ddl_lock)
            try:
                with self._transaction() as cur:
                    # only when missing: CREATE SCHEMA IF NOT EXISTS checks the CREATE privilege
                    # on the database first, which a restricted role owning its schema does not
                    # hold (deploy/cluster/worker-role.sql)
                    cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
                    if cur.fetchone() is None:
                        cur.execute(f"CREATE SCHEMA {schema}")
                    self._migrate(cur)
            finally:
                with suppress(self._psycopg.Error):  # a lost connection released it already
                    self._db.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", ddl_lock)
        except BaseException:
            self._db.close()
            raise

    def _create_more(self, cur: Any) -> None:
        """A subclass's own tables, created in the same transaction as the common ones."""

    def _complete(self, cur: Any) -> bool:
        """Whether an existing schema at the current version has every table of this store
        (a subclass adds its own)."""
        return True

    def _migrate(self, cur: Any) -> None:
        """Bring the schema to this code's version (versions.py) inside the opening
        transaction: a new schema is created at it, an older one gets its missing tables and
        the steps it lacks, a newer one is refused before anything is written. A schema at the
        current version is left alone: a worker role, which owns nothing, runs no DDL."""
        s = self.schema
        cur.execute("SELECT to_regclass(%s)", (f"{s}.meta",))
        new = cur.fetchone()[0] is None
        steps: Sequence[Callable[[Any, str], None]] = []
        found = 0
        if not new:
            row = cur.execute(
                f"SELECT value FROM {s}.meta WHERE key = %s", (SCHEMA_VERSION_KEY,)
            ).fetchone()
            found = parse_version(None if row is None else str(row[0]), self.where)
            steps = pending_steps(found, MIGRATIONS, self.where)
            if not steps and self._complete(cur):
                return
        owner = cur.execute(
            "SELECT has_schema_privilege(%s, 'CREATE') AND coalesce(pg_has_role("
            "(SELECT relowner FROM pg_class WHERE oid = to_regclass(%s)), 'MEMBER'), TRUE)",
            (s, f"{s}.meta"),
        ).fetchone()[0]
        if not owner:
            what = "creating" if new else f"migrating from schema version {found}"
            raise StoreError(
                f"state store {self.where} needs {what} to version "
                f"{current_version(MIGRATIONS)}, which this database role may not do: an "
                "administrator runs python -m streamfilter.runtime.store.setup (docs/cluster.md); "
                "refusing to start"
            )
        cur.execute(_TABLES.format(s=s))
        self._create_more(cur)
        for step in steps:
            step(cur, s)
        if new or not steps:
            _add_guards(cur, s)  # a new schema's, or a subclass's new tables': as step 1 → 2
        cur.execute(
            f"INSERT INTO {s}.meta(key, value) VALUES (%s, %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (SCHEMA_VERSION_KEY, str(current_version(MIGRATIONS))),
        )

    # -- plumbing --------------------------------------------------------------------------
    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        """One serializable transaction; any driver error becomes ``StoreError`` (rolled back)."""
        try:
            with self._db.transaction(), self._db.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                yield cur
        except self._psycopg.Error as exc:
            raise StoreError(
                f"state store {self.where} failed to commit: {type(exc).__name__}: "
                f"{_first_line(exc)}"
            ) from None

    def _read(
        self, sql: str, args: tuple[object, ...] = (), *, binary: bool = False
    ) -> list[tuple[Any, ...]]:
        try:
            rows = self._db.execute(sql.format(s=self.schema), args, binary=binary).fetchall()
            return list(rows)
        except self._psycopg.Error as exc:
            raise StoreError(
                f"cannot read state store {self.where}: {type(exc).__name__}: {_first_line(exc)}"
            ) from None

    def _meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM {s}.meta WHERE key = %s", (key,))
        return None if not rows else str(rows[0][0])

    def _set_meta(self, cur: Any, key: str, value: str) -> None:
        cur.execute(f"SELECT {self.schema}.sf_set_meta(%s, %s)", (key, value))

    def _meta_for_update(self, cur: Any, key: str) -> str | None:
        """``meta``'s value of ``key`` (None: absent), its row locked until the commit."""
        row = cur.execute(f"SELECT {self.schema}.sf_meta_for_update(%s)", (key,)).fetchone()
        return None if row[0] is None else str(row[0])

    def _raise_budgets(
        self, cur: Any, users: list[str], spent: list[int], retired: list[bool]
    ) -> None:
        """Write users' budgets (new rows, or higher spends: the guard refuses a lower one)."""
        cur.execute(
            f"SELECT {self.schema}.sf_raise_budgets(%s::text[], %s::bigint[], %s::boolean[])",
            (users, spent, retired),
        )

    # -- StateStore --------------------------------------------------------------------------
    def load(self) -> StoredState:
        """The whole state, read in one repeatable-read snapshot."""
        s = self.schema
        try:
            with self._db.transaction(), self._db.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                meta = dict(cur.execute(f"SELECT key, value FROM {s}.meta").fetchall())
                state = StoredState(
                    config_fingerprint=meta.get("config_fingerprint"),
                    last_closed_day=meta.get("last_closed_day"),
                    seq=int(meta.get("seq", 0)),
                )
                state.budgets = [
                    (str(u), int(sp), bool(r))
                    for u, sp, r in cur.execute(
                        f"SELECT user_id, spent_units, retired FROM {s}.budgets"
                    )
                ]
                state.queries = [
                    bytes(p)
                    for (p,) in cur.execute(f"SELECT payload FROM {s}.queries ORDER BY seq")
                ]
                state.positions = {
                    str(p): Position(int(r), int(h))
                    for p, r, h in cur.execute(
                        f"SELECT partition, resume_offset, high_offset FROM {s}.positions"
                    )
                }
                state.releases = [
                    bytes(p)
                    for (p,) in cur.execute(f"SELECT payload FROM {s}.releases ORDER BY day, ord")
                ]
                active = meta.get("active_set_state")
                state.active_set_state = None if active is None else active.encode()
                coverage = meta.get("coverage_state")
                state.coverage_state = None if coverage is None else coverage.encode()
                population = meta.get("population_state")
                state.population_state = None if population is None else population.encode()
                return state
        except self._psycopg.Error as exc:
            raise StoreError(
                f"cannot read state store {self.where}: {type(exc).__name__}: {_first_line(exc)}; "
                "refusing to start"
            ) from None

    def set_config_fingerprint(self, fingerprint: str) -> None:
        with self._transaction() as cur:
            self._set_meta(cur, "config_fingerprint", fingerprint)

    def add_queries(self, canonical_jsons: Sequence[bytes]) -> None:
        with self._transaction() as cur:
            for canonical_json in canonical_jsons:
                cur.execute(
                    f"INSERT INTO {self.schema}.queries(query_id, payload) VALUES(%s, %s) "
                    "ON CONFLICT (query_id) DO NOTHING",
                    (json.loads(canonical_json)["query_id"], bytes(canonical_json)),
                )

    def commit_day(self, commit: DayCommit) -> int:
        """One transaction: 1. budgets, 2. releases (unsent), 3. positions, 4. day + sequence."""
        s = self.schema
        with self._transaction() as cur:
            stored_seq = self._meta_for_update(cur, "seq")
            seq = int(stored_seq) + 1 if stored_seq is not None else 1
            # 1. budget debits (exact integers), one statement for the whole day
            if len(commit.changed_users):
                self._raise_budgets(
                    cur,
                    [str(u) for u in commit.changed_users],
                    [int(x) for x in commit.spent_units],
                    [bool(x) for x in commit.retired],
                )
            # 2. releases, noise already drawn; the primary key refuses a second (day, query)
            if commit.releases:
                cur.executemany(
                    f"INSERT INTO {s}.releases(day, query_id, ord, payload) VALUES(%s, %s, %s, %s)",
                    [(commit.day, q, i, bytes(p)) for i, (q, p) in enumerate(commit.releases)],
                )
            # 3. input positions
            self._write_positions(cur, commit.positions)
            # 4. the day and the monotonic sequence
            cur.execute(f"INSERT INTO {s}.days(day, seq) VALUES(%s, %s)", (commit.day, seq))
            self._set_meta(cur, "seq", str(seq))
            self._set_meta(cur, "last_closed_day", commit.day)
            # 5. the opt-in active-set tracker (exact partial counts: stored, never published)
            if commit.active_set_state is not None:
                self._set_meta(cur, "active_set_state", commit.active_set_state.decode())
            if commit.coverage_state is not None:
                self._set_meta(cur, "coverage_state", commit.coverage_state.decode())
            if commit.population_state is not None:
                self._set_meta(cur, "population_state", commit.population_state.decode())
        return seq

    def _write_positions(self, cur: Any, positions: dict[str, Position]) -> None:
        if positions:
            cur.executemany(
                f"INSERT INTO {self.schema}.positions(partition, resume_offset, high_offset) "
                "VALUES(%s, %s, %s) ON CONFLICT (partition) DO UPDATE SET "
                "resume_offset = excluded.resume_offset, high_offset = excluded.high_offset",
                [(p, pos.resume_offset, pos.high_offset) for p, pos in positions.items()],
            )

    def save_positions(self, positions: dict[str, Position]) -> None:
        with self._transaction() as cur:
            self._write_positions(cur, positions)

    def unsent_releases(self) -> list[tuple[str, str, bytes]]:
        rows = self._read(
            "SELECT day, query_id, payload FROM {s}.releases WHERE NOT sent ORDER BY day, ord"
        )
        return [(str(d), str(q), bytes(p)) for d, q, p in rows]

    def sent_releases_after(self, day: str | None) -> list[tuple[str, str, bytes]]:
        rows = self._read(
            "SELECT day, query_id, payload FROM {s}.releases WHERE sent AND day > %s "
            "ORDER BY day, ord",
            (day or "",),
        )
        return [(str(d), str(q), bytes(p)) for d, q, p in rows]

    def mark_sent(self, keys: list[tuple[str, str]]) -> None:
        with self._transaction() as cur:
            self._mark_sent(cur, keys)

    def _mark_sent(self, cur: Any, keys: list[tuple[str, str]]) -> None:
        cur.execute(
            f"SELECT {self.schema}.sf_mark_sent(%s::text[], %s::text[])",
            ([d for d, _ in keys], [q for _, q in keys]),
        )

    def spent_units(self, user_id: str) -> tuple[int, bool] | None:
        rows = self._read(
            "SELECT spent_units, retired FROM {s}.budgets WHERE user_id = %s", (user_id,)
        )
        return None if not rows else (int(rows[0][0]), bool(rows[0][1]))

    def telemetry_ledger(self) -> list[TelemetryCharge]:
        rows = self._read("SELECT kind, rho, record FROM {s}.telemetry_ledger ORDER BY seq")
        return [TelemetryCharge(str(k), float(r), bytes(p)) for k, r, p in rows]

    def charge_telemetry(
        self,
        charge: TelemetryCharge,
        rho_total: float,
        *,
        active_set_state: bytes | None = None,
        coverage_state: bytes | None = None,
    ) -> TelemetryBalance:
        """Check, then commit, in one serializable transaction (see :class:`StateStore`).

        The coverage tracker's one-time charge is made at most once per state: a charge that
        comes with ``coverage_state`` when the state already holds one (cluster workers starting
        together, docs/design.md §7) finds it made, under the ledger's exclusive lock, and writes
        nothing."""
        check_telemetry_arguments(charge, rho_total)
        s = self.schema
        with self._transaction() as cur:
            # LOCK TABLE takes no snapshot: the reads below see every earlier charge
            cur.execute(f"LOCK TABLE {s}.telemetry_ledger IN EXCLUSIVE MODE")
            row = cur.execute(
                f"SELECT value FROM {s}.meta WHERE key = 'telemetry_rho_total'"
            ).fetchone()
            pinned = None if row is None else str(row[0])
            charges = [float(r) for (r,) in cur.execute(f"SELECT rho FROM {s}.telemetry_ledger")]
            if (
                coverage_state is not None
                and cur.execute(f"SELECT 1 FROM {s}.meta WHERE key = 'coverage_state'").fetchone()
            ):
                return telemetry_balance(rho_total, charges)
            check_telemetry_charge(charge, rho_total, pinned, charges, self.where)
            if pinned is None:
                self._set_meta(cur, "telemetry_rho_total", repr(float(rho_total)))
            cur.execute(
                f"INSERT INTO {s}.telemetry_ledger(kind, rho, record) VALUES(%s, %s, %s)",
                (charge.kind, float(charge.rho), bytes(charge.record)),
            )
            if active_set_state is not None:
                self._set_meta(cur, "active_set_state", active_set_state.decode())
            if coverage_state is not None:
                self._set_meta(cur, "coverage_state", coverage_state.decode())
        return telemetry_balance(rho_total, [*charges, charge.rho])

    def size_bytes(self) -> int | None:
        rows = self._read(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
            (self.schema,),
        )
        return int(rows[0][0])

    def close(self) -> None:
        with suppress(self._psycopg.Error):
            self._db.close()  # ends the session: the server releases the advisory lock


def _first_line(exc: BaseException) -> str:
    """The driver's message without the connection details a later line may carry."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
