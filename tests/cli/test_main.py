"""End to end through the real CLI on files: config, run, rejects, guarantee, restart."""

import json
import random
import signal
import subprocess
import sys
import time

import pytest

from streamfilter.runtime.store import SQLiteStateStore
from tests.support.cli import (
    cli,
    fold_budget_log_early,
    releases,
    stored_budgets,
    write_world,
)


def test_end_to_end_on_files(tmp_path):
    write_world(tmp_path)
    proc = cli("run", "--config", "streamfilter.toml", "--until-end", "--testing", cwd=tmp_path)
    rel = releases(tmp_path)
    keys = [(r["day"], r["query_id"]) for r in rel]
    assert keys == [
        ("2026-01-01", "active"),
        ("2026-01-02", "active"),
        ("2026-01-02", "plans"),
        ("2026-01-03", "active"),
        ("2026-01-03", "plans"),
        ("2026-01-03", "mix"),
        ("2026-01-04", "active"),
        ("2026-01-04", "plans"),
        ("2026-01-05", "active"),
    ]
    for r in rel:
        assert r["mechanism"] == "discrete_gaussian" and len(r["value"]) == len(r["labels"]) == len(
            r["ci95"]
        )
        # values are on the lattice
        assert all(float(v / r["granularity"]).is_integer() for v in r["value"])
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert sorted({r["reason"] for r in rejects}) == [
        "invalid_day",
        "invalid_user_id",
        "malformed_json",
        "unknown_query_kind",
    ]
    assert all("raw" in r for r in rejects)
    summary = json.loads(proc.stderr.strip().splitlines()[-1])["summary"]
    assert summary["rejected"] == len(rejects) == 16 and summary["days_closed"] == 5


def test_run_refuses_test_seed_without_flag(tmp_path):
    write_world(tmp_path)
    proc = cli("run", "--config", "streamfilter.toml", "--until-end", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "noise_seed" in proc.stderr


def test_config_errors_name_the_key(tmp_path):
    (tmp_path / "c.toml").write_text("[privacy]\nb_norm = -1\nrho = 0.5\n[sink]\nkind = 'file'\n")
    proc = cli("guarantee", "--config", "c.toml", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert "privacy.b_norm" in proc.stderr and "sink" in proc.stderr
    (tmp_path / "c.toml").write_text("[privacy]\nb_norm = 4\nrho = 0.5\ngranularity = 0.3\n")
    proc = cli("guarantee", "--config", "c.toml", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "granularity" in proc.stderr


def test_env_overrides_the_file(tmp_path):
    (tmp_path / "c.toml").write_text("[privacy]\nb_norm = 4\nrho = 0.5\n")
    out = json.loads(
        cli(
            "guarantee",
            "--config",
            "c.toml",
            "--json",
            cwd=tmp_path,
            env={"STREAMFILTER_PRIVACY__RHO": "0.125"},
        ).stdout
    )
    assert out["rho"] == 0.125 and abs(out["sigma"] - (4 / 0.25) ** 0.5) < 1e-3


def test_guarantee_json_keys_and_calibration(tmp_path):
    (tmp_path / "c.toml").write_text("[privacy]\nb_norm = 4\nepsilon = 1.0\ndelta = 1e-6\n")
    out = json.loads(cli("guarantee", "--config", "c.toml", "--json", cwd=tmp_path).stdout)
    for key in ("rho", "sigma", "b_norm", "mechanism", "delta", "epsilon"):
        assert key in out
    assert out["mechanism"] == "discrete_gaussian" and out["delta"] == 1e-6
    assert out["epsilon"] <= 1.0 + 1e-9  # calibrated so the reported ε meets the target
    text = cli("guarantee", "--config", "c.toml", cwd=tmp_path).stdout
    assert "zCDP" in text


def test_restart_after_sigkill_publishes_identical_releases_without_double_debit(tmp_path):
    """Kill `run` mid-way at several points; the restarted runs must end with exactly the
    releases of an uninterrupted run under the same test seed, and the same budgets.

    ``mid_compaction:2``: killed while the upkeep between two day closes folds the budget log
    into the table for the second time (``budget_log_max_rows = 0``); the budgets it ends with
    equal those of the reference run, which never folds."""
    ref = tmp_path / "ref"
    ref.mkdir()
    write_world(ref, days=8, users=200, bad=False)
    started = time.monotonic()
    cli("run", "--config", "streamfilter.toml", "--until-end", "--testing", cwd=ref)
    ref_seconds = time.monotonic() - started
    expected = (ref / "out" / "releases.jsonl").read_bytes()
    ref_budgets = stored_budgets(ref / "state.db")
    assert len(ref_budgets) == 200 and all(s > 0 for _, s, _ in ref_budgets)

    for point in ("after_commit:3", "after_publish:2", "before_mark_sent:4", "mid_compaction:2"):
        work = tmp_path / point.replace(":", "_")
        work.mkdir()
        write_world(work, days=8, users=200, bad=False)
        if point.startswith("mid_compaction"):
            fold_budget_log_early(work)
        crashed = cli(
            "run",
            "--config",
            "streamfilter.toml",
            "--until-end",
            "--testing",
            cwd=work,
            env={"STREAMFILTER_CRASH_AT": point},
            check=False,
        )
        assert crashed.returncode == -signal.SIGKILL
        cli("run", "--config", "streamfilter.toml", "--until-end", "--testing", cwd=work)
        assert (work / "out" / "releases.jsonl").read_bytes() == expected, point
        assert stored_budgets(work / "state.db") == ref_budgets, point

    # a real SIGKILL at a random moment of a slower run
    work = tmp_path / "random"
    work.mkdir()
    write_world(work, days=8, users=200, bad=False)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamfilter",
            "run",
            "--config",
            "streamfilter.toml",
            "--until-end",
            "--testing",
        ],
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(random.uniform(0.4, 0.9) * ref_seconds)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    cli("run", "--config", "streamfilter.toml", "--until-end", "--testing", cwd=work)
    assert (work / "out" / "releases.jsonl").read_bytes() == expected
    assert stored_budgets(work / "state.db") == ref_budgets


def test_second_process_on_the_same_state_refuses(tmp_path):
    write_world(tmp_path)

    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        proc = cli(
            "run",
            "--config",
            "streamfilter.toml",
            "--until-end",
            "--testing",
            cwd=tmp_path,
            check=False,
        )
    finally:
        store.close()
    assert proc.returncode == 3 and "another streamfilter process" in proc.stderr


def test_changed_privacy_config_on_existing_state_is_refused(tmp_path):
    write_world(tmp_path)
    cli("run", "--config", "streamfilter.toml", "--until-end", "--testing", cwd=tmp_path)
    proc = cli(
        "run",
        "--config",
        "streamfilter.toml",
        "--until-end",
        "--testing",
        cwd=tmp_path,
        env={"STREAMFILTER_PRIVACY__B_NORM": "30"},
        check=False,
    )
    assert proc.returncode == 2 and "cannot change during a run" in proc.stderr


@pytest.mark.timeout(120)
def test_demo_runs_small(tmp_path):
    """The table is the demo's output: the daemon's log lines go to a file beside the releases,
    not to the terminal ahead of the table."""
    proc = cli("demo", "--users", "2000", "--days", "6", "--out", str(tmp_path), cwd=tmp_path)
    assert "zCDP" in proc.stdout and "2026-01-06" in proc.stdout
    assert " INFO " not in proc.stderr, proc.stderr[:500]
    log = (tmp_path / "demo.log").read_text()
    assert " INFO streamfilter." in log and str(tmp_path / "demo.log") in proc.stdout


def test_guarantee_adds_the_telemetry_budget_by_zcdp_composition(tmp_path):
    """budget-stats and the active-set estimate spend a separate, enforced [telemetry] budget:
    the run's total per user is at most ρ + telemetry.rho (zCDP composes additively), and the
    guarantee says so, with its ε, rounded up."""
    from fractions import Fraction

    from streamfilter.privacy.accounting import epsilon_from_rho_cks

    (tmp_path / "c.toml").write_text(
        "[privacy]\nb_norm = 4\nrho = 0.1\ndelta = 1e-6\n[telemetry]\nrho = 0.2\n"
    )
    out = json.loads(cli("guarantee", "--config", "c.toml", "--json", cwd=tmp_path).stdout)
    assert out["rho_telemetry_max"] == 0.2
    assert Fraction(out["rho_total_max"]) >= Fraction(0.1) + Fraction(0.2)  # never rounded down
    assert out["rho_total_max"] <= 0.30000000000000010
    assert out["epsilon_total_max"] == epsilon_from_rho_cks(out["rho_total_max"], 1e-6)
    assert out["epsilon_total_max"] > out["epsilon"]
    text = cli("guarantee", "--config", "c.toml", cwd=tmp_path).stdout
    assert "telemetry" in text and "0.3-zCDP" in text
