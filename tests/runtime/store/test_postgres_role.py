"""Least privilege: streamfilter runs as a restricted PostgreSQL role, created by the
operator's script ``deploy/cluster/postgres-init.sh`` (``deploy/cluster/worker-role.sql``; the
compose file and the Kubernetes manifests run the same script when the database first starts) (no superuser, no CREATEDB/CREATEROLE, no
replication, no BYPASSRLS; it owns one schema and may connect). The seeded golden run publishes
the same bytes as with the administrator's role, and the role can touch nothing else.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import pytest

from streamfilter.cli import main
from streamfilter.errors import StoreError
from streamfilter.runtime.store.schema import PackedBudgets
from tests.system.test_golden_releases import GOLDEN

CLUSTER = Path(__file__).resolve().parents[3] / "deploy" / "cluster"


def _init_role(
    admin_url: str, role: str, schema: str, password: str, *, single_process: bool = False
) -> None:
    """Run the operator's script as the container entrypoint would, against the test server."""
    assert shutil.which("psql"), "psql (postgresql-client) comes with the server (make test-deps)"
    url = urlsplit(admin_url)
    env = {
        **os.environ,
        "PGHOST": url.hostname or "127.0.0.1",
        "PGPORT": str(url.port),
        "PGPASSWORD": url.password or "",
        "POSTGRES_USER": url.username or "",
        "POSTGRES_DB": url.path.lstrip("/"),
        "STREAMFILTER_PG_ROLE": role,
        "STREAMFILTER_PG_SCHEMA": schema,
        "STREAMFILTER_PG_PASSWORD": password,
        "STREAMFILTER_ROLE_SQL": str(CLUSTER / "worker-role.sql"),
    }
    made = subprocess.run(
        ["bash", str(CLUSTER / "postgres-init.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    # the administrator's command: the state's tables, owned by the administrator, and the
    # worker's rights on them
    setup = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamfilter.runtime.store.setup",
            "--schema",
            schema,
            "--worker-role",
            role,
            *(["--single-process"] if single_process else []),
        ],
        env={**os.environ, "STREAMFILTER_ADMIN_URL": admin_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert setup.returncode == 0, setup.stderr
    from streamfilter.runtime.store.postgres import MIGRATIONS
    from streamfilter.runtime.store.versions import current_version

    now = current_version(MIGRATIONS)
    assert setup.stdout.strip() == f"state {schema} at schema version {now}; {role} may use it"


def test_streamfilter_runs_as_a_restricted_role(postgres_url, tmp_path, monkeypatch):
    psycopg = pytest.importorskip("psycopg")
    role = f"sf_worker_{uuid.uuid4().hex[:8]}"
    schema = f"sf_state_{uuid.uuid4().hex[:8]}"
    password = secrets.token_urlsafe(18)
    _init_role(postgres_url, role, schema, password, single_process=True)
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        flags = admin.execute(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls "
            "FROM pg_roles WHERE rolname = %s",
            (role,),
        ).fetchone()
        assert flags == (False, False, False, False, False)
        # another state in the same database, which the role must not be able to read
        admin.execute("CREATE SCHEMA IF NOT EXISTS sf_other")
        admin.execute("CREATE TABLE IF NOT EXISTS sf_other.budgets (user_id TEXT)")

    url = urlsplit(postgres_url)
    bare = urlunsplit(url._replace(netloc=f"{role}@{url.hostname}:{url.port}"))
    monkeypatch.setenv("SF_TEST_WORKER_PASSWORD", password)
    for f in ("events.jsonl", "queries.jsonl"):
        shutil.copy(GOLDEN / f, tmp_path / f)
    config = (
        (GOLDEN / "dg_skip_activeset.toml")
        .read_text()
        .replace(
            '[state]\npath = "state.db"',
            f'[state]\nkind = "postgres"\nurl = "{bare}"\npg_schema = "{schema}"\n'
            'password_env = "SF_TEST_WORKER_PASSWORD"',
        )
    )
    assert f'pg_schema = "{schema}"' in config
    (tmp_path / "run.toml").write_text(config)
    assert main(["run", "--config", str(tmp_path / "run.toml"), "--until-end", "--testing"]) == 0
    assert (tmp_path / "releases.jsonl").read_bytes() == (
        GOLDEN / "dg_skip_activeset.releases.jsonl"
    ).read_bytes()

    with psycopg.connect(bare, password=password, autocommit=True) as worker:
        assert worker.execute(f"SELECT count(*) FROM {schema}.days").fetchone()[0] > 0
        for forbidden in (
            "SELECT * FROM sf_other.budgets",
            "CREATE SCHEMA sf_worker_own",
            "CREATE TABLE public.t (x INT)",
            "CREATE DATABASE sf_worker_db",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                worker.execute(forbidden)


def _worker(postgres_url: str, role: str, password: str):
    import psycopg

    url = urlsplit(postgres_url)
    bare = urlunsplit(url._replace(netloc=f"{role}@{url.hostname}:{url.port}"))
    return bare, psycopg.connect(bare, password=password, autocommit=True)


def test_the_worker_role_cannot_rewrite_the_ledger(postgres_url):
    """Connected as the worker role, every direct write to budgets, partial sums, releases and
    meta, every attempt to lower or erase a budget, a release or a released day, and every DDL
    statement is refused; the role owns nothing and writes those tables only through the
    ledger's functions, which raise a spend but never lower it. The ledger itself works as the
    role (it opens without DDL)."""
    psycopg = pytest.importorskip("psycopg")
    from streamfilter.runtime.store.cluster import ClusterLedger

    role = f"sf_worker_{uuid.uuid4().hex[:8]}"
    s = f"sf_ledger_{uuid.uuid4().hex[:8]}"
    password = secrets.token_urlsafe(18)
    _init_role(postgres_url, role, s, password)
    bare, worker = _worker(postgres_url, role, password)
    with worker:
        owned = worker.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND pg_get_userbyid(c.relowner) = %s",
            (s, role),
        ).fetchone()[0]
        assert owned == 0
        assert worker.execute(
            "SELECT pg_get_userbyid(nspowner) <> %s FROM pg_namespace WHERE nspname = %s",
            (role, s),
        ).fetchone()[0]
        ledger = ClusterLedger(bare, schema=s, password=password)  # opens as the role
        # budgets: a partition's packed records, appended through sf_append_budgets only; a
        # hostile append of lower spends (or a revival) changes no rebuilt budget
        honest = PackedBudgets.of(
            np.array(["u-1", "u-2"], dtype=object), np.array([5, 7]), np.array([False, True])
        )
        lower = PackedBudgets.of(
            np.array(["u-1", "u-2"], dtype=object), np.array([0, 1]), np.array([False, False])
        )
        append = f"SELECT {s}.sf_append_budgets(%s, %s, %s, %s, %s, %s, %s, %s)"
        worker.execute(append, ("2026-01-01", 1, 0, *honest.values()))
        before = sorted(ledger.partition_budgets(0, 1).items())
        assert before == [("u-1", 5, False), ("u-2", 7, True)]
        worker.execute(append, ("2026-01-02", 1, 0, *lower.values()))
        assert sorted(ledger.partition_budgets(0, 1).items()) == before
        assert ledger.spent_units("u-1") == (5, False)
        with pytest.raises(psycopg.errors.CheckViolation):  # columns that do not fit together
            worker.execute(append, ("2026-01-02", 1, 0, 3, *honest.values()[1:]))
        with pytest.raises(StoreError, match="permission denied"):  # the administrator's fold
            ledger.fold_budgets()
        ledger.close()
        # what a worker legitimately writes: new budgets, a higher spend, a release, a partial
        worker.execute(
            f"SELECT {s}.sf_raise_budgets(%s, %s, %s)", (["u-1", "u-2"], [5, 7], [False, False])
        )
        worker.execute(f"SELECT {s}.sf_raise_budgets(%s, %s, %s)", (["u-1"], [6], [True]))
        worker.execute(f"INSERT INTO {s}.releases VALUES ('2026-01-02', 'q', 0, 'noised', false)")
        worker.execute(f"INSERT INTO {s}.cluster_days(day, partitions) VALUES ('2026-01-02', 1)")
        worker.execute(f"UPDATE {s}.cluster_days SET frozen = true, released = true")
        worker.execute(f"INSERT INTO {s}.cluster_partials VALUES ('2026-01-02', 'q', 0, '{{3}}')")
        worker.execute(f"SELECT {s}.sf_set_meta('released_through', '2026-01-02')")
        worker.execute(f"SELECT {s}.sf_mark_sent(%s, %s)", (["2026-01-02"], ["q"]))
        refused = [
            # direct writes (the reset of spends that charged users twice)
            f"UPDATE {s}.budgets SET spent_units = 0",
            f"DELETE FROM {s}.budgets",
            f"TRUNCATE {s}.budgets",
            f"UPDATE {s}.releases SET payload = 'fresh noise'",
            f"UPDATE {s}.releases SET sent = false",
            f"DELETE FROM {s}.releases",
            f"TRUNCATE {s}.releases",
            f"UPDATE {s}.cluster_partials SET sums = '{{0}}'",
            f"DELETE FROM {s}.cluster_partials",
            f"DELETE FROM {s}.cluster_commits",
            f"UPDATE {s}.meta SET value = '' WHERE key = 'released_through'",
            f"INSERT INTO {s}.meta VALUES ('first_day', '2026-01-01')",
            f"DELETE FROM {s}.meta",
            f"DELETE FROM {s}.cluster_days",
            f"INSERT INTO {s}.cluster_budget_records(day, partitions, partition, n_users, "
            "id_lengths, ids, spent_units, retired) VALUES ('d', 1, 0, 0, '', '', '', '')",
            f"UPDATE {s}.cluster_budget_records SET spent_units = ''",
            f"DELETE FROM {s}.cluster_budget_records",
            f"TRUNCATE {s}.cluster_budget_records",
            # through the functions or the rights it has: lower, revive, erase, move back
            f"SELECT {s}.sf_raise_budgets(ARRAY['u-2'], ARRAY[0::bigint], ARRAY[false])",
            f"SELECT {s}.sf_raise_budgets(ARRAY['u-1'], ARRAY[6::bigint], ARRAY[false])",
            f"SELECT {s}.sf_set_meta('released_through', '2026-01-01')",
            f"SELECT {s}.sf_set_meta('schema_version', '1')",
            f"UPDATE {s}.cluster_days SET released = false",
            f"UPDATE {s}.cluster_days SET frozen = false",
            # DDL
            f"DROP TABLE {s}.budgets",
            f"DROP TABLE {s}.cluster_partials",
            f"DROP TABLE {s}.cluster_budget_records",
            f"ALTER TABLE {s}.cluster_budget_records DISABLE TRIGGER ALL",
            f"ALTER TABLE {s}.budgets DISABLE TRIGGER ALL",
            f"ALTER TABLE {s}.releases DROP CONSTRAINT releases_pkey",
            f"ALTER TABLE {s}.meta OWNER TO {role}",
            f"CREATE TABLE {s}.t (x INT)",
            f"CREATE FUNCTION {s}.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            f"DROP FUNCTION {s}.sf_set_meta(TEXT, TEXT)",
            f"DROP TRIGGER budgets_never_lowered ON {s}.budgets",
            f"DROP SCHEMA {s} CASCADE",
        ]
        for statement in refused:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                worker.execute(statement)
        # the partial sums are write-only; a day's totals only while it awaits its release
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker.execute(f"SELECT * FROM {s}.cluster_partials")
        assert worker.execute(f"SELECT * FROM {s}.sf_day_sums('2026-01-02')").fetchall() == []
        # a second noise draw for a stored release is refused by its key
        with pytest.raises(psycopg.errors.UniqueViolation):
            worker.execute(
                f"INSERT INTO {s}.releases VALUES ('2026-01-02', 'q', 0, 'other', false)"
            )
        rows = worker.execute(f"SELECT user_id, spent_units, retired FROM {s}.budgets ORDER BY 1")
        assert rows.fetchall() == [("u-1", 6, True), ("u-2", 7, False)]
        assert worker.execute(f"SELECT payload, sent FROM {s}.releases").fetchall() == [
            (b"noised", True)
        ]
    # another role than the worker may not even call the functions
    other, other_password = f"sf_other_{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(18)
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {other} LOGIN PASSWORD '{other_password}'")
        admin.execute(f"GRANT USAGE ON SCHEMA {s} TO {other}")
    _, stranger = _worker(postgres_url, other, other_password)
    with stranger:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            stranger.execute(
                f"SELECT {s}.sf_raise_budgets(ARRAY['u-9'], ARRAY[1::bigint], ARRAY[false])"
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            stranger.execute(
                f"SELECT {s}.sf_append_budgets('d', 1, 0, 0, ''::bytea, ''::bytea, ''::bytea, "
                "''::bytea)"
            )


def test_a_worker_role_refuses_a_state_it_would_have_to_create(postgres_url):
    """The worker role runs no DDL: a schema the administrator has not set up is refused with
    one line naming the administrator's command (exit 4)."""
    pytest.importorskip("psycopg")
    from streamfilter.errors import StoreError
    from streamfilter.runtime.store.cluster import ClusterLedger

    role = f"sf_worker_{uuid.uuid4().hex[:8]}"
    s = f"sf_ledger_{uuid.uuid4().hex[:8]}"
    password = secrets.token_urlsafe(18)
    env_schema = f"sf_unset_{uuid.uuid4().hex[:8]}"
    _init_role(postgres_url, role, s, password)
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {env_schema}")
        admin.execute(f"GRANT USAGE ON SCHEMA {env_schema} TO {role}")
    bare, worker = _worker(postgres_url, role, password)
    worker.close()
    with pytest.raises(StoreError) as refused:
        ClusterLedger(bare, schema=env_schema, password=password)
    assert refused.value.exit_code == 4 and "\n" not in str(refused.value)
    assert "python -m streamfilter.runtime.store.setup" in str(refused.value)
