"""Pytest plugin: a real, throw-away PostgreSQL cluster (``deploy/postgres/pg-up.sh``).

``postgres_url`` (session) -> ``"postgresql://streamfilter_admin:…@127.0.0.1:PORT/streamfilter"``
    If ``STREAMFILTER_PG_URL`` is set, that server is used as is (never started or stopped here).
    Otherwise one cluster is started on a free port under a temporary directory (loopback only,
    SCRAM passwords, ``fsync = off``: a test cluster needs no durability across machine crashes)
    and stopped and deleted at the end of the session.

``postgres_private_server`` (function) -> :class:`PostgresServer`
    A server of one test's own, always started here (even with ``STREAMFILTER_PG_URL``): the
    test may ``stop()`` it and ``start()`` it again with the same data, port and password
    (``PG_KEEP_DATA=1``), without disturbing the tests that share ``postgres_url``.

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

PG_DIR = Path(__file__).resolve().parents[2] / "deploy" / "postgres"
EXIT_UNAVAILABLE = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """A cluster of ``deploy/postgres/pg-up.sh`` in a temporary directory on a free port."""

    def __init__(self) -> None:
        self.run_dir = tempfile.mkdtemp(prefix="streamfilter-pg-")
        self.port = free_port()
        self.url = ""

    def _script(self, name: str, *, keep_data: bool) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "PG_PORT": str(self.port),
            "PG_RUN_DIR": self.run_dir,
            "PG_FSYNC": "off",
            "PG_KEEP_DATA": "1" if keep_data else "0",
        }
        return subprocess.run(
            ["bash", str(PG_DIR / name)], env=env, capture_output=True, text=True, timeout=180
        )

    def start(self, *, keep_data: bool = False) -> str:
        """Start the server (``keep_data``: the one ``stop(keep_data=True)`` left); its URL."""
        up = self._script("pg-up.sh", keep_data=keep_data)
        if up.returncode == EXIT_UNAVAILABLE:
            require(False, f"PostgreSQL is not available: {up.stderr.strip()}")
        assert up.returncode == 0, f"pg-up.sh failed ({up.returncode}): {up.stderr[-2000:]}"
        printed = up.stdout.strip().splitlines()[-1]  # no password: it is in the run directory
        password = (Path(self.run_dir) / "password").read_text().strip()
        self.url = printed.replace("streamfilter_admin@", f"streamfilter_admin:{password}@", 1)
        return self.url

    def stop(self, *, keep_data: bool = False) -> None:
        """Fast shutdown (every connection is closed); ``keep_data`` keeps the files."""
        down = self._script("pg-down.sh", keep_data=keep_data)
        assert down.returncode == 0, f"pg-down.sh failed ({down.returncode}): {down.stderr}"


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    external = os.environ.get("STREAMFILTER_PG_URL")
    if external:
        yield external
        return
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def postgres_private_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
