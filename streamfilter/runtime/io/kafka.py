"""Apache Kafka adapters: events source, query feed, release/reject sink, topic admin.

Topics: events (key ``user_id``), queries, releases (key ``day/query_id``, value = release JSON),
rejects (``reason`` + ``raw``). The daemon is a single writer (one SQLite state): it assigns
itself every partition of the events topic and seeks to the offsets stored in the state store;
the consumer group's committed offsets only *mirror* those (so lag tools work) and are never read
back. Releases go out through an idempotent producer with ``acks=all``; a release is marked sent
in the store only after the broker acknowledged it, and a restart republishes the stored bytes,
so the releases topic holds exactly one distinct value per key (possibly repeated: readers dedupe
on the key).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, KafkaTimeoutError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata

from streamfilter.errors import PublishError
from streamfilter.runtime.io.base import QueryFeed, RecordBatch, Sink, Source, SourceRecord

__all__ = [
    "KafkaQueryFeed",
    "KafkaSink",
    "KafkaSource",
    "TopicSpec",
    "create_topics",
    "missing_topics",
]

log = logging.getLogger("streamfilter.kafka")
_OFFSET, _VALUE = attrgetter("offset"), attrgetter("value")


@dataclass(frozen=True)
class TopicSpec:
    role: str  # config key that names it, e.g. "source.topic"
    name: str
    partitions: int = 1
    replication_factor: int = 1


def _label(tp: TopicPartition) -> str:
    return f"{tp.topic}:{tp.partition}"


class _AssignedConsumer:
    """A consumer that owns every partition of one topic (manual assignment, no rebalances)."""

    def __init__(
        self,
        topic: str,
        client: dict[str, Any],
        group_id: str | None,
        metadata_max_age_ms: int = 300_000,
    ) -> None:
        self.topic = topic
        self.consumer = KafkaConsumer(
            **client,
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            metadata_max_age_ms=metadata_max_age_ms,
        )
        parts = self.consumer.partitions_for_topic(topic)
        if not parts:
            self.consumer.close()
            raise LookupError(f"kafka topic {topic!r} does not exist")
        self.tps = [TopicPartition(topic, p) for p in sorted(parts)]
        self.consumer.assign(self.tps)
        self.by_label = {_label(tp): tp for tp in self.tps}

    def seek(self, offsets: dict[str, int]) -> dict[str, int]:
        """Resume at ``offsets`` (at the beginning where none or an earlier one is stored);
        return the records skipped per partition: stored offset → beginning (a gap)."""
        beginning = self.consumer.beginning_offsets(self.tps)
        gaps = {}
        for label, tp in self.by_label.items():
            stored = offsets.get(label)
            if stored is not None and stored < beginning[tp]:
                gaps[label] = beginning[tp] - stored
            self.consumer.seek(tp, max(offsets.get(label, 0), beginning[tp]))
        return gaps

    def poll(self, max_records: int, timeout_ms: int) -> list[tuple[str, int, bytes]]:
        batches = self.consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        out = []
        for tp, records in sorted(batches.items(), key=lambda kv: kv[0].partition):
            label = _label(tp)
            for rec in records:
                out.append((label, rec.offset, rec.value if rec.value is not None else b""))
        return out

    def positions(self) -> dict[str, int]:
        return {label: self.consumer.position(tp) for label, tp in self.by_label.items()}

    def add_new_partitions(self, fresh_metadata: bool) -> list[TopicPartition]:
        """Assign the topic's partitions added since the last look (from their beginning) and
        return them; ``fresh_metadata`` asks the broker first (else the cached metadata, at most
        ``metadata_max_age_ms`` old). Raises ``KafkaError`` when the broker cannot answer."""
        if fresh_metadata:
            self.consumer.topics()  # one Metadata request
        parts = self.consumer.partitions_for_topic(self.topic)
        new = [TopicPartition(self.topic, p) for p in sorted(parts) if p >= len(self.tps)]
        if new:
            self.tps = [*self.tps, *new]
            self.consumer.assign(self.tps)  # kept partitions keep their positions
            self.consumer.seek_to_beginning(*new)
            self.by_label.update((_label(tp), tp) for tp in new)
        return new

    def close(self) -> None:
        self.consumer.close(autocommit=False)


class KafkaSource(Source):
    """Events from every partition of ``topic``; offsets are Kafka offsets.

    Partitions follow the topic: the cached metadata (refreshed every
    ``metadata_refresh_s``) is checked at every poll and fresh metadata is asked for before
    days close (:meth:`refresh_partitions`); an added partition is read from its beginning."""

    def __init__(
        self,
        topic: str,
        client: dict[str, Any],
        group_id: str,
        poll_timeout_ms: int = 500,
        metadata_refresh_s: float = 5.0,
    ) -> None:
        self._c = _AssignedConsumer(topic, client, group_id, int(metadata_refresh_s * 1000))
        self._poll_timeout_ms = poll_timeout_ms
        self._end_at_start = self._c.consumer.end_offsets(self._c.tps)
        self._ends = dict(self._end_at_start)
        self._ends_at = time.monotonic()

    def partitions(self) -> list[str]:
        return list(self._c.by_label)

    def seek(self, offsets: dict[str, int]) -> None:
        self._gaps = self._c.seek(offsets)

    def retention_gaps(self) -> dict[str, int]:
        return dict(getattr(self, "_gaps", {}))

    def poll(self, max_records: int) -> list[SourceRecord]:
        return [
            SourceRecord(b.partition, offset, offset + 1, value)
            for b in self.poll_batches(max_records)
            for offset, value in zip(b.offsets, b.values, strict=True)
        ]

    def refresh_partitions(self, fresh: bool = True) -> list[str]:
        new = self._c.add_new_partitions(fresh)
        if new:
            ends = self._c.consumer.end_offsets(new)
            self._end_at_start.update(ends)
            self._ends.update(ends)
            log.warning(
                "kafka topic %r grew to %d partitions; reading %s from the beginning",
                self._c.topic,
                len(self._c.tps),
                ", ".join(map(_label, new)),
            )
        return [_label(tp) for tp in new]

    def poll_batches(self, max_records: int) -> list[RecordBatch]:
        """One batch per partition that returned records, in partition order. (Two C-level
        passes over kafka-python's records; this runs for every input record.)"""
        with contextlib.suppress(KafkaError):  # cached metadata: no request
            self.refresh_partitions(fresh=False)
        polled = self._c.consumer.poll(timeout_ms=self._poll_timeout_ms, max_records=max_records)
        out: list[RecordBatch] = []
        for tp, records in sorted(polled.items(), key=lambda kv: kv[0].partition):
            if not records:
                continue
            offsets = list(map(_OFFSET, records))
            values = list(map(_VALUE, records))
            if None in values:  # a tombstone (null value) is an empty record: rejected as such
                values = [b"" if v is None else v for v in values]
            out.append(RecordBatch(_label(tp), offsets, values, offsets[-1] + 1))
        return out

    def mark_end(self) -> None:
        self._end_at_start = self._c.consumer.end_offsets(self._c.tps)

    def at_end(self) -> bool:
        """Consumed up to the end offsets seen when the run started (``--until-end``)."""
        return all(self._c.consumer.position(tp) >= self._end_at_start[tp] for tp in self._c.tps)

    def committed(self, offsets: dict[str, int]) -> None:
        mirror = {
            tp: OffsetAndMetadata(offsets[label], "", -1)
            for label, tp in self._c.by_label.items()
            if label in offsets
        }
        if mirror:
            self._c.consumer.commit(mirror)

    def lag(self) -> dict[str, int]:
        ends = self._c.consumer.end_offsets(self._c.tps)
        return {
            label: max(0, ends[tp] - self._c.consumer.position(tp))
            for label, tp in self._c.by_label.items()
        }

    def caught_up(self, partition: str) -> bool:
        """Position at the partition's end offset (asked at most once a second). During a
        broker outage the answer is False: an unreachable partition is not known to be idle."""
        now = time.monotonic()
        if now - self._ends_at >= 1.0:
            try:
                self._ends = self._c.consumer.end_offsets(self._c.tps)
                self._ends_at = now
            except KafkaError:
                return False
        tp = self._c.by_label[partition]
        return bool(self._c.consumer.position(tp) >= self._ends.get(tp, 0))

    def close(self) -> None:
        self._c.close()


class KafkaQueryFeed(QueryFeed):
    """Queries from every partition of ``topic``; positions are stored with each closed day."""

    def __init__(self, topic: str, client: dict[str, Any]) -> None:
        self._c = _AssignedConsumer(topic, client, group_id=None)
        self._prefix = "queries:"

    def seek(self, offsets: dict[str, int]) -> None:
        own = {k[len(self._prefix) :]: v for k, v in offsets.items() if k.startswith(self._prefix)}
        self._c.seek(own)

    def positions(self) -> dict[str, int]:
        return {self._prefix + label: off for label, off in self._c.positions().items()}

    def poll(self) -> list[tuple[str, bytes]]:
        return [(f"{label}:{offset}", value) for label, offset, value in self._c.poll(10_000, 0)]

    def poll_all(self, timeout_s: float = 60.0) -> list[tuple[str, bytes]]:
        """Every query up to the end offsets captured now (a day is about to close): one fetch
        returns only part of a backlog, and a query left unread would be refused as
        ``closed_day`` after the close. Raises ``KafkaTimeoutError`` when the end is not reached
        within ``timeout_s`` (the daemon retries; the day does not close without them)."""
        consumer, tps = self._c.consumer, self._c.tps
        ends = consumer.end_offsets(tps)
        out: list[tuple[str, bytes]] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"reading kafka topic {self._c.topic!r} to its end")
            out.extend(
                (f"{label}:{offset}", value) for label, offset, value in self._c.poll(10_000, 200)
            )
        return out

    def close(self) -> None:
        self._c.close()


class KafkaSink(Sink):
    """Idempotent producer, ``acks=all``; ``flush`` returns once the broker acknowledged all."""

    def __init__(
        self, topic: str, client: dict[str, Any], delivery_timeout_s: float = 300.0
    ) -> None:
        self.topic = topic
        self._client = client
        self._held_through: tuple[str | None] | None = None
        self._timeout_s = delivery_timeout_s
        self._producer = KafkaProducer(
            **client,
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            max_in_flight_requests_per_connection=5,
            delivery_timeout_ms=int(delivery_timeout_s * 1000),
            request_timeout_ms=30_000,
            max_block_ms=int(delivery_timeout_s * 1000),
        )
        self._pending: list[Any] = []

    def publish(self, key: str, payload: bytes) -> None:
        self._pending.append(self._producer.send(self.topic, key=key.encode(), value=payload))

    def flush(self) -> None:
        deadline = time.monotonic() + self._timeout_s
        pending, self._pending = self._pending, []  # after a failure the caller republishes
        self._producer.flush(timeout=self._timeout_s)
        for future in pending:
            future.get(timeout=max(1.0, deadline - time.monotonic()))  # raises KafkaError

    def last_published_day(self) -> str | None:
        """The latest day among the releases the topic held when first asked.

        Releases are published in day order with key ``day/query_id``, so each partition's last
        record carries that partition's latest day; the stale-state check (``runtime.store``)
        compares their maximum with the state's last closed day. Reads one record per partition.
        """
        if self._held_through is None:
            self._held_through = (self._read_last_day(),)
        return self._held_through[0]

    def _read_last_day(self) -> str | None:
        consumer = KafkaConsumer(**self._client, group_id=None, enable_auto_commit=False)
        try:
            parts = consumer.partitions_for_topic(self.topic) or set()
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            if not tps:
                return None
            consumer.assign(tps)
            ends = consumer.end_offsets(tps)
            starts = consumer.beginning_offsets(tps)
            wanted = {tp for tp in tps if ends[tp] > starts[tp]}
            for tp in wanted:
                consumer.seek(tp, ends[tp] - 1)
            latest: str | None = None
            deadline = time.monotonic() + 30.0
            while wanted and time.monotonic() < deadline:
                for tp, records in consumer.poll(timeout_ms=500).items():
                    for rec in records:
                        if rec.offset == ends[tp] - 1:
                            wanted.discard(tp)
                            day = (rec.key or b"").decode("utf-8", "replace").split("/", 1)[0]
                            latest = max(latest or day, day)
            if wanted:
                raise PublishError(
                    f"could not read the last release of kafka topic {self.topic!r} to check that "
                    "the state is not a stale copy; refusing to start"
                )
            return latest
        finally:
            consumer.close()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._producer.close(timeout=10)


def _admin(client: dict[str, Any]) -> KafkaAdminClient:
    return KafkaAdminClient(**client)


def missing_topics(client: dict[str, Any], specs: Iterable[TopicSpec]) -> list[TopicSpec]:
    admin = _admin(client)
    try:
        existing = set(admin.list_topics())
    finally:
        admin.close()
    return [s for s in specs if s.name not in existing]


def create_topics(client: dict[str, Any], specs: Iterable[TopicSpec]) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    specs = list(specs)
    todo = missing_topics(client, specs)
    if not todo:
        return []
    admin = _admin(client)
    created = []
    try:
        for spec in todo:
            try:
                admin.create_topics(
                    [NewTopic(spec.name, spec.partitions, spec.replication_factor)],
                    timeout_ms=30_000,
                )
                created.append(spec.name)
            except TopicAlreadyExistsError:
                pass
    except KafkaError as exc:
        raise RuntimeError(f"could not create kafka topics: {exc}") from exc
    finally:
        admin.close()
    return created
