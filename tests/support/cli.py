"""What the CLI tests share: a small world on files (config, queries, events with rejects) and the
real ``python -m streamfilter`` run as a subprocess."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from streamfilter.runtime.store import SQLiteStateStore

CONFIG = """
[privacy]
b_norm = 3.0
rho = 0.5
granularity = 0.0009765625
exhaustion = "skip"

[source]
kind = "file"
path = "events.jsonl"

[queries]
kind = "file"
path = "queries.jsonl"

[sink]
kind = "file"
path = "out/releases.jsonl"

[state]
path = "state.db"

[testing]
noise_seed = 11
"""

QUERIES = [
    {
        "query_id": "active",
        "kind": "sum",
        "features": ["active"],
        "clip": 1.0,
        "from_day": "2026-01-01",
    },
    {
        "query_id": "plans",
        "kind": "histogram",
        "feature": "plan",
        "categories": ["free", "pro", "team"],
        "clip": 1.0,
        "from_day": "2026-01-02",
        "until_day": "2026-01-04",
    },
    {
        "query_id": "mix",
        "kind": "linear",
        "weights": {"active": [1, 0], "minutes": [0, 0.01]},
        "clip": 2.0,
        "from_day": "2026-01-03",
        "until_day": "2026-01-03",
    },
]


def write_world(tmp: Path, days: int = 5, users: int = 30, bad: bool = True) -> None:
    (tmp / "streamfilter.toml").write_text(CONFIG)
    (tmp / "queries.jsonl").write_text(
        "".join(json.dumps(q) + "\n" for q in QUERIES) + '{"query_id": "x", "kind": "median"}\n'
    )
    lines = []
    for d in range(days):
        day = f"2026-01-{d + 1:02d}"
        for u in range(users):
            if (u * 7 + d) % 3:
                lines.append(
                    json.dumps(
                        {
                            "user_id": f"u-{u}",
                            "day": day,
                            "values": {
                                "active": 1,
                                "minutes": u * 3.0,
                                "plan": ["free", "pro", "team"][u % 3],
                            },
                            "event_id": f"e{d}-{u}",
                        }
                    )
                )
        if bad:
            lines += [
                "{oops",
                json.dumps({"user_id": "", "day": day, "values": {}}),
                '{"user_id": "u-1", "day": "2026-02-31", "values": {}}',
            ]
    (tmp / "events.jsonl").write_text("\n".join(lines) + "\n")


def cli(*args, cwd, env=None, check=True, timeout=120):
    proc = subprocess.run(
        [sys.executable, "-m", "streamfilter", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def releases(tmp):
    return [json.loads(x) for x in (tmp / "out" / "releases.jsonl").read_text().splitlines()]


def stored_budgets(state: Path) -> list[tuple[str, int, bool]]:
    """Every user's ``(user_id, spent_units, retired)`` as the store loads them (log and table)."""
    store = SQLiteStateStore(state)
    try:
        return sorted(store.load().budgets)
    finally:
        store.close()


def fold_budget_log_early(tmp: Path) -> None:
    """``budget_log_max_rows = 0``: the budget log is folded into the table whenever it holds
    more rows than the table (the first time at the first day that charges anyone)."""
    config = tmp / "streamfilter.toml"
    text = config.read_text()
    assert '[state]\npath = "state.db"\n' in text
    config.write_text(
        text.replace('path = "state.db"\n', 'path = "state.db"\nbudget_log_max_rows = 0\n')
    )


#: a log line (``logging``'s default format here), as opposed to the error a run ends with
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING) ")


def error_lines(stderr: str) -> list[str]:
    """stderr without the log lines a run writes before it fails (where it serves metrics, or
    that another test's daemon holds the metrics port): the error lines alone."""
    return [x for x in stderr.strip().splitlines() if not LOG_LINE.match(x)]
