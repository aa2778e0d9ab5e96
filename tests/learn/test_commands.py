"""``streamfilter learn reproduce|individual`` (CI's reduced version of the reproductions):
the output formats, the row selection, and the HTML report rendered in headless Chromium."""

import argparse
import json
import shutil
import subprocess

import numpy as np
import pytest

from streamfilter.learn.commands import add_learn_commands
from streamfilter.learn.reproduce import PAPER, settings
from tests.conftest import require

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _run(argv):
    parser = argparse.ArgumentParser()
    add_learn_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_reproduce_writes_the_rows_of_the_selected_cells(tmp_path):
    out = tmp_path / "rows.json"
    argv = ["learn", "reproduce", "--dataset", "digits", "--trials", "2", "--seed", "0"]
    argv += ["--epsilon", "0.3", "--regime", "tuned", "--regime", "suboptimal_clip"]
    assert _run([*argv, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["epsilon"], r["regime"]) for r in rows] == [(0.3, "tuned"), (0.3, "suboptimal_clip")]
    for r in rows:
        assert set(r) >= {
            "epsilon",
            "regime",
            "gd_mean",
            "gd_sd",
            "filtered_mean",
            "filtered_sd",
            "trials",
        }
        assert r["trials"] == 2
        assert 40.0 < r["gd_mean"] <= 100.0 and 40.0 < r["filtered_mean"] <= 100.0
        assert r["gd_sd"] >= 0 and r["filtered_sd"] >= 0
        assert (r["paper_gd_mean"], r["paper_filtered_mean"]) == PAPER[(0.3, r["regime"])]
        plan = r["plan"]
        assert plan["epsilon_gd"] <= 0.3 * (1 + 1e-9) and plan["epsilon_filtered"] <= 0.3 * (
            1 + 1e-9
        )
    # the suboptimal-clip cell multiplies C by 1.5 and divides σ by 1.5 (same noise σC), k ÷ 2.25
    tuned, clip = (r["plan"] for r in rows)
    assert clip["clip"] == 1.5 * tuned["clip"] and clip["sigma"] == tuned["sigma"] / 1.5
    assert clip["gd_steps"] == pytest.approx(tuned["gd_steps"] / 2.25, abs=1)


def test_every_cell_is_calibrated_to_its_target():
    cells = settings()
    assert len(cells) == 9
    for cell in cells:
        factor = 2.0 if cell.epsilon == 1.0 else 1.5
        tuned = next(c.plan for c in cells if c.epsilon == cell.epsilon and c.regime == "tuned")
        if cell.regime == "suboptimal_noise":
            assert cell.plan.sigma == pytest.approx(tuned.sigma / factor)
            assert cell.plan.clip == tuned.clip
        assert cell.plan.rho_gd <= cell.plan.rho_target
        assert cell.plan.rho_filter + cell.plan.rho_checks <= cell.plan.rho_target


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    d = tmp_path_factory.mktemp("individual")
    assert (
        _run(
            [
                "learn",
                "individual",
                "--steps",
                "36",
                "--exact-sample",
                "60",
                "--seed",
                "2",
                "--json",
                str(d / "study.json"),
                "--html",
                str(d / "report.html"),
            ]
        )
        == 0
    )
    return d, json.loads((d / "study.json").read_text())


def test_individual_study_output(study):
    _, s = study
    assert s["epsilon"]["max"] <= s["worst_case_epsilon"] * (1 + 1e-9)
    assert sum(s["epsilon"]["histogram"]["counts"]) == s["n_train"]
    assert len(s["per_class"]) == 10
    assert s["estimated_vs_exact"]["examples"] == 60
    assert -1.0 <= s["estimated_vs_exact"]["pearson_r"] <= 1.0
    cost = s["rounding_cost"]
    assert cost["rdp_evaluations_rounded"] <= 101 < cost["rdp_evaluations_unrounded"]
    rel = s["released_statistics"]
    assert set(rel["quantiles"]) == {"0.1", "0.3", "0.5", "0.7", "0.9"}
    assert rel["mean"] != rel["nonprivate_mean"]
    assert np.isfinite(s["loss_correlation"]["pearson_r_epsilon_log_loss"])


@pytest.mark.timeout(240)
def test_individual_report_renders_in_headless_chromium(study, tmp_path):
    chromium = shutil.which("chromium")
    require(
        chromium is not None,
        "chromium not found; install it with deploy/install-test-deps.sh (Debian package 'chromium')",
    )
    assert chromium is not None
    d, _ = study
    url = (d / "report.html").resolve().as_uri()
    base = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "report.png"
    out = subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1200,1800", url],
        capture_output=True,
        timeout=180,
    )
    assert out.returncode == 0 and shot.exists(), out.stderr.decode()[-2000:]
    from tests.cli.test_report import decode_png

    img = decode_png(shot.read_bytes())
    assert img.shape[:2] == (1800, 1200)
    rgb = img[:, :, :3].reshape(-1, 3).astype(int)
    # blue data marks and the red worst-case / diagonal lines are on screen
    for colour in ((31, 119, 180), (214, 39, 40)):
        assert (np.abs(rgb - colour).sum(axis=1) <= 60).sum() > 200, colour
    dom = subprocess.run(
        [*base, "--dump-dom", url], capture_output=True, timeout=180, text=True
    ).stdout
    assert dom.count("<svg") == 5 and dom.count('class="series"') == 5
    assert "Estimated against exact" in dom
