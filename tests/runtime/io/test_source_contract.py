"""Contract suite for Source: every implementation runs these tests (runtime/io/base.py states
the guarantees; each test's docstring quotes the one it checks).

A case is a source over a fixed input written before the test starts (``written``, per
partition), plus what the implementation can do: append input later, report lag. What a broker's
source can also do (:class:`BrokerSource`) has its own suite,
tests/runtime/io/test_broker_source_contract.py. Kafka runs on
the real test broker (``tests/support/kafka_broker.py``: skipped locally without one, never in CI).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import pytest

from streamfilter.runtime.io import files
from streamfilter.runtime.io.base import BrokerSource, RecordBatch, Source, SourceRecord
from streamfilter.runtime.io.files import FileSource
from streamfilter.runtime.io.synthetic import SyntheticSource
from streamfilter.testing import MemorySource

FOREIGN_LABELS = {"queries:queries.jsonl": 7, "no-such-topic:0": 3}


def values(n: int, tag: str) -> list[bytes]:
    return [f'{{"record": "{tag}-{i}"}}'.encode() for i in range(n)]


@dataclass
class SourceCase:
    open: Callable[[], Source]  # a new source over the same input (a restart)
    written: dict[str, list[bytes]]  # every record that exists at start, per partition
    append: Callable[[Source, str, bytes], None] | None  # add input after start (None: fixed)
    knows_end: bool  # a BrokerSource: lag() and caught_up() report unread records
    end_fixed_at_start: bool  # at_end() ignores input appended after start until mark_end()
    patience_s: float = 5.0  # how long records may take to become available to poll
    opened: list[Source] = field(default_factory=list)

    def start(self, offsets: dict[str, int] | None = None) -> Source:
        """A new source, sought as the daemon does at start-up."""
        source = self.open()
        self.opened.append(source)
        source.seek({} if offsets is None else offsets)
        return source

    @property
    def total(self) -> int:
        return sum(map(len, self.written.values()))


def memory_case(tmp_path: Path) -> SourceCase:
    written = {"p0": values(7, "p0"), "p1": values(5, "p1"), "p2": []}

    def append(source: Source, partition: str, value: bytes) -> None:
        assert isinstance(source, MemorySource)
        source.append(partition, value)

    return SourceCase(lambda: MemorySource(written), written, append, False, False)


def file_case(tmp_path: Path, follow: bool) -> SourceCase:
    path = tmp_path / "events.jsonl"
    lines = values(9, "f")
    # a blank line is skipped: the next record starts past the previous one's next_offset
    path.write_bytes(b"\n".join([*lines[:4], b"", *lines[4:]]) + b"\n")

    def append(source: Source, partition: str, value: bytes) -> None:
        with open(path, "ab") as fh:
            fh.write(value + b"\n")

    return SourceCase(
        lambda: FileSource(path, follow=follow), {"file:events.jsonl": lines}, append, False, False
    )


def synthetic_case(tmp_path: Path) -> SourceCase:
    def make() -> SyntheticSource:
        return SyntheticSource(users=40, days=3, start_day="2026-01-01", p_active=0.3, seed=4)

    reference = make()
    reference.seek({})
    written = {"synthetic": [r.value for r in reference.poll(10**6)]}
    assert written["synthetic"], "the synthetic case needs some events"
    return SourceCase(make, written, None, False, False)


def kafka_case(bootstrap: str) -> SourceCase:
    from kafka import KafkaProducer

    from streamfilter.runtime.io.kafka import KafkaSource
    from tests.support.kafka_broker import create_topic, unique_topic

    topic = create_topic(bootstrap, unique_topic("source-contract"), partitions=3)
    written = {f"{topic}:0": values(7, "k0"), f"{topic}:1": values(5, "k1"), f"{topic}:2": []}
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")

    def produce(partition: str, value: bytes) -> None:
        number = int(partition.rsplit(":", 1)[1])
        producer.send(topic, value=value, partition=number).get(timeout=30)

    for partition, vals in written.items():
        for value in vals:
            produce(partition, value)
    group = unique_topic("source-contract-group")
    client = {"bootstrap_servers": bootstrap}
    return SourceCase(
        lambda: KafkaSource(topic, client, group, poll_timeout_ms=100),
        written,
        lambda _source, partition, value: produce(partition, value),
        True,
        True,
        patience_s=30.0,
    )


@pytest.fixture(
    params=[
        "memory",
        "file",
        "file-follow",
        "synthetic",
        pytest.param("kafka", marks=pytest.mark.kafka),
    ]
)
def case(request, tmp_path) -> Iterator[SourceCase]:
    if request.param == "memory":
        made = memory_case(tmp_path)
    elif request.param.startswith("file"):
        made = file_case(tmp_path, follow=request.param == "file-follow")
    elif request.param == "synthetic":
        made = synthetic_case(tmp_path)
    else:
        made = kafka_case(request.getfixturevalue("kafka_bootstrap"))
    yield made
    for source in made.opened:
        source.close()


def read(case: SourceCase, poll: Callable[[], list[SourceRecord]], want: int) -> list[SourceRecord]:
    """Poll until ``want`` records came back (or the case's patience ran out)."""
    got: list[SourceRecord] = []
    deadline = time.monotonic() + case.patience_s
    while len(got) < want and time.monotonic() < deadline:
        got.extend(poll())
    return got


def by_partition(records: list[SourceRecord]) -> dict[str, list[SourceRecord]]:
    out: dict[str, list[SourceRecord]] = defaultdict(list)
    for r in records:
        out[r.partition].append(r)
    return out


def values_of(records: list[SourceRecord]) -> dict[str, list[bytes]]:
    return {p: [r.value for r in rs] for p, rs in by_partition(records).items()}


def non_empty(written: dict[str, list[bytes]]) -> dict[str, list[bytes]]:
    return {p: v for p, v in written.items() if v}


def test_poll_returns_every_record_once_in_order_per_partition_then_nothing(case):
    """``poll``: up to ``max_records`` new records, each carrying its partition (one of
    ``partitions()``); ``[]`` when nothing is available; every partition in written order."""
    source = case.start()
    assert sorted(source.partitions()) == sorted(case.written)
    sizes: list[int] = []

    def poll() -> list[SourceRecord]:
        batch = source.poll(3)
        sizes.append(len(batch))
        return batch

    got = read(case, poll, case.total)
    assert max(sizes) <= 3
    assert {r.partition for r in got} <= set(source.partitions())
    assert values_of(got) == non_empty(case.written)
    assert source.poll(3) == []


def test_offsets_increase_per_partition_and_next_offset_is_past_the_record(case):
    """Records carry their offsets: ``offset < next_offset``, and the next record of the
    partition starts at or after ``next_offset`` (monotone; a skipped blank line leaves a gap)."""
    source = case.start()
    got = read(case, lambda: source.poll(4), case.total)
    for records in by_partition(got).values():
        for r in records:
            assert r.offset < r.next_offset
        for before, after in pairwise(records):
            assert after.offset >= before.next_offset


def test_poll_batches_are_the_records_of_poll_as_per_partition_columns(case):
    """``poll_batches``: what ``poll`` returns, in the same order, one batch per run of
    consecutive records of one partition; ``offsets[i]``/``values[i]`` are record ``i``;
    ``next_offset`` is the last record's ``next_offset``."""
    plain_source = case.start()
    plain = read(case, lambda: plain_source.poll(4), case.total)
    batched_source = case.start()
    batches: list[RecordBatch] = []

    def poll() -> list[SourceRecord]:
        out = batched_source.poll_batches(4)
        assert sum(len(b.offsets) for b in out) <= 4
        for first, second in pairwise(out):
            assert first.partition != second.partition  # runs: one batch per run
        batches.extend(out)
        return [
            SourceRecord(b.partition, o, -1, v)
            for b in out
            for o, v in zip(b.offsets, b.values, strict=True)
        ]

    as_records = read(case, poll, case.total)
    assert all(b.offsets and len(b.offsets) == len(b.values) for b in batches)
    expected = {p: [(r.offset, r.value) for r in rs] for p, rs in by_partition(plain).items()}
    assert {
        p: [(r.offset, r.value) for r in rs] for p, rs in by_partition(as_records).items()
    } == expected
    next_offset = {(r.partition, r.offset): r.next_offset for r in plain}
    for b in batches:
        assert b.next_offset == next_offset[(b.partition, b.offsets[-1])]


@pytest.mark.parametrize("at", ["offset", "next_offset"])
def test_seek_resumes_each_partition_at_its_stored_offset(case, at):
    """``seek``: each partition resumes at the given offset (record ``i`` starts at its
    ``offset``; ``next_offset`` is where the record after it starts); labels that are not
    partitions of this source are ignored (the daemon passes the query feed's too)."""
    first = case.start()
    everything = by_partition(read(case, lambda: first.poll(100), case.total))
    middle = {p: len(rs) // 2 for p, rs in everything.items()}
    resume_at = {p: getattr(rs[middle[p]], at) for p, rs in everything.items()}
    skip = 0 if at == "offset" else 1
    expected = {p: [r.value for r in rs[middle[p] + skip :]] for p, rs in everything.items()}
    again = case.start(resume_at | FOREIGN_LABELS)
    got = read(case, lambda: again.poll(100), sum(map(len, expected.values())))
    assert values_of(got) == {p: v for p, v in expected.items() if v}
    assert again.at_end()


def test_partitions_not_named_in_seek_start_at_0(case):
    """``seek``: partitions not named start at 0 (here: all but the first, which resumes past
    its last record)."""
    first = case.start()
    everything = by_partition(read(case, lambda: first.poll(100), case.total))
    named = sorted(everything)[0] if len(everything) > 1 else None
    offsets = {named: everything[named][-1].next_offset} if named else {}
    again = case.start(offsets | FOREIGN_LABELS)
    expected = {p: v for p, v in non_empty(case.written).items() if p != named}
    got = read(case, lambda: again.poll(100), sum(map(len, expected.values())))
    assert values_of(got) == expected


def test_at_end_exactly_once_everything_that_existed_at_start_was_returned(case):
    """``at_end``: True once everything that existed at start has been returned (and not
    before)."""
    source = case.start()
    assert not source.at_end()
    got: list[SourceRecord] = []
    deadline = time.monotonic() + case.patience_s
    while len(got) < case.total and time.monotonic() < deadline:
        got.extend(source.poll(2))
        assert source.at_end() == (len(got) == case.total)
    assert len(got) == case.total and source.at_end()


def test_input_appended_after_the_end_is_read_and_at_end_waits_for_it(case):
    """``at_end`` of a source without a broker follows its current end: input appended once
    everything was read is read too, and ``at_end`` waits for it (a broker source's end is fixed
    until ``mark_end``: tests/runtime/io/test_broker_source_contract.py)."""
    if case.append is None:
        pytest.skip("this source's input is fixed at construction: nothing can be appended")
    if case.end_fixed_at_start:
        pytest.skip("this source's end is the one at start (or at mark_end)")
    source = case.start()
    read(case, lambda: source.poll(100), case.total)
    assert source.at_end()
    partition = sorted(non_empty(case.written))[-1]
    case.append(source, partition, b'{"record": "appended"}')
    assert not source.at_end()
    got = read(case, lambda: source.poll(100), 1)
    assert [(r.partition, r.value) for r in got] == [(partition, b'{"record": "appended"}')]
    assert source.at_end()


def test_input_appended_after_start_does_not_delay_at_end(case):
    """``at_end``: everything that existed *at start* (Kafka: the end offsets seen at start)."""
    if case.append is None:
        pytest.skip("this source's input is fixed at construction: nothing can be appended")
    if not case.end_fixed_at_start:
        pytest.skip(
            "at_end() of this source follows its current end (docs/design.md §5.6: "
            "'once the input is exhausted'), not the end at start"
        )
    source = case.start()
    partition = sorted(non_empty(case.written))[0]
    case.append(source, partition, b'{"record": "late"}')
    start_records = {(p, v) for p, vs in case.written.items() for v in vs}
    returned: set[tuple[str, bytes]] = set()
    deadline = time.monotonic() + case.patience_s
    while not start_records <= returned and time.monotonic() < deadline:
        returned.update((r.partition, r.value) for r in source.poll(1))
    assert start_records <= returned
    assert source.at_end()  # the late record may be unread still


def test_only_a_broker_source_claims_the_broker_abilities(case):
    """A source is a :class:`BrokerSource` (lag, gaps, partitions added, offsets mirrored) iff
    it reads a broker; the daemon gives any other source no lag, no gaps and fixed partitions."""
    source = case.start()
    assert isinstance(source, BrokerSource) == case.knows_end


# ------------------------------------------------------------- FileSource.poll_batches edges
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from streamfilter.runtime.io.base import group_records  # noqa: E402

file_lines = st.lists(
    st.sampled_from([b'{"a": 1}', b"", b"  ", b"\r", b'{"b": 2}\r', b"x\r\r", b" y ", b"\t"]),
    max_size=30,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=file_lines,
    tail=st.sampled_from([b"", b'{"partial": 1', b"  "]),
    follow=st.booleans(),
    max_records=st.integers(1, 7),
    block_bytes=st.sampled_from([1, 2, 5, 8, 13, 1 << 20]),
)
def test_file_poll_batches_equal_the_line_by_line_poll_on_blank_crlf_and_partial_lines(
    tmp_path_factory, monkeypatch, lines, tail, follow, max_records, block_bytes
):
    """FileSource reads its batches in blocks split by C: on blank and whitespace lines, CR line
    ends, a trailing partial line (kept for later in follow mode) and lines longer than a block
    or cut by a block's end, every poll gives what the line-by-line ``poll`` gives, and both
    leave the source at the same offset."""
    monkeypatch.setattr(files, "BLOCK_BYTES", block_bytes)
    path = tmp_path_factory.mktemp("file") / "events.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines) + tail)
    plain, batched = FileSource(path, follow=follow), FileSource(path, follow=follow)
    plain.seek({})
    batched.seek({})
    try:
        for _ in range(len(lines) + 2):
            assert batched.poll_batches(max_records) == group_records(plain.poll(max_records))
            assert batched._offset == plain._offset
    finally:
        plain.close()
        batched.close()
