"""No query that cannot be answered goes unnoticed.

At registration (``run``, ``Monitor``) a query whose full contribution can never be admitted
(clip² > B_norm under skip/retire), or that a user active every day can afford on fewer than
``[queries] min_affordable_days`` days, is warned about with the numbers (and still registered:
the choice documented in the README). ``streamfilter check`` validates config, paths and query
file and prints per query its cost, the days affordable and the overlaps.
"""

import json
import logging

from streamfilter import Monitor
from tests.support.cli import CONFIG, cli, write_world

SPEND = {"query_id": "spend", "kind": "sum", "features": ["minutes"], "clip": 50.0}


def _queries(tmp_path, *extra):
    from tests.support.cli import QUERIES

    lines = [*QUERIES, *extra]
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in lines))


def test_check_prints_costs_days_overlaps_and_warnings(tmp_path):
    write_world(tmp_path)
    _queries(tmp_path, {**SPEND, "from_day": "2026-01-01"})
    out = json.loads(cli("check", "--config", "streamfilter.toml", "--json", cwd=tmp_path).stdout)
    assert out["problems"] == []
    rows = {r["query_id"]: r for r in out["queries"]}
    assert rows["active"]["cost_full_contribution"] == 1.0
    assert rows["active"]["full_days_affordable"] == 3  # b_norm = 3
    assert rows["mix"]["full_days_affordable"] == 0 and rows["spend"]["full_days_affordable"] == 0
    assert {tuple(o["queries"]) for o in out["overlaps"]} >= {("active", "mix"), ("mix", "spend")}
    spend = next(w for w in out["warnings"] if w.startswith("query spend"))
    assert "clip² = 2500 exceeds b_norm = 3" in spend
    assert any(w.startswith("query active") and "after 3 day(s)" in w for w in out["warnings"])
    text = cli("check", "--config", "streamfilter.toml", cwd=tmp_path).stdout
    assert "OK: the configuration would run" in text and "WARNING: query spend" in text


def test_check_fails_on_missing_paths_and_bad_query_lines(tmp_path):
    write_world(tmp_path)  # its query file has a line of unknown kind
    (tmp_path / "events.jsonl").unlink()
    proc = cli("check", "--config", "streamfilter.toml", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert "ERROR: source.path: events file not found" in proc.stdout
    assert "ERROR: queries.jsonl:4: unknown_query_kind" in proc.stdout


def test_run_warns_at_registration_naming_the_numbers(tmp_path):
    write_world(tmp_path)
    _queries(tmp_path, {**SPEND, "from_day": "2026-01-01"})
    (tmp_path / "streamfilter.toml").write_text(CONFIG + "[metrics]\nenabled = false\n")
    proc = cli("run", "--config", "streamfilter.toml", "--until-end", "--testing", cwd=tmp_path)
    assert (
        "WARNING streamfilter.daemon: query spend: clip² = 2500 exceeds b_norm = 3" in proc.stderr
    )


def test_monitor_warns_once_per_query(caplog):
    m = Monitor(b_norm=4.0, rho=0.5, test_seed=1)
    with caplog.at_level(logging.WARNING, logger="streamfilter.monitor"):
        m.add_query({**SPEND, "from_day": "2026-01-01"})
        m.add_query({**SPEND, "from_day": "2026-01-01"})  # identical re-registration
        m.add_query({**SPEND, "query_id": "ok", "clip": 0.5, "from_day": "2026-01-01"})
    assert caplog.text.count("query spend: clip² = 2500 exceeds b_norm = 4") == 1
    assert "query ok" not in caplog.text  # 16 full days


def test_check_flags_coordinates_no_event_has_with_a_suggestion(tmp_path):
    """A misspelled feature or a category in the wrong case would be released as noise only."""
    write_world(tmp_path)
    typo = {"query_id": "typo", "kind": "sum", "features": ["activ"], "clip": 1.0}
    case = {
        "query_id": "case",
        "kind": "histogram",
        "feature": "plan",
        "categories": ["Pro", "team"],
        "clip": 1.0,
    }
    _queries(tmp_path, {**typo, "from_day": "2026-01-01"}, {**case, "from_day": "2026-01-01"})
    out = json.loads(cli("check", "--config", "streamfilter.toml", "--json", cwd=tmp_path).stdout)
    noise = [w for w in out["warnings"] if "noise only" in w]
    assert len(noise) == 2
    assert "'activ'" in noise[0] and "did you mean 'active'?" in noise[0]
    assert "'plan=Pro'" in noise[1] and "did you mean 'plan=pro'?" in noise[1]


def test_check_reports_event_values_of_another_type_than_the_queries_read(tmp_path):
    """``check --events FILE``: a feature a query sums that holds strings, or one a histogram
    counts that holds numbers, is reported with how many events (the run rejects them as
    ``wrong_type``)."""
    write_world(tmp_path)
    sessions = {"query_id": "sessions", "kind": "sum", "features": ["sessions"], "clip": 1.0}
    _queries(tmp_path, {**sessions, "from_day": "2026-01-01"})
    events = tmp_path / "typed.jsonl"
    rows = [{"sessions": "1", "plan": "pro"}, {"sessions": 2, "plan": 3}, {"sessions": "3"}]
    events.write_text(
        "".join(
            json.dumps({"user_id": f"u{i}", "day": "2026-01-01", "values": v}) + "\n"
            for i, v in enumerate(rows)
        )
    )
    args = ("check", "--config", "streamfilter.toml", "--events", str(events), "--json")
    out = json.loads(cli(*args, cwd=tmp_path).stdout)
    typed = sorted(w for w in out["warnings"] if "wrong_type" in w)
    assert len(typed) == 2, out["warnings"]
    assert "'plan'" in typed[0] and "1 of 3 events" in typed[0] and "hold a number" in typed[0]
    assert "'sessions'" in typed[1] and "2 of 3 events" in typed[1] and "hold a string" in typed[1]
