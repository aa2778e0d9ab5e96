"""``[telemetry] population``: on by default where it applies, refused where it cannot run
(docs/design.md §2.12)."""

import pytest

from streamfilter.config import load_config

KAFKA = '[source]\nkind = "kafka"\ntopic = "events"\n'
POSTGRES = '[state]\nkind = "postgres"\nurl = "postgresql://u@127.0.0.1:1/db"\n'


def _settings(tmp_path, privacy: str = "", rest: str = ""):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[privacy]\nb_norm = 4.0\nrho = 0.5\n{privacy}{rest}")
    return load_config(cfg)


@pytest.mark.parametrize(
    ("privacy", "rest", "on"),
    [
        ("", "", True),  # central, discrete Gaussian, skip: the defaults
        ('exhaustion = "retire"\n', "", False),  # the departure rule would replace the policy
        ('exhaustion = "clip"\n', "", False),
        ('mechanism = "gaussian"\n', "", False),  # needs the discrete Gaussian
        ("", '[mode]\nkind = "local"\n', False),  # no per-user state on the server
        ("", "[cluster]\nenabled = true\n" + KAFKA + POSTGRES, False),  # no departed partials
        ("", "[telemetry]\npopulation = false\n", False),  # the opt-out
        ("", "[analysts.ads]\nshare = 0.5\n", False),  # quotas are not in the departure rule
        ('exhaustion = "retire"\n', "[telemetry]\npopulation = true\n", True),  # chosen
    ],
)
def test_unset_it_is_on_only_where_it_applies(tmp_path, privacy, rest, on):
    assert _settings(tmp_path, privacy, rest).telemetry.population is on


@pytest.mark.parametrize(
    ("privacy", "rest", "message"),
    [
        ('mechanism = "gaussian"\n', "", "privacy.mechanism = 'gaussian'"),
        ("", "[cluster]\nenabled = true\n" + KAFKA + POSTGRES, "cluster.enabled = true"),
        ("", '[mode]\nkind = "local"\n', "not available in local mode"),
    ],
)
def test_population_true_where_it_cannot_run_is_refused(tmp_path, privacy, rest, message):
    with pytest.raises(ValueError, match=message):
        _settings(tmp_path, privacy, "[telemetry]\npopulation = true\n" + rest)
