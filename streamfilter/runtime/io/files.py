"""File implementations: JSON-lines events (:class:`FileSource`), releases and rejects appended to
a file or written to stdout (:class:`FileSink`, :class:`StdoutSink`), queries from a JSON-lines
file (:class:`FileQueryFeed`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import IO

import numpy as np

from streamfilter.engine.lines import BlockLines, split_lines
from streamfilter.errors import ExitCode, PublishError, StreamfilterError
from streamfilter.runtime.io.base import QueryFeed, RecordBatch, Sink, Source, SourceRecord
from streamfilter.runtime.private_files import open_private

log = logging.getLogger("streamfilter.source")

#: bytes ``FileSource.poll_batches`` reads at a time
BLOCK_BYTES = 1 << 20


#: bytes at the head of a file whose hash identifies it (stored with the input position)
HEAD_BYTES = 4096
_HEAD_LEN_BITS = 13  # HEAD_BYTES fits: a mark is hash << 13 | length, below 2**61


class InputChangedError(StreamfilterError, RuntimeError):
    """The input file is not the one the state read up to its stored position (replaced,
    truncated, or rotated away while a day read from it was open): reading on from the stored
    offset would skip or misread records silently."""

    exit_code = ExitCode.FAIL_CLOSED
    consequence = "nothing was read or released past the last committed day"


def _head_mark(head: bytes) -> int:
    """A file's identity as one stored integer: a 48-bit hash of its first ``len(head)`` bytes
    (at most :data:`HEAD_BYTES`) and that length."""
    digest = hashlib.blake2b(head, digest_size=6).digest()
    return int.from_bytes(digest, "big") << _HEAD_LEN_BITS | len(head)


class FileSource(Source):
    """JSON lines from one file; offsets are byte offsets. In follow mode a trailing partial line
    (no newline yet) is left for the next poll; at end of input it counts as a line.

    Rotation, as ``tail -F``: in follow mode, when the path comes to name another file (the old
    one renamed, a new one created), the old file is read to its end (a last line without its
    newline counts) and the new one from its start; offsets go on from where the old file ended
    (the partition's offsets are bytes of the files in order), so nothing is lost or read twice.

    Identity: with each committed position the source stores two marks (:meth:`marks`): the
    bytes of earlier files (``#base``) and a hash of the current file's first bytes it read
    (``#head``, up to :data:`HEAD_BYTES`). A file that no longer starts with those bytes, or is
    shorter than the stored position, was replaced or truncated: :meth:`seek` raises
    :class:`InputChangedError` (exit 4) instead of reading on from a wrong place. So does a file
    truncated while followed (copy-and-truncate rotation loses the lines written in between)."""

    def __init__(self, path: Path, follow: bool = False) -> None:
        self.path = Path(path)
        self.follow = follow
        self._partition = f"file:{self.path.name}"
        self._fh: IO[bytes] | None = None
        self._offset = 0  # in the open file
        self._base = 0  # bytes of the files read before it (rotated away)
        self._stored_head: int | None = None  # the #head mark the state holds, until verified
        self._head: int | None = None  # the mark of the open file's first HEAD_BYTES (when read)

    @property
    def _base_label(self) -> str:
        return self._partition + "#base"

    @property
    def _head_label(self) -> str:
        return self._partition + "#head"

    def partitions(self) -> list[str]:
        return [self._partition]

    def seek(self, offsets: dict[str, int]) -> None:
        self._base = offsets.get(self._base_label, 0)
        self._stored_head = offsets.get(self._head_label)
        self._offset = offsets.get(self._partition, 0) - self._base
        if self._offset < 0:
            raise InputChangedError(
                f"source.path {self.path}: a day still open began in a file rotated away since "
                f"(its records are in the old file, {-self._offset:,} bytes before this one "
                "began): put the old file's remaining lines back at the start of this one, or "
                "restore the old file under this name until the day closes"
            )
        if self._fh is None:
            try:
                self._open()
            except FileNotFoundError:
                if not self.follow:
                    raise
                return
        assert self._fh is not None
        self._fh.seek(self._offset)

    def _open(self) -> None:
        """Open the file and check it is the one the stored position refers to."""
        fh = open(self.path, "rb")  # noqa: SIM115 - owned by the source
        try:
            size = os.fstat(fh.fileno()).st_size
            stored = self._stored_head
            length = 0 if stored is None else stored & ((1 << _HEAD_LEN_BITS) - 1)
            what = None
            if size < max(self._offset, length):
                what = f"it holds {size:,} bytes but the state read {self._offset:,}: truncated"
            elif stored is not None and _head_mark(os.pread(fh.fileno(), length, 0)) != stored:
                what = f"its first {length:,} bytes differ from those the state read: replaced"
            if what is not None:
                raise InputChangedError(
                    f"source.path {self.path} is not the file this state read ({what}); "
                    "reading on from the stored position would skip or misread records — "
                    "restore the file the state read (and append to it), or name the new input "
                    "with a new file name in source.path (each name is read from its start)"
                )
        except BaseException:
            fh.close()
            raise
        self._fh = fh
        self._stored_head = None

    def marks(self) -> dict[str, int]:
        """What identifies the open file, committed with the position (see the class)."""
        if self._fh is None:  # not opened yet: keep what the state holds
            held = {self._base_label: self._base}
            if self._stored_head is not None:
                held[self._head_label] = self._stored_head
            return held
        head = self._head
        if head is None or head & ((1 << _HEAD_LEN_BITS) - 1) < min(self._offset, HEAD_BYTES):
            head = _head_mark(os.pread(self._fh.fileno(), min(self._offset, HEAD_BYTES), 0))
            self._head = head
        return {self._base_label: self._base, self._head_label: head}

    def _final(self) -> bool:
        """Whether what the open file holds now is all it will hold: not following, or the
        path names another file (rotated: the old one is read to its end, then left).
        Following, a file now shorter than what was read was truncated: refused."""
        if not self.follow:
            return True
        assert self._fh is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False  # renamed away, the new one not created yet: the writer may append
        own = os.fstat(self._fh.fileno())
        if (st.st_dev, st.st_ino) != (own.st_dev, own.st_ino):
            return True
        if st.st_size < self._offset:
            raise InputChangedError(
                f"source.path {self.path} was truncated while being read ({st.st_size:,} bytes, "
                f"{self._offset:,} read): a copy-and-truncate rotation loses the lines written "
                "between the copy and the truncation — rotate by renaming the file and creating "
                "a new one (logrotate without copytruncate)"
            )
        return False

    def _ready(self) -> bool | None:
        """Before a poll: the file open (None: not there yet), and whether its end is final.
        A rotated file read to its end is left for the new one, read from its start."""
        if self._fh is None:
            if not self.path.exists():
                return None
            self._open()
            assert self._fh is not None
            self._fh.seek(self._offset)
        final = self._final()
        if final and self.follow and self._offset >= os.fstat(self._fh.fileno()).st_size:
            log.info(
                "%s was rotated: the old file was read to its end (%d bytes); reading the new "
                "one from its start",
                self.path,
                self._offset,
            )
            self._fh.close()
            self._fh = None
            self._base += self._offset
            self._offset = 0
            self._head = None
            if not self.path.exists():
                return None
            self._open()
            final = self._final()
        return final

    def poll(self, max_records: int) -> list[SourceRecord]:
        final = self._ready()
        if final is None:
            return []
        assert self._fh is not None
        out: list[SourceRecord] = []
        fh, base = self._fh, self._base
        fh.seek(self._offset)
        while len(out) < max_records:
            line = fh.readline()
            if not line:
                break
            if not line.endswith(b"\n") and not final:
                break  # partial line: wait for the writer to finish it
            start = self._offset
            self._offset += len(line)
            body = line.rstrip(b"\r\n")
            if body.strip():
                out.append(SourceRecord(self._partition, base + start, base + self._offset, body))
        return out

    def poll_batches(self, max_records: int) -> list[RecordBatch]:
        """What :meth:`poll` returns, as one batch: the file is read in blocks of
        :data:`BLOCK_BYTES`, split into lines natively (``engine.lines.split_lines``) and kept as
        spans of the blocks (``engine.lines.BlockLines``): no Python step and no ``bytes``
        object per line. A line longer than a block is completed with ``readline``."""
        final = self._ready()
        if final is None:
            return []
        assert self._fh is not None
        fh, base = self._fh, self._base
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
            starts, ends, taken, consumed, last_end = split_lines(block, need, at_eof and final)
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
        offsets = np.concatenate([p[1] + (p[3] + base) for p in parts]).tolist()
        if len(parts) == 1:
            block, line_starts, line_ends, _ = parts[0]
        else:  # the blocks' lines back to back in one buffer (each up to its last line's end)
            used = [int(p[2][-1]) for p in parts]
            shift = np.cumsum([0, *used[:-1]])
            block = b"".join(memoryview(p[0])[:u] for p, u in zip(parts, used, strict=True))
            line_starts = np.concatenate([p[1] + d for p, d in zip(parts, shift, strict=True)])
            line_ends = np.concatenate([p[2] + d for p, d in zip(parts, shift, strict=True)])
        values = BlockLines(block, line_starts, line_ends)
        return [RecordBatch(self._partition, offsets, values, base + next_offset)]

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
    """Query JSON lines from a file, read from a stored byte offset; new lines are picked up.

    With the offset the feed stores a hash of every byte before it (``#prefix``); at
    :meth:`seek` a file whose consumed lines changed (edited, truncated, replaced) is refused
    (:class:`InputChangedError`, exit 4): a registered query cannot be edited in place, and
    reading on from the offset would skip or misread the lines after it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._prefix = hashlib.blake2b(digest_size=7)  # of the bytes before _offset

    @property
    def _label(self) -> str:
        return f"queries:{self.path.name}"

    def seek(self, offsets: dict[str, int]) -> None:
        self._offset = offsets.get(self._label, 0)
        stored = offsets.get(self._label + "#prefix")
        self._prefix = hashlib.blake2b(digest_size=7)
        if self._offset == 0:
            return
        read = 0
        try:
            with open(self.path, "rb") as fh:
                while read < self._offset:
                    chunk = fh.read(min(BLOCK_BYTES, self._offset - read))
                    if not chunk:
                        break
                    self._prefix.update(chunk)
                    read += len(chunk)
        except FileNotFoundError:
            pass
        if read < self._offset or (stored is not None and self._mark() != stored):
            what = "truncated or removed" if read < self._offset else "changed"
            raise InputChangedError(
                f"queries.path {self.path}: the lines the state already read ({self._offset:,} "
                f"bytes) were {what}; a registered query cannot be edited or withdrawn by "
                "editing the file — restore those lines and append new queries after them "
                "(a changed query takes a new query_id)"
            )

    def _mark(self) -> int:
        return int.from_bytes(self._prefix.digest(), "big")

    def positions(self) -> dict[str, int]:
        return {self._label: self._offset, self._label + "#prefix": self._mark()}

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
                self._prefix.update(line)
                if line.strip():
                    out.append((f"{self.path.name}:{start}", line.rstrip(b"\r\n")))
        return out
