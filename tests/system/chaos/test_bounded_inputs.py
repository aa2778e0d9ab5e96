"""Bounded inputs and bounded rejects, in process (the same probes on the
real broker are in ``test_bounded_inputs_kafka.py``).

Failed before: the reject of a 300 KB line of ``\\x01`` bytes was a 1.8 MB record (JSON escapes
each byte as ``\\u0001``), over a Kafka producer's 1 MB limit: the daemon crashed on it at every
start. A 4096-category histogram and a 4096 × 4096 linear query were accepted.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from streamfilter.engine.monitor import Engine
from streamfilter.engine.params import PrivacyParams
from streamfilter.privacy.noise import SeededRandomBits
from streamfilter.runtime.daemon import Daemon, InputLimits
from streamfilter.runtime.io.base import reject_payload
from streamfilter.runtime.store import SQLiteStateStore
from streamfilter.testing import MemorySink, MemorySource
from tests.runtime.test_daemon import ListFeed

PARAMS = PrivacyParams.create(b_norm=2.0, rho=0.5, granularity=2.0**-8)
SUM = {"query_id": "n", "kind": "sum", "features": ["n"], "clip": 1.0, "from_day": "2026-01-01"}
PRODUCER_LIMIT = 1_048_576  # kafka-python's default max_request_size


class LimitedSink(MemorySink):
    """A sink that refuses records over ``limit`` bytes, as a Kafka producer does."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def publish(self, key: str, payload: bytes) -> None:
        if len(payload) > self.limit:
            raise ValueError(f"record of {len(payload)} bytes over {self.limit}")
        super().publish(key, payload)


def events(n_per_day: int) -> list[bytes]:
    return [
        json.dumps({"user_id": f"u{i}", "day": day, "values": {"n": 1}}).encode()
        for day in ("2026-01-01", "2026-01-02")
        for i in range(n_per_day)
    ]


def run(tmp_path, name, lines, queries, reject_sink, limits=None):
    store = SQLiteStateStore(tmp_path / f"{name}.db")
    sink = MemorySink()
    daemon = Daemon(
        Engine(PARAMS, SeededRandomBits(4)),
        store,
        MemorySource({"p0": list(lines)}),
        ListFeed([]),
        sink,
        reject_sink,
        poll_interval_s=0,
        limits=limits,
    )
    daemon.feed.pending = list(queries)
    summary = daemon.run(until_end=True)
    store.close()
    return sink.payloads, summary


def test_hostile_records_are_bounded_rejects_and_every_other_event_counts(tmp_path):
    good = events(50)
    control = b"\x01" * 300_000
    huge = b'{"user_id": "' + b"x" * 5_000_000 + b'"}'
    histogram = {
        "query_id": "wide",
        "kind": "histogram",
        "feature": "c",
        "categories": [f"c{i}" for i in range(4096)],
        "clip": 1.0,
        "from_day": "2026-01-01",
    }
    linear_json = (
        b'{"kind": "linear", "weights": {'
        + b", ".join(b'"f%d": [%s]' % (i, b", ".join([b"0.5"] * 64)) for i in range(4096))
        + b'}, "query_id": "big", "clip": 1.0, "from_day": "2026-01-01"}'
    )
    assert len(linear_json) > 1 << 20
    queries = [json.dumps(SUM).encode(), json.dumps(histogram).encode(), linear_json]
    ref, _ = run(tmp_path, "ref", good, [json.dumps(SUM).encode()], MemorySink())
    rejects = LimitedSink(PRODUCER_LIMIT)
    got, summary = run(
        tmp_path, "hostile", [control, *good[:50], huge, *good[50:]], queries, rejects
    )
    assert got == ref  # every valid event counted, byte-identical releases
    assert summary.rejects == {"oversized": 3, "query_too_large": 1}
    assert summary.rejects_dropped == 0
    by_source = {k: json.loads(p) for k, p in rejects.records}
    assert max(map(len, rejects.payloads)) < 30_000
    first = by_source["p0:0"]
    assert first["raw_bytes"] == len(control)
    assert first["raw_sha256"] == hashlib.sha256(control).hexdigest()
    assert first["raw"] == "\x01" * 4096


def test_a_reject_the_sink_still_refuses_is_counted_and_skipped(tmp_path, caplog):
    good = events(20)
    bad = [b"{broken", b"\xff\xfe", b"[]"]

    class Refusing(MemorySink):
        def publish(self, key, payload):
            raise OSError("no space for rejects")

    got, summary = run(tmp_path, "r", [*bad, *good], [json.dumps(SUM).encode()], Refusing())
    ref, _ = run(tmp_path, "ref", good, [json.dumps(SUM).encode()], MemorySink())
    assert got == ref and summary.rejects_dropped == 3
    assert sum(summary.rejects.values()) == 3
    assert len([r for r in caplog.records if "reject sink refused" in r.message]) == 1


def test_query_count_and_event_size_limits(tmp_path):
    limits = InputLimits(max_live_queries=2, max_event_bytes=200)
    queries = [json.dumps({**SUM, "query_id": f"q{i}"}).encode() for i in range(4)]
    big = json.dumps({"user_id": "u", "day": "2026-01-01", "values": {"s": "y" * 250}}).encode()
    _, summary = run(tmp_path, "l", [*events(5), big], queries, MemorySink(), limits=limits)
    assert summary.rejects == {"too_many_queries": 2, "oversized": 1}
    assert summary.queries_registered == 2


@pytest.mark.parametrize("raw", [b"x" * 10, "é".encode() * 3000, b"\xff" * 5000])
def test_reject_payload_is_bounded_and_identifies_the_original(raw):
    rec = json.loads(reject_payload("oversized", "d", raw, "p:0", max_raw_bytes=4096))
    quoted = rec["raw"].encode() if "raw" in rec else base64.b64decode(rec["raw_b64"])
    assert raw.startswith(quoted) and len(quoted) <= 4096
    if len(raw) > 4096:
        assert rec["raw_bytes"] == len(raw)
        assert rec["raw_sha256"] == hashlib.sha256(raw).hexdigest()
    else:
        assert quoted == raw and "raw_bytes" not in rec
