"""Every refused query is loud, and ``check`` refuses what ``run`` refuses."""

from __future__ import annotations

import json
import re

from tests.cli.test_main import cli

CONFIG = """
[privacy]
b_norm = 4
rho = 0.1
[source]
kind = "file"
path = "events.jsonl"
[queries]
kind = "file"
path = "queries.jsonl"
[sink]
kind = "file"
path = "out/releases.jsonl"
[limits]
max_live_queries = 2
[metrics]
enabled = false
"""

QUERIES = [
    {"query_id": "count", "kind": "count", "features": ["active"], "clip": 1},
    {"query_id": "negative", "kind": "sum", "features": ["active"], "clip": -1},
    {"query_id": "us-date", "kind": "sum", "features": ["active"], "from_day": "09/01/2026"},
    {"query_id": "ok-1", "kind": "sum", "features": ["active"], "clip": 1},
    {"query_id": "ok-2", "kind": "sum", "features": ["active"], "clip": 1},
    {"query_id": "third", "kind": "sum", "features": ["active"], "clip": 1},  # over the limit
]
REFUSED = {
    "count": "unknown_query_kind",
    "negative": "invalid_query",
    "us-date": "invalid_query",
    "third": "too_many_queries",
}


def _world(tmp):
    (tmp / "c.toml").write_text(CONFIG)
    queries = [{**q, "from_day": q.get("from_day", "2026-01-01")} for q in QUERIES]
    (tmp / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (tmp / "events.jsonl").write_text(
        "".join(
            json.dumps({"user_id": f"u{u}", "day": f"2026-01-0{d}", "values": {"active": 1}}) + "\n"
            for d in (1, 2)
            for u in range(5)
        )
    )


def test_run_warns_of_each_refused_query_and_check_refuses_the_same(tmp_path):
    _world(tmp_path)
    run = cli("run", "--config", "c.toml", "--until-end", cwd=tmp_path)
    warned = dict(
        re.findall(r"WARNING streamfilter\.daemon: query (\S+) refused \((\w+)\)", run.stderr)
    )
    assert warned == REFUSED, run.stderr
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert sorted(r["reason"] for r in rejects) == sorted(REFUSED.values())
    line = next(x for x in (run.stdout + run.stderr).splitlines() if x.startswith('{"summary"'))
    summary = json.loads(line)["summary"]
    assert summary["queries_registered"] == 2

    check = cli("check", "--config", "c.toml", cwd=tmp_path, check=False)
    assert check.returncode == 2
    reported = re.findall(r"ERROR: queries\.jsonl:(\d+): (\w+):", check.stdout)
    ids = [q["query_id"] for q in QUERIES]
    assert {ids[int(n) - 1]: reason for n, reason in reported} == REFUSED, check.stdout
