"""Contract suite for Sink: every implementation runs these tests (runtime/io/base.py states
the guarantees).

A case opens sinks on one target (opening again is a restart) and reads back, independently of
the sink, what the target holds: per ordered stream (a file, stdout, a Kafka partition). Sinks
that cannot tell what their target holds say so (``reads_back``): ``last_published_day`` is then
``None``. Kafka runs on the real test broker (skipped locally without one, never in CI).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streamfilter.errors import PublishError
from streamfilter.runtime.io.base import Sink
from streamfilter.runtime.io.files import FileSink, StdoutSink
from streamfilter.testing import MemorySink


def release(day: str, query_id: str, value: float) -> tuple[str, bytes]:
    """(key, payload) as the outbox relay publishes a release."""
    payload = json.dumps({"day": day, "query_id": query_id, "value": value}).encode()
    return f"{day}/{query_id}", payload


RELEASES = [
    release(day, qid, i + 0.5)
    for i, (day, qid) in enumerate(
        (d, q) for d in ("2026-01-01", "2026-01-02", "2026-01-03") for q in ("active", "plans")
    )
]


@dataclass
class SinkCase:
    open: Callable[[], Sink]  # a sink on the case's target; opening again is a restart
    held: Callable[[], list[list[bytes]]]  # what the target holds, per ordered stream
    reads_back: bool  # last_published_day() reports what the target holds
    tear: Callable[[], None] | None = None  # leave a torn record, as a crash mid-write can
    opened: list[Sink] = field(default_factory=list)

    def start(self) -> Sink:
        sink = self.open()
        self.opened.append(sink)
        return sink

    def held_records(self) -> Counter[bytes]:
        return Counter(p for stream in self.held() for p in stream)


def memory_case() -> SinkCase:
    records: list[tuple[str, bytes]] = []
    sinks: list[MemorySink] = []

    def open_sink() -> MemorySink:
        sinks.append(MemorySink(records))
        return sinks[-1]

    def held() -> list[list[bytes]]:
        return [[p for _, p in records[: max((s.flushed for s in sinks), default=0)]]]

    return SinkCase(open_sink, held, reads_back=False)


def file_case(path: Path, dedupe_releases: bool) -> SinkCase:
    def held() -> list[list[bytes]]:
        return [path.read_bytes().splitlines()] if path.exists() else [[]]

    def tear() -> None:
        with open(path, "ab") as fh:
            fh.write(release("2026-01-09", "active", 1.5)[1][:20])  # no newline: cut short

    return SinkCase(
        lambda: FileSink(path, dedupe_releases=dedupe_releases),
        held,
        reads_back=dedupe_releases,
        tear=tear,
    )


def stdout_case(capfdbinary: pytest.CaptureFixture[bytes]) -> SinkCase:
    out: list[bytes] = []

    def held() -> list[list[bytes]]:
        out.extend(capfdbinary.readouterr().out.splitlines())
        return [list(out)]

    return SinkCase(StdoutSink, held, reads_back=False)


def kafka_case(bootstrap: str) -> SinkCase:
    from streamfilter.runtime.io.kafka import KafkaSink
    from tests.support.kafka_broker import create_topic, read_topic, unique_topic

    topic = create_topic(bootstrap, unique_topic("sink-contract"), partitions=3)

    def held() -> list[list[bytes]]:
        streams: dict[int, list[bytes]] = {}
        for rec in read_topic(bootstrap, topic):
            streams.setdefault(rec.partition, []).append(rec.value)
        return list(streams.values())

    return SinkCase(
        lambda: KafkaSink(topic, {"bootstrap_servers": bootstrap}, delivery_timeout_s=60),
        held,
        reads_back=True,
    )


@pytest.fixture(
    params=[
        "memory",
        "file",
        "file-rejects",
        "stdout",
        pytest.param("kafka", marks=pytest.mark.kafka),
    ]
)
def case(request, tmp_path) -> Iterator[SinkCase]:
    if request.param == "memory":
        made = memory_case()
    elif request.param == "file":
        made = file_case(tmp_path / "releases.jsonl", dedupe_releases=True)
    elif request.param == "file-rejects":
        made = file_case(tmp_path / "rejects.jsonl", dedupe_releases=False)
    elif request.param == "stdout":
        made = stdout_case(request.getfixturevalue("capfdbinary"))
    else:
        made = kafka_case(request.getfixturevalue("kafka_bootstrap"))
    yield made
    for sink in made.opened:
        sink.close()


def assert_holds_in_order(case: SinkCase, published: list[bytes]) -> None:
    """The target holds exactly ``published``; each stream in publish order."""
    streams = case.held()
    assert Counter(p for s in streams for p in s) == Counter(published)
    for stream in streams:
        assert stream == [p for p in published if p in stream]


def test_flush_returns_once_everything_published_before_is_held(case):
    """``flush``: when it returns, every record passed to ``publish`` before it is durable (file:
    fsync'd; Kafka: acknowledged), in publish order; flushing with nothing new is harmless."""
    sink = case.start()
    sink.flush()
    assert case.held_records() == Counter()
    for key, payload in RELEASES[:4]:
        sink.publish(key, payload)
    sink.flush()
    assert_holds_in_order(case, [p for _, p in RELEASES[:4]])
    for key, payload in RELEASES[4:]:
        sink.publish(key, payload)
    sink.flush()
    sink.flush()
    assert_holds_in_order(case, [p for _, p in RELEASES])


def test_republished_identical_records_are_held_once_or_more_never_lost(case):
    """A restart republishes unsent releases byte for byte: a sink may drop a record whose key
    it already holds with identical bytes, and holds every record at least once."""
    sink = case.start()
    for key, payload in RELEASES[:4]:
        sink.publish(key, payload)
    sink.flush()
    sink.close()
    again = case.start()
    for key, payload in RELEASES:  # the first four again, then the rest
        again.publish(key, payload)
    again.publish(*RELEASES[5])  # and one twice in the same run
    again.flush()
    held = case.held_records()
    assert set(held) == {p for _, p in RELEASES}
    assert all(held[p] >= 1 for _, p in RELEASES)


def test_a_different_record_under_a_held_key_is_never_silently_dropped(case):
    """Only a record with identical bytes may be dropped for its key: any other record is held
    once ``flush`` returns, unless ``publish`` refused it loudly (``PublishError``)."""
    sink = case.start()
    key, payload = RELEASES[0]
    sink.publish(key, payload)
    sink.flush()
    other = payload.replace(b"0.5", b"9.5")
    for target in (sink, case.start()):  # the same run, and after a restart
        try:
            target.publish(key, other)
            target.flush()
        except PublishError as exc:
            assert key in str(exc)
        else:
            assert other in case.held_records()


def test_last_published_day_is_the_latest_day_the_target_holds(case):
    """``last_published_day``: a sink that can read back what it holds reports the latest day it
    holds a release of (the stale-state check at start); others report ``None``."""
    fresh = case.start()
    assert fresh.last_published_day() is None
    for key, payload in RELEASES:  # published in day order, as the outbox relays them
        fresh.publish(key, payload)
    fresh.flush()
    fresh.close()
    assert case.start().last_published_day() == ("2026-01-03" if case.reads_back else None)


def test_a_restart_after_a_torn_write_holds_every_record_published_after_it(case):
    """``flush`` makes what was published before it durable, also after a restart over a record
    a crash cut short (it was never flushed: publish writes a record whole)."""
    if case.tear is None:
        pytest.skip("this target never holds a torn record (no partial writes)")
    sink = case.start()
    for key, payload in RELEASES[:2]:
        sink.publish(key, payload)
    sink.flush()
    sink.close()
    case.tear()
    again = case.start()
    for key, payload in RELEASES[2:4]:
        again.publish(key, payload)
    again.flush()
    assert {p for _, p in RELEASES[:4]} <= set(case.held_records())


def test_the_file_sink_fsyncs_what_it_wrote_and_only_then(tmp_path, monkeypatch):
    """``FileSink.flush`` makes every published line durable with one fsync of the file, and
    skips the fsync when nothing was written since the last one (the reject file is flushed at
    every day's close and is usually empty). The real fsync runs; the test counts the calls."""
    import os

    import streamfilter.runtime.io.files as files

    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", counting_fsync)
    sink = FileSink(tmp_path / "out.jsonl")
    try:
        sink.flush()
        assert synced == []  # nothing written
        sink.publish(*RELEASES[0])
        sink.flush()
        assert len(synced) == 1
        sink.flush()
        sink.publish(*RELEASES[0])  # held already with identical bytes: nothing written
        sink.flush()
        assert len(synced) == 1
        sink.publish(*RELEASES[1])
        sink.flush()
        assert len(synced) == 2
        lines = (tmp_path / "out.jsonl").read_bytes().splitlines()
        assert lines == [RELEASES[0][1], RELEASES[1][1]]
    finally:
        sink.close()
    assert len(synced) == 2  # closing with nothing new written
