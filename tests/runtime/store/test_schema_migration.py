"""A state written before packed row checksums (``tests/system/data/old_state``: made by that version's
own ``streamfilter run``, see its ``make_state.py``) is converted when the writer opens it — in one
transaction, every row checked against its old checksum first — and loads exactly what that
version loaded; a damaged old row is refused, not re-checksummed; the read-only reader refuses
an unconverted state with one line naming the command that converts it."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from streamfilter.cli.main import main
from streamfilter.errors import StoreError
from streamfilter.runtime.store import SQLiteStateReader, SQLiteStateStore
from streamfilter.runtime.store.schema import (
    CRC_COLUMNS,
    ROW_FORMAT,
    CorruptRowError,
    legacy_row_crc,
    row_crc,
)
from tests.support.cli import cli

OLD = Path(__file__).resolve().parents[2] / "system" / "data" / "old_state"
EXPECTED = json.loads((OLD / "expected.json").read_text())
#: the configuration the old state was made with (``make_state.py``), its state folded early
CLI_CONFIG = """
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

[testing]
noise_seed = 7

[state]
path = "state.db"
"""


@pytest.fixture
def old_state(tmp_path) -> Path:
    for name in ("state.db", "state.db.seq"):
        shutil.copyfile(OLD / name, tmp_path / name)
    return tmp_path / "state.db"


def _rows(path: Path) -> dict[str, list[tuple]]:
    with sqlite3.connect(path) as db:
        return {
            table: db.execute(f"SELECT {', '.join(columns)}, crc FROM {table}").fetchall()
            for table, (columns, _key) in CRC_COLUMNS.items()
        }


def test_the_fixture_is_in_the_old_format(old_state):
    rows = _rows(old_state)
    assert rows["budgets"] and rows["budget_log"] and rows["releases"] and rows["queries"]
    for table_rows in rows.values():
        for *values, crc in table_rows:
            assert crc == legacy_row_crc(*values) != row_crc(*values)


def test_an_old_state_is_converted_on_open_and_loads_what_it_held(old_state):
    store = SQLiteStateStore(old_state)
    try:
        state = store.load()
    finally:
        store.close()
    assert state.last_closed_day == EXPECTED["last_closed_day"] and state.seq == EXPECTED["seq"]
    assert sorted([u, s, r] for u, s, r in state.budgets) == EXPECTED["budgets"]
    assert [q.decode() for q in state.queries] == EXPECTED["queries"]
    rows = _rows(old_state)
    for table_rows in rows.values():
        for *values, crc in table_rows:
            assert crc == row_crc(*values)
    assert ("row_format", ROW_FORMAT, row_crc("row_format", ROW_FORMAT)) in rows["meta"]
    with SQLiteStateReader(old_state) as reader:  # converted: the reader takes it
        assert reader.last_closed_day() == EXPECTED["last_closed_day"]
    reopened = SQLiteStateStore(old_state)  # a second open changes nothing
    reopened.close()
    assert _rows(old_state) == rows


def test_a_damaged_old_row_is_refused_and_the_state_left_as_it_was(old_state):
    with sqlite3.connect(old_state) as db:
        user = db.execute("SELECT user_id FROM budgets LIMIT 1").fetchone()[0]
        db.execute("UPDATE budgets SET spent_units = spent_units - 1 WHERE user_id = ?", (user,))
    before = _rows(old_state)
    with pytest.raises(CorruptRowError, match="table budgets does not match its checksum"):
        SQLiteStateStore(old_state)
    assert _rows(old_state) == before  # the transaction rolled back: nothing re-checksummed


def test_the_reader_refuses_an_old_state_naming_the_command(old_state, capsys):
    with pytest.raises(StoreError) as exc:
        SQLiteStateReader(old_state)
    message = str(exc.value)
    assert "\n" not in message and f"streamfilter migrate-state {old_state}" in message
    assert main(["migrate-state", str(old_state)]) == 0
    assert "row checksums in this version's format" in capsys.readouterr().out
    with SQLiteStateReader(old_state) as reader:
        assert reader.closed_days()[-1] == EXPECTED["last_closed_day"]


def test_a_new_state_is_written_in_the_packed_format(tmp_path):
    SQLiteStateStore(tmp_path / "new.db").close()
    meta = dict((k, v) for k, v, _crc in _rows(tmp_path / "new.db")["meta"])
    assert meta["row_format"] == ROW_FORMAT


UNIT = 2**20  # clip 1 at γ = 2^-10: one full contribution, in lattice units


def test_a_state_from_before_analysts_runs_with_analysts_its_spend_the_default_analysts(
    old_state,
):
    """The old state (every user spent b_norm = 3 before analysts existed) opens at schema
    version 4 under a configuration that declares ``growth`` with half of every budget: the old
    spend is the default analyst's, so the old users can afford nothing more from anyone (the
    global filter binds), while a new user gets growth's half and the default's half, each
    admitted only while it fits both its sub-budget and the user's budget — and the analysts'
    entries survive the budget log's fold into the table."""
    run = old_state.parent
    config = CLI_CONFIG.replace('"events.jsonl"', '"events-new.jsonl"')  # new input, new name
    config += "budget_log_max_rows = 0\n[analysts.growth]\nshare = 0.5\n"
    (run / "streamfilter.toml").write_text(config)
    growth = {
        "query_id": "g",
        "kind": "sum",
        "features": ["active"],
        "clip": 1.0,
        "from_day": "2026-01-06",
        "analyst": "growth",
    }
    queries = [*EXPECTED["queries"], json.dumps(growth)]
    (run / "queries.jsonl").write_text("".join(q + "\n" for q in queries))
    users = [u for u, _, _ in EXPECTED["budgets"]] + [f"new-{i}" for i in range(1, 21)]
    events = [
        {"user_id": u, "day": day, "values": {"active": 1}}
        for day in ("2026-01-06", "2026-01-07")
        for u in users
    ]
    (run / "events-new.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    cli("run", "--config", "streamfilter.toml", "--until-end", "--testing", cwd=run)
    with sqlite3.connect(old_state) as db:
        version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert version == ("4",)
        folded = "SELECT count(*) FROM budgets WHERE instr(user_id, char(31)) > 0"
        assert db.execute(folded).fetchone()[0] > 0  # growth's entries folded into the table
    spent = {}
    for user in ("u-1", "new-1"):
        out = json.loads(
            cli("budget", "--config", "streamfilter.toml", "--user", user, "--json", cwd=run).stdout
        )
        spent[user] = (
            out["spent_units"],
            {a: v["spent_units"] for a, v in out["analysts"].items()},
        )
    budget = 3 * UNIT
    assert spent["u-1"] == (budget, {"default": budget, "growth": 0})
    # day 6: active (default, 1 unit) and g (growth, 1 unit) fit; mix's (1, 0) would take the
    # default past its 1.5 units; day 7: nothing fits a sub-budget of 1.5 holding 1 already
    assert spent["new-1"] == (2 * UNIT, {"default": UNIT, "growth": UNIT})
    growth_releases = [
        json.loads(x) for x in (run / "releases.jsonl").read_text().splitlines() if '"g"' in x
    ]
    assert [r["analyst"] for r in growth_releases] == ["growth", "growth"]


def test_an_upgrade_refuses_a_stored_id_with_the_analysts_separator(old_state):
    with sqlite3.connect(old_state) as db:
        user = db.execute("SELECT user_id FROM budgets LIMIT 1").fetchone()[0]
        db.execute("UPDATE budgets SET user_id = ? WHERE user_id = ?", ("x\x1fy", user))
    with sqlite3.connect(old_state) as db:  # keep its old checksum valid: only the id is odd
        db.execute(
            "UPDATE budgets SET crc = ? WHERE user_id = ?",
            (
                legacy_row_crc(
                    *db.execute(
                        "SELECT user_id, spent_units, retired FROM budgets WHERE user_id = ?",
                        ("x\x1fy",),
                    ).fetchone()
                ),
                "x\x1fy",
            ),
        )
    with pytest.raises(StoreError, match="U\\+001F"):
        SQLiteStateStore(old_state)
