"""``[state]``: the SQLite default, or PostgreSQL with the password kept out of the URL."""

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


def test_an_unreachable_postgres_state_fails_closed_without_the_password(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("SF_TEST_PW", "s3cret-pw")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        BASE
        + '[state]\nkind = "postgres"\nurl = "postgresql://u@127.0.0.1:1/db?connect_timeout=2"\n'
        'password_env = "SF_TEST_PW"\n'
    )
    assert main(["run", "--config", str(cfg), "--until-end"]) == 4
    err = capsys.readouterr().err
    assert "cannot connect to the state store" in err and "s3cret-pw" not in err
