"""One guarantee everywhere: Monitor's repr and guarantee(), ``streamfilter guarantee``, the
report, the demo and /metrics state the same total ρ for every combination of features."""

import itertools
import json
import re

import pytest
from prometheus_client import CollectorRegistry

from streamfilter.cli.main import main
from streamfilter.cli.report import ReportData, render_report
from streamfilter.config import load_config
from streamfilter.engine.monitor import Monitor
from streamfilter.runtime.observe.http import metrics_endpoint
from streamfilter.telemetry.active_set import ActiveSetSpec
from streamfilter.telemetry.coverage import CoverageSpec
from streamfilter.telemetry.population import PopulationSpec

# exact binary fractions, so that every surface's sum is the same float
RHO, COVERAGE, ACTIVE = 0.5, 0.125, 0.0625


def _daemon_surfaces(cfg, capsys) -> dict[str, float]:
    settings = load_config(cfg)
    assert main(["guarantee", "--config", str(cfg), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)["rho_total_max"]
    page = render_report(settings, ReportData([], [], "test"))
    headline = re.search(r"<b>([0-9.]+)-zCDP in total</b>", page)
    assert headline is not None
    reg = CollectorRegistry()
    metrics_endpoint(settings, settings.privacy_params(), registry=reg)
    gauge = reg.get_sample_value("streamfilter_privacy_guarantee_rho")
    assert gauge is not None
    return {"guarantee": cli, "report": float(headline.group(1)), "metrics": gauge}


@pytest.mark.parametrize(
    ("coverage", "active_set", "population"),
    # population None: unset, on by default in central mode (it costs no ρ either way)
    list(itertools.product([False, True], [False, True], [False, True, None])),
)
def test_every_surface_states_the_same_total(tmp_path, capsys, coverage, active_set, population):
    telemetry = (COVERAGE if coverage else 0.0) + (ACTIVE if active_set else 0.0)
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[privacy]\nb_norm = 4.0\nrho = {RHO}\n[queries]\nkind = "none"\n'
        f"[telemetry]\nrho = {telemetry or 0.25}\ncoverage = {str(coverage).lower()}\n"
        f"active_set = {str(active_set).lower()}\n"
        + ("" if population is None else f"population = {str(population).lower()}\n")
        + (f"coverage_rho = {COVERAGE}\n" if coverage else "")
        + (f"active_set_rho = {ACTIVE}\n" if active_set else "")
    )
    surfaces = _daemon_surfaces(cfg, capsys)
    expected = RHO + (telemetry or 0.25)
    assert set(surfaces.values()) == {expected}, surfaces
    if telemetry:  # the Monitor has no budget-stats: its total is what its estimates charge
        m = Monitor(
            b_norm=4.0,
            rho=RHO,
            coverage=CoverageSpec(rho=COVERAGE) if coverage else None,
            active_set=ActiveSetSpec(rho=ACTIVE) if active_set else None,
            population=None if population is False else PopulationSpec(),
        )
        assert m.guarantee().rho == expected
        assert repr(m).startswith(f"<Monitor {expected:g}-zCDP per user in total")


def test_the_demo_prints_the_total_of_its_own_configuration(tmp_path, capsys):
    assert main(["demo", "--users", "500", "--days", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    printed = re.search(r"guarantee: ([0-9.]+)-zCDP per user in total", out)
    assert printed is not None
    surfaces = _daemon_surfaces(tmp_path / "streamfilter.toml", capsys)
    assert set(surfaces.values()) == {float(printed.group(1))}, surfaces
    assert "population" in out
