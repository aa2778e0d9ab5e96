"""File implementations: JSON-lines events (:class:`FileSource`), releases and rejects appended to
a file or written to stdout (:class:`FileSink`, :class:`StdoutSink`), queries from a JSON-lines
file (:class:`FileQueryFeed`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import IO

import numpy as np

from streamfilter.engine.lines import BlockLines, split_lines
from streamfilter.errors import PublishError
from streamfilter.runtime.io.base import QueryFeed, RecordBatch, Sink, Source, SourceRecord
from streamfilter.runtime.private_files import open_private

#: bytes ``FileSource.poll_batches`` reads at a time
BLOCK_BYTES = 1 << 20


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

    def poll_batches(self, max_records: int) -> list[RecordBatch]:
        """What :meth:`poll` returns, as one batch: the file is read in blocks of
        :data:`BLOCK_BYTES`, split into lines natively (``engine.lines.split_lines``) and kept as
        spans of the blocks (``engine.lines.BlockLines``): no Python step and no ``bytes``
        object per line. A line longer than a block is completed with ``readline``."""
        if self._fh is None:
            if not self.path.exists():
                return []
            self.seek({self._partition: self._offset})
        assert self._fh is not None
        fh = self._fh
        # per block read: the block, its kept lines' starts and ends, the block's file offset
        parts: list[tuple[bytes, np.ndarray, np.ndarray, int]] = []
        kept = 0
        next_offset = self._offset
        while kept < max_records:
            fh.seek(self._offset)
            block = fh.read(BLOCK_BYTES)
            if not block:
                break
            at_eof = len(block) < BLOCK_BYTES
            if not at_eof and b"\n" not in block:  # no newline in a whole block: a long line
                block += fh.readline()
                at_eof = not block.endswith(b"\n")
            need = max_records - kept
            starts, ends, taken, consumed, last_end = split_lines(
                block, need, at_eof and not self.follow
            )
            line_starts = np.frombuffer(starts, np.int64)
            if len(line_starts):
                parts.append((block, line_starts, np.frombuffer(ends, np.int64), self._offset))
                kept += len(line_starts)
                next_offset = self._offset + last_end
            self._offset += consumed
            if at_eof and taken < need:  # every line there is was taken
                break
        if not parts:
            return []
        offsets = np.concatenate([p[1] + p[3] for p in parts]).tolist()
        if len(parts) == 1:
            block, line_starts, line_ends, _ = parts[0]
        else:  # the blocks' lines back to back in one buffer (each up to its last line's end)
            used = [int(p[2][-1]) for p in parts]
            shift = np.cumsum([0, *used[:-1]])
            block = b"".join(memoryview(p[0])[:u] for p, u in zip(parts, used, strict=True))
            line_starts = np.concatenate([p[1] + d for p, d in zip(parts, shift, strict=True)])
            line_ends = np.concatenate([p[2] + d for p, d in zip(parts, shift, strict=True)])
        values = BlockLines(block, line_starts, line_ends)
        return [RecordBatch(self._partition, offsets, values, next_offset)]

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


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


def _cut_torn_tail(path: Path) -> None:
    """Truncate a last line that lacks its newline: a record a crash cut short. ``publish``
    writes a record and its newline together and ``flush`` had not returned for it, so the
    outbox still holds it; appending after it would merge the next record into that line."""
    if not path.is_file():  # missing, or a pipe / device: nothing to cut
        return
    with open(path, "rb+") as fh:
        end = fh.seek(0, os.SEEK_END)
        if end == 0:
            return
        fh.seek(end - 1)
        if fh.read(1) == b"\n":
            return
        keep = 0
        while end > 0:
            start = max(0, end - 65536)
            fh.seek(start)
            newline = fh.read(end - start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())


class FileSink(Sink):
    """Append JSON lines to a file; ``flush`` fsyncs. On open, a last line a crash cut short is
    truncated (it was never flushed). Idempotent per key for release files:
    on open, keys already present (``day/query_id`` of existing lines) are remembered with a
    digest of their line; a record with a held key is dropped when its bytes are identical and
    refused (``PublishError``) when they differ: that would be a second noise draw.
    ``private``: a file it creates is ``0600`` (``runtime.private_files``)."""

    def __init__(self, path: Path, dedupe_releases: bool = True, private: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(self.path)
        self._held: dict[str, bytes] = {}  # key -> digest of the record held under it
        if dedupe_releases and self.path.exists():
            with open(self.path, "rb") as fh:
                for line in fh:
                    try:
                        obj = json.loads(line)
                        key = f"{obj['day']}/{obj['query_id']}"
                    except (ValueError, KeyError, TypeError):
                        continue
                    self._held.setdefault(key, _digest(line.rstrip(b"\n")))
        self._dedupe = dedupe_releases
        self._held_through = max((k.split("/", 1)[0] for k in self._held), default=None)
        if private:  # raw input (the reject file): the operator's alone
            fd = open_private(self.path, os.O_WRONLY | os.O_APPEND)
            self._fh: IO[bytes] = os.fdopen(fd, "ab")
        else:
            self._fh = open(self.path, "ab")  # noqa: SIM115 - owned by the sink
        self._unsynced = False  # written since the last fsync

    def publish(self, key: str, payload: bytes) -> None:
        if self._dedupe:
            digest, held = _digest(payload), self._held.get(key)
            if held == digest:
                return  # already held with identical bytes
            if held is not None:
                raise PublishError(
                    f"release file {self.path} already holds a different record under key "
                    f"{key!r}; refusing to publish a second value for it"
                )
            self._held[key] = digest
        self._fh.write(payload + b"\n")
        self._unsynced = True

    def flush(self) -> None:
        """Durable once it returns; an fsync only when something was written since the last
        (the reject file is flushed at every day's close and is usually empty)."""
        if self._unsynced:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._unsynced = False

    def last_published_day(self) -> str | None:
        """The latest ``day`` among the release lines the file held when it was opened."""
        return self._held_through

    def close(self) -> None:
        if not self._fh.closed:
            self.flush()
            self._fh.close()


class StdoutSink(Sink):
    def __init__(self, stream: IO[bytes] | None = None) -> None:
        self._out = stream if stream is not None else sys.stdout.buffer

    def publish(self, key: str, payload: bytes) -> None:
        self._out.write(payload + b"\n")

    def flush(self) -> None:
        self._out.flush()


class FileQueryFeed(QueryFeed):
    """Query JSON lines from a file, read from a stored byte offset; new lines are picked up."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0

    @property
    def _label(self) -> str:
        return f"queries:{self.path.name}"

    def seek(self, offsets: dict[str, int]) -> None:
        self._offset = offsets.get(self._label, 0)

    def positions(self) -> dict[str, int]:
        return {self._label: self._offset}

    def poll(self) -> list[tuple[str, bytes]]:
        if not self.path.exists():
            return []
        out = []
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            for line in fh:
                if not line.endswith(b"\n") and line.strip():
                    break  # partial line
                start = self._offset
                self._offset += len(line)
                if line.strip():
                    out.append((f"{self.path.name}:{start}", line.rstrip(b"\r\n")))
        return out
