"""Lines of a read block, held as spans of the block: no ``bytes`` object per line on the hot path.

A file source reads its input in blocks. ``split_lines`` finds the block's lines as
``(start, end)`` spans, and :class:`BlockLines` is the batch's values as a sequence of bytes over
those spans: the native scanner reads each line in place (``engine/_jsonl.c``, ``scan_spans``),
and a ``bytes`` per line is made only when something asks for one (the per-line paths: a reject,
a batch the scanner does not take). The event ids the scanner finds stay spans of the block too
(:class:`EventIdSpans`): the event-id index reads them in place (``engine/_pair_set.c``,
``insert_spans``). docs/design.md §8.4 gives the cost this saves.

The split is the file source's line rule (``runtime/io/files.py``): lines end at ``\\n``; trailing
``\\r`` are not part of a line; a blank line (only ASCII whitespace, as ``bytes.strip`` sees it) is
consumed but is not a record; the input's last line may lack its newline (``final``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import Generic, TypeVar, overload

import numpy as np

from streamfilter.engine.native import jsonl as _jsonl

__all__ = ["BlockLines", "EventIdSpans", "id_list", "split_lines"]

_PLUS_ONE = (1).__add__  # a line's length with its newline

_T = TypeVar("_T")


class _ListLike(Sequence[_T], Generic[_T]):
    """A sequence that iterates, compares and prints as the list it stands for (``tolist``),
    and, like a list, has no hash."""

    __slots__ = ()

    def tolist(self) -> list[_T]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[_T]:
        return iter(self.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _ListLike | list | tuple):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.tolist()!r})"


def split_lines(
    block: bytes, need: int, final: bool
) -> tuple[bytearray | bytes, bytearray | bytes, int, int, int]:
    """The first ``need`` lines of ``block`` (blank ones count towards ``need``, but are not
    kept): ``(starts, ends, taken, consumed, last_end)`` — the kept lines' spans as int64
    buffers, the lines taken, the bytes they take (newlines included), and where the last kept
    line's bytes end (-1: none kept). A line without its newline is taken only when ``final``
    (the end of the input). Native when built; the same results in Python otherwise
    (``tests/engine/test_lines.py``)."""
    if need < 0:
        raise ValueError("split_lines: need must be >= 0")
    if _jsonl is not None:
        return _jsonl.split_lines(block, need, final)
    return _split_lines_py(block, need, final)


def _split_lines_py(block: bytes, need: int, final: bool) -> tuple[bytes, bytes, int, int, int]:
    lines = block.split(b"\n")
    tail = lines.pop()  # after the last newline: part of a line, or b""
    lines = lines[:need]
    ends = list(accumulate(map(_PLUS_ONE, map(len, lines)), initial=0))
    if final and tail and len(lines) < need and ends[-1] + len(tail) == len(block):
        lines.append(tail)
        ends.append(len(block))
    starts_out: list[int] = []
    ends_out: list[int] = []
    last_end = -1
    for line, start, next_start in zip(lines, ends, ends[1:], strict=False):
        body = line.rstrip(b"\r")
        if body.strip():
            starts_out.append(start)
            ends_out.append(start + len(body))
            last_end = next_start
    return (
        np.array(starts_out, np.int64).tobytes(),
        np.array(ends_out, np.int64).tobytes(),
        len(lines),
        ends[-1],
        last_end,
    )


class BlockLines(_ListLike[bytes]):
    """Line ``i`` is ``block[starts[i]:ends[i]]`` (int64 spans, checked within the block). A
    sequence of ``bytes`` like a list of the lines, and equal to one; the ``bytes`` are made
    once, on first use, and kept."""

    __slots__ = ("_lines", "block", "ends", "starts")

    def __init__(self, block: bytes, starts: np.ndarray, ends: np.ndarray) -> None:
        starts = np.ascontiguousarray(starts, np.int64)
        ends = np.ascontiguousarray(ends, np.int64)
        if starts.shape != ends.shape or starts.ndim != 1:
            raise ValueError("BlockLines: starts and ends are int64 vectors of one length")
        if len(starts) and (starts.min() < 0 or (ends < starts).any() or ends.max() > len(block)):
            raise ValueError("BlockLines: a span outside its block")
        self.block = block
        self.starts = starts
        self.ends = ends
        self._lines: list[bytes] | None = None

    def lengths(self) -> np.ndarray:
        """Each line's length in bytes, without making the lines."""
        return self.ends - self.starts

    def lines(self) -> list[bytes]:
        """The lines as a list of ``bytes`` (made once)."""
        if self._lines is None:
            if _jsonl is not None:
                self._lines = _jsonl.lines_of(self.block, self.starts, self.ends)
            else:
                block = self.block
                self._lines = [
                    block[a:b]
                    for a, b in zip(self.starts.tolist(), self.ends.tolist(), strict=True)
                ]
        return self._lines

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, i: int) -> bytes: ...

    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...

    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            return self.lines()[i]
        if self._lines is not None:
            return self._lines[i]
        a, b = int(self.starts[i]), int(self.ends[i])  # IndexError as a list gives it
        return self.block[a:b]

    def tolist(self) -> list[bytes]:
        return self.lines()


class EventIdSpans(_ListLike[str | None]):
    """A scanned batch's event ids as spans of its block: id ``i`` is
    ``block[starts[i]:starts[i] + lengths[i]]`` (int64 offsets, int32 lengths; ``-1``: the event
    has no id). The scanner gives only ASCII ids without escapes (``engine/_jsonl.c``), so an
    id's bytes are its text. A sequence of ``str | None`` like the list the scanner would
    otherwise make, and equal to it; each ``str`` is made only when asked for (off the hot path:
    the event-id index takes the spans themselves)."""

    __slots__ = ("block", "lengths", "starts")

    def __init__(self, block: bytes, starts: np.ndarray, lengths: np.ndarray) -> None:
        starts = np.ascontiguousarray(starts, np.int64)
        lengths = np.ascontiguousarray(lengths, np.int32)
        if starts.shape != lengths.shape or starts.ndim != 1:
            raise ValueError("EventIdSpans: starts and lengths are vectors of one length")
        present = lengths >= 0
        if len(starts) and (
            (lengths < -1).any()
            or (starts[present] < 0).any()
            or (starts[present] + lengths[present] > len(block)).any()
        ):
            raise ValueError("EventIdSpans: a span outside its block")
        self.block = block
        self.starts = starts
        self.lengths = lengths

    def without_id(self) -> int:
        """How many events have no id."""
        return int(np.count_nonzero(self.lengths < 0))

    def count(self, value: object) -> int:
        return self.without_id() if value is None else sum(i == value for i in self.tolist())

    def tolist(self) -> list[str | None]:
        """The ids as a list (a ``str`` each): natively when built (``_jsonl.ids_of``)."""
        if _jsonl is not None:
            return _jsonl.ids_of(self.block, self.starts, self.lengths)
        block = self.block
        return [
            None if n < 0 else block[a : a + n].decode("ascii")
            for a, n in zip(self.starts.tolist(), self.lengths.tolist(), strict=True)
        ]

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, i: int) -> str | None: ...

    @overload
    def __getitem__(self, i: slice) -> EventIdSpans: ...

    def __getitem__(self, i: int | slice) -> str | EventIdSpans | None:
        if isinstance(i, slice):
            return EventIdSpans(self.block, self.starts[i], self.lengths[i])
        a, n = int(self.starts[i]), int(self.lengths[i])  # IndexError as a list gives it
        return None if n < 0 else self.block[a : a + n].decode("ascii")


def id_list(event_ids: Sequence[str | None]) -> list[str | None]:
    """``event_ids`` as a list (itself when it is one)."""
    if type(event_ids) is list:
        return event_ids
    return event_ids.tolist() if isinstance(event_ids, _ListLike) else list(event_ids)
