"""Nothing silent that loses data.

A configured query source that does not exist is a configuration error (exit 2) like a missing
events file; a run without any query source needs an explicit ``[queries] kind = "none"``; a
standing query can start at the first open day (``"from_day": "next"``) instead of being refused.
"""

import json

import pytest

from streamfilter import Monitor
from streamfilter.engine.contract import Reject
from tests.support.cli import cli, releases, write_world


def _config(tmp_path, queries_section: str) -> None:
    from tests.support.cli import CONFIG

    head, _, tail = CONFIG.partition("[queries]")
    rest = tail.split("[sink]", 1)[1]
    (tmp_path / "streamfilter.toml").write_text(head + queries_section + "\n[sink]" + rest)


def test_missing_query_file_is_exit_2_and_creates_no_state(tmp_path):
    write_world(tmp_path)
    _config(tmp_path, '[queries]\nkind = "file"\npath = "no-such-queries.jsonl"\n')
    proc = cli(
        "run",
        "--config",
        "streamfilter.toml",
        "--until-end",
        "--testing",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2
    assert "queries.path" in proc.stderr and "no-such-queries.jsonl" in proc.stderr
    assert not (tmp_path / "state.db").exists()  # refused before the state opened
    assert not (tmp_path / "out" / "releases.jsonl").exists()


def test_no_queries_section_is_exit_2_unless_kind_none(tmp_path):
    write_world(tmp_path)
    _config(tmp_path, "")
    proc = cli(
        "run",
        "--config",
        "streamfilter.toml",
        "--until-end",
        "--testing",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2 and 'kind = "none"' in proc.stderr
    _config(tmp_path, '[queries]\nkind = "none"\n')
    proc = cli("run", "--config", "streamfilter.toml", "--until-end", "--testing", cwd=tmp_path)
    summary = json.loads(proc.stderr.strip().splitlines()[-1])["summary"]
    assert summary["days_closed"] == 5 and summary["releases_published"] == 0


def test_a_query_from_next_starts_at_the_first_open_day_after_a_restart(tmp_path):
    write_world(tmp_path)
    (tmp_path / "queries.jsonl").write_text("")
    cli("run", "--config", "streamfilter.toml", "--until-end", "--testing", cwd=tmp_path)
    # days 1-5 are closed; a dated query for them is refused, "next" starts on day 6
    late = {"query_id": "late", "kind": "sum", "features": ["active"], "clip": 1.0}
    with (tmp_path / "queries.jsonl").open("a") as fh:
        fh.write(json.dumps({**late, "from_day": "2026-01-01"}) + "\n")
        fh.write(json.dumps({**late, "query_id": "next", "from_day": "next"}) + "\n")
    day6 = [{"user_id": f"u-{i}", "day": "2026-01-06", "values": {"active": 1}} for i in range(9)]
    with (tmp_path / "events.jsonl").open("a") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in day6)
    cli("run", "--config", "streamfilter.toml", "--until-end", "--testing", cwd=tmp_path)
    rel = [(r["day"], r["query_id"]) for r in releases(tmp_path)]
    assert rel == [("2026-01-06", "next")]
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    closed = [r for r in rejects if r["reason"] == "closed_day"]
    assert len(closed) == 1 and '"next"' in closed[0]["detail"]


def test_monitor_from_next_and_re_announcing_it_is_idempotent():
    m = Monitor(b_norm=4.0, rho=0.5, test_seed=1)
    q = {"query_id": "a", "kind": "sum", "features": ["active"], "clip": 1.0, "from_day": "next"}
    m.close_day("2026-01-01", [])
    first = m.add_query(q)
    assert str(first.from_day) == "2026-01-02"
    m.close_day("2026-01-02", [])
    assert m.add_query(q) is first  # the same standing query, not a conflicting duplicate
    with pytest.raises(Reject) as exc:
        m.add_query({**q, "from_day": "2026-01-02", "query_id": "b"})
    assert exc.value.reason == "closed_day"
