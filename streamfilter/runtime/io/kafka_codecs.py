"""Polling Kafka without ever stopping at a batch the client cannot decode.

Every codec Kafka producers use (none, gzip, snappy, lz4, zstd) is decoded: the codec libraries
kafka-python imports are dependencies of streamfilter (pyproject.toml). A batch that still
cannot be decoded — a corrupt batch (CRC mismatch), a codec this client does not have, a
compressed payload its library refuses — must not stop the run: kafka-python raises the error
from ``poll`` without moving the partition's position, so every restart would hit the same
batch again (a crash loop).

:func:`poll_decodable` polls as usual; when the poll raises such an error it steps the failing
partition's position over the record it stopped at and reports that offset as an
:class:`Undecodable`; the daemon rejects it with reason ``undecodable_batch`` (partition and
offset in the reject record) and goes on. A fetch from an offset inside a compressed batch
returns the whole batch again and nothing in kafka-python's error says where the batch ends, so
a batch of ``n`` records costs ``n`` fetches and gives ``n`` rejects: every skipped record is
accounted for.

kafka-python 3.0.x does not say which partition failed, and after the error the failing
partition's parsed records stay next in line with an exhausted iterator: polling again without
a seek spins forever inside ``Fetcher.fetched_records``. The partition is read from that
next-in-line slot (``consumer._fetcher._next_partition_records``, a private attribute:
``tests/runtime/io/test_kafka_codecs.py`` pins the behaviour); seeking it past the record makes
the fetcher drop the stale slot. When the slot is not there (another kafka-python), the error
propagates as before.
"""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import CorruptRecordError, KafkaError, UnsupportedCodecError

__all__ = ["DECODE_ERRORS", "Undecodable", "is_decode_error", "poll_decodable"]

log = logging.getLogger("streamfilter.kafka")

#: errors kafka-python (or a codec library under it) raises for a batch it cannot decode
DECODE_ERRORS: tuple[type[BaseException], ...] = (
    UnsupportedCodecError,
    CorruptRecordError,
    zlib.error,
    struct.error,
    EOFError,
    ValueError,
    RuntimeError,  # lz4.frame and zstandard raise RuntimeError subclasses on bad frames
    OSError,  # gzip.BadGzipFile
)


def is_decode_error(exc: BaseException) -> bool:
    """True for an error decoding a fetched batch (never a broker, network or auth error)."""
    if isinstance(exc, UnsupportedCodecError | CorruptRecordError):
        return True
    return isinstance(exc, DECODE_ERRORS) and not isinstance(exc, KafkaError)


@dataclass(frozen=True)
class Undecodable:
    """One record the client could not decode: where it is and why (no payload)."""

    tp: TopicPartition
    offset: int
    detail: str


def _detail(exc: BaseException) -> str:
    name = type(exc).__name__
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return text if text.startswith(name) else f"{name}: {text}" if text else name


def poll_decodable(
    consumer: KafkaConsumer,
    max_records: int,
    timeout_ms: int,
) -> tuple[dict[TopicPartition, list[Any]], list[Undecodable]]:
    """``consumer.poll`` that steps over an undecodable record instead of raising.

    Returns the records polled per partition and the undecodable record skipped, if the poll
    stopped at one (then no records: they come with the next poll). Any other error propagates.
    """
    try:
        return consumer.poll(timeout_ms=timeout_ms, max_records=max_records), []
    except Exception as exc:
        if not is_decode_error(exc):
            raise
        tp = _failing_partition(consumer)
        if tp is None:
            raise
        offset = consumer.position(tp)
        consumer.seek(tp, offset + 1)
        bad = Undecodable(tp, offset, _detail(exc))
    log.warning(
        "kafka %s:%d offset %d cannot be decoded (%s): rejected, skipping it",
        bad.tp.topic,
        bad.tp.partition,
        bad.offset,
        bad.detail,
    )
    return {}, [bad]


def _failing_partition(consumer: KafkaConsumer) -> TopicPartition | None:
    """The partition whose parsed records raised (kafka-python's next-in-line slot)."""
    fetcher = getattr(consumer, "_fetcher", None)
    part = getattr(fetcher, "_next_partition_records", None)
    tp = getattr(part, "topic_partition", None)
    return tp if isinstance(tp, TopicPartition) else None
