"""``make bench-quick`` (``python -m benchmarks.run --quick``), the benchmark suite's CI smoke,
finishes within a minute on CI's machine (2 cores) and writes well-formed results: every module
ran, none failed, and every entry that is measured in quick mode was measured — the Kafka entry
on the session's broker (``KAFKA_BOOTSTRAP``), so it is never skipped here. This bounds the
suite's wall time; it asserts nothing about any benchmark's value.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.run import MODULES

ROOT = Path(__file__).resolve().parents[2]
#: the CI budget of the whole quick suite, wall clock (Makefile ``bench-quick``)
QUICK_BUDGET_S = 60.0
#: modules --quick does not measure, each with the reason its skipped entry gives
NOT_IN_QUICK = {"bench_cluster": "not in --quick"}


def _run_quick(out: Path, bootstrap: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    """The quick suite in its own process group (its modules are grandchildren: a timeout ends
    them all), as CI runs it; wall seconds and the finished process."""
    env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "PYTHONUNBUFFERED": "1"}
    args = [sys.executable, "-m", "benchmarks.run", "--quick", "--out-dir", str(out)]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=2 * QUICK_BUDGET_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"bench-quick still running after {2 * QUICK_BUDGET_S:.0f} s:\n{stdout}")
    wall = time.monotonic() - t0
    return wall, subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.alone  # its wall-clock budget is CI's 2 cores, not what another worker leaves
@pytest.mark.timeout(300)
def test_bench_quick_finishes_within_a_minute_with_well_formed_results(kafka_bootstrap, tmp_path):
    wall, proc = _run_quick(tmp_path, kafka_bootstrap)
    timings = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("# "))
    assert proc.returncode == 0, f"{timings}\n{proc.stderr[-3000:]}"
    entries = json.loads((tmp_path / "results-quick.json").read_text())

    modules = [m.rsplit(".", 1)[-1] for m in MODULES]
    assert sorted({e["module"] for e in entries}) == sorted(modules)
    failed = [(e["module"], e["skipped"]) for e in entries if e.get("failed")]
    assert not failed, f"{failed}\n{proc.stderr[-3000:]}"
    for e in entries:
        assert e["quick"] is True and e["machine"]["cores"] >= 1, e
        assert isinstance(e["name"], str) and e["name"] and isinstance(e["baseline"], str), e
        assert _number(e["module_seconds"]), e
        if e["module"] in NOT_IN_QUICK:
            assert NOT_IN_QUICK[e["module"]] in e["skipped"], e
            continue
        assert not e.get("skipped"), e  # e.g. the Kafka entry: the session's broker is there
        assert _number(e["value"]) and _number(e["baseline_value"]), e
        assert _number(e["ratio"]) and e["ratio"] > 0, e
    table = (tmp_path / "results-quick.md").read_text()
    assert all(f"`{e['name']}`" in table for e in entries)

    assert wall < QUICK_BUDGET_S, f"bench-quick took {wall:.1f} s:\n{timings}"


def test_a_failed_module_says_why_in_its_entry(tmp_path, monkeypatch):
    """A module that raises becomes a failed entry whose reason ends with the exception's own
    line, not only an exit status buried under the other modules' logs (CI failed that way)."""
    from benchmarks.run import _run_module

    (tmp_path / "bench_broken_probe.py").write_text(
        "import sys\n"
        "def run(quick=False):\n"
        "    print('noise from the module', file=sys.stderr)\n"
        "    raise RuntimeError('the day was released before the kill')\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    [entry] = _run_module("bench_broken_probe", quick=True)
    assert entry["failed"] is True and entry["name"] == "bench_broken_probe"
    assert entry["skipped"].startswith("failed: exit status 1: ")
    assert entry["skipped"].endswith("RuntimeError: the day was released before the kill")
