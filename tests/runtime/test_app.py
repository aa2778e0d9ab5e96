"""Start-up: a broker or database that does not answer is waited for (one WARNING per attempt,
/readyz says so), never taken for a configuration error; the systemd unit restarts on every
exit code a restart can change."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from streamfilter.errors import RESTART_CANNOT_HELP, ExitCode

BASE = """
[privacy]
b_norm = 4
rho = 0.1
[queries]
kind = "none"
[sink]
kind = "file"
path = "out/releases.jsonl"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        body = err.read().decode()
        err.close()
        return err.code, body
    except OSError:
        return 0, ""


def _start(tmp: Path, config: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    (tmp / "c.toml").write_text(config)
    return subprocess.Popen(
        [sys.executable, "-m", "streamfilter", "run", "--config", "c.toml", "--until-end"],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.timeout(120)
def test_an_unreachable_broker_is_waited_for_not_a_configuration_error(tmp_path):
    closed = _free_port()  # nothing listens there
    metrics = _free_port()
    proc = _start(
        tmp_path,
        BASE + f'[source]\nkind = "kafka"\ntopic = "events"\n[kafka]\nbootstrap_servers = '
        f'"127.0.0.1:{closed}"\n[metrics]\nenabled = true\nport = {metrics}\n',
    )
    try:
        deadline = time.monotonic() + 10
        status, body = _readyz(metrics)
        while status == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
            status, body = _readyz(metrics)
        assert status == 503 and f"kafka at 127.0.0.1:{closed}" in body, body
        time.sleep(40)  # a first attempt (kafka-python's 30 s bootstrap) and its retry
        assert proc.poll() is None  # still waiting: no exit, let alone a configuration one
        status, body = _readyz(metrics)
        assert status == 503 and "attempt 2" in body, body
    finally:
        proc.send_signal(signal.SIGTERM)  # honoured once the attempt under way ends
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "stopped while waiting for kafka" in err, err
    attempts = re.findall(
        r"WARNING streamfilter\.app: kafka at .* did not answer \(attempt (\d+)", err
    )
    assert attempts == [str(n) for n in range(1, len(attempts) + 1)] != [], err  # one per attempt
    assert " ERROR " not in err and "kafka.net" not in err, err  # ... not the client's screenful


@pytest.mark.timeout(300)
def test_a_database_down_at_start_is_waited_for_and_the_run_goes_on_once_it_answers(
    postgres_private_server, tmp_path
):
    server = postgres_private_server
    url = urlsplit(server.url)
    bare = urlunsplit(url._replace(netloc=f"{url.username}@{url.hostname}:{url.port}"))
    server.stop(keep_data=True)
    config = (
        BASE
        + '[source]\nkind = "synthetic"\n[source.synthetic]\nusers = 50\ndays = 2\n'
        + f'[state]\nkind = "postgres"\nurl = "{bare}"\npassword_env = "SF_TEST_DOWN_PW"\n'
        + "[metrics]\nenabled = false\n"
    )
    proc = _start(tmp_path, config, env={"SF_TEST_DOWN_PW": url.password or ""})
    try:
        time.sleep(4)  # attempts at 0, 1 and 3 s: all refused
        assert proc.poll() is None
        server.start(keep_data=True)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert re.search(r"WARNING streamfilter\.app: the state database .* did not answer", err)
    summary = json.loads(next(x for x in (out + err).splitlines() if x.startswith('{"summary')))
    assert summary["summary"]["days_closed"] == 2


def test_the_unit_prevents_restarts_only_where_a_restart_cannot_help():
    """An unreachable service exits with none of them (it is waited for); a held lock (3),
    a failed store or sink (4) and a refused Kafka access (6) may pass and are restarted."""
    assert {ExitCode.STATE_IN_USE, ExitCode.FAIL_CLOSED, ExitCode.KAFKA_ACCESS}.isdisjoint(
        RESTART_CANNOT_HELP
    )
    assert {ExitCode.CONFIG, ExitCode.FENCED} <= RESTART_CANNOT_HELP
