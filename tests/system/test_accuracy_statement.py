"""Issue #16 point 7: each release and ``guarantee`` state Corollary 4.7's ℓ∞ bound for the
active set at a stated failure probability, beside σ and the 95% half-width."""

import json

import numpy as np
import pytest

from streamfilter import Monitor
from streamfilter.privacy.accuracy import linf_bound, linf_bound_for_variance
from tests.support.cli import cli

HIST = {
    "query_id": "plans",
    "kind": "histogram",
    "feature": "plan",
    "categories": ["free", "pro", "team"],
    "clip": 1.0,
    "from_day": "2026-01-01",
}


def test_the_bound_is_corollary_4_7_for_the_calibrated_variance():
    for b, rho, d in ((4.0, 0.5, 1), (10.0, 0.0244, 3), (1.0, 2.0, 16)):
        for mech in ("gaussian", "discrete_gaussian"):
            ours = linf_bound_for_variance(b / (2 * rho), d, 0.05, mechanism=mech)
            assert ours == pytest.approx(linf_bound(b, rho, d, 0.05, mechanism=mech), rel=1e-12)


def test_each_release_states_the_bound_and_it_holds_at_its_failure_probability():
    """400 seeded days of a 3-bin histogram whose exact answer is known (every user stays
    active: cost 1 a day, huge budget): the bound fails in at most β of the releases (it is a
    tail bound, so far fewer: ~1% here); a σ too small would fail it much more often."""
    m = Monitor(b_norm=1e6, rho=0.5, test_seed=5)
    m.add_query(HIST)
    exact = np.array([3.0, 2.0, 1.0])
    plans = ["free"] * 3 + ["pro"] * 2 + ["team"]
    misses = 0
    for n in range(400):
        day = (np.datetime64("2026-01-01") + n).astype(str)
        events = [
            {"user_id": f"u{i}", "day": day, "values": {"plan": p}} for i, p in enumerate(plans)
        ]
        (rel,) = m.close_day(day, events)
        assert rel.linf_failure_probability == 0.05
        assert rel.linf_bound == m.params.linf_bound(3) > rel.ci95[0]
        misses += np.max(np.abs(np.array(rel.value) - exact)) > rel.linf_bound
    assert misses <= 0.05 * 400
    assert json.loads(rel.to_json())["linf_bound"] == rel.linf_bound


def test_guarantee_states_the_bound(tmp_path):
    (tmp_path / "c.toml").write_text("[privacy]\nb_norm = 4.0\nepsilon = 1.0\ndelta = 1e-6\n")
    out = json.loads(cli("guarantee", "--config", "c.toml", "--json", cwd=tmp_path).stdout)
    assert out["linf_failure_probability"] == 0.05
    assert out["linf_bound_d1"] >= linf_bound(
        4.0, out["rho"], 1, 0.05, mechanism="discrete_gaussian"
    )
    text = cli("guarantee", "--config", "c.toml", cwd=tmp_path).stdout
    assert f"accuracy (Corollary 4.7): each answer is within {out['linf_bound_d1']:.6g}" in text


def test_the_report_states_the_bound_of_each_query(tmp_path):
    from streamfilter.cli.report import ReportData, render_report
    from streamfilter.config import load_config

    (tmp_path / "c.toml").write_text("[privacy]\nb_norm = 4.0\nrho = 0.5\n")
    m = Monitor(b_norm=4.0, rho=0.5, test_seed=2)
    m.add_query(HIST)
    days = ["2026-01-01", "2026-01-02"]
    for day in days:
        m.close_day(day, [{"user_id": "u", "day": day, "values": {"plan": "pro"}}])
    data = ReportData(releases=m.releases, days=days, days_source="test")
    page = render_report(load_config(tmp_path / "c.toml"), data)
    bound = m.releases[-1].linf_bound
    assert 'class="linf"' in page and "(Corollary 4.7)" in page
    assert f"{bound:.4g}"[:4] in page.split('class="linf"', 1)[1][:80]
