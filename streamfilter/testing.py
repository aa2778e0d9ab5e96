"""Test doubles shipped with the package: in-memory source and sink, a fake clock, crash points.

Crash points: set ``STREAMFILTER_CRASH_AT=<name>[:<n>]`` and the process SIGKILLs itself the n-th
time (default 1st) it reaches ``crash_point(<name>)``. Names: ``after_commit``,
``after_publish``, ``before_mark_sent``, ``before_mirror``, ``mid_compaction``
(:mod:`streamfilter.runtime.faults`). Nothing here draws noise or touches the accounting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamfilter.runtime.faults import crash_point
from streamfilter.runtime.io.base import Sink, Source, SourceRecord

__all__ = ["FakeClock", "MemorySink", "MemorySource", "crash_point"]


@dataclass
class FakeClock:
    """Injectable clock: ``wall`` (UTC epoch seconds) and ``mono`` advance only when told."""

    wall: float = 0.0
    mono: float = 0.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@dataclass
class MemorySink(Sink):
    records: list[tuple[str, bytes]] = field(default_factory=list)
    flushed: int = 0

    def publish(self, key: str, payload: bytes) -> None:
        self.records.append((key, payload))

    def flush(self) -> None:
        self.flushed = len(self.records)

    @property
    def payloads(self) -> list[bytes]:
        return [p for _, p in self.records]


class MemorySource(Source):
    """Records per partition, appended by the test (``append``); offsets are list indices."""

    def __init__(self, partitions: dict[str, list[bytes]] | None = None) -> None:
        self.data: dict[str, list[bytes]] = {
            p: list(v) for p, v in (partitions or {"p0": []}).items()
        }
        self.offsets = {p: 0 for p in self.data}

    def append(self, partition: str, value: bytes) -> None:
        self.data.setdefault(partition, []).append(value)
        self.offsets.setdefault(partition, 0)

    def partitions(self) -> list[str]:
        return list(self.data)

    def seek(self, offsets: dict[str, int]) -> None:
        for p in self.data:
            self.offsets[p] = offsets.get(p, 0)

    def poll(self, max_records: int) -> list[SourceRecord]:
        out: list[SourceRecord] = []
        for p, values in self.data.items():
            while self.offsets[p] < len(values) and len(out) < max_records:
                i = self.offsets[p]
                out.append(SourceRecord(p, i, i + 1, values[i]))
                self.offsets[p] = i + 1
        return out

    def at_end(self) -> bool:
        return all(self.offsets[p] >= len(v) for p, v in self.data.items())
