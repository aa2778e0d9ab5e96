"""``topics create`` on a real single-node broker: a replication factor the cluster cannot
hold is explained in one line (not as refused access)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.kafka_broker import unique_topic


def test_a_replication_factor_above_the_brokers_is_explained_in_one_line(kafka_bootstrap, tmp_path):
    topic = unique_topic("events")
    (tmp_path / "c.toml").write_text(
        "[privacy]\nb_norm = 4\nrho = 0.1\n"
        f'[source]\nkind = "kafka"\ntopic = "{topic}"\nreplication_factor = 3\n'
        '[queries]\nkind = "none"\n[sink]\nkind = "stdout"\n'
        f'[kafka]\nbootstrap_servers = "{kafka_bootstrap}"\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "streamfilter", "topics", "create", "--config", "c.toml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [x for x in proc.stderr.splitlines() if x.startswith("streamfilter: ")]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Response" not in lines[0], proc.stderr
    line = lines[0]
    assert "source.replication_factor" in line and "3" in line and "1 broker" in line, line
    assert "access" not in line
