"""A day's event-id index that spills to disk, so an open day's memory does not grow with events.

:class:`SpillingEventIds` implements ``dedup.index.EventIdIndex`` with the same exact
answers as the in-memory index. Recent pairs are held once, in memory, packed: in the native
hash set (``engine/_pair_set.c``) when built, else a ``dedup.in_memory.SeenEventIds`` (sorted runs,
``dedup.in_memory.PairRun``) — 24 B a pair plus the id's UTF-8 bytes either way
(``dedup.in_memory.new_seen_event_ids``); once a batch brings them to ``memory_pairs`` they are taken
as runs sorted by key and merged, as they are, into one immutable *segment* file sorted by the
pairs' 64-bit keys, and memory starts empty again. A segment is four columns sorted by key —
keys (int64), user codes (int32), each id's start (int64) and length (int32) in the text — then
the ids' UTF-8 text, input after input. Once segments exist, each batch is keyed once
(``dedup.index.pair_keys``); the keys serve the segments and memory alike (before that,
memory keys what it adds itself, the same keys). The files have no name (0600, in a private
0700 directory: event ids are user data), so they vanish with their descriptors however the
process ends;
:meth:`SpillingEventIds.close` (the day's close) closes them and removes the directory, as does
collecting an index left unclosed.

What stays in memory per segment is small: the first and last key of every block of
``BLOCK_PAIRS`` keys (fences) and a blocked Bloom filter (``FILTER_BITS_PER_PAIR`` bits a pair,
``FILTER_HASHES`` bits in one 64-bit word a key: one gather a key, ~1% false positives). A key
that passes a segment's filter reads the keys of the block(s) its fences name with ``os.pread``
(not ``mmap``: mapped file pages would count toward the RSS); a key match then reads the user
code and the id's bytes and compares both exactly. Segments of one tier merge ``MERGE_FANOUT``
at a time into one of the next tier, streamed in chunks of ``MERGE_CHUNK_PAIRS`` per input, so
there are O(log n) segments, each pair is rewritten O(log n) times and a merge's memory is
bounded; a spill is the same streamed merge, its inputs the in-memory runs (docs/design.md §2.2).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from streamfilter.dedup import index as dedup_index
from streamfilter.dedup.in_memory import PairRun, new_seen_event_ids
from streamfilter.dedup.index import id_bytes, user_codes
from streamfilter.engine.lines import EventIdSpans, id_list

__all__ = ["DEFAULT_MEMORY_PAIRS", "SpillingEventIds"]

log = logging.getLogger("streamfilter.event_ids")

#: pairs held in memory before they spill: with ~10-character ids, ~35 MiB (24 B a pair plus
#: the id, held once), up to about twice that while the newest runs merge
DEFAULT_MEMORY_PAIRS = 1 << 20
#: keys per fence block: a key that passes a segment's filter reads one block's keys (2 KiB)
BLOCK_PAIRS = 256
FILTER_BITS_PER_PAIR = 12
FILTER_HASHES = 5
#: segments of one tier merged into one of the next tier
MERGE_FANOUT = 4
#: pairs read from each input segment at a time while merging
MERGE_CHUNK_PAIRS = 1 << 17
#: pairs ``add`` buffers before they join the index
ADDED_MAX = 1 << 12

_SIGN = np.uint64(1 << 63)
_MASK_MIX = np.uint64(0xD6E8FEB86659FD93)


class _Filter:
    """A Bloom filter blocked by 64-bit word: a key's ``FILTER_HASHES`` bits all lie in the word
    its top bits pick (one random read a key; no false negatives), ``FILTER_BITS_PER_PAIR`` bits
    a pair exactly (words are picked by multiply-shift, so their count need not be a power of 2).
    """

    __slots__ = ("n_words", "words")

    def __init__(self, n_pairs: int) -> None:
        self.n_words = np.uint64(max(1, -(-n_pairs * FILTER_BITS_PER_PAIR // 64)))
        self.words = np.zeros(int(self.n_words), np.uint64)

    def _word(self, keys: np.ndarray) -> np.ndarray:
        """The word of each key: its top 32 bits scaled to the word count, with the sign flipped
        first so that keys sorted as int64 have non-decreasing words."""
        top = (keys.view(np.uint64) ^ _SIGN) >> np.uint64(32)
        word: np.ndarray = ((top * self.n_words) >> np.uint64(32)).astype(np.intp)
        return word

    @staticmethod
    def masks(keys: np.ndarray) -> np.ndarray:
        """Each key's bits within its word (the same whatever the filter's size)."""
        mixed = keys.view(np.uint64) * _MASK_MIX
        mask = np.zeros(len(keys), np.uint64)
        for i in range(1, FILTER_HASHES + 1):
            mask |= np.left_shift(np.uint64(1), mixed >> np.uint64(64 - 6 * i) & np.uint64(63))
        return mask

    def add(self, keys: np.ndarray) -> None:
        """Set the bits of ``keys`` (sorted ascending: then each word's keys are one run)."""
        if len(keys) == 0:
            return
        word, mask = self._word(keys), self.masks(keys)
        if not (word[1:] >= word[:-1]).all():  # not sorted: slower, still exact
            np.bitwise_or.at(self.words, word, mask)
            return
        starts = np.flatnonzero(np.r_[True, word[1:] != word[:-1]])
        self.words[word[starts]] |= np.bitwise_or.reduceat(mask, starts)

    def may_hold(self, keys: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """False where the key was never added (``masks``: ``_Filter.masks(keys)``)."""
        held: np.ndarray = (self.words[self._word(keys)] & masks) == masks
        return held


def _pread(fd: int, size: int, offset: int) -> bytes:
    """Exactly ``size`` bytes at ``offset`` (``os.pread`` may return fewer)."""
    parts = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            raise OSError(f"event-id spill file ended early ({size} bytes missing)")
        parts.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _pwrite(fd: int, data: np.ndarray, offset: int) -> None:
    view = data.data.cast("B")
    while len(view):
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


class _SpillDir:
    """The index's private directory (0700) and its open segment files (0600) — files with no
    name (``O_TMPFILE``, else unlinked as soon as they are opened), so the kernel frees them when
    their descriptors close, however the process ends: a crash or a kill leaves no event id on
    disk, only the empty directory. ``cleanup`` closes them and removes the directory (also run
    by a finalizer when the index is collected)."""

    def __init__(self, parent: str | None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="streamfilter-event-ids-", dir=parent))
        self.fds: dict[str, int] = {}
        self._next = 0

    def create(self) -> tuple[str, int]:
        name = f"segment-{self._next:06d}"
        self._next += 1
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
        unnamed = getattr(os, "O_TMPFILE", 0)
        fd = -1
        if unnamed:
            with contextlib.suppress(OSError):  # a file system without unnamed files
                fd = os.open(self.path, flags | unnamed, 0o600)
        if fd < 0:
            fd = os.open(self.path / name, flags | os.O_CREAT | os.O_EXCL, 0o600)
            os.unlink(self.path / name)
        self.fds[name] = fd
        return name, fd

    def remove(self, name: str) -> None:
        os.close(self.fds.pop(name))

    def cleanup(self) -> None:
        for name in list(self.fds):
            with contextlib.suppress(OSError):
                self.remove(name)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _columns_at(n: int) -> tuple[int, int, int, int]:
    """Where a segment of ``n`` pairs keeps its user codes, text starts, id lengths and text
    (its keys at 0)."""
    return 8 * n, 12 * n, 20 * n, 24 * n


@dataclass(eq=False)
class _Segment:
    """One immutable segment file: ``n`` pairs sorted by key, and what memory keeps of it.

    Columns, in key order: keys (int64), user codes (int32), each id's start in the text (int64)
    and its length in bytes (int32); then the ids' UTF-8 text (a merge copies its inputs' text
    as is, input after input, and only re-bases the starts)."""

    name: str
    fd: int
    n: int
    text_bytes: int
    tier: int
    firsts: np.ndarray  # the first key of each block
    lasts: np.ndarray  # the last key of each block
    filter: _Filter

    def column(self, which: int, dtype: type, a: int, b: int) -> np.ndarray:
        """Pairs ``a..b-1`` of column ``which`` (0 keys, 1 users, 2 starts, 3 lengths)."""
        width = np.dtype(dtype).itemsize
        at = 0 if which == 0 else _columns_at(self.n)[which - 1]
        return np.frombuffer(_pread(self.fd, width * (b - a), at + width * a), dtype)

    def keys(self, a: int, b: int) -> np.ndarray:
        return self.column(0, np.int64, a, b)

    def write_text(self, fd: int, at: int) -> None:
        """Copy the text into file ``fd`` at ``at`` (a merge)."""
        _copy(self.fd, _columns_at(self.n)[3], fd, at, self.text_bytes)

    def holds_at(self, j: int, user: int, event_id: bytes) -> bool:
        """Pair ``j`` is exactly ``(user, event_id)``."""
        if int(self.column(1, np.int32, j, j + 1)[0]) != user:
            return False
        if int(self.column(3, np.int32, j, j + 1)[0]) != len(event_id):
            return False
        start = int(self.column(2, np.int64, j, j + 1)[0])
        return _pread(self.fd, len(event_id), _columns_at(self.n)[3] + start) == event_id

    def find(
        self,
        keys: np.ndarray,
        masks: np.ndarray,
        users: np.ndarray,
        event_ids: list[str],
        todo: np.ndarray,
    ) -> np.ndarray:
        """The indices among ``todo`` whose pair this segment holds: the filter first, then the
        fenced block(s) of each key that passes, then an exact comparison on a key match."""
        if len(todo) < len(keys):
            keys, masks = keys[todo], masks[todo]
        passed = self.filter.may_hold(keys, masks)
        maybe, k = todo[passed], keys[passed]
        if len(maybe) == 0:
            return maybe
        first_block = np.searchsorted(self.lasts, k, "left")  # its last key >= k
        stop_block = np.searchsorted(self.firsts, k, "right")  # blocks before: first key <= k
        # the usual candidate (a filter false positive) has one block: all such blocks are read
        # (one pread each) and searched at once; a key found there, or a key whose equals
        # straddle blocks, is then located and compared exactly
        one = np.flatnonzero(stop_block - first_block == 1)
        rows = self._blocks(first_block[one])
        hit = one[(rows == k[one, None]).any(axis=1)]
        exact = np.union1d(hit, np.flatnonzero(stop_block - first_block > 1))
        found = [
            int(maybe[c])
            for c in exact.tolist()
            if self._holds(
                int(k[c]),
                range(int(first_block[c]), int(stop_block[c])),
                int(users[maybe[c]]),
                event_ids[maybe[c]],
            )
        ]
        return np.array(found, np.intp)

    def _blocks(self, blocks: np.ndarray) -> np.ndarray:
        """The keys of each block, one row each (a short last block padded with its last key,
        which matches only a key it holds)."""
        if len(blocks) == 0:
            return np.zeros((0, BLOCK_PAIRS), np.int64)
        width = 8 * BLOCK_PAIRS
        parts = []
        for b in blocks.tolist():
            data = _pread(
                self.fd, 8 * (min(self.n, (b + 1) * BLOCK_PAIRS) - b * BLOCK_PAIRS), b * width
            )
            parts.append(
                data if len(data) == width else data + data[-8:] * ((width - len(data)) // 8)
            )
        return np.frombuffer(b"".join(parts), np.int64).reshape(len(blocks), BLOCK_PAIRS)

    def _holds(self, key: int, blocks: range, user: int, event_id: str) -> bool:
        """Some pair of ``blocks`` with this key is exactly ``(user, event_id)``."""
        encoded = id_bytes(event_id)
        for block in blocks:
            start = block * BLOCK_PAIRS
            block_keys = self.keys(start, min(self.n, start + BLOCK_PAIRS))
            lo = int(np.searchsorted(block_keys, key, "left"))
            hi = int(np.searchsorted(block_keys, key, "right"))
            if any(self.holds_at(start + j, user, encoded) for j in range(lo, hi)):
                return True
        return False


def _copy(src: int, src_at: int, dst: int, dst_at: int, size: int) -> None:
    """``size`` bytes from one file to another, in the kernel where it can (no Python buffer)."""
    while size > 0:
        try:
            done = os.copy_file_range(src, dst, size, src_at, dst_at)
        except (AttributeError, OSError):  # not Linux, or not across these file systems
            done = 0
        if done == 0:
            chunk = _pread(src, min(size, 1 << 24), src_at)
            _pwrite(dst, np.frombuffer(chunk, np.uint8), dst_at)
            done = len(chunk)
        size, src_at, dst_at = size - done, src_at + done, dst_at + done


class _SegmentWriter:
    """Writes a segment of ``n`` pairs from chunks of columns sorted by key, each after the
    last; the text is written (or copied) on its own, ``text_bytes`` in all."""

    def __init__(self, files: _SpillDir, n: int, text_bytes: int, tier: int) -> None:
        self.name, self.fd = files.create()
        self.n, self.text_bytes, self.tier = n, text_bytes, tier
        self.pos = 0
        self.firsts: list[np.ndarray] = []
        self.lasts: list[np.ndarray] = []
        self.filter = _Filter(n)

    @property
    def text_at(self) -> int:
        return _columns_at(self.n)[3]

    def append(
        self, keys: np.ndarray, users: np.ndarray, starts: np.ndarray, lengths: np.ndarray
    ) -> None:
        m = len(keys)
        if m == 0:
            return
        users_at, starts_at, lengths_at, _ = _columns_at(self.n)
        _pwrite(self.fd, np.ascontiguousarray(keys, np.int64), 8 * self.pos)
        _pwrite(self.fd, np.ascontiguousarray(users, np.int32), users_at + 4 * self.pos)
        _pwrite(self.fd, np.ascontiguousarray(starts, np.int64), starts_at + 8 * self.pos)
        _pwrite(self.fd, np.ascontiguousarray(lengths, np.int32), lengths_at + 4 * self.pos)
        # copies, not views: a view would keep the whole chunk's keys alive
        self.firsts.append(keys[-self.pos % BLOCK_PAIRS :: BLOCK_PAIRS].copy())
        lasts = keys[-(self.pos + 1) % BLOCK_PAIRS :: BLOCK_PAIRS].copy()
        if self.pos + m == self.n and (self.n - 1) % BLOCK_PAIRS != BLOCK_PAIRS - 1:
            lasts = np.r_[lasts, keys[-1:]]  # the last block is short
        self.lasts.append(lasts)
        self.filter.add(keys)
        self.pos += m

    def finish(self) -> _Segment:
        if self.pos != self.n:
            raise RuntimeError("event-id segment written short")
        return _Segment(
            self.name,
            self.fd,
            self.n,
            self.text_bytes,
            self.tier,
            np.concatenate([np.zeros(0, np.int64), *self.firsts]),
            np.concatenate([np.zeros(0, np.int64), *self.lasts]),
            self.filter,
        )


class _InMemory:
    """A sorted run of the in-memory tier as the input of a merge (a spill): the columns a
    segment would read from its file are slices of the run's arrays."""

    def __init__(self, run: PairRun) -> None:
        self.run = run
        self.n, self.text_bytes = len(run.keys), len(run.text)

    def column(self, which: int, dtype: type, a: int, b: int) -> np.ndarray:
        r = self.run
        column: np.ndarray = (r.keys, r.users, r.starts, r.lengths)[which][a:b]
        return column

    def write_text(self, fd: int, at: int) -> None:
        _pwrite(fd, np.frombuffer(self.run.text, np.uint8), at)


_COLUMN_TYPES = (np.int64, np.int32, np.int64, np.int32)


class _Reader:
    """Streams one input's columns in key order, a chunk at a time (for a merge); the starts
    come re-based by ``text_offset`` (where the input's text lands in the merged segment)."""

    def __init__(self, source: _Segment | _InMemory, text_offset: int) -> None:
        self.source = source
        self.text_offset = text_offset
        self.pos = 0  # the next pair not yet buffered
        self.columns: list[np.ndarray] = [np.zeros(0, np.int64)] * 4

    @property
    def keys(self) -> np.ndarray:
        return self.columns[0]

    @property
    def unread(self) -> bool:
        return self.pos < self.source.n

    def refill(self) -> None:
        s, a = self.source, self.pos
        b = min(s.n, a + MERGE_CHUNK_PAIRS)
        self.columns = [s.column(i, t, a, b) for i, t in enumerate(_COLUMN_TYPES)]
        self.columns[2] = self.columns[2] + self.text_offset
        self.pos = b

    def take(self, bound: int | None) -> list[np.ndarray]:
        """The buffered columns of the pairs with keys <= ``bound`` (all when None), removed
        from the buffer."""
        m = len(self.keys) if bound is None else int(np.searchsorted(self.keys, bound, "right"))
        taken = [c[:m] for c in self.columns]
        self.columns = [c[m:] for c in self.columns]
        return taken


class SpillingEventIds:
    """The exact set of a day's ``(user code, event id)`` pairs, at most ``memory_pairs`` of them
    in memory and the rest in sorted segment files under ``spill_dir`` (the system's temporary
    directory when None). ``label`` names the index in logs (the day). See the module doc."""

    def __init__(
        self,
        memory_pairs: int = DEFAULT_MEMORY_PAIRS,
        spill_dir: str | Path | None = None,
        label: str = "",
    ) -> None:
        if memory_pairs < 1:
            raise ValueError("memory_pairs must be at least 1")
        self.memory_pairs = memory_pairs
        self.spill_dir = None if spill_dir is None else str(spill_dir)
        self.label = label
        self._recent = new_seen_event_ids()  # the pairs not spilled yet, keyed by ``pair_keys``
        self._added: set[tuple[int, str]] = set()
        self._segments: list[_Segment] = []
        self._files: _SpillDir | None = None
        self._cleanup: weakref.finalize[[], SpillingEventIds] | None = None
        self._failed: BaseException | None = None  # a spill that failed: no answer is exact now
        self.spilled_pairs = 0

    # ------------------------------------------------------------------ the interface
    def __len__(self) -> int:
        return len(self._added) + len(self._recent) + self.spilled_pairs

    def __contains__(self, pair: tuple[int, str]) -> bool:
        self._check()
        if pair in self._added:
            return True
        user, event_id = pair
        users = np.array([user], np.int64)
        keys = dedup_index.pair_keys(users, [event_id])
        if self._recent.holds_keyed(int(keys[0]), user, event_id):
            return True
        return len(self._spilled(keys, users, [event_id])) > 0

    def add(self, pair: tuple[int, str]) -> None:
        self._added.add(pair)
        if len(self._added) >= ADDED_MAX:
            self._flush_added()

    def insert(self, users: np.ndarray, event_ids: list[str] | EventIdSpans) -> np.ndarray:
        """Add each pair not already held; True where the pair is new — neither held before
        nor earlier in the batch."""
        self._check()
        self._flush_added()
        n = len(event_ids)
        if n == 0:
            return np.ones(0, bool)
        users = user_codes(users)
        if len(self._recent) and len(self._recent) + n > self.memory_pairs:
            self._spill_checked()  # before: memory never holds more than the bound, even briefly
        if not self._segments:  # nothing on disk: memory alone answers, and keys what it adds
            new = self._recent.insert(users, event_ids)
            self._spill_if_full()
            return new
        event_ids = cast(list[str], id_list(event_ids))
        keys = dedup_index.pair_keys(users, event_ids)  # once: segments and memory alike
        spilled = self._spilled(keys, users, event_ids)
        if len(spilled) == 0:
            new = self._recent.insert_keyed(keys, users, event_ids)
        else:  # pairs a segment holds are not new, however often the batch repeats them
            new = np.zeros(n, bool)
            rest = np.setdiff1d(np.arange(n), spilled, assume_unique=True)
            rest_ids = list(map(event_ids.__getitem__, rest.tolist()))
            new[rest] = self._recent.insert_keyed(keys[rest], users[rest], rest_ids)
        self._spill_if_full()
        return new

    def _spill_if_full(self) -> None:
        if len(self._recent) >= self.memory_pairs:
            self._spill_checked()

    def _spill_checked(self) -> None:
        try:
            self._spill()
        except BaseException as exc:  # e.g. a full disk: the pairs may be lost
            self._failed = exc
            raise

    def _check(self) -> None:
        if self._failed is not None:
            raise RuntimeError(
                "the event-id index failed to spill to disk; its answers would not be exact"
            ) from self._failed

    def close(self) -> None:
        """Drop every pair: the memory, and the segment files and their directory."""
        self._recent = new_seen_event_ids()
        self._added, self._segments = set(), []
        self.spilled_pairs = 0
        if self._cleanup is not None:
            self._cleanup()

    # ------------------------------------------------------------------ inspection
    @property
    def directory(self) -> Path | None:
        """The private directory of the segment files (None before the first spill)."""
        return None if self._files is None else self._files.path

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    # ------------------------------------------------------------------ the segments
    def _flush_added(self) -> None:
        if self._added:
            users, event_ids = zip(*self._added, strict=True)
            self._added = set()
            self.insert(np.array(users, np.int64), list(event_ids))

    def _spilled(self, keys: np.ndarray, users: np.ndarray, event_ids: list[str]) -> np.ndarray:
        """The indices of the pairs some segment holds."""
        if not self._segments:
            return np.zeros(0, np.intp)
        masks = _Filter.masks(keys)
        todo = np.arange(len(keys))
        found = []
        for segment in self._segments:
            hits = segment.find(keys, masks, users, event_ids, todo)
            if len(hits):
                found.append(hits)
                todo = np.setdiff1d(todo, hits, assume_unique=True)
        return np.sort(np.concatenate(found)) if found else np.zeros(0, np.intp)

    def _spill(self) -> None:
        """Write the recent pairs as a segment of tier 0 — the in-memory runs merged straight
        into the file, a chunk at a time — then merge full tiers."""
        runs = [_InMemory(run) for run in self._recent.take_runs()]
        n = sum(run.n for run in runs)
        if self._files is None:
            self._files = _SpillDir(self.spill_dir)
            self._cleanup = weakref.finalize(self, self._files.cleanup)
            log.info(
                "day %s: %d event ids held in memory; spilling them to %s",
                self.label or "?",
                n,
                self._files.path,
            )
        self._segments.append(self._merge(runs, tier=0))
        self.spilled_pairs += n
        del runs  # the pairs are on disk now: their memory goes before any merge of segments
        self._merge_full_tiers()

    def _merge_full_tiers(self) -> None:
        while True:
            tiers = [s.tier for s in self._segments]
            full = [t for t in set(tiers) if tiers.count(t) >= MERGE_FANOUT]
            if not full:
                return
            tier = min(full)
            inputs = [s for s in self._segments if s.tier == tier][:MERGE_FANOUT]
            for s in inputs:  # no look-up runs until the merge ends: the inputs' filters can go
                s.filter = _Filter(0)
            merged = self._merge(inputs, tier + 1)
            assert self._files is not None
            self._segments = [s for s in self._segments if s not in inputs] + [merged]
            for s in inputs:
                self._files.remove(s.name)

    def _merge(self, inputs: list[_Segment] | list[_InMemory], tier: int) -> _Segment:
        """One segment of every pair of ``inputs`` (disjoint sets; segments, or the in-memory
        runs at a spill). The text is copied input after input; the columns are streamed: each
        round emits the buffered pairs up to the smallest last key among the inputs with more
        unread, so memory holds a chunk an input."""
        assert self._files is not None
        writer = _SegmentWriter(
            self._files, sum(s.n for s in inputs), sum(s.text_bytes for s in inputs), tier
        )
        offset = 0
        readers = []
        for s in inputs:
            s.write_text(writer.fd, writer.text_at + offset)
            readers.append(_Reader(s, offset))
            offset += s.text_bytes
        while True:
            for r in readers:
                if len(r.keys) == 0 and r.unread:
                    r.refill()
            unread = [r for r in readers if r.unread]
            bound = min(int(r.keys[-1]) for r in unread) if unread else None
            taken = [r.take(bound) for r in readers if len(r.keys)]
            if not taken:
                break
            columns = [np.concatenate(c) for c in zip(*taken, strict=True)]
            order = np.argsort(columns[0], kind="stable")  # sorted runs: a merge
            writer.append(*(c[order] for c in columns))
        return writer.finish()
