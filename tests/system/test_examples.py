"""The example configurations under examples/ are shipped and each runs."""

import json
import shutil
from pathlib import Path

import pytest

from tests.support.cli import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _copy(tmp_path):
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    return tmp_path / "examples"


def test_the_examples_the_docs_name_exist():
    assert {p.name for p in EXAMPLES.glob("*.toml")} == {
        "analysts.toml",
        "file.toml",
        "kafka.toml",
        "local.toml",
    }


def test_file_example_checks_and_runs(tmp_path):
    d = _copy(tmp_path)
    cli("check", "--config", "file.toml", cwd=d)
    proc = cli("run", "--config", "file.toml", "--until-end", cwd=d)
    summary = json.loads(proc.stderr.strip().splitlines()[-1])["summary"]
    assert summary["days_closed"] == 3 and summary["releases_published"] == 6
    rel = [json.loads(x) for x in (d / "out" / "releases.jsonl").read_text().splitlines()]
    assert {r["query_id"] for r in rel} == {"active", "plans"}
    assert all(r["linf_bound"] > r["ci95"][0] for r in rel)


def test_local_example_simulates(tmp_path):
    d = _copy(tmp_path)
    cli("check", "--config", "local.toml", cwd=d)
    cli("simulate-local", "--config", "local.toml", cwd=d, timeout=300)
    assert (d / "out-local" / "contributions.jsonl").stat().st_size > 0  # the default path
    rel = (d / "out-local" / "releases.jsonl").read_text().splitlines()
    assert len(rel) == 10 and all(
        json.loads(r)["mechanism"] == "local_discrete_gaussian" for r in rel
    )


def test_kafka_example_loads_and_checks_without_a_broker(tmp_path):
    """The Kafka run itself needs a broker (tests/runtime/io/test_kafka_daemon.py runs that path);
    the example's configuration and guarantee are checked here."""
    d = _copy(tmp_path)
    out = cli("check", "--config", "kafka.toml", cwd=d).stdout
    assert "queries come from kafka" in out and "OK" in out
    g = json.loads(cli("guarantee", "--config", "kafka.toml", "--json", cwd=d).stdout)
    assert g["epsilon"] <= 1.0 + 1e-9


def test_analysts_example_checks_runs_and_reports_per_analyst(tmp_path):
    """Two analysts' quotas: check reports each one's daily cost and affordable days, every
    release names its analyst, no user spends beyond an analyst's sub-budget, the report
    groups the panels by analyst, and budget-stats reads one analyst's sub-budget."""
    d = _copy(tmp_path)
    check = json.loads(cli("check", "--config", "analysts.toml", "--json", cwd=d).stdout)
    per_analyst = {a["analyst"]: a for a in check["analysts"]}
    assert set(per_analyst) == {"billing", "default", "growth"}
    assert per_analyst["growth"]["queries"] == ["active"]
    assert per_analyst["growth"]["full_days_affordable"] == 9  # floor(1.2 / 0.35²), exact units
    cli("run", "--config", "analysts.toml", "--until-end", cwd=d)
    rel = [json.loads(x) for x in (d / "out-analysts" / "releases.jsonl").read_text().splitlines()]
    owners = {r["query_id"]: r.get("analyst") for r in rel}
    assert owners == {"active": "growth", "plans": "billing", "active_all": None}
    budget = json.loads(
        cli("budget", "--config", "analysts.toml", "--user", "u-0", "--json", cwd=d).stdout
    )
    spent = {a: v["spent"] for a, v in budget["analysts"].items()}
    assert sum(spent.values()) == pytest.approx(budget["spent"])
    assert spent["growth"] > 0 and spent["billing"] > 0 and spent["default"] > 0
    assert all(v["spent"] <= v["sub_budget"] for v in budget["analysts"].values())
    cli("report", "--config", "analysts.toml", "--out", "report.html", cwd=d)
    page = (d / "report.html").read_text()
    order = [page.index(f'id="analyst-{a}"') for a in ("billing", "default", "growth")]
    assert order == sorted(order) and order[0] < page.index('id="q-plans"') < order[1]
    stats = json.loads(
        cli(
            "budget-stats", "--config", "analysts.toml", "--analyst", "growth", "--json", cwd=d
        ).stdout
    )
    assert stats["analyst"] == "growth" and stats["rho_charged"] > 0


def test_local_example_runs_with_an_analyst_declared(tmp_path):
    """Local mode with a quota: the server registers the analyst's query, the simulated devices
    hold it to the analyst's sub-budget (client.core.answer_day), and its releases name it."""
    d = _copy(tmp_path)
    config = d / "local.toml"
    config.write_text(
        config.read_text().replace('path = "queries.jsonl"', 'path = "queries-local.jsonl"')
        + "\n[analysts.growth]\nshare = 0.25\n"
    )
    queries = [json.loads(x) for x in (d / "queries.jsonl").read_text().splitlines()]
    queries[0]["analyst"] = "growth"
    (d / "queries-local.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    cli("simulate-local", "--config", "local.toml", cwd=d, timeout=300)
    rel = [json.loads(r) for r in (d / "out-local" / "releases.jsonl").read_text().splitlines()]
    named = {r["query_id"]: r.get("analyst") for r in rel}
    assert named == {queries[0]["query_id"]: "growth", queries[1]["query_id"]: None}
