"""The state file deleted while the daemon runs is noticed before the next
commit: exit 4 (fail closed), nothing of the next day published.

Failed before: the daemon kept committing to the unlinked file, published the next days and
exited 0; the committed days were lost with the file.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.runtime.io.test_kafka_daemon import spawn
from tests.system.chaos.harness import HEAD, QUERY, events


def released_days(path):
    if not path.exists():
        return []
    return [json.loads(line)["day"] for line in path.read_bytes().splitlines()]


@pytest.mark.timeout(120)
def test_state_deleted_while_running_fails_closed(tmp_path):
    (tmp_path / "streamfilter.toml").write_text(
        HEAD.format(idle="1s")
        + '[source]\nkind = "file"\npath = "events.jsonl"\n'
        + '[queries]\nkind = "file"\npath = "queries.jsonl"\n'
        + '[sink]\nkind = "file"\npath = "releases.jsonl"\n'
    )
    (tmp_path / "queries.jsonl").write_text(json.dumps(QUERY) + "\n")
    (tmp_path / "events.jsonl").write_bytes(
        b"\n".join(events(["2026-01-01", "2026-01-02"], 20)) + b"\n"
    )
    daemon = spawn(["run", "--config", "streamfilter.toml", "--testing"], tmp_path)
    releases = tmp_path / "releases.jsonl"
    deadline = time.monotonic() + 60
    while released_days(releases) != ["2026-01-01", "2026-01-02"]:
        assert daemon.poll() is None, daemon.tail()
        assert time.monotonic() < deadline, daemon.tail()
        time.sleep(0.2)
    (tmp_path / "state.db").unlink()
    with open(tmp_path / "events.jsonl", "ab") as f:
        f.write(b"\n".join(events(["2026-01-03", "2026-01-04"], 20, seed=1)) + b"\n")
    assert daemon.wait(timeout=60) == 4, daemon.tail()
    assert "no longer the file this process opened" in daemon.tail()
    assert released_days(releases) == ["2026-01-01", "2026-01-02"]
