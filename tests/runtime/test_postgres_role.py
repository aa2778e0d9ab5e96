"""Issue #18, point 5: streamfilter runs as a restricted PostgreSQL role, created by the
operator's script ``deploy/postgres/worker-role.sql`` (no superuser, no CREATEDB/CREATEROLE, no
replication, no BYPASSRLS; it owns one schema and may connect). The seeded golden run publishes
the same bytes as with the administrator's role, and the role can touch nothing else.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from streamfilter.cli import main
from tests.test_golden_releases import GOLDEN

ROLE_SQL = Path(__file__).resolve().parents[2] / "deploy" / "postgres" / "worker-role.sql"


def _psql(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    psql = shutil.which("psql")
    assert psql, "psql (postgresql-client) is installed with the server by make test-deps"
    return subprocess.run(
        [psql, url, "-X", "-q", "-v", "ON_ERROR_STOP=1", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_streamfilter_runs_as_a_restricted_role(postgres_url, tmp_path, monkeypatch):
    psycopg = pytest.importorskip("psycopg")
    role = f"sf_worker_{uuid.uuid4().hex[:8]}"
    schema = f"sf_state_{uuid.uuid4().hex[:8]}"
    password = secrets.token_urlsafe(18)
    made = _psql(
        postgres_url,
        "-v",
        f"role={role}",
        "-v",
        f"schema={schema}",
        "-v",
        f"password={password}",
        "-f",
        str(ROLE_SQL),
    )
    assert made.returncode == 0, made.stderr
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
