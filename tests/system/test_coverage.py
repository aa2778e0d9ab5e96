"""Coverage with every release, through the daemon, the report and Chromium.

The story: true daily actives are flat, but the released ``dau`` falls because
heavy users run out of budget — and a sum whose clip² exceeds ``b_norm`` admits nobody's full
contribution. Every query's release now says how many users it covers; the report plots it
beside the series, shades the days below ``[report] low_coverage_fraction`` and flags the
noise-only series (docs/design.md §2.11).
"""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from streamfilter.cli.main import main
from streamfilter.cli.report import write_report
from streamfilter.config import load_config
from streamfilter.errors import ConfigError
from streamfilter.runtime.store import SQLiteStateStore, TelemetryCharge
from tests.cli.test_report import CHROMIUM_FLAGS, decode_png
from tests.conftest import require
from tests.support.run_configs import file_run

HEAVY, LIGHT = 300, 300
DAYS = [f"2026-04-{d:02d}" for d in range(1, 13)]
QUERIES = [
    {"query_id": "dau", "kind": "sum", "features": ["active"], "clip": 1.0},
    {"query_id": "wide", "kind": "sum", "features": ["minutes"], "clip": 3.0},  # 9 > b_norm
]
CONFIG = file_run(
    """
[privacy]
b_norm = 6.0
rho = 2.0
delta = 1e-6
[metrics]
enabled = false
[testing]
noise_seed = 16
[telemetry]
rho = 1.0
coverage_rho = 0.5
population = false  # the exact coverage below is the plain filter's (no departure rule)
[report]
low_coverage_fraction = 0.6
"""
)


def write_days(d: Path, days) -> None:
    """Heavy users are active every day; light users every third day (days 3, 6, 9, 12)."""
    with open(d / "events.jsonl", "a") as fh:
        for k, day in enumerate(days, start=DAYS.index(days[0]) + 1):
            users = [f"h{i}" for i in range(HEAVY)]
            users += [f"l{i}" for i in range(LIGHT)] if k % 3 == 0 else []
            for u in users:
                fh.write(
                    json.dumps({"user_id": u, "day": day, "values": {"active": 1, "minutes": 0.5}})
                    + "\n"
                )


def setup_run(d: Path, days=DAYS) -> Path:
    (d / "streamfilter.toml").write_text(CONFIG)
    (d / "queries.jsonl").write_text(
        "".join(json.dumps({**q, "from_day": DAYS[0]}) + "\n" for q in QUERIES)
    )
    write_days(d, days)
    return d / "streamfilter.toml"


def exact_dau_coverage(k: int) -> int:
    """Users counted by day k who can afford a full ``dau`` contribution at its close.

    ``dau`` costs 1 of B = 6 a day and maps to the threshold 1.5 (the smallest ``B/2^j ≥ 1``);
    ``wide`` admits the small ``minutes = 0.5`` (cost 0.25) under skip. Heavy users have spent
    1.25·k after day k (remaining < 1.5 from day 4); light users 1.25·(k // 3), counted from
    day 3, remaining < 1.5 from day 12."""
    heavy = HEAVY if 6 - 1.25 * k >= 1.5 else 0
    light = LIGHT if k >= 3 and 6 - 1.25 * (k // 3) >= 1.5 else 0
    return heavy + light


def releases(d: Path, query_id: str) -> list[dict]:
    rel = [json.loads(x) for x in (d / "releases.jsonl").read_text().splitlines()]
    return [r for r in rel if r["query_id"] == query_id]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("coverage")
    cfg = setup_run(d)
    assert main(["run", "--config", str(cfg), "--until-end", "--testing"]) == 0
    return d


def test_every_release_says_how_many_users_it_covers(run_dir):
    """The released dau falls (heavy users run out) while coverage falls with it: the estimate
    is within twice its stated 95% half-width of the exact count on every day."""
    dau = releases(run_dir, "dau")
    assert [r["day"] for r in dau] == DAYS
    for k, r in enumerate(dau, start=1):
        c = r["coverage"]
        assert set(c) == {"users", "sigma", "ci95", "fraction", "counted_users", "threshold"}
        assert c["threshold"] == 1.5 and c["sigma"] > 0 and c["ci95"] > 0
        assert abs(c["users"] - exact_dau_coverage(k)) <= 2 * c["ci95"], (k, c)
    # day 3: everyone counted so far can afford it; day 4: heavy users cannot (≈ half)
    assert dau[2]["coverage"]["fraction"] > 0.9 and dau[3]["coverage"]["fraction"] < 0.6
    assert dau[0]["value"][0] > 250 and dau[10]["value"][0] < 50  # the released "trend"


def test_a_query_nobody_can_afford_is_exactly_zero_and_marked(run_dir):
    for r in releases(run_dir, "wide"):  # clip² = 9 > b_norm = 6
        c = r["coverage"]
        assert (c["users"], c["sigma"], c["ci95"], c["threshold"]) == (0, 0.0, 0.0, None)


def test_coverage_is_charged_once_and_resumes_across_a_restart(tmp_path):
    """Six days, a restart, six more: the tracker resumes from the state (one charge in the
    telemetry ledger), and the releases are byte for byte those of one uninterrupted run."""
    whole = tmp_path / "whole"
    split = tmp_path / "split"
    whole.mkdir(), split.mkdir()
    cfg = setup_run(whole)
    assert main(["run", "--config", str(cfg), "--until-end", "--testing"]) == 0
    cfg = setup_run(split, DAYS[:6])
    assert main(["run", "--config", str(cfg), "--until-end", "--testing"]) == 0
    write_days(split, DAYS[6:])
    assert main(["run", "--config", str(cfg), "--until-end", "--testing"]) == 0
    assert (split / "releases.jsonl").read_bytes() == (whole / "releases.jsonl").read_bytes()
    store = SQLiteStateStore(split / "state.db")
    try:
        assert [(c.kind, c.rho) for c in store.telemetry_ledger()] == [("coverage", 0.5)]
        assert b'"exact"' in store.load().coverage_state  # stored (sensitive), never published
    finally:
        store.close()
    assert b'"exact"' not in (split / "releases.jsonl").read_bytes()
    # the description cannot change during a run
    (split / "streamfilter.toml").write_text(
        CONFIG.replace("coverage_rho = 0.5", "coverage_rho = 0.4")
    )
    with pytest.raises(ConfigError, match="cannot change during a run"):
        from streamfilter.runtime.app import build_daemon

        build_daemon(load_config(split / "streamfilter.toml"), follow=False, allow_test_seed=True)


def test_a_telemetry_budget_that_cannot_pay_for_coverage_refuses_to_start(tmp_path, capsys):
    cfg = setup_run(tmp_path, DAYS[:2])
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        store.charge_telemetry(TelemetryCharge("budget_stats", 0.9, b"{}"), 1.0)
    finally:
        store.close()
    assert main(["run", "--config", str(cfg), "--until-end", "--testing"]) == 2
    err = capsys.readouterr().err
    assert "telemetry.coverage_rho" in err and "coverage = false" in err
    assert not (tmp_path / "releases.jsonl").exists()


def test_coverage_is_on_by_default_in_central_mode_and_off_in_local_mode(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[privacy]\nb_norm = 4.0\nrho = 0.5\n[queries]\nkind = "none"\n')
    t = load_config(cfg).telemetry
    assert t.coverage is True and t.coverage_rho == pytest.approx(0.4 * t.rho)
    assert t.rho == pytest.approx(0.05)  # a tenth of the query ρ: the headline total is 0.55
    local = tmp_path / "l.toml"
    local.write_text(cfg.read_text() + '[mode]\nkind = "local"\n')
    assert load_config(local).telemetry.coverage is False
    local.write_text(local.read_text() + "[telemetry]\ncoverage = true\n")
    with pytest.raises(ConfigError, match="not available in local mode"):
        load_config(local)
    cfg.write_text(cfg.read_text() + "[telemetry]\ncoverage_epoch_days = 100\n")
    with pytest.raises(ConfigError, match="power of two"):
        load_config(cfg)


def test_the_guarantee_headlines_the_total_and_names_the_coverage_share(run_dir, capsys):
    assert main(["guarantee", "--config", str(run_dir / "streamfilter.toml"), "--json"]) == 0
    g = json.loads(capsys.readouterr().out)
    assert g["rho_coverage"] == 0.5 and g["rho_telemetry_max"] == 1.0
    assert g["rho_total_max"] == pytest.approx(3.0)
    assert main(["guarantee", "--config", str(run_dir / "streamfilter.toml")]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[1].startswith("  TOTAL 3-zCDP")
    assert "coverage with every release 0.5 for the whole run" in text


# ---------------------------------------------------------------------------- the report
def test_the_report_plots_coverage_and_flags_low_and_noise_only_series(run_dir, tmp_path):
    page = write_report(load_config(run_dir / "streamfilter.toml"), tmp_path / "r.html").read_text()
    dau = page[page.index('id="q-dau"') : page.index('id="q-wide"')]
    wide = page[page.index('id="q-wide"') : page.index('id="telemetry"')]
    assert dau.count('<svg class="plot"') == 2  # the values and the coverage beside them
    assert "coverage (noisy users who can afford a full contribution)" in dau
    # days 4–12: coverage fraction (≈ 300 of 600, then 0) below 0.6 → shaded on both plots
    assert dau.count('class="low-coverage"') == 2 * 9
    assert "9 day(s) with coverage below 0.6" in dau
    # day 12: nobody left who can afford it — that day alone is flagged, not the series
    assert "Partial answers on 1 day(s)" in dau and 'class="tag partial"' not in dau
    assert "noise only" not in page.lower()  # small vectors are still answered: never noise
    assert 'class="tag partial"' in wide and 'class="flag partial"' in wide
    assert "Answers users with ‖x‖ ≤ " in wide and "clip² of wide exceeds B_norm" in wide
    assert wide.count('class="low-coverage"') == 2 * 12  # nobody can afford it: every day


@pytest.mark.timeout(240)
def test_the_report_shows_coverage_in_headless_chromium(run_dir, tmp_path):
    chromium = shutil.which("chromium")
    require(
        chromium is not None,
        "chromium not found; install it with deploy/install-test-deps.sh (Debian package 'chromium')",
    )
    assert chromium is not None
    page = write_report(load_config(run_dir / "streamfilter.toml"), tmp_path / "report.html")
    url = page.resolve().as_uri()
    base = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(
        [*base, "--dump-dom", url], capture_output=True, timeout=180, text=True
    ).stdout
    # after rendering: both queries' coverage plots, the shaded low-coverage days, the flags
    assert dom.count("coverage (noisy users who can afford a full contribution)") >= 2
    assert dom.count('class="low-coverage"') == 2 * 9 + 2 * 12
    assert dom.count('class="flag partial"') == 2  # dau's last day; every day of wide
    assert dom.count('class="tag partial"') == 1  # the series flagged: wide
    shot = tmp_path / "report.png"
    out = subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1200,2400", url],
        capture_output=True,
        timeout=180,
    )
    assert out.returncode == 0 and shot.exists(), out.stderr.decode()[-2000:]
    rgb = decode_png(shot.read_bytes())[:, :, :3].reshape(-1, 3).astype(int)

    def pixels(colour, tol=6):
        return int((np.abs(rgb - colour).sum(axis=1) <= tol).sum())

    assert pixels((44, 160, 44)) > 200  # the green coverage line is drawn
    # the low-coverage shading: #e8590c at 14% over the plot area #fbfbfd ≈ (248, 228, 219)
    assert pixels((248, 228, 219), tol=9) > 2000
    # the partial-answers banner background #fdecea
    assert pixels((253, 236, 234), tol=3) > 2000


def test_a_series_whose_coverage_is_indistinguishable_from_zero_is_flagged(tmp_path):
    """Coverage within its 95% half-width of 0 on every day (users who can afford it: none,
    though clip² ≤ b_norm): the series is tagged noise only; a healthy one is not."""
    from streamfilter.cli.report import ReportData, render_report
    from streamfilter.engine.contract import Coverage, Release

    cfg = tmp_path / "c.toml"
    cfg.write_text('[privacy]\nb_norm = 4.0\nrho = 0.5\n[queries]\nkind = "none"\n')
    settings = load_config(cfg)

    def rel(day, qid, users):
        cov = Coverage(users, 10.0, 20.0, None, 15, 1.0)
        return Release(day, qid, [qid], [0.5], 2.0, [4.0], "discrete_gaussian", 1.0, coverage=cov)

    days = ["2026-05-01", "2026-05-02", "2026-05-03"]
    releases = [rel(d, "ghost", u) for d, u in zip(days, (3, -12, 18), strict=True)]
    releases += [rel(d, "fine", 400) for d in days]
    page = render_report(settings, ReportData(releases, days, "test"))
    ghost = page[page.index('id="q-ghost"') : page.index('id="q-fine"')]
    fine = page[page.index('id="q-fine"') : page.index('id="telemetry"')]
    assert 'class="tag partial"' in ghost and "Partial answers:</b> on every day of ghost" in ghost
    assert 'class="flag partial"' not in fine and 'class="tag partial"' not in fine
    assert "answers users with ‖x‖ ≤ 1 in full" in ghost


def test_coverage_turned_on_mid_run_counts_the_users_the_state_already_holds(tmp_path):
    """Six days without coverage, then six with it: the users already in the ledger are counted
    with the first day that has coverage (each once), so the estimate matches the exact count
    as in a run that had coverage from the start."""
    cfg = setup_run(tmp_path, DAYS[:6])
    cfg.write_text(CONFIG.replace("coverage_rho = 0.5", "coverage = false"))
    assert main(["run", "--config", str(cfg), "--until-end", "--testing"]) == 0
    write_days(tmp_path, DAYS[6:])
    cfg.write_text(CONFIG)
    assert main(["run", "--config", str(cfg), "--until-end", "--testing"]) == 0
    dau = releases(tmp_path, "dau")
    assert all("coverage" not in r for r in dau[:6])
    for k, r in enumerate(dau[6:], start=7):
        c = r["coverage"]
        assert abs(c["users"] - exact_dau_coverage(k)) <= 2 * c["ci95"], (k, c)
        assert abs(c["counted_users"] - (HEAVY + LIGHT)) <= 2 * c["ci95"], (k, c)
