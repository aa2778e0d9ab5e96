"""The file source follows rotation like ``tail -F`` and refuses a file replaced or truncated
under its stored position; the query file refuses a consumed line changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest

from streamfilter.runtime.io.files import FileQueryFeed, FileSource, InputChangedError

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
[window]
poll_interval = "50ms"
[metrics]
enabled = false
"""
QUERY = {"query_id": "active", "kind": "sum", "features": ["active"], "clip": 1}


def _events(n: int, tag: str, day: str = "2026-01-01") -> str:
    return "".join(
        json.dumps({"user_id": f"{tag}{i}", "day": day, "values": {"active": 1}}) + "\n"
        for i in range(n)
    )


def _world(tmp: Path, events: str) -> None:
    (tmp / "c.toml").write_text(CONFIG)
    (tmp / "queries.jsonl").write_text(json.dumps({**QUERY, "from_day": "2026-01-01"}) + "\n")
    (tmp / "events.jsonl").write_text(events)


def _run(tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamfilter", "run", "--config", "c.toml", "--until-end"],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _summary(proc: subprocess.CompletedProcess[str]) -> dict:
    line = next(x for x in (proc.stdout + proc.stderr).splitlines() if x.startswith('{"summary'))
    return json.loads(line)["summary"]


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [x for x in proc.stderr.splitlines() if x.startswith("streamfilter: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("replacement", "said"),
    [
        (_events(300, "v", "2026-01-09"), "truncated"),  # shorter than what was read
        (_events(30_000, "w", "2026-01-09"), "replaced"),  # longer, other lines
    ],
)
def test_a_file_replaced_between_runs_is_refused_with_one_line_never_read_from_the_old_offset(
    tmp_path, replacement, said
):
    _world(tmp_path, _events(20_000, "u"))
    assert _summary(_run(tmp_path))["records_read"] == 20_000
    (tmp_path / "new.jsonl").write_text(replacement)
    os.replace(tmp_path / "new.jsonl", tmp_path / "events.jsonl")  # mv new.jsonl events.jsonl
    again = _run(tmp_path)
    assert again.returncode == 4, again.stderr
    line = _one_error_line(again)
    assert said in line and "new file name in source.path" in line
    assert not (tmp_path / "out" / "releases.jsonl").read_text().count("2026-01-09")


def test_appending_and_a_new_file_name_are_read_and_the_state_goes_on(tmp_path):
    _world(tmp_path, _events(50, "u"))
    _run(tmp_path)
    with open(tmp_path / "events.jsonl", "a") as fh:
        fh.write(_events(20, "x", "2026-01-02"))
    assert _summary(_run(tmp_path))["records_read"] == 20  # appended: read on, not refused
    (tmp_path / "events-2.jsonl").write_text(_events(7, "y", "2026-01-03"))
    cfg = tmp_path / "c.toml"
    cfg.write_text(cfg.read_text().replace('"events.jsonl"', '"events-2.jsonl"'))
    assert _summary(_run(tmp_path))["records_read"] == 7


def test_a_consumed_query_line_changed_is_refused(tmp_path):
    _world(tmp_path, _events(50, "u"))
    _run(tmp_path)
    queries = tmp_path / "queries.jsonl"
    queries.write_text(queries.read_text().replace('"clip": 1', '"clip": 2'))
    again = _run(tmp_path)
    assert again.returncode == 4
    assert "queries.path" in _one_error_line(again) and "changed" in _one_error_line(again)


def test_query_lines_appended_after_the_consumed_ones_are_read(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes(b'{"a": 1}\n')
    feed = FileQueryFeed(path)
    feed.seek({})
    assert [raw for _, raw in feed.poll()] == [b'{"a": 1}']
    held = feed.positions()
    with open(path, "ab") as fh:
        fh.write(b'{"b": 2}\n')
    again = FileQueryFeed(path)
    again.seek(held)
    assert [raw for _, raw in again.poll()] == [b'{"b": 2}']
    path.write_bytes(b'{"a": 9}\n{"b": 2}\n')
    with pytest.raises(InputChangedError):
        FileQueryFeed(path).seek(held)


def _drain(source: FileSource, want: int, timeout_s: float = 5.0) -> list[tuple[int, int, bytes]]:
    got: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for batch in source.poll_batches(1000):
            ends = [*batch.offsets[1:], batch.next_offset]
            got += zip(batch.offsets, ends, [bytes(v) for v in batch.values], strict=True)
    return got


def test_following_reads_a_renamed_file_to_its_end_then_the_new_one_from_its_start(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"n": 0}\n{"n": 1}\n')
    source = FileSource(path, follow=True)
    source.seek({})
    got = _drain(source, 2)
    os.rename(path, tmp_path / "events.jsonl.1")  # logrotate's rename ...
    with open(tmp_path / "events.jsonl.1", "ab") as old:  # the writer appends until it reopens
        old.write(b'{"n": 2}\n{"n": 3}')  # ... its last line cut short by the rotation
    got += _drain(source, 3, timeout_s=0.3)  # the old file still is the path's: nothing new
    path.write_bytes(b'{"n": 4}\n')  # ... and `create`: the new file
    got += _drain(source, 3)
    assert [json.loads(v)["n"] for _, _, v in got] == [0, 1, 2, 3, 4]  # none lost, none twice
    assert all(a[1] == b[0] for a, b in pairwise(got))  # offsets go on
    marks = source.marks()
    resume = {source.partitions()[0]: got[-1][1], **marks}
    source.close()
    with open(path, "ab") as fh:
        fh.write(b'{"n": 5}\n')
    restarted = FileSource(path, follow=True)  # a restart on the stored position and marks
    restarted.seek(resume)
    assert [json.loads(v)["n"] for _, _, v in _drain(restarted, 1)] == [5]
    restarted.close()


def test_a_file_truncated_while_followed_is_refused(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"n": 0}\n{"n": 1}\n')
    source = FileSource(path, follow=True)
    source.seek({})
    assert len(_drain(source, 2)) == 2
    with open(path, "r+b") as fh:  # copytruncate
        fh.truncate(0)
    with pytest.raises(InputChangedError, match="truncated while being read"):
        source.poll_batches(10)
    source.close()


@pytest.mark.timeout(120)
def test_a_following_run_reads_every_line_across_a_rotation(tmp_path):
    """The daemon itself, following: lines written before and after a rename-and-create
    rotation are each read once."""
    _world(tmp_path, _events(100, "a"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamfilter", "run", "--config", "c.toml"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)
        os.rename(tmp_path / "events.jsonl", tmp_path / "events.jsonl.1")
        with open(tmp_path / "events.jsonl.1", "a") as old:
            old.write(_events(40, "b"))
        time.sleep(0.5)
        (tmp_path / "events.jsonl").write_text(_events(60, "c"))
        time.sleep(3)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    summary = json.loads(next(x for x in (out + err).splitlines() if x.startswith('{"summary')))
    assert summary["summary"]["records_read"] == 200, err
    assert "was rotated" in err
