"""``[state]``: the SQLite default, or PostgreSQL with the password kept out of the URL."""

import os
import signal
import subprocess
import sys
import time

import pytest

from streamfilter.cli.main import main

BASE = """
[privacy]
b_norm = 4.0
rho = 0.5
[source]
kind = "synthetic"
[queries]
kind = "none"
[sink]
kind = "stdout"
"""


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ('kind = "postgres"', "needs state.url"),
        ('kind = "postgres"\nurl = "mysql://h/db"', "must be a postgresql:// URL"),
        (
            'kind = "postgres"\nurl = "postgresql://u:s3cret@127.0.0.1:5432/db"',
            "must not contain a password",
        ),
        (  # libpq reads a password from the query string too, and an empty one from user:@
            'kind = "postgres"\nurl = "postgresql://sf@db/state?password=s3cret"',
            "must not contain a password",
        ),
        (
            'kind = "postgres"\nurl = "postgresql://sf@db/state?sslmode=require&PassWord=s3cret"',
            "must not contain a password",
        ),
        ('kind = "postgres"\nurl = "postgresql://sf:@db/state"', "must not contain a password"),
        (
            'kind = "postgres"\nurl = "postgresql://u@127.0.0.1/db"\npg_schema = "Bad-Name"',
            "pg_schema",
        ),
        (
            'kind = "postgres"\nurl = "postgresql://u@127.0.0.1:1/db"\npassword_env = "SF_NOT_SET_X"',
            "SF_NOT_SET_X is not set",
        ),
    ],
)
def test_postgres_state_settings_are_checked_and_never_echo_a_password(
    tmp_path, capsys, monkeypatch, state, message
):
    monkeypatch.delenv("SF_NOT_SET_X", raising=False)
    cfg = tmp_path / "c.toml"
    cfg.write_text(BASE + "[state]\n" + state + "\n")
    assert main(["run", "--config", str(cfg), "--until-end"]) == 2
    err = capsys.readouterr().err
    assert message in err and "s3cret" not in err


def test_an_unreachable_postgres_state_is_waited_for_without_the_password(tmp_path):
    """A database that does not answer is not a configuration (nor a store) failure: start-up
    retries it, one WARNING per attempt naming the cause, never the password; SIGTERM ends
    the wait cleanly."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        BASE
        + '[state]\nkind = "postgres"\nurl = "postgresql://u@127.0.0.1:1/db?connect_timeout=2"\n'
        'password_env = "SF_TEST_PW"\n[metrics]\nenabled = false\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamfilter", "run", "--config", str(cfg), "--until-end"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SF_TEST_PW": "s3cret-pw"},
    )
    time.sleep(4)  # attempts at 0, 1 and 3 s
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert err.count("cannot connect to the state store") >= 2 and "s3cret-pw" not in err
    assert "stopped while waiting for the state database" in err
