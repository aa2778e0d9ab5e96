"""The daemon's I/O interfaces: where events come from (:class:`Source`, and what a broker's source
can also do: :class:`BrokerSource`), where releases and rejects go (:class:`Sink`), where queries
come from (:class:`QueryFeed`). Implementations live
beside this file (``files``, ``synthetic``, ``policy``, ``kafka``; in-memory doubles in
``streamfilter.testing``); each interface has one contract test suite that every implementation
runs (``tests/runtime/io/``).

Source lifecycle: the daemon calls :meth:`Source.seek` once with the positions stored in the
state store (possibly none), then :meth:`Source.poll_batches` repeatedly. Each record carries its
partition and offsets; the daemon, not the source, decides what is durable. ``at_end`` tells
``--until-end`` that the input is exhausted (:meth:`Source.at_end` says which end).
``poll`` returns one :class:`SourceRecord` per record; ``poll_batches`` returns the same records
as columns, one :class:`RecordBatch` per run of consecutive records of one partition (the
daemon's hot path: no object per record). Its default groups ``poll``; a source that receives
records in per-partition batches anyway (Kafka) overrides it.

Sink guarantee expected by the outbox relay: when :meth:`Sink.flush` returns, every record passed
to :meth:`Sink.publish` before it is durable (file: fsync'd; Kafka: acknowledged). Records are
published with a key (``day/query_id`` for releases); a sink may drop a record whose key it
already holds with identical bytes (a different record under a held key is never dropped
silently: the sink holds it too, or ``publish`` refuses it with ``PublishError``). A sink that can read back what it holds reports the latest
day it holds a release of (:meth:`Sink.last_published_day`): the daemon refuses to start from a
state whose last closed day is earlier (a restored stale copy of the state; docs/design.md §5).

A query feed yields raw query records; the daemon validates and registers them durably.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from streamfilter.engine.contract import Release


class SourceRecord(msgspec.Struct, frozen=True, gc=False):
    """One input record. (A msgspec struct: built ~10× faster than a frozen dataclass, and
    every input record is one.)"""

    partition: str
    offset: int
    next_offset: int
    value: bytes


class RecordBatch(msgspec.Struct, frozen=True):
    """Consecutive records of one partition as columns: record ``i`` starts at ``offsets[i]``
    and has value ``values[i]``; ``next_offset`` is where the record after the last one starts.

    ``undecodable`` (non-empty: why) marks records the source could not decode (e.g. a Kafka
    batch compressed with a codec the client lacks): their values are empty and the daemon
    rejects each one as ``undecodable_batch`` instead of parsing it."""

    partition: str
    offsets: list[int]
    values: Sequence[bytes]  # a list, or the file source's lines in place (engine.lines)
    next_offset: int
    undecodable: str = ""


def group_records(records: list[SourceRecord]) -> list[RecordBatch]:
    """``records`` as batches, one per run of consecutive records of the same partition."""
    out: list[RecordBatch] = []
    start = 0
    for i in range(1, len(records) + 1):
        if i == len(records) or records[i].partition != records[start].partition:
            run = records[start:i]
            out.append(
                RecordBatch(
                    run[0].partition,
                    [r.offset for r in run],
                    [r.value for r in run],
                    run[-1].next_offset,
                )
            )
            start = i
    return out


class Source(abc.ABC):
    @abc.abstractmethod
    def partitions(self) -> list[str]: ...

    @abc.abstractmethod
    def seek(self, offsets: dict[str, int]) -> None:
        """Resume each partition at the given offset (partitions not named start at 0)."""

    @abc.abstractmethod
    def poll(self, max_records: int) -> list[SourceRecord]:
        """Up to ``max_records`` new records; ``[]`` when nothing is available right now."""

    def poll_batches(self, max_records: int) -> list[RecordBatch]:
        """What :meth:`poll` returns, in the same order, as per-partition column batches."""
        return group_records(self.poll(max_records))

    @abc.abstractmethod
    def at_end(self) -> bool:
        """True once the input is exhausted for ``--until-end``: a source that knows its end
        offsets (Kafka) means everything that existed at start (or at
        :meth:`BrokerSource.mark_end`); a file
        or in-memory source means everything it holds now, so input appended while it runs is
        read too (tests/runtime/io/test_source_contract.py pins both)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def marks(self) -> dict[str, int]:
        """Values to commit with the positions, under labels of their own, and to get back in
        :meth:`seek`'s ``offsets`` (a file source stores what identifies its file). Default:
        none."""
        return {}


@runtime_checkable
class BrokerSource(Protocol):
    """What a source reading a broker's partitions can also do (Kafka's sources implement it):
    compare its positions with the partitions' ends, mirror the store's offsets, follow
    partitions added while it runs. The daemon asks ``isinstance(source, BrokerSource)`` once;
    a source without a broker behaves as if it had no lag, no gaps and a fixed set of
    partitions."""

    def mark_end(self) -> None:
        """Make :meth:`Source.at_end` refer to what exists now (a driver that appends input
        between ``--until-end`` runs, e.g. ``simulate-local``)."""
        ...

    def committed(self, offsets: dict[str, int]) -> None:
        """The store committed these resume offsets; the source may mirror them (consumer
        groups); they are never read back."""
        ...

    def lag(self) -> dict[str, int]:
        """Records behind the end per partition."""
        ...

    def retention_gaps(self) -> dict[str, int]:
        """Per partition, the records between the offset the last ``seek`` asked for and the
        partition's beginning (deleted before they were read)."""
        ...

    def refresh_partitions(self, fresh: bool = True) -> list[str]:
        """Partitions added to the input since the last call (read from their beginning from
        now on); raises when the source cannot tell (then no day may close). ``fresh``: ask the
        broker now rather than a cached view."""
        ...

    def caught_up(self, partition: str) -> bool:
        """False while ``partition`` is known to hold unread records (an idle partition must
        be caught up before it stops holding the watermark back)."""
        ...


class Sink(abc.ABC):
    @abc.abstractmethod
    def publish(self, key: str, payload: bytes) -> None: ...

    @abc.abstractmethod
    def flush(self) -> None:
        """Return once everything published so far is durable / acknowledged."""

    def last_published_day(self) -> str | None:
        """The latest day this sink already holds a release of, if it can tell (else ``None``)."""
        return None

    def take_over(self) -> str | None:
        """Become the sink's only publisher (fencing any earlier one, where the sink can) and
        return :meth:`last_published_day` as it is after that."""
        return self.last_published_day()

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


#: how much of a refused record a reject record quotes by default (``[rejects] max_raw_bytes``)
DEFAULT_REJECT_RAW_BYTES = 4096


def reject_payload(
    reason: str, detail: str, raw: bytes, source: str, max_raw_bytes: int | None = None
) -> bytes:
    """One reject record: the reason, a value-free detail, and the raw bytes (as text when they
    are UTF-8, else ``raw_b64``).

    A record longer than ``max_raw_bytes`` is quoted up to that many bytes (its text cut at a
    character boundary) and the record adds ``raw_bytes`` (the original length) and
    ``raw_sha256`` (of all the original bytes): a reject stays bounded — at most about
    ``6 × max_raw_bytes`` bytes once JSON escapes control characters — so that no input can make
    a reject the sink refuses (a 5 MB message, a line of control bytes)."""
    record: dict[str, str | int] = {"reason": reason, "detail": detail, "source": source}
    head = raw if max_raw_bytes is None or len(raw) <= max_raw_bytes else raw[:max_raw_bytes]
    try:
        raw.decode("utf-8")
        record["raw"] = head.decode("utf-8", "ignore")  # drops only a cut last character
    except UnicodeDecodeError:
        import base64

        record["raw_b64"] = base64.b64encode(head).decode("ascii")
    if len(head) < len(raw):
        import hashlib

        record["raw_bytes"] = len(raw)
        record["raw_sha256"] = hashlib.sha256(raw).hexdigest()
    return json.dumps(record, ensure_ascii=False).encode("utf-8")


Policy = Callable[[Sequence[Release], str], Iterable[dict[str, Any]]]


class QueryFeed:
    def poll(self) -> list[tuple[str, bytes]]:
        """New raw query records as (source label, bytes)."""
        return []

    def poll_all(self) -> list[tuple[str, bytes]]:
        """Everything published to the feed so far (called right before a day closes, so that
        every query registered before the close applies). Default: one ``poll``."""
        return self.poll()

    def on_day(self, history: Sequence[Release], next_day: str) -> list[tuple[str, bytes]]:
        """Called before ``next_day`` closes, with every release so far."""
        return []

    def positions(self) -> dict[str, int]:
        """Durable read positions (partition label → next offset), stored with each day."""
        return {}

    def seek(self, offsets: dict[str, int]) -> None:
        """Resume at stored positions (labels this feed does not own are ignored)."""

    def close(self) -> None:
        pass


class NoQueryFeed(QueryFeed):
    pass
