"""Files that hold budgets or raw input are created 0600 whatever the umask, and the mirror's
temporary file is never written through a symlink."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from streamfilter.runtime.store.mirror import SequenceMirror, read_mirror, write_mirror
from streamfilter.runtime.store.sqlite import SQLiteStateStore
from tests.cli.test_main import write_world


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_run_under_umask_000_creates_its_state_mirror_and_rejects_0600(tmp_path):
    write_world(tmp_path)  # with refused lines: the reject file quotes them
    (tmp_path / "streamfilter.toml").write_text(
        (tmp_path / "streamfilter.toml").read_text().split("[testing]")[0]
    )
    proc = subprocess.run(
        [sys.executable, "-m", "streamfilter", "run", "--config=streamfilter.toml", "--until-end"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0),
    )
    assert proc.returncode == 0, proc.stderr
    rejects = tmp_path / "out" / "rejects.jsonl"
    assert rejects.read_text()  # raw input is in it
    for path in (tmp_path / "state.db", tmp_path / "state.db.seq", rejects):
        assert _mode(path) == 0o600, (path, oct(_mode(path)))
    assert _mode(tmp_path / "out" / "releases.jsonl") == 0o666  # published output: the umask's


def test_the_state_write_ahead_log_is_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        store = SQLiteStateStore(tmp_path / "state.db")
    finally:
        os.umask(old)
    try:
        store.load()
        for suffix in ("", "-wal", "-shm", ".lock"):
            path = tmp_path / f"state.db{suffix}"
            assert path.exists() and _mode(path) == 0o600, (suffix, oct(_mode(path)))
    finally:
        store.close()


def test_the_mirror_is_not_written_through_a_link_planted_at_its_temporary_name(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    mirror = tmp_path / "state.db.seq"
    (tmp_path / "state.db.seq.tmp").symlink_to(victim)
    write_mirror(mirror, SequenceMirror("id", 3, "2026-01-02"))
    assert victim.read_text() == "keep me\n"
    assert read_mirror(mirror) == SequenceMirror("id", 3, "2026-01-02")
    assert _mode(mirror) == 0o600 and not mirror.is_symlink()
