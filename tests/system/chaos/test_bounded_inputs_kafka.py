"""Bounded inputs on the real broker: a 5 MB message, a 300 KB line of ``\\x01`` bytes and
a 4096 × 4096 linear query (84 MB of JSON) over [limits] max_query_bytes are rejects
with bounded records; no crash, every other event counted. (With the ``crc32c`` C extension, a
dependency, the 84 MB record takes seconds to produce and consume; kafka-python's pure
Python CRC-32C needed about three minutes.)

Failed before: the reject of the ``\\x01`` line (1.8 MB once JSON-escaped) and of the 5 MB
message exceeded the producer's 1 MB limit; the daemon exited 1 with
``MessageSizeTooLargeError`` at every start.
"""

from __future__ import annotations

import json

import pytest

from tests.runtime.io.test_kafka_daemon import cli
from tests.support.kafka_broker import read_topic
from tests.system.chaos.harness import (
    QUERY,
    events,
    kafka_world,
    produce,
    reference,
    release_values,
)

pytestmark = pytest.mark.kafka
DAYS = ["2026-01-01", "2026-01-02"]


def linear_query_json(k: int, d: int) -> bytes:
    row = b"[" + b", ".join([b"0.5"] * d) + b"]"
    weights = b", ".join(b'"f%d": %s' % (i, row) for i in range(k))
    return b'{"query_id": "huge", "kind": "linear", "clip": 1.0, "from_day": "2026-01-01", ' + (
        b'"weights": {' + weights + b"}}"
    )


@pytest.mark.timeout(300)
def test_giant_records_are_bounded_rejects_and_the_run_goes_on(kafka_bootstrap, tmp_path):
    good = events(DAYS, 40)
    expected = reference(tmp_path, good)
    work, topics = kafka_world(tmp_path, kafka_bootstrap, big=True)
    huge_query = linear_query_json(4096, 4096)
    assert len(huge_query) > 80 << 20  # the 84 MB
    huge_len = len(huge_query)
    produce(kafka_bootstrap, topics["queries"], [json.dumps(QUERY).encode(), huge_query], big=True)
    del huge_query
    control = b"\x01" * 300_000
    five_mb = b'{"user_id": "' + b"x" * (5 << 20) + b'"}'
    produce(kafka_bootstrap, topics["events"], [control, *good[:40], five_mb, *good[40:]], big=True)

    proc = cli(["run", "--config", "streamfilter.toml", "--until-end", "--testing"], cwd=work)
    assert proc.returncode == 0
    assert release_values(kafka_bootstrap, topics["releases"]) == expected
    rejects = [json.loads(r.value) for r in read_topic(kafka_bootstrap, topics["rejects"])]
    assert sorted(r["reason"] for r in rejects) == ["oversized"] * 3
    assert sorted(r["raw_bytes"] for r in rejects) == sorted([len(control), len(five_mb), huge_len])
    assert max(len(json.dumps(r)) for r in rejects) < 30_000
