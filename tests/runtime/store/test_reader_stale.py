"""Stale-store detection (docs/design.md §5): a restored older copy of the state is refused.

Every committed day increments the store's monotonic sequence; after each commit the sequence is
mirrored outside the database in ``<state>.seq`` (atomic rename). A mirror *ahead* of the store
means the state is older than what was already committed — and maybe published — so starting
from it would re-draw noise for released (day, query) pairs and forget spent budget: refused with
exit 4. A mirror *behind* the store (crash between the commit and the mirror write) is repaired.
The release file is a second mirror outside the state directory: a stale state restored together
with its ``.seq`` file is still caught because the sink holds releases of later days.

Everything runs through the real CLI, real SQLite files and real SIGKILLs.
"""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
from pathlib import Path

import pytest

from streamfilter.runtime.store import SQLiteStateStore, StaleStoreError, StoreError
from tests.support.cli import CONFIG, QUERIES, cli, error_lines

DAYS = 8
USERS = 60
RUN = ("run", "--config", "streamfilter.toml", "--until-end", "--testing")


def event_lines(days: range) -> list[str]:
    lines = []
    for d in days:
        day = f"2026-01-{d + 1:02d}"
        for u in range(USERS):
            if (u * 7 + d) % 3:
                values = {"active": 1, "minutes": u * 3.0, "plan": ["free", "pro", "team"][u % 3]}
                lines.append(json.dumps({"user_id": f"u-{u}", "day": day, "values": values}))
    return lines


def setup(tmp: Path, days: range = range(DAYS)) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "streamfilter.toml").write_text(CONFIG)
    (tmp / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    (tmp / "events.jsonl").write_text("".join(line + "\n" for line in event_lines(days)))
    return tmp


def append_days(tmp: Path, days: range) -> None:
    with open(tmp / "events.jsonl", "a") as fh:
        fh.write("".join(line + "\n" for line in event_lines(days)))


def release_bytes(tmp: Path) -> bytes:
    return (tmp / "out" / "releases.jsonl").read_bytes()


def keys(data: bytes) -> list[tuple[str, str]]:
    return [(r["day"], r["query_id"]) for r in map(json.loads, data.splitlines())]


def mirror(tmp: Path) -> dict:
    return json.loads((tmp / "state.db.seq").read_text())


def store_seq(tmp: Path) -> int:
    # a read-write connection: a read-only one would leave a -wal file behind on close
    db = sqlite3.connect(tmp / "state.db")
    try:
        return int(db.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()[0])
    finally:
        db.close()


def snapshot(tmp: Path, name: str, files: tuple[str, ...] = ("state.db",)) -> Path:
    """Copy the state (after a clean exit the WAL is checkpointed into state.db)."""
    assert not (tmp / "state.db-wal").exists()
    dest = tmp / name
    dest.mkdir()
    for f in files:
        shutil.copy2(tmp / f, dest / f)
    return dest


def restore(tmp: Path, snap: Path) -> None:
    for suffix in ("-wal", "-shm"):
        (tmp / f"state.db{suffix}").unlink(missing_ok=True)
    for f in snap.iterdir():
        shutil.copy2(f, tmp / f.name)


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> bytes:
    """The releases of one uninterrupted run over all days (test seed)."""
    ref = setup(tmp_path_factory.mktemp("ref"))
    cli(*RUN, cwd=ref)
    data = release_bytes(ref)
    assert len(set(keys(data))) == len(keys(data)) > DAYS
    return data


def test_restored_stale_copy_is_refused_then_the_newest_state_resumes(tmp_path, expected):
    work = setup(tmp_path / "w", range(3))
    cli(*RUN, cwd=work)
    assert mirror(work)["seq"] == store_seq(work) == 3
    after_day_3 = snapshot(work, "after-day-3", ("state.db", "state.db.seq"))
    append_days(work, range(3, 6))
    cli(*RUN, cwd=work)
    assert mirror(work) == {
        "state_id": mirror(after_day_3)["state_id"],
        "seq": 6,
        "last_closed_day": "2026-01-06",
    }
    newest = snapshot(work, "after-day-6", ("state.db", "state.db.seq"))
    published = release_bytes(work)

    # 1. the old database alone is put back: the .seq mirror is ahead of it
    restore(work, after_day_3)
    (work / "state.db.seq").write_bytes((newest / "state.db.seq").read_bytes())
    append_days(work, range(6, DAYS))
    proc = cli(*RUN, cwd=work, check=False)
    assert proc.returncode == 4, proc.stderr
    (line,) = error_lines(proc.stderr)  # one clear line
    assert "is stale" in line and "holds 3 committed days" in line and "6 days" in line
    assert "state.db.seq" in line and "restore the newest copy" in line
    assert "u-" not in line  # no user ids, no values
    assert release_bytes(work) == published  # nothing was published
    assert store_seq(work) == 3  # and nothing was written

    # 2. the whole state directory is put back (database and its .seq): the release file,
    # outside the state, already holds later days
    restore(work, after_day_3)
    assert mirror(work)["seq"] == 3
    proc = cli(*RUN, cwd=work, check=False)
    assert proc.returncode == 4, proc.stderr
    # one clear error line, last, after the INFO start-up and shutdown lines (logging is on by default)
    *logs, line = proc.stderr.strip().splitlines()
    assert line.startswith("streamfilter: ") and not any("ERROR" in x for x in logs)
    assert all(" INFO " in x or " WARNING " in x for x in logs) and "u-" not in "".join(logs)
    assert "is stale" in line and "already holds releases of 2026-01-06" in line
    assert "2026-01-03" in line
    assert release_bytes(work) == published and store_seq(work) == 3

    # 3. the newest state is restored: the run resumes and ends exactly like an uninterrupted one
    restore(work, newest)
    cli(*RUN, cwd=work)
    assert release_bytes(work) == expected
    assert len(keys(expected)) == len(set(keys(expected)))  # every (day, query) exactly once
    assert mirror(work)["seq"] == store_seq(work) == DAYS


def test_crash_between_commit_and_mirror_write_is_accepted_and_repaired(tmp_path, expected):
    work = setup(tmp_path / "w")
    crashed = cli(*RUN, cwd=work, env={"STREAMFILTER_CRASH_AT": "before_mirror:3"}, check=False)
    assert crashed.returncode == -signal.SIGKILL
    assert store_seq(work) == 3 and mirror(work)["seq"] == 2  # the mirror is behind
    cli(*RUN, cwd=work)
    assert release_bytes(work) == expected
    assert mirror(work)["seq"] == store_seq(work) == DAYS


def test_mirror_behind_is_repaired_at_open(tmp_path):
    work = setup(tmp_path / "w", range(2))
    cli(*RUN, cwd=work)
    text = (work / "state.db.seq").read_text()
    behind = dict(json.loads(text), seq=1, last_closed_day="2026-01-01")
    (work / "state.db.seq").write_text(json.dumps(behind))
    SQLiteStateStore(work / "state.db").close()
    assert json.loads((work / "state.db.seq").read_text()) == json.loads(text)


def test_deleted_or_emptied_state_is_refused_not_started_from_empty(tmp_path):
    work = setup(tmp_path / "w", range(2))
    cli(*RUN, cwd=work)
    published = release_bytes(work)
    for damage in ("delete", "truncate"):
        saved = (work / "state.db").read_bytes()
        if damage == "delete":
            (work / "state.db").unlink()
        else:
            (work / "state.db").write_bytes(b"")
        proc = cli(*RUN, cwd=work, check=False)
        assert proc.returncode == 4, (damage, proc.stderr)
        (line,) = error_lines(proc.stderr)
        assert "is not the state recorded in" in line and "committed 2 days" in line, damage
        assert release_bytes(work) == published
        (work / "state.db").write_bytes(saved)
    cli(*RUN, cwd=work)  # the real state is back: accepted


def test_unreadable_mirror_is_refused(tmp_path):
    SQLiteStateStore(tmp_path / "state.db").close()
    (tmp_path / "state.db.seq").write_text('{"seq": "many"}')
    with pytest.raises(StoreError, match="unreadable") as info:
        SQLiteStateStore(tmp_path / "state.db")
    assert not isinstance(info.value, StaleStoreError)
    # the lock was released: once the operator removed the mirror, the state opens
    (tmp_path / "state.db.seq").unlink()
    SQLiteStateStore(tmp_path / "state.db").close()
    assert json.loads((tmp_path / "state.db.seq").read_text())["seq"] == 0


def test_a_state_that_never_committed_a_day_may_be_replaced(tmp_path):
    SQLiteStateStore(tmp_path / "state.db").close()
    first = json.loads((tmp_path / "state.db.seq").read_text())
    (tmp_path / "state.db").unlink()
    SQLiteStateStore(tmp_path / "state.db").close()
    second = json.loads((tmp_path / "state.db.seq").read_text())
    assert second["seq"] == first["seq"] == 0 and second["state_id"] != first["state_id"]


def test_releases_the_sink_lost_are_published_again_with_their_stored_noise(tmp_path):
    """A release file cut back to its first days (as a releases topic deleted and created
    again loses what it held): the state recorded the later releases as published, so the
    next start publishes them again — their stored payloads, byte for byte — and draws no
    noise."""
    tmp = setup(tmp_path / "run")
    cli(*RUN, cwd=tmp)
    full = release_bytes(tmp)
    lines = full.splitlines(keepends=True)
    first_days = [line for line in lines if json.loads(line)["day"] <= "2026-01-03"]
    assert 0 < len(first_days) < len(lines)
    (tmp / "out" / "releases.jsonl").write_bytes(b"".join(first_days))
    proc = cli(*RUN, cwd=tmp)
    assert "publishing them again with their stored noise" in proc.stderr
    assert release_bytes(tmp) == full
    # nothing lost, nothing published twice on the next start
    proc = cli(*RUN, cwd=tmp)
    assert "publishing them again" not in proc.stderr
    assert release_bytes(tmp) == full
