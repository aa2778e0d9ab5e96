"""Safe, strict privacy settings.

``b_norm`` and the privacy level are required; the privacy section is strictly typed; implausible
values warn; typos suggest the key meant; the telemetry budget defaults to a stated fraction of
the query budget and ``guarantee`` headlines the total.
"""

import json
import logging

import pytest

from streamfilter.config import ConfigError, load_config
from tests.support.cli import cli


def _load(tmp_path, text):
    (tmp_path / "c.toml").write_text(text)
    return load_config(tmp_path / "c.toml")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[privacy]\nrho = 0.5\n", "privacy.b_norm: required"),
        ("[privacy]\nb_norm = 4.0\n", "give rho, or epsilon and delta"),
        ("[privacy]\nb_norm = 4.0\nepsilon = 1.0\n", "give rho, or epsilon and delta"),
        ('[privacy]\nb_norm = 4.0\nrho = "0.5"\n', "privacy.rho: must be a number, not str"),
        ('[privacy]\nb_norm = "4"\nrho = 0.5\n', "privacy.b_norm: must be a number"),
        ("[privacy]\nb_norm = true\nrho = 0.5\n", "privacy.b_norm: must be a number, not bool"),
        ("[privacy]\nb_norm = 4.0\nrh0 = 0.5\n", "did you mean 'rho'?"),
        ("[privacy]\nb_norm = 4.0\nrho = 0.5\n[sink]\npaht = 'x'\n", "did you mean 'path'?"),
        ("[privacy]\nb_norm = 4.0\nrho = 0.5\n[telemetri]\nrho = 0.1\n", "'telemetry'?"),
    ],
)
def test_loose_privacy_settings_are_refused_naming_the_key(tmp_path, text, needle):
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, text)
    assert needle in str(exc.value)


def test_env_overrides_stay_text_and_are_parsed(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMFILTER_PRIVACY__RHO", "0.125")
    assert _load(tmp_path, "[privacy]\nb_norm = 4.0\nrho = 0.5\n").privacy.rho == 0.125


def test_implausible_values_warn(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="streamfilter.config"):
        _load(tmp_path, "[privacy]\nb_norm = 1e12\nrho = 0.5\n")
    assert "too large for answers" in caplog.text and "b_norm" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="streamfilter.config"):
        _load(
            tmp_path, "[privacy]\nb_norm = 4.0\nepsilon = 1.0\ndelta = 1e-3\npopulation = 50000\n"
        )
    assert "delta is above 1/population" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="streamfilter.config"):
        _load(
            tmp_path, "[privacy]\nb_norm = 4.0\nepsilon = 1.0\ndelta = 1e-6\npopulation = 50000\n"
        )
    assert caplog.text == ""


def test_telemetry_defaults_to_a_tenth_of_the_query_budget(tmp_path):
    s = _load(tmp_path, "[privacy]\nb_norm = 4.0\nepsilon = 1.0\ndelta = 1e-6\n")
    rho = s.privacy_params().rho
    assert s.telemetry.rho == pytest.approx(0.1 * rho) and s.telemetry.rho <= 0.1 * rho
    assert s.telemetry.stats_rho <= s.telemetry.rho / 5
    assert s.telemetry.active_set_rho <= 2 * s.telemetry.rho / 5
    s = _load(tmp_path, "[privacy]\nb_norm = 4.0\nrho = 0.5\n[telemetry]\nrho = 0.2\n")
    assert s.telemetry.rho == 0.2 and s.telemetry.stats_rho == pytest.approx(0.04)


def test_guarantee_headlines_the_total(tmp_path):
    (tmp_path / "c.toml").write_text("[privacy]\nb_norm = 4.0\nepsilon = 1.0\ndelta = 1e-6\n")
    text = cli("guarantee", "--config", "c.toml", cwd=tmp_path).stdout
    out = json.loads(cli("guarantee", "--config", "c.toml", "--json", cwd=tmp_path).stdout)
    headline = text.splitlines()[1]
    assert headline.strip().startswith("TOTAL")
    assert f"{out['rho_total_max']:.6g}-zCDP" in headline
    assert f"{out['epsilon_total_max']:.6g}" in headline
    assert out["rho_total_max"] <= 1.1 * out["rho"] * (1 + 1e-12)


def test_report_and_demo_headline_the_total(tmp_path):
    from streamfilter.cli.guarantee import with_telemetry
    from streamfilter.cli.report import render_report

    (tmp_path / "c.toml").write_text(
        "[privacy]\nb_norm = 4.0\nepsilon = 1.0\ndelta = 1e-6\n[state]\npath = 'state.db'\n"
    )
    settings = load_config(tmp_path / "c.toml")
    params = settings.privacy_params()
    total = with_telemetry(params.rho, settings.telemetry.rho, params.delta)
    page = render_report(settings)  # no state yet: the guarantee is data-independent
    headline = page.split('id="headline">', 1)[1].split("</p>", 1)[0]
    assert "in total" in headline and "(1, 1e-06)-DP</b>" not in headline
    assert f"{total['epsilon_total_max']:.4g}"[:4] in headline
    out = cli("demo", "--users", "300", "--days", "2", "--out", "d", cwd=tmp_path).stdout
    assert "0.55-zCDP per user in total" in out.splitlines()[1]


def test_a_spill_directory_must_exist_and_is_relative_to_the_config(tmp_path):
    base = "[privacy]\nb_norm = 4.0\nrho = 0.5\n[spill]\n"
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, base + 'dir = "absent"\n')
    assert "spill.dir: no such directory" in str(exc.value)
    (tmp_path / "scratch").mkdir()
    settings = _load(tmp_path, base + 'dir = "scratch"\nevent_ids_in_memory = 1000\n')
    assert settings.spill.dir == tmp_path / "scratch"
    assert settings.spill.event_ids_in_memory == 1000
    assert _load(tmp_path, "[privacy]\nb_norm = 4.0\nrho = 0.5\n").spill.dir is None


def test_the_spill_bound_defaults_to_the_index_default():
    from streamfilter.config import SpillSection
    from streamfilter.dedup.spill import DEFAULT_MEMORY_PAIRS

    assert SpillSection().event_ids_in_memory == DEFAULT_MEMORY_PAIRS


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("STREAMFILTER_PRIVCY__RHO", "did you mean STREAMFILTER_PRIVACY__RHO?"),
        ("STREAMFILTER_PRIVACY__RH0", "unknown key privacy.rh0 (did you mean STREAMFILTER_PRIV"),
        ("streamfilter_sink__paht", "did you mean STREAMFILTER_SINK__PATH?"),
        ("STREAMFILTER_NOPE__X", "unknown section 'nope'"),
    ],
)
def test_an_environment_override_naming_no_setting_is_refused_like_the_file(
    tmp_path, monkeypatch, name, needle
):
    """An override the settings would ignore is a configuration error, with a suggestion:
    the run it was meant for would otherwise go ahead under the value it was meant to replace."""
    monkeypatch.setenv(name, "0.1")
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, "[privacy]\nb_norm = 4.0\nrho = 0.5\n")
    assert needle in str(exc.value) and "0.1" not in str(exc.value)
    assert cli("guarantee", "--config", "c.toml", cwd=tmp_path, check=False).returncode == 2


def test_variables_that_are_not_overrides_and_real_overrides_are_accepted(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMFILTER_PG_PASSWORD", "x")  # a password source, not an override
    monkeypatch.setenv("STREAMFILTER_PRIVACY__RHO", "0.25")
    monkeypatch.setenv("STREAMFILTER_SOURCE__SYNTHETIC__USERS", "12")
    settings = _load(tmp_path, "[privacy]\nb_norm = 4.0\nrho = 0.5\n[source]\nkind = 'synthetic'\n")
    assert settings.privacy.rho == 0.25 and settings.source.synthetic.users == 12
