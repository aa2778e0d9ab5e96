"""Fail closed (docs/design.md §5): when the state store cannot commit, nothing is released.

Three real failures of the SQLite state, each through the real CLI in a child process:

* **disk full** — the child runs ``streamfilter run`` under ``RLIMIT_FSIZE`` (set in
  ``preexec_fn``, with ``SIGXFSZ`` ignored so an oversized write fails with ``EFBIG`` instead of
  killing the process). The limit is one byte below the size the WAL reaches when a chosen day
  commits (measured by a run that is SIGKILLed right after that commit), so exactly that day's
  commit fails, mid-run;
* **read-only database** — ``chmod 0444`` (when the tests run as root, the child drops
  ``CAP_DAC_OVERRIDE`` from its capability bounding set before ``exec``, so root is bound by the
  file mode like any service user), and ``chattr +i`` (immutable: refused even to root);
* **corrupted database** — bytes of the file overwritten (the header, a b-tree page header, cell
  content).

Each time: exit code 4, one line on stderr naming the problem (no user id, no value), no release
of the failing day in the sink, the state unchanged; then, with the store healthy again (limit
removed, mode restored, original bytes back), ``streamfilter run`` resumes and the release file is
byte-identical to an uninterrupted run under the test seed, every (day, query) exactly once.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamfilter.runtime.store import SQLiteStateStore, StoreError
from tests.conftest import require
from tests.runtime.store.test_reader_stale import (
    DAYS,
    RUN,
    append_days,
    keys,
    mirror,
    release_bytes,
    setup,
    store_seq,
)
from tests.support.cli import cli, fold_budget_log_early

FAILING_DAY = 5  # days 1..4 commit, day 5 is the one whose commit fails


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> bytes:
    ref = setup(tmp_path_factory.mktemp("ref"))
    cli(*RUN, cwd=ref)
    return release_bytes(ref)


def run_child(cwd: Path, preexec_fn: Callable[[], None] | None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamfilter", *RUN],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=preexec_fn,
    )


def assert_failed_closed(proc, work: Path, published: bytes, *words: str) -> str:
    """Exit 4, one clear line without data, nothing new released, the state unchanged."""
    assert proc.returncode == 4, proc.stderr
    # one clear error line, last, after the INFO/WARNING log lines (logging is on by default)
    *logs, line = proc.stderr.strip().splitlines()
    assert all(" INFO " in x or " WARNING " in x for x in logs), proc.stderr
    assert not any(x.startswith("streamfilter: ") for x in logs), proc.stderr
    assert "u-" not in "".join(logs)  # the logs name no user either
    assert line.startswith("streamfilter: ") and "state.db" in line
    for word in words:
        assert word in line, (word, line)
    assert "u-" not in line and "plan" not in line and "minutes" not in line  # no data
    assert release_bytes(work) == published
    return line


def days_released(data: bytes) -> list[str]:
    return sorted({day for day, _ in keys(data)})


def day(n: int) -> str:
    return f"2026-01-{n:02d}"


def assert_resumes_identically(work: Path, expected: bytes) -> None:
    proc = run_child(work, None)
    assert proc.returncode == 0, proc.stderr
    assert release_bytes(work) == expected
    assert len(keys(expected)) == len(set(keys(expected)))  # every (day, query) exactly once
    assert store_seq(work) == mirror(work)["seq"] == DAYS


# ---------------------------------------------------------------------------- disk full


def file_size_limit(limit: int) -> Callable[[], None]:
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def test_disk_full_mid_run_releases_nothing_of_the_failing_day_then_resumes(tmp_path, expected):
    # measure: the largest file right after day FAILING_DAY committed (deterministic input and
    # SQLite page layout: the limited run writes the same bytes up to that commit)
    probe = setup(tmp_path / "probe")
    crashed = cli(
        *RUN, cwd=probe, env={"STREAMFILTER_CRASH_AT": f"after_commit:{FAILING_DAY}"}, check=False
    )
    assert crashed.returncode == -signal.SIGKILL
    sizes = {f.name: f.stat().st_size for f in probe.rglob("*") if f.is_file()}
    largest = max(sizes, key=sizes.__getitem__)
    assert largest == "state.db-wal" and sizes[largest] > 65536, sizes
    limit = sizes[largest] - 1  # the failing day's commit needs the WAL to reach this size
    assert all(size < limit for name, size in sizes.items() if name != largest)

    work = setup(tmp_path / "work")
    proc = run_child(work, file_size_limit(limit))
    partial = release_bytes(work)
    line = assert_failed_closed(proc, work, partial, "failed to commit", "disk full")
    assert "SQLITE_FULL" in line or "SQLITE_IOERR" in line
    # days before the failing one were committed and released; nothing of the failing day
    assert days_released(partial) == [day(n) for n in range(1, FAILING_DAY)]
    assert expected.startswith(partial)
    assert store_seq(work) == mirror(work)["seq"] == FAILING_DAY - 1

    assert_resumes_identically(work, expected)  # no limit: resume


# ---------------------------------------------------------------------------- read-only

PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE = 1


def drop_dac_override() -> None:
    """In the child, before exec: root without CAP_DAC_OVERRIDE obeys file modes."""
    if os.geteuid() != 0:
        return  # an ordinary user obeys them anyway
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE)")


def chattr(flag: str, path: Path) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True, capture_output=True, timeout=30)


def committed_world(tmp_path: Path, *, fold_early: bool = False) -> tuple[Path, bytes]:
    """Days before FAILING_DAY committed and released; the rest of the input arrives later.

    The budgets are in the budget log (60 users never reach ``budget_log_max_rows``), or with
    ``fold_early`` in the ``budgets`` table too (``budget_log_max_rows = 0``: folded whenever
    the log outgrows the table)."""
    work = setup(tmp_path / "work", range(FAILING_DAY - 1))
    if fold_early:
        fold_budget_log_early(work)
    cli(*RUN, cwd=work)
    append_days(work, range(FAILING_DAY - 1, DAYS))
    published = release_bytes(work)
    assert days_released(published) == [day(n) for n in range(1, FAILING_DAY)]
    return work, published


def test_read_only_database_by_file_mode(tmp_path, expected):
    work, published = committed_world(tmp_path)
    db = work / "state.db"
    db.chmod(0o444)
    try:
        if os.geteuid() == 0:  # the mechanism is real: a plain root child would still write
            ok = subprocess.run(
                [sys.executable, "-c", f"open({str(db)!r}, 'r+b').close()"], capture_output=True
            )
            assert ok.returncode == 0
        proc = run_child(work, drop_dac_override)
    finally:
        db.chmod(0o644)
    assert_failed_closed(proc, work, published, "cannot be written", "SQLITE_READONLY")
    assert store_seq(work) == FAILING_DAY - 1
    assert_resumes_identically(work, expected)


def test_read_only_database_immutable_even_for_root(tmp_path, expected):
    require(shutil.which("chattr") is not None, "chattr (e2fsprogs) is needed")
    work, published = committed_world(tmp_path)
    db = work / "state.db"
    try:
        chattr("+i", db)
    except subprocess.CalledProcessError as exc:
        require(False, f"chattr +i is not permitted here: {exc.stderr.strip()}")
    try:
        proc = run_child(work, None)
    finally:
        chattr("-i", db)
    assert_failed_closed(proc, work, published, "cannot be written", "SQLITE_READONLY")
    assert store_seq(work) == FAILING_DAY - 1
    assert_resumes_identically(work, expected)


# ---------------------------------------------------------------------------- corrupted


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ("file header", ("not a database", "damaged")),
        ("budgets page header", ("malformed", "damaged")),
        ("budgets cell content", ("is corrupt", "integrity check")),
        ("budget_log page header", ("malformed", "damaged")),
        # the packed columns of the log are mostly blob bytes: the row checksum sees the damage
        ("budget_log cell content", ("is corrupt", "table budget_log")),
        # the page structure survives (integrity_check passes): the payload no longer decodes
        ("releases cell content", ("is corrupt", "table releases")),
    ],
)
def test_corrupted_database_is_refused_never_started_from_empty(tmp_path, expected, where, words):
    work, published = committed_world(tmp_path, fold_early=where.startswith("budgets "))
    db = work / "state.db"
    original = db.read_bytes()
    con = sqlite3.connect(db)
    try:
        page_size = con.execute("PRAGMA page_size").fetchone()[0]
        roots = dict(con.execute("SELECT name, rootpage FROM sqlite_master").fetchall())
    finally:
        con.close()
    data = bytearray(original)
    if where == "file header":
        at, n = 0, 16  # "SQLite format 3\0"
    else:
        table, part = where.split(" ", 1)
        start = (roots[table] - 1) * page_size
        at, n = (start, 12) if part == "page header" else (start + page_size - 200, 90)
    data[at : at + n] = b"\xa5" * n
    db.write_bytes(bytes(data))

    proc = run_child(work, None)
    assert_failed_closed(proc, work, published, *words)
    assert db.read_bytes() == bytes(data)  # not "repaired", not replaced by an empty state

    db.write_bytes(original)  # the intact copy is restored
    assert_resumes_identically(work, expected)


def _bump_digit(data: bytearray, at: int) -> None:
    """Replace the first decimal digit at or after ``at`` by another digit (still valid JSON)."""
    while not chr(data[at]).isdigit():
        at += 1
    data[at] = ord("0") + (data[at] - ord("0") + 1) % 10


def _flip(data: bytearray, at: int) -> None:
    data[at] ^= 0x01


def _read(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize(
    ("table", "needle", "damage", "sql"),
    [
        # a budget's spent units (the integer right after the user id in the record): the page
        # stays well-formed, the number changes — a user could be charged less than they spent
        ("budgets", b"u-59", _flip, "SELECT user_id, spent_units FROM budgets"),
        # one byte of a day's packed budget changes (the first byte after an id): another id
        ("budget_log", b"u-59", _flip, "SELECT ids, spent_units FROM budget_log"),
        # one digit of a stored release value: still valid JSON, still a well-formed page
        ("releases", b'"value": [', _bump_digit, "SELECT payload FROM releases"),
    ],
)
def test_damaged_value_with_intact_pages_is_caught_by_the_row_checksum(
    tmp_path, expected, table, needle, damage, sql
):
    work, published = committed_world(tmp_path, fold_early=table == "budgets")
    db = work / "state.db"
    original = db.read_bytes()
    before = _read(db, sql)
    at = original.find(needle)
    while True:  # the first copy that is live data (free space may hold stale copies)
        assert at >= 0, "no live copy of the value found"
        data = bytearray(original)
        damage(data, at + len(needle))
        db.write_bytes(bytes(data))
        if _read(db, sql) != before:
            break
        at = original.find(needle, at + 1)
    integrity = _read(db, "PRAGMA integrity_check")
    assert integrity == [("ok",)]  # SQLite alone does not see it

    proc = run_child(work, None)
    assert_failed_closed(proc, work, published, "does not match its checksum", f"table {table}")

    db.write_bytes(original)
    assert_resumes_identically(work, expected)


OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE budgets (
    user_id TEXT PRIMARY KEY, spent_units INTEGER NOT NULL, retired INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE queries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, query_id TEXT UNIQUE NOT NULL, payload BLOB NOT NULL
);
CREATE TABLE days (day TEXT PRIMARY KEY, seq INTEGER NOT NULL);
CREATE TABLE releases (
    day TEXT NOT NULL, query_id TEXT NOT NULL, ord INTEGER NOT NULL, payload BLOB NOT NULL,
    sent INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (day, query_id)
);
CREATE TABLE positions (
    partition TEXT PRIMARY KEY, resume_offset INTEGER NOT NULL, high_offset INTEGER NOT NULL
);
CREATE TABLE telemetry_ledger (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, rho REAL NOT NULL,
    record BLOB NOT NULL
);
"""


def test_state_written_before_row_checksums_is_upgraded_then_protected(tmp_path):
    """A state from before the ``crc`` column: the first open adds it (from the rows as they
    are); from then on a damaged value is refused like in a new state."""
    path = tmp_path / "state.db"
    con = sqlite3.connect(path)
    con.executescript(OLD_SCHEMA)
    con.executemany(
        "INSERT INTO meta VALUES (?, ?)", [("seq", "1"), ("last_closed_day", "2026-01-01")]
    )
    con.executemany("INSERT INTO budgets VALUES (?, ?, ?)", [("u-1", 70000, 0), ("u-2", 9, 1)])
    con.execute("INSERT INTO queries(query_id, payload) VALUES ('q', X'7B7D')")
    con.execute("INSERT INTO days VALUES ('2026-01-01', 1)")
    con.execute("INSERT INTO releases VALUES ('2026-01-01', 'q', 0, X'7B7D', 1)")
    con.execute("INSERT INTO positions VALUES ('p0', 10, 12)")
    con.commit()
    con.close()

    store = SQLiteStateStore(path)
    try:
        state = store.load()
        assert sorted(state.budgets) == [("u-1", 70000, False), ("u-2", 9, True)]
        assert state.seq == 1 and state.releases == [b"{}"] and state.queries == [b"{}"]
    finally:
        store.close()
    con = sqlite3.connect(path)
    con.execute("UPDATE budgets SET spent_units = 7 WHERE user_id = 'u-1'")  # not via the store
    con.commit()
    con.close()
    store = SQLiteStateStore(path)
    try:
        with pytest.raises(StoreError, match="table budgets does not match its checksum"):
            store.load()
    finally:
        store.close()


def test_a_new_state_has_large_pages_and_an_old_one_keeps_its_own(tmp_path):
    """A new state file gets ``PAGE_BYTES`` pages (a day's packed debits in fewer pages and
    writes); a state written with SQLite's default 4 KiB pages opens, commits and stays so."""
    from streamfilter.runtime.store.sqlite import PAGE_BYTES

    new = SQLiteStateStore(tmp_path / "new.db")
    new.close()
    old_path = tmp_path / "old.db"
    con = sqlite3.connect(old_path)
    con.execute("CREATE TABLE t(x)")
    con.close()
    old = SQLiteStateStore(old_path)
    try:
        assert old.load().seq == 0
    finally:
        old.close()
    for path, size in ((tmp_path / "new.db", PAGE_BYTES), (old_path, 4096)):
        con = sqlite3.connect(path)
        assert con.execute("PRAGMA page_size").fetchone()[0] == size, path
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        con.close()


def _reference_row_crc(*values: object) -> int:
    """The row checksum as first defined (states on disk carry it): per value a type tag, an
    8-byte little-endian length, then the raw bytes (blobs) or the UTF-8 ``repr`` (the rest)."""
    import zlib

    crc = 0
    for v in values:
        data = v if isinstance(v, bytes) else repr(v).encode("utf-8", "surrogatepass")
        head = (b"b" if isinstance(v, bytes) else b"r") + len(data).to_bytes(8, "little")
        crc = zlib.crc32(data, zlib.crc32(head, crc))
    return crc


_ids = st.text(min_size=1, max_size=600) | st.sampled_from(["u-1", "it's", 'a"b', "\\", "\ud800"])
_cells = _ids | st.binary(max_size=300) | st.integers() | st.floats(allow_nan=False)


@given(st.lists(_cells, max_size=6))
def test_the_older_row_checksum_keeps_its_format(values):
    """States written before packed rows stay verifiable (and so convertible): the older
    checksum is the one they were written with."""
    from streamfilter.runtime.store.schema import legacy_row_crc

    assert legacy_row_crc(*values) == _reference_row_crc(*values)
