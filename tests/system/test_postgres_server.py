"""The throw-away PostgreSQL cluster the cluster-mode tests run on (``make pg-up``)."""

import os
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from tests.support.postgres_server import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_the_cluster_serves_the_printed_url_over_loopback_with_passwords(postgres_url):
    url = urlsplit(postgres_url)
    assert (
        url.scheme == "postgresql" and url.hostname == "127.0.0.1" and url.path == "/streamfilter"
    )
    with psycopg.connect(postgres_url) as con:
        assert con.execute("SELECT current_database(), current_user").fetchone() == (
            "streamfilter",
            "streamfilter_admin",
        )
        listen = con.execute("SHOW listen_addresses").fetchone()
        assert listen == ("127.0.0.1",)
    wrong = postgres_url.replace(f":{url.password}@", ":not-the-password@")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong, connect_timeout=10)


def test_make_pg_up_is_idempotent_and_pg_down_removes_the_cluster():
    # under /tmp itself: the cluster runs as the unprivileged 'postgres' user when we are root
    run_dir = Path(tempfile.mkdtemp(prefix="streamfilter-pg-"))
    port = free_port()  # not a fixed one: other workers and other runs share the machine
    env = {**os.environ, "PG_PORT": str(port), "PG_RUN_DIR": str(run_dir)}
    up = [
        subprocess.run(
            ["make", "--no-print-directory", "pg-up"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        for _ in range(2)
    ]
    try:
        if up[0].returncode == 3:
            pytest.skip("PostgreSQL is not installed")  # the session fixture already enforces CI
        assert [u.returncode for u in up] == [0, 0], up[0].stderr + up[1].stderr
        first, second = (u.stdout.strip().splitlines()[-1] for u in up)
        assert first == second and first.startswith("postgresql://") and f":{port}/" in first
        password = (run_dir / "password").read_text().strip()
        assert all(password not in u.stdout for u in up)  # printed without its password
        assert "export STREAMFILTER_PG_PASSWORD=" in up[0].stdout  # but with where it is
        assert urlsplit(first).password is None
        with psycopg.connect(first, password=password) as con:
            assert con.execute("SELECT 1").fetchone() == (1,)
    finally:
        down = subprocess.run(
            ["make", "--no-print-directory", "pg-down"], cwd=ROOT, env=env, timeout=120
        )
    assert down.returncode == 0 and not run_dir.exists()


def test_a_server_stopped_with_keep_data_starts_again_with_its_data(postgres_private_server):
    """``PG_KEEP_DATA=1`` pg-down.sh then pg-up.sh: the same server (URL, password, data)."""
    server = postgres_private_server
    url = server.url
    with psycopg.connect(url) as con:
        con.execute("CREATE TABLE kept (x INT)")
        con.execute("INSERT INTO kept VALUES (42)")
    server.stop(keep_data=True)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=5)
    assert server.start(keep_data=True) == url
    with psycopg.connect(url) as con:
        assert con.execute("SELECT x FROM kept").fetchall() == [(42,)]
