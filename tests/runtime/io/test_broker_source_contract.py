"""Contract suite for BrokerSource (runtime/io/base.py): what a source reading a broker's
partitions can also do — report lag and caught-up partitions, mirror committed offsets, move
its end (``mark_end``). Every BrokerSource runs these tests; the cases are the Source suite's
broker cases (Kafka, on the real test broker: ``tests/support/kafka_broker.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streamfilter.runtime.io.base import BrokerSource
from tests.runtime.io.test_source_contract import (
    FOREIGN_LABELS,
    SourceCase,
    by_partition,
    kafka_case,
    non_empty,
    read,
    values_of,
)


@pytest.fixture(params=[pytest.param("kafka", marks=pytest.mark.kafka)])
def case(request) -> Iterator[SourceCase]:
    made = kafka_case(request.getfixturevalue("kafka_bootstrap"))
    yield made
    for source in made.opened:
        source.close()


def broker(source: object) -> BrokerSource:
    assert isinstance(source, BrokerSource)
    return source


def test_lag_and_caught_up_report_unread_records(case):
    """``lag``: records behind the end per partition. ``caught_up``: False while the
    partition is known to hold unread records."""
    source = case.start()
    b = broker(source)
    assert b.lag() == {p: len(v) for p, v in case.written.items()}
    assert {p: b.caught_up(p) for p in source.partitions()} == {
        p: not v for p, v in case.written.items()
    }
    read(case, lambda: source.poll(100), case.total)
    assert b.lag() == dict.fromkeys(case.written, 0)
    assert all(b.caught_up(p) for p in source.partitions())


def test_committed_offsets_are_only_mirrored_never_read_back(case):
    """``committed``: a source may mirror the store's resume offsets (labels it does not own
    included), but the store decides what is durable: the next start seeks to what it is given."""
    source = case.start()
    got = read(case, lambda: source.poll(100), case.total)
    resume = {p: rs[-1].next_offset for p, rs in by_partition(got).items()}
    broker(source).committed(resume | FOREIGN_LABELS)
    assert source.poll(100) == [] and source.at_end()
    source.close()
    case.opened.remove(source)
    again = case.start()  # no stored positions: from the start, whatever was mirrored
    assert values_of(read(case, lambda: again.poll(100), case.total)) == non_empty(case.written)


def test_mark_end_makes_at_end_wait_for_input_appended_since(case):
    """``mark_end``: ``at_end`` then refers to what exists now (simulate-local appends input
    between ``--until-end`` runs)."""
    assert case.append is not None
    source = case.start()
    read(case, lambda: source.poll(100), case.total)
    assert source.at_end()
    partition = sorted(non_empty(case.written))[-1]
    case.append(source, partition, b'{"record": "appended"}')
    broker(source).mark_end()
    assert not source.at_end()
    got = read(case, lambda: source.poll(100), 1)
    assert [(r.partition, r.value) for r in got] == [(partition, b'{"record": "appended"}')]
    assert source.at_end()


def test_no_gaps_after_seeking_inside_the_retained_records(case):
    """``retention_gaps``: none when every record after the sought offsets is still held."""
    source = case.start()
    assert broker(source).retention_gaps() == {}
    assert broker(source).refresh_partitions(fresh=True) == []  # the topic did not grow


def test_caught_up_sees_a_record_appended_a_moment_ago(case):
    """A partition that was caught up a moment ago and has since received a record is not
    caught up: the watermark rule closes an idle partition's day only when it is read to its
    end, so an answer remembered from before the record arrived would close the day under it
    (its record then rejected as late)."""
    assert case.append is not None
    source = case.start()
    read(case, lambda: source.poll(100), case.total)
    b = broker(source)
    partition = sorted(non_empty(case.written))[-1]
    assert b.caught_up(partition)
    case.append(source, partition, b'{"record": "just now"}')
    assert not b.caught_up(partition)
