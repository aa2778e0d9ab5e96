"""``[cluster]``: cluster mode is one explicit switch, checked strictly (docs/design.md §7.1)."""

import pytest

from streamfilter.cli.main import main

PRIVACY = '[privacy]\nb_norm = 4.0\nrho = 0.5\n[queries]\nkind = "none"\n'
KAFKA = '[source]\nkind = "kafka"\ntopic = "events"\n'
POSTGRES = '[state]\nkind = "postgres"\nurl = "postgresql://u@127.0.0.1:1/db"\n'


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("[cluster]\nenabled = true\n" + POSTGRES, "needs source.kind = 'kafka'"),
        ("[cluster]\nenabled = true\n" + KAFKA, "state.kind = 'postgres'"),
        (
            "[cluster]\nenabled = true\n[telemetry]\nactive_set = true\n" + KAFKA + POSTGRES,
            "telemetry.active_set = false",
        ),
        (
            '[cluster]\nenabled = true\nsession_timeout = "2s"\nheartbeat_interval = "3s"\n'
            + KAFKA
            + POSTGRES,
            "heartbeat_interval must be below",
        ),
        ("[cluster]\nenabled = true\nworkers = 3\n" + KAFKA + POSTGRES, "unknown key"),
        ('[cluster]\nenabled = "yes"\n' + KAFKA + POSTGRES, "cluster.enabled"),
        # the producer's delivery timeout: a duration above kafka-python's 30 s request timeout
        (
            '[cluster]\nenabled = true\n[kafka]\ndelivery_timeout = "30s"\n' + KAFKA + POSTGRES,
            "kafka.delivery_timeout: Input should be greater than or equal to 31",
        ),
        (
            "[cluster]\nenabled = true\n[kafka]\ndelivery_timeout = true\n" + KAFKA + POSTGRES,
            "kafka.delivery_timeout",
        ),
    ],
)
def test_cluster_settings_are_checked(tmp_path, capsys, config, message):
    path = tmp_path / "cluster.toml"
    path.write_text(PRIVACY + config)
    assert main(["run", "--config", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_cluster_workers_refuse_until_end(tmp_path, capsys):
    """Refused before anything is opened (no broker, no database needed)."""
    path = tmp_path / "cluster.toml"
    path.write_text(PRIVACY + "[cluster]\nenabled = true\n" + KAFKA + POSTGRES)
    assert main(["run", "--config", str(path), "--until-end"]) == 2
    assert "--until-end is not available in cluster mode" in capsys.readouterr().err


def test_a_cluster_declaring_analysts_fails_at_start_with_one_line(tmp_path, capsys):
    """Per-analyst quotas run in one process and in local mode; a cluster refuses them before
    anything is opened."""
    path = tmp_path / "cluster.toml"
    analysts = "[analysts.growth]\nshare = 0.3\n"
    path.write_text(PRIVACY + "[cluster]\nenabled = true\n" + KAFKA + POSTGRES + analysts)
    assert main(["run", "--config", str(path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "analysts are not supported in cluster mode yet" in err[0]
