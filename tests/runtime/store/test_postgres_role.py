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
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from streamfilter.cli import main
from tests.system.test_golden_releases import GOLDEN

CLUSTER = Path(__file__).resolve().parents[3] / "deploy" / "cluster"


def _init_role(admin_url: str, role: str, schema: str, password: str) -> None:
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


def test_streamfilter_runs_as_a_restricted_role(postgres_url, tmp_path, monkeypatch):
    psycopg = pytest.importorskip("psycopg")
    role = f"sf_worker_{uuid.uuid4().hex[:8]}"
    schema = f"sf_state_{uuid.uuid4().hex[:8]}"
    password = secrets.token_urlsafe(18)
    _init_role(postgres_url, role, schema, password)
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
