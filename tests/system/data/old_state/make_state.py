"""Writes ``state.db`` (and its sequence mirror ``state.db.seq``) and ``expected.json`` here: a
SQLite state in the row format of streamfilter before packed rows (each row's ``crc`` taken over
the ``repr`` of its values), for ``tests/runtime/store/test_schema_migration.py``.

Run with that version on the path (commit 98485a0 or earlier)::

    git worktree add /tmp/old 98485a0 && cd /tmp/old && make .venv/.installed
    /tmp/old/.venv/bin/python tests/system/data/old_state/make_state.py   # from this checkout

Five days of a few users whose ids ``repr`` spells unlike their text (a quote, a backslash,
non-ASCII), three queries, a budget log of two rows per fold (so both ``budgets`` and
``budget_log`` hold rows), a telemetry charge; ``expected.json`` is what that version loads.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
USERS = ["u-1", "it's", 'a"b', "back\\slash", "é-2", "😀", "u-7"]
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
path = "releases.jsonl"

[state]
path = "state.db"
budget_log_max_rows = 2

[testing]
noise_seed = 7
"""
QUERIES = [
    {"query_id": "active", "kind": "sum", "features": ["active"], "clip": 1.0, "from_day": "2026-01-01"},
    {"query_id": "plans", "kind": "histogram", "feature": "plan", "categories": ["free", "pro"], "clip": 1.0, "from_day": "2026-01-02"},
    {"query_id": "mix", "kind": "linear", "weights": {"active": [1, 0], "minutes": [0, 0.01]}, "clip": 2.0, "from_day": "2026-01-03"},
]  # fmt: skip


def main() -> None:
    from streamfilter.runtime.store import SQLiteStateStore

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        (run / "streamfilter.toml").write_text(CONFIG)
        (run / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
        lines = []
        for d in range(5):
            for i, user in enumerate(USERS):
                if (i + d) % 4:
                    values = {"active": 1, "minutes": 10.0 * i, "plan": ["free", "pro"][i % 2]}
                    lines.append({"user_id": user, "day": f"2026-01-{d + 1:02d}", "values": values})
        (run / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        cmd = [sys.executable, "-m", "streamfilter", "run", "--config", "streamfilter.toml"]
        subprocess.run([*cmd, "--until-end", "--testing"], cwd=run, check=True)
        for name in ("state.db", "state.db.seq"):
            shutil.copyfile(run / name, HERE / name)
    with sqlite3.connect(HERE / "state.db") as db:  # small pages: a small file, the same rows
        db.execute("PRAGMA journal_mode=DELETE")
        db.execute("PRAGMA page_size=4096")
        db.execute("VACUUM")
    store = SQLiteStateStore(HERE / "state.db")
    try:
        state = store.load()
    finally:
        store.close()
    expected = {
        "last_closed_day": state.last_closed_day,
        "seq": state.seq,
        "budgets": sorted([u, s, r] for u, s, r in state.budgets),
        "queries": [q.decode() for q in state.queries],
    }
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")
    (HERE / "state.db.lock").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
