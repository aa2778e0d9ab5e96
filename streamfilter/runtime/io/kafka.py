"""Apache Kafka adapters: events source, query feed, release/reject sink, topic admin.

Topics: events (key ``user_id``), queries, releases (key ``day/query_id``, value = release JSON),
rejects (``reason`` + ``raw``). The daemon is a single writer (one SQLite state): it assigns
itself every partition of the events topic and seeks to the offsets stored in the state store;
the consumer group's committed offsets only *mirror* those (so lag tools work) and are never read
back. Releases go out in Kafka transactions under the releases topic's own transactional id
(``release_transactional_id``): a second instance fences the first, and only then compares the
topic with its state. A release is marked sent in the store only after its transaction
committed, and a restart republishes the stored bytes: one distinct value per key for
``read_committed`` readers (readers dedupe on the key). Codecs: ``kafka_codecs``. Cluster mode
(docs/design.md §7): the workers read through the consumer group (``KafkaGroupSource``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from kafka import (
    ConsumerRebalanceListener,
    KafkaAdminClient,
    KafkaConsumer,
    KafkaProducer,
    TopicPartition,
)
from kafka.admin import NewTopic
from kafka.errors import (
    AuthorizationError,
    BrokerResponseError,
    InvalidProducerEpochError,
    InvalidReplicationFactorError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
)
from kafka.structs import OffsetAndMetadata

from streamfilter.errors import ConfigError, KafkaAccessError, PublisherFencedError, PublishError
from streamfilter.runtime.io.base import (
    BrokerSource,
    QueryFeed,
    RecordBatch,
    Sink,
    Source,
    SourceRecord,
)
from streamfilter.runtime.io.kafka_codecs import Undecodable, poll_decodable
from streamfilter.runtime.io.kafka_errors import kafka_access, sink_topic_gone
from streamfilter.runtime.io.kafka_group import GroupMembership, member_client_id

__all__ = [
    "KafkaGroupSource",
    "KafkaQueryFeed",
    "KafkaSink",
    "KafkaSource",
    "TopicSpec",
    "create_topics",
    "missing_topics",
    "release_transactional_id",
]

log = logging.getLogger("streamfilter.kafka")
_OFFSET, _VALUE = attrgetter("offset"), attrgetter("value")


#: seconds ``KafkaSource.lag`` waits for the broker's end offsets
LAG_TIMEOUT_S = 5.0


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

    def poll_raw(
        self, max_records: int, timeout_ms: int
    ) -> tuple[dict[TopicPartition, list[Any]], list[Undecodable]]:
        """``consumer.poll``, stepping over records the client cannot decode (returned apart)."""
        return poll_decodable(self.consumer, max_records, timeout_ms)

    def poll(self, max_records: int, timeout_ms: int) -> list[tuple[str, int, bytes]]:
        """Records as (partition, offset, value); an undecodable one has the value ``b""``
        (refused by whoever parses it)."""
        batches, undecodable = self.poll_raw(max_records, timeout_ms)
        out = [(_label(u.tp), u.offset, b"") for u in undecodable]
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


class KafkaSource(Source, BrokerSource):
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
        self._gaps: dict[str, int] = {}  # the last seek's retention gaps
        self._poll_timeout_ms = poll_timeout_ms
        self._end_at_start = self._c.consumer.end_offsets(self._c.tps)
        self._ends = dict(self._end_at_start)
        self._ends_at = time.monotonic()

    def partitions(self) -> list[str]:
        return list(self._c.by_label)

    def seek(self, offsets: dict[str, int]) -> None:
        self._gaps = self._c.seek(offsets)

    def retention_gaps(self) -> dict[str, int]:
        return dict(self._gaps)

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
        polled, undecodable = self._c.poll_raw(max_records, self._poll_timeout_ms)
        return _batches(polled, undecodable)

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
        """Records behind each partition's end; a metric, so it waits at most ``LAG_TIMEOUT_S``
        for the broker (not the client's 30 s request timeout: the loop must not stall on it)."""
        ends = self._c.consumer.end_offsets(self._c.tps, timeout_ms=int(LAG_TIMEOUT_S * 1000))
        return {
            label: max(0, ends[tp] - self._c.consumer.position(tp))
            for label, tp in self._c.by_label.items()
        }

    def caught_up(self, partition: str) -> bool:
        """Position at the partition's end offset. A remembered end (at most a second old)
        answers "not yet"; "caught up" is always asked of the broker now, since a record may
        have arrived since. During a broker outage the answer is False: an unreachable
        partition is not known to be idle."""
        tp = self._c.by_label[partition]
        position = self._c.consumer.position(tp)
        if time.monotonic() - self._ends_at < 1.0 and position < self._ends.get(tp, 0):
            return False
        try:
            self._ends = self._c.consumer.end_offsets(self._c.tps)
            self._ends_at = time.monotonic()
        except KafkaError:
            return False
        return bool(position >= self._ends.get(tp, 0))

    def close(self) -> None:
        self._c.close()


def _batches(
    polled: dict[TopicPartition, list[Any]], undecodable: list[Undecodable]
) -> list[RecordBatch]:
    out: list[RecordBatch] = [
        RecordBatch(_label(u.tp), [u.offset], [b""], u.offset + 1, undecodable=u.detail)
        for u in undecodable
    ]
    for tp, records in sorted(polled.items(), key=lambda kv: kv[0].partition):
        if not records:
            continue
        offsets = list(map(_OFFSET, records))
        values = list(map(_VALUE, records))
        if None in values:  # a tombstone (null value) is an empty record: rejected as such
            values = [b"" if v is None else v for v in values]
        out.append(RecordBatch(_label(tp), offsets, values, offsets[-1] + 1))
    return out


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, source: KafkaGroupSource) -> None:
        self.source = source

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.source._assigned([])

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.source._assigned(sorted(assigned, key=attrgetter("partition")))


class KafkaGroupSource(Source, BrokerSource):
    """Events of the partitions the consumer group assigns this worker (cluster mode,
    docs/design.md §7.1): Kafka's group protocol decides who reads what; a worker joining or
    leaving rebalances the group without any operator action.

    On every assignment (kafka-python's protocol is eager: a rebalance first revokes every
    partition, then assigns the new set) ``on_assign`` is called inside the poll with the new
    partitions' labels (an empty list on revocation) and returns where each must resume (the ledger's stored positions); the
    consumer seeks there before it fetches. The group's committed offsets only mirror the
    ledger's, as in single-process mode. With ``assignment_settle_s`` new partitions are paused
    until the assignment has held that long (docs/design.md §7.1: no record read twice)."""

    def __init__(
        self,
        topic: str,
        client: dict[str, Any],
        group_id: str,
        *,
        member_name: str,
        session_timeout_s: float = 10.0,
        heartbeat_interval_s: float = 3.0,
        max_poll_interval_s: float = 300.0,
        poll_timeout_ms: int = 500,
        assignment_settle_s: float = 0.0,
    ) -> None:
        self.topic = topic
        self.member_name = member_name  # the worker's name, in its client id (io.kafka_group)
        self.on_assign: Any = lambda labels: {}
        self._tps: list[TopicPartition] = []
        self._poll_timeout_ms = poll_timeout_ms
        self._settle_s = assignment_settle_s
        self._settle_until: float | None = None  # when a settling assignment is resumed
        self.consumer = KafkaConsumer(
            **{**client, "client_id": member_client_id(client, member_name)},
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=int(session_timeout_s * 1000),
            heartbeat_interval_ms=int(heartbeat_interval_s * 1000),
            max_poll_interval_ms=int(max_poll_interval_s * 1000),
        )
        if not self.consumer.partitions_for_topic(topic):
            self.consumer.close()
            raise LookupError(f"kafka topic {topic!r} does not exist")
        self.consumer.subscribe([topic], listener=_Rebalance(self))
        self.membership = GroupMembership(self.consumer, client, group_id)
        self._ends: dict[TopicPartition, int] = {}
        self._ends_at = 0.0

    def _assigned(self, tps: list[TopicPartition]) -> None:
        self._tps = list(tps)
        offsets = self.on_assign([_label(tp) for tp in tps])  # also none: the worker idles
        for tp in tps:
            self.consumer.seek(tp, offsets.get(_label(tp), 0))
        self._ends_at = 0.0
        self._settle_until = None
        if tps and self._settle_s > 0:  # read nothing until no other member joins for a while
            self.consumer.pause(*tps)
            self._settle_until = time.monotonic() + self._settle_s

    def partition_count(self) -> int:
        """The topic's partition count in the client's metadata."""
        return len(self.consumer.partitions_for_topic(self.topic) or ())

    def partitions(self) -> list[str]:
        return [_label(tp) for tp in self._tps]

    def seek(self, offsets: dict[str, int]) -> None:  # positions come with each assignment
        pass

    def poll(self, max_records: int) -> list[SourceRecord]:
        return [
            SourceRecord(b.partition, offset, offset + 1, value)
            for b in self.poll_batches(max_records)
            for offset, value in zip(b.offsets, b.values, strict=True)
        ]

    def poll_batches(self, max_records: int) -> list[RecordBatch]:
        """The next records; none while an assignment settles (the poll still joins rebalances)."""
        if self._settle_until is not None and time.monotonic() >= self._settle_until:
            self._settle_until = None
            self.consumer.resume(*self._tps)
        polled, undecodable = poll_decodable(self.consumer, max_records, self._poll_timeout_ms)
        return _batches(polled, undecodable)

    def at_end(self) -> bool:
        return False

    def mark_end(self) -> None:
        """A group's input has no end to mark (``at_end`` is always False)."""

    def retention_gaps(self) -> dict[str, int]:
        """None known: each assigned partition resumes at the ledger's position."""
        return {}

    def refresh_partitions(self, fresh: bool = True) -> list[str]:
        """Never grows here: the group's rebalance assigns new partitions (``on_assign``)."""
        return []

    def committed(self, offsets: dict[str, int]) -> None:
        mirror = {
            tp: OffsetAndMetadata(offsets[_label(tp)], "", -1)
            for tp in self._tps
            if _label(tp) in offsets
        }
        if mirror:
            self.consumer.commit(mirror)

    def lag(self) -> dict[str, int]:
        ends = self.consumer.end_offsets(self._tps)
        return {_label(tp): max(0, ends[tp] - self.consumer.position(tp)) for tp in self._tps}

    def caught_up(self, partition: str) -> bool:
        """As ``KafkaSource.caught_up``: "caught up" is always asked of the broker now."""
        tp = TopicPartition(self.topic, int(partition.rsplit(":", 1)[1]))
        if tp not in self._tps:
            return False  # not (or no longer) assigned here
        position = self.consumer.position(tp)
        if time.monotonic() - self._ends_at < 1.0 and position < self._ends.get(tp, 0):
            return False
        try:
            self._ends = self.consumer.end_offsets(self._tps)
            self._ends_at = time.monotonic()
        except KafkaError:
            return False
        return tp in self._ends and bool(position >= self._ends[tp])

    def close(self) -> None:
        self.membership.close()
        self.consumer.close(autocommit=False)


class KafkaQueryFeed(QueryFeed):
    """Queries from every partition of ``topic``; positions are stored with each closed day."""

    def __init__(self, topic: str, client: dict[str, Any], read_timeout_s: float = 30.0) -> None:
        self._c = _AssignedConsumer(topic, client, group_id=None)
        self._prefix = "queries:"
        self._read_timeout_s = read_timeout_s

    def seek(self, offsets: dict[str, int]) -> None:
        own = {k[len(self._prefix) :]: v for k, v in offsets.items() if k.startswith(self._prefix)}
        self._c.seek(own)

    def positions(self) -> dict[str, int]:
        return {self._prefix + label: off for label, off in self._c.positions().items()}

    def poll(self) -> list[tuple[str, bytes]]:
        return self._records(0)

    def poll_all(self) -> list[tuple[str, bytes]]:
        """Every query up to the end offsets captured now (a day is about to close): one fetch
        returns only part of a backlog, and a query left unread would be refused as
        ``closed_day`` after the close. Raises ``KafkaTimeoutError`` when the end is not reached
        within ``read_timeout_s`` (the daemon retries; the day does not close without them)."""
        consumer, tps = self._c.consumer, self._c.tps
        deadline = time.monotonic() + self._read_timeout_s
        ends = consumer.end_offsets(tps, timeout_ms=int(self._read_timeout_s * 1000))
        out = self._records(0)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() >= deadline:
                raise KafkaTimeoutError(
                    f"could not read kafka topic {self._c.topic!r} to its end offsets within "
                    f"{self._read_timeout_s:g}s"
                )
            out.extend(self._records(100))
        return out

    def _records(self, timeout_ms: int) -> list[tuple[str, bytes]]:
        polled = self._c.poll(10_000, timeout_ms)
        return [(f"{label}:{offset}", value) for label, offset, value in polled]

    def close(self) -> None:
        self._c.close()


def release_transactional_id(topic: str) -> str:
    """The transactional id of the releases topic ``topic``: one publisher per topic, whatever
    state it runs from (docs/kafka.md, "Fenced publishing"; its ACL is on this name)."""
    return f"streamfilter-releases-{topic}"


_FENCED = (ProducerFencedError, InvalidProducerEpochError)

#: how often a waiting flush checks that the releases topic still exists
TOPIC_PROBE_S = 5.0


def _is_fenced(exc: BaseException) -> bool:
    """A fenced producer's error, raised as is or (after the transaction failed) wrapped by
    kafka-python in a generic ``KafkaError`` whose arguments carry it."""
    return isinstance(exc, _FENCED) or any(
        isinstance(a, _FENCED) or (isinstance(a, type) and issubclass(a, _FENCED)) for a in exc.args
    )


class KafkaSink(Sink):
    r"""Producer with ``acks=all``; ``flush`` returns once the broker acknowledged everything.

    With ``transactional_id`` (the releases sink) everything published between two flushes is
    one Kafka transaction, committed by ``flush``: a day's releases become visible to
    ``read_committed`` readers at once. Construction fences no one: :meth:`last_published_day`
    first reads the topic as the running publisher left it, and only a state found not stale
    :meth:`take_over`\ s the topic (``init_transactions``, fencing every earlier producer with
    the same id) and reads it again, now that no other instance can write to it. A fenced sink
    raises
    :class:`PublisherFencedError`. Without ``transactional_id`` (rejects) it is an idempotent
    producer.
    """

    def __init__(
        self,
        topic: str,
        client: dict[str, Any],
        delivery_timeout_s: float = 300.0,
        transactional_id: str | None = None,
    ) -> None:
        self.topic = topic
        self._client = client
        self._held_through: tuple[str | None] | None = None
        self._timeout_s = delivery_timeout_s
        self._transactional_id = transactional_id
        self._in_transaction = False
        self._topic_deleted = False
        extra: dict[str, Any] = {}
        if transactional_id is not None:
            extra = {"transactional_id": transactional_id, "transaction_timeout_ms": 60_000}
        self._producer = KafkaProducer(
            **client,
            **extra,
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            max_in_flight_requests_per_connection=5,
            delivery_timeout_ms=int(delivery_timeout_s * 1000),
            request_timeout_ms=30_000,
            max_block_ms=int(delivery_timeout_s * 1000),
        )
        self._pending: list[Any] = []
        self._taken_over = transactional_id is None  # a plain producer fences no one

    @contextlib.contextmanager
    def _fencing(self) -> Iterator[None]:
        try:
            yield
        except KafkaError as exc:
            if not _is_fenced(exc):
                raise
            raise PublisherFencedError(
                f"another streamfilter instance started publishing to kafka topic {self.topic!r} "
                f"(transactional id {self._transactional_id!r}) and fenced this one "
                f"({type(exc).__name__})"
            ) from None

    def take_over(self) -> str | None:
        """Fence every earlier producer of the topic (``init_transactions``: their open
        transaction is aborted, their next send or commit fails), then read the topic's latest
        day again: what it holds now that no one else can write to it. Called once the state
        was checked against :meth:`last_published_day` (``check_sink_not_ahead``), so a stale
        copy is refused before it stops the instance that is publishing."""
        if not self._taken_over:
            with kafka_access(self._client, topic=self.topic, role="sink.topic"), self._fencing():
                self._producer.init_transactions()
            self._taken_over = True
            self._held_through = None
        return self.last_published_day()

    def publish(self, key: str, payload: bytes) -> None:
        if not self._taken_over:
            raise PublishError(
                f"kafka topic {self.topic!r}: the releases sink publishes only after take_over "
                "(the stale-state check)"
            )
        with self._fencing():
            if self._transactional_id is not None and not self._in_transaction:
                self._producer.begin_transaction()
                self._in_transaction = True
            self._pending.append(self._producer.send(self.topic, key=key.encode(), value=payload))

    def flush(self) -> None:
        """Wait until the broker acknowledged everything (commit the transaction), at most the
        delivery timeout; every ``TOPIC_PROBE_S`` of waiting, check that the topic still
        exists: a deleted topic fails closed within seconds (``PublishError``), not after the
        delivery timeout (the releases stay in the state's outbox)."""
        deadline = time.monotonic() + self._timeout_s
        pending, self._pending = self._pending, []  # after a failure the caller republishes
        with self._fencing():
            try:
                self._wait(self._producer.flush, deadline)
                for future in pending:  # raises the send's KafkaError
                    self._wait(future.get, deadline)
            except (KafkaError, PublishError) as exc:
                # a failed send dooms the open transaction: abort it (if the broker answers) so
                # that the relay's retry republishes in a new one; the store keeps the releases.
                # A deleted topic's transaction is left to the broker (its abort would wait for
                # the sends that cannot complete)
                if self._in_transaction and isinstance(exc, KafkaError):
                    with contextlib.suppress(KafkaError):
                        self._producer.abort_transaction()
                self._in_transaction = False
                self._topic_deleted = isinstance(exc, PublishError)
                raise
            if self._in_transaction:
                self._producer.commit_transaction()
                self._in_transaction = False

    def _wait(self, wait: Callable[[float], object], deadline: float) -> None:
        """``wait(seconds)`` in slices of ``TOPIC_PROBE_S`` until ``deadline``; between slices,
        a topic found deleted fails closed (``PublishError``)."""
        while True:
            left = deadline - time.monotonic()
            try:
                wait(max(1.0, min(TOPIC_PROBE_S, left)))
                return
            except KafkaTimeoutError:
                if left <= TOPIC_PROBE_S:
                    raise
                if (gone := sink_topic_gone(self._client, self.topic)) is not None:
                    raise gone from None

    def last_published_day(self) -> str | None:
        """The latest day among the (committed) releases the topic held when first asked.

        Releases are published in day order with key ``day/query_id``, so each partition's last
        records carry that partition's latest day; the stale-state check (``runtime.store``)
        compares their maximum with the state's last closed day. Reads the tail of each
        partition (``read_committed``: transaction markers and aborted releases are skipped).
        """
        if self._held_through is None:
            role = "sink.topic, READ for the stale-state check"
            with kafka_access(self._client, topic=self.topic, role=role):
                self._held_through = (self._read_last_day(),)
        return self._held_through[0]

    def _read_last_day(self) -> str | None:
        consumer = KafkaConsumer(
            **self._client,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        try:
            parts = consumer.partitions_for_topic(self.topic) or set()
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            if not tps and (gone := sink_topic_gone(self._client, self.topic)) is not None:
                raise gone  # deleted since the start-up check
            if not tps:  # it exists: the user may not read it
                raise KafkaAccessError(
                    f"kafka topic {self.topic!r} (sink.topic) cannot be read by this user: grant "
                    "READ on it — every start reads its last releases to check that the state is "
                    "not a stale copy (docs/kafka.md, ACLs)"
                )
            consumer.assign(tps)
            ends = consumer.end_offsets(tps)
            starts = consumer.beginning_offsets(tps)
            latest: str | None = None
            for tp in tps:
                back, day = 64, None  # the tail holds a commit marker per transaction
                while ends[tp] > starts[tp]:
                    start = max(starts[tp], ends[tp] - back)
                    day = self._last_day_from(consumer, tp, start, ends[tp])
                    if day == "":
                        raise PublishError(
                            f"could not read the last release of kafka topic {self.topic!r} to "
                            "check that the state is not a stale copy; refusing to start"
                        )
                    if day is not None or start == starts[tp]:
                        break
                    back *= 8
                if day is not None:
                    latest = max(latest or day, day)
            return latest
        finally:
            consumer.close()

    @staticmethod
    def _last_day_from(
        consumer: KafkaConsumer, tp: TopicPartition, start: int, end: int
    ) -> str | None:
        """The latest day among the committed records of ``tp`` from ``start`` to its end
        (``None`` if there are none there, ``""`` if the end could not be reached)."""
        consumer.pause(*consumer.assignment())
        consumer.resume(tp)
        consumer.seek(tp, start)
        latest: str | None = None
        deadline = time.monotonic() + 30.0
        while consumer.position(tp) < end:
            if time.monotonic() > deadline:
                return ""
            for records in consumer.poll(timeout_ms=500).values():
                for rec in records:
                    day = (rec.key or b"").decode("utf-8", "replace").split("/", 1)[0]
                    latest = max(latest or day, day)
        return latest

    def close(self) -> None:
        if self._topic_deleted:
            # nothing can be delivered: fail the waiting sends (kafka-python's close flushes
            # first and gives up on a timeout), then close without waiting
            self._producer._accumulator.abort_incomplete_batches()
            with contextlib.suppress(KafkaError):
                self._producer.close(timeout=0)
            return
        try:
            self.flush()
        finally:
            self._producer.close(timeout=10)


def _admin(client: dict[str, Any]) -> KafkaAdminClient:
    return KafkaAdminClient(**client)


def missing_topics(client: dict[str, Any], specs: Iterable[TopicSpec]) -> list[TopicSpec]:
    """The topics of ``specs`` the admin client can see are missing. A topic the user may not
    describe is not listed by the broker: it raises ``KafkaAccessError`` naming it (Kafka
    answers "not authorized" for a topic the user has no rights on, whether it exists or not)."""
    specs = list(specs)
    with kafka_access(client):
        admin = _admin(client)
        try:
            existing = set(admin.list_topics())
            unseen = [s for s in specs if s.name not in existing]
            if not unseen:
                return []
            described = admin.describe_topics([s.name for s in unseen])
            denied = {
                d["name"]
                for d in described
                if d.get("error_code") == TopicAuthorizationFailedError.errno
            }
            for spec in unseen:
                if spec.name in denied:
                    from streamfilter.runtime.io.kafka_errors import explain

                    raise explain(
                        TopicAuthorizationFailedError(), client, topic=spec.name, role=spec.role
                    )
        finally:
            admin.close()
    return unseen


def create_topics(client: dict[str, Any], specs: Iterable[TopicSpec]) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    specs = list(specs)
    todo = missing_topics(client, specs)
    if not todo:
        return []
    created: list[str] = []
    with kafka_access(client):
        admin = _admin(client)
        try:
            _create(admin, todo, created)
        except KafkaError as exc:
            if isinstance(exc, AuthorizationError):
                raise
            raise KafkaAccessError(f"could not create kafka topics: {exc}") from None
        finally:
            admin.close()
    return created


def _create(admin: KafkaAdminClient, todo: list[TopicSpec], created: list[str]) -> None:
    for spec in todo:
        try:
            admin.create_topics(
                [NewTopic(spec.name, spec.partitions, spec.replication_factor)],
                timeout_ms=30_000,
            )
            created.append(spec.name)
        except TopicAlreadyExistsError:
            pass
        except InvalidReplicationFactorError:
            brokers = len(admin.describe_cluster().get("brokers", []))
            key = spec.role.rsplit(".", 1)[0] + ".replication_factor"
            raise ConfigError(
                f"{key} = {spec.replication_factor}: the cluster has {brokers} broker(s), and a "
                f"topic cannot have more replicas than brokers — set {key} to at most "
                f"{brokers} (the topic {spec.name!r} was not created)"
            ) from None
        except BrokerResponseError as exc:
            if isinstance(exc, AuthorizationError):
                raise
            said = re.search(r"error_message='([^']*)'", str(exc))
            raise ConfigError(
                f"kafka refused to create the topic {spec.name!r} ({spec.role}): "
                f"{type(exc).__name__}" + (f": {said.group(1)}" if said else "")
            ) from None
