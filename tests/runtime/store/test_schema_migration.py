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

OLD = Path(__file__).resolve().parents[2] / "system" / "data" / "old_state"
EXPECTED = json.loads((OLD / "expected.json").read_text())


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
