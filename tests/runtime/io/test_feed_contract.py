"""Contract suite for QueryFeed: every implementation runs these tests (runtime/io/base.py states
the guarantees).

A case is a feed plus, for feeds read from a wire (a file, a Kafka topic), a way to publish raw
query records to it; a policy feed answers ``on_day`` instead. Kafka runs on the real test broker
(skipped locally without one, never in CI).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streamfilter.policies import standing_monitoring
from streamfilter.runtime.io.base import NoQueryFeed, Policy, QueryFeed
from streamfilter.runtime.io.files import FileQueryFeed
from streamfilter.runtime.io.policy import PolicyFeed

QUERIES = [
    f'{{"query_id": "q{i}", "kind": "sum", "features": ["active"]}}'.encode() for i in range(5)
]
FOREIGN_LABELS = {"file:events.jsonl": 11, "events-topic:0": 4}


@dataclass
class FeedCase:
    open: Callable[[], QueryFeed]
    publish: Callable[[list[bytes]], None] | None  # append raw queries to the wire (None: none)
    policy: Policy | None  # what on_day answers (None: nothing)
    patience_s: float = 5.0  # how long published records may take to reach poll
    opened: list[QueryFeed] = field(default_factory=list)

    def start(self, offsets: dict[str, int] | None = None) -> QueryFeed:
        """A new feed, sought to stored positions as the daemon does at start-up."""
        feed = self.open()
        self.opened.append(feed)
        feed.seek({} if offsets is None else offsets)
        return feed


def file_case(path: Path) -> FeedCase:
    def publish(lines: list[bytes]) -> None:
        with open(path, "ab") as fh:
            fh.write(b"".join(line + b"\n" for line in lines))

    return FeedCase(lambda: FileQueryFeed(path), publish, None)


def kafka_case(bootstrap: str) -> FeedCase:
    from kafka import KafkaProducer

    from streamfilter.runtime.io.kafka import KafkaQueryFeed
    from tests.support.kafka_broker import create_topic, unique_topic

    topic = create_topic(bootstrap, unique_topic("feed-contract"), partitions=2)

    def publish(lines: list[bytes]) -> None:
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        try:
            for line in lines:
                producer.send(topic, value=line).get(timeout=30)
        finally:
            producer.close()

    client = {"bootstrap_servers": bootstrap}
    return FeedCase(lambda: KafkaQueryFeed(topic, client), publish, None, patience_s=30.0)


@pytest.fixture(params=["file", "policy", "none", pytest.param("kafka", marks=pytest.mark.kafka)])
def case(request, tmp_path) -> Iterator[FeedCase]:
    if request.param == "file":
        made = file_case(tmp_path / "queries.jsonl")
    elif request.param == "policy":
        spec = "streamfilter.policies:standing_monitoring"
        made = FeedCase(lambda: PolicyFeed(spec), None, standing_monitoring)
    elif request.param == "none":
        made = FeedCase(NoQueryFeed, None, None)
    else:
        made = kafka_case(request.getfixturevalue("kafka_bootstrap"))
    yield made
    for feed in made.opened:
        feed.close()


def raw(records: list[tuple[str, bytes]]) -> Counter[bytes]:
    assert all(isinstance(label, str) and label for label, _ in records)
    return Counter(value for _, value in records)


def poll_until(case: FeedCase, feed: QueryFeed, want: int) -> list[tuple[str, bytes]]:
    got: list[tuple[str, bytes]] = []
    deadline = time.monotonic() + case.patience_s
    while len(got) < want and time.monotonic() < deadline:
        got.extend(feed.poll())
    return got


def test_poll_returns_each_published_query_once_and_picks_up_new_ones(case):
    """``poll``: new raw query records as (source label, bytes): each published record once,
    later ones as they arrive. A feed without a wire has nothing to poll and no positions."""
    if case.publish is None:
        feed = case.start(FOREIGN_LABELS)
        assert feed.poll() == [] and feed.poll_all() == [] and feed.positions() == {}
        return
    case.publish(QUERIES[:3])
    feed = case.start()
    assert raw(poll_until(case, feed, 3)) == Counter(QUERIES[:3])
    assert feed.poll() == []
    case.publish(QUERIES[3:])
    assert raw(poll_until(case, feed, 2)) == Counter(QUERIES[3:])


def test_poll_all_returns_everything_published_so_far_in_one_call(case):
    """``poll_all``: everything published to the feed so far (called right before a day closes,
    so that every query registered before the close applies)."""
    if case.publish is None:
        pytest.skip("no wire: nothing is published to this feed")
    case.publish(QUERIES[:3])
    feed = case.start()
    assert raw(feed.poll_all()) == Counter(QUERIES[:3])
    case.publish(QUERIES[3:])
    assert raw(feed.poll_all()) == Counter(QUERIES[3:])
    assert feed.poll() == []


def test_seek_resumes_after_the_positions_of_what_was_read(case):
    """``positions``: durable read positions (label → next offset), stored with each day;
    ``seek`` resumes there, ignoring labels the feed does not own (the source's)."""
    if case.publish is None:
        pytest.skip("no wire: nothing to resume (positions() is {}, checked above)")
    case.publish(QUERIES[:3])
    feed = case.start()
    assert raw(poll_until(case, feed, 3)) == Counter(QUERIES[:3])
    stored = feed.positions()
    assert stored and not set(stored) & set(FOREIGN_LABELS)
    feed.close()
    case.opened.remove(feed)
    case.publish(QUERIES[3:])
    again = case.start(stored | FOREIGN_LABELS)
    assert raw(poll_until(case, again, 2)) == Counter(QUERIES[3:])
    fresh = case.start(FOREIGN_LABELS)  # no position of its own: from the start
    assert raw(poll_until(case, fresh, 5)) == Counter(QUERIES)


def test_on_day_answers_the_policy_for_the_releases_so_far(case):
    """``on_day``: called before ``next_day`` closes with every release so far; a policy feed
    returns its policy's queries (deterministic in its inputs), any other feed nothing."""
    feed = case.start()
    answer = feed.on_day([], "2026-01-01")
    assert feed.on_day([], "2026-01-01") == answer
    expected = case.policy([], "2026-01-01") if case.policy is not None else []
    assert [json.loads(value) for _, value in answer] == expected
    assert all(isinstance(label, str) and label for label, _ in answer)
