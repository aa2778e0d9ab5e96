"""Event sources: small interface, several implementations (file, synthetic; Kafka elsewhere).

Lifecycle: the daemon calls :meth:`Source.seek` once with the positions stored in the state
store (possibly none), then :meth:`Source.poll_batches` repeatedly. Each record carries its
partition and offsets; the daemon, not the source, decides what is durable. ``at_end`` tells
``--until-end`` that every partition has delivered everything that existed when the run started.

``poll`` returns one :class:`SourceRecord` per record; ``poll_batches`` returns the same records
as columns, one :class:`RecordBatch` per run of consecutive records of one partition (the daemon's
hot path: no object per record). Its default groups ``poll``; a source that receives records in
per-partition batches anyway (Kafka) overrides it.
"""

from __future__ import annotations

import abc
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import msgspec
import numpy as np

__all__ = ["FileSource", "RecordBatch", "Source", "SourceRecord", "SyntheticSource"]


class SourceRecord(msgspec.Struct, frozen=True, gc=False):
    """One input record. (A msgspec struct: built ~10× faster than a frozen dataclass, and
    every input record is one.)"""

    partition: str
    offset: int
    next_offset: int
    value: bytes


class RecordBatch(msgspec.Struct, frozen=True):
    """Consecutive records of one partition as columns: record ``i`` starts at ``offsets[i]``
    and has value ``values[i]``; ``next_offset`` is where the record after the last one starts."""

    partition: str
    offsets: list[int]
    values: list[bytes]
    next_offset: int


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
        """True once everything that existed at start has been returned."""

    def mark_end(self) -> None:  # noqa: B027 - optional hook
        """Make :meth:`at_end` refer to what exists now (a driver that appends input between
        ``--until-end`` runs, e.g. ``simulate-local``)."""

    def committed(self, offsets: dict[str, int]) -> None:  # noqa: B027 - optional hook
        """The store committed these resume offsets; a source may mirror them (Kafka groups)."""

    def lag(self) -> dict[str, int]:
        """Records behind the end per partition, for sources that know it."""
        return {}

    def caught_up(self, partition: str) -> bool:
        """False while ``partition`` is known to hold unread records (an idle partition must
        be caught up before it stops holding the watermark back)."""
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class FileSource(Source):
    """JSON lines from one file; offsets are byte offsets. In follow mode a trailing partial line
    (no newline yet) is left for the next poll; at end of input it counts as a line."""

    def __init__(self, path: Path, follow: bool = False) -> None:
        self.path = Path(path)
        self.follow = follow
        self._partition = f"file:{self.path.name}"
        self._fh: IO[bytes] | None = None
        self._offset = 0

    def partitions(self) -> list[str]:
        return [self._partition]

    def seek(self, offsets: dict[str, int]) -> None:
        self._offset = offsets.get(self._partition, 0)
        if self._fh is None:
            try:
                self._fh = open(self.path, "rb")  # noqa: SIM115 - owned by the source
            except FileNotFoundError:
                if not self.follow:
                    raise
                return
        self._fh.seek(self._offset)

    def poll(self, max_records: int) -> list[SourceRecord]:
        if self._fh is None:
            if not self.path.exists():
                return []
            self.seek({self._partition: self._offset})
        assert self._fh is not None
        out: list[SourceRecord] = []
        fh = self._fh
        fh.seek(self._offset)
        while len(out) < max_records:
            line = fh.readline()
            if not line:
                break
            if not line.endswith(b"\n") and self.follow:
                break  # partial line: wait for the writer to finish it
            start = self._offset
            self._offset += len(line)
            body = line.rstrip(b"\r\n")
            if body.strip():
                out.append(SourceRecord(self._partition, start, self._offset, body))
        return out

    def at_end(self) -> bool:
        return self._offset >= self._file_size()

    def _file_size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class SyntheticSource(Source):
    """A reproducible sparse-monitoring stream: each user is active on a day with probability
    ``p_active``; an active user sends one or two events with ``active``, ``minutes`` and a
    ``plan``. Offsets are event indices. The data generator is seeded (it is synthetic *data*,
    not noise)."""

    PLANS = ("free", "pro", "team")

    def __init__(
        self, users: int, days: int, start_day: str, p_active: float, seed: int = 0
    ) -> None:
        self.users, self.days, self.p_active, self.seed = users, days, p_active, seed
        self.start = dt.date.fromisoformat(start_day)
        self._partition = "synthetic"
        self._offset = 0
        self._iter: Iterator[tuple[int, bytes]] | None = None
        rng = np.random.default_rng([seed, 0])
        self._plan = rng.choice(3, size=users, p=[0.6, 0.3, 0.1])
        self._engagement = rng.beta(2.0, 5.0, size=users)

    def partitions(self) -> list[str]:
        return [self._partition]

    def seek(self, offsets: dict[str, int]) -> None:
        self._offset = offsets.get(self._partition, 0)
        self._iter = self._generate(self._offset)

    def _day_events(self, k: int) -> list[bytes]:
        rng = np.random.default_rng([self.seed, 1, k])
        p = np.minimum(1.0, self.p_active * 2 * self._engagement)
        active = np.flatnonzero(rng.random(self.users) < p)
        minutes = np.round(rng.gamma(2.0, 6.0, size=len(active)), 1)
        twice = rng.random(len(active)) < 0.2
        day = (self.start + dt.timedelta(days=k)).isoformat()
        out: list[bytes] = []
        for j, u in enumerate(active.tolist()):
            plan = self.PLANS[self._plan[u]]
            out.append(
                json.dumps(
                    {
                        "user_id": f"u-{u}",
                        "day": day,
                        "values": {"active": 1, "minutes": float(minutes[j]), "plan": plan},
                        "event_id": f"e-{k}-{u}",
                    }
                ).encode()
            )
            if twice[j]:
                out.append(
                    json.dumps(
                        {"user_id": f"u-{u}", "day": day, "values": {"minutes": 3.5}}
                    ).encode()
                )
        return out

    def _generate(self, start_offset: int) -> Iterator[tuple[int, bytes]]:
        offset = 0
        for k in range(self.days):
            events = self._day_events(k)
            if offset + len(events) <= start_offset:
                offset += len(events)
                continue
            for ev in events:
                if offset >= start_offset:
                    yield offset, ev
                offset += 1

    def poll(self, max_records: int) -> list[SourceRecord]:
        if self._iter is None:
            self.seek({})
        assert self._iter is not None
        out = []
        for offset, value in self._iter:
            out.append(SourceRecord(self._partition, offset, offset + 1, value))
            self._offset = offset + 1
            if len(out) >= max_records:
                break
        else:
            self._iter = iter(())
        return out

    def at_end(self) -> bool:
        if self._iter is None:
            return False
        # the generator is exhausted once a poll returned fewer records than asked
        try:
            first = next(self._iter)
        except StopIteration:
            return True
        self._iter = _chain_one(first, self._iter)
        return False


def _chain_one(
    first: tuple[int, bytes], rest: Iterator[tuple[int, bytes]]
) -> Iterator[tuple[int, bytes]]:
    yield first
    yield from rest
