"""The Kafka query feed reads the queries topic to the end offsets captured
when a day becomes closable, not one fetch.

The probe: 10,000 queries (about 3.5 MB, more than three times what one fetch of a
partition returns) wait on the topic; the last one starts on the first day. Failed before: one
fetch (``poll(timeout 0)``) left most of the backlog unread when the days closed, so the last
query had no release and would be refused as ``closed_day`` when read later. (Registering them
once cost one store transaction each, 66 s here; a poll's new queries are now one transaction.)
"""

from __future__ import annotations

import json

import pytest

from tests.runtime.io.test_kafka_daemon import cli
from tests.support.kafka_broker import read_topic
from tests.system.chaos.harness import QUERY, events, kafka_world, produce, release_values

pytestmark = pytest.mark.kafka
BACKLOG = 10_000


@pytest.mark.timeout(300)
def test_a_backlog_of_queries_is_read_before_a_day_closes(kafka_bootstrap, tmp_path):
    work, topics = kafka_world(
        tmp_path, kafka_bootstrap, extra="[limits]\nmax_live_queries = 10000\n"
    )
    # registered, never due in this run; ~2 KB each
    later = {
        **QUERY,
        "from_day": "2026-06-01",
        "features": [f"feature_{i:03d}" for i in range(12)],
    }
    backlog = [json.dumps({**later, "query_id": f"q{i}"}).encode() for i in range(BACKLOG - 1)]
    produce(kafka_bootstrap, topics["queries"], [*backlog, json.dumps(QUERY).encode()])
    produce(kafka_bootstrap, topics["events"], events(["2026-01-01", "2026-01-02"], 20))

    proc = cli(["run", "--config", "streamfilter.toml", "--until-end", "--testing"], cwd=work)
    summary = json.loads(proc.stderr.strip().splitlines()[-1])["summary"]
    assert summary["queries_registered"] == BACKLOG
    days = [json.loads(v)["day"] for v in release_values(kafka_bootstrap, topics["releases"])]
    assert days == ["2026-01-01", "2026-01-02"]
    assert read_topic(kafka_bootstrap, topics["rejects"]) == []  # none refused as closed_day
