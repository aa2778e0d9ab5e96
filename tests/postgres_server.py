"""Pytest plugin: a real, throw-away PostgreSQL cluster (``deploy/postgres/pg-up.sh``).

``postgres_url`` (session) -> ``"postgresql://streamfilter_admin:…@127.0.0.1:PORT/streamfilter"``
    If ``STREAMFILTER_PG_URL`` is set, that server is used as is (never started or stopped here).
    Otherwise one cluster is started on a free port under a temporary directory (loopback only,
    SCRAM passwords, ``fsync = off``: a test cluster needs no durability across machine crashes)
    and stopped and deleted at the end of the session.

When the PostgreSQL server binaries are missing the tests are skipped with the reason, except
when ``CI=true``, where they fail (``tests.conftest.require``): ``make test`` installs the Debian
package ``postgresql`` (``deploy/install-test-deps.sh``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require

PG_DIR = Path(__file__).resolve().parents[1] / "deploy" / "postgres"
EXIT_UNAVAILABLE = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    external = os.environ.get("STREAMFILTER_PG_URL")
    if external:
        yield external
        return
    run_dir = tempfile.mkdtemp(prefix="streamfilter-pg-")
    env = {**os.environ, "PG_PORT": str(_free_port()), "PG_RUN_DIR": run_dir, "PG_FSYNC": "off"}
    up = subprocess.run(
        ["bash", str(PG_DIR / "pg-up.sh")], env=env, capture_output=True, text=True, timeout=180
    )
    if up.returncode == EXIT_UNAVAILABLE:
        require(False, f"PostgreSQL is not available: {up.stderr.strip()}")
    assert up.returncode == 0, f"pg-up.sh failed ({up.returncode}): {up.stderr[-2000:]}"
    try:
        yield up.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(
            ["bash", str(PG_DIR / "pg-down.sh")], env=env, capture_output=True, timeout=120
        )
