"""Batch event validation: JSON lines → validated :class:`Event` objects (the daemon's hot path).

``parse_events(lines)`` returns, for each line, exactly what ``parse_event(line)`` would return or
raise: an equal ``Event``, or a ``Reject`` with the same reason and detail (returned, not raised).

How. A msgspec ``Decoder`` for the ``Event`` struct (C, typed decoding; the contract's limits are
the struct's ``Meta`` constraints) decodes a well-formed line in about a microsecond, against
~8 µs for ``json.loads`` + the Python checks. A line it decodes then gets the two checks msgspec
cannot express: the calendar day and its range (cached per distinct day string) and ``=`` in
feature names (only when the line has a ``=`` or a ``\\u`` escape at all). Every line the decoder
refuses, or that fails those checks, goes to ``parse_event``, which gives the reason. So the fast
path only ever *accepts*; every reject — and every unusual acceptance, e.g. a UTF-8 BOM or
UTF-16 input (which ``json.loads`` detects), or a duplicate key whose first value is invalid —
comes from ``parse_event`` itself.

Why a line the decoder accepts is accepted by ``parse_event`` with the same values (each point
is pinned by ``tests/engine/test_ingest.py``):

* syntax: both are strict RFC 8259 parsers (no ``NaN``/``Infinity``, no trailing commas, no raw
  control characters in strings) and both let the last of duplicate keys win;
* text: msgspec refuses invalid UTF-8 and lone-surrogate escapes (``parse_event`` refuses both,
  as ``malformed_json`` and through ``_is_utf8``); string limits count code points, like ``len``;
* numbers: msgspec decodes every JSON number into the correctly rounded float (the same bits as
  ``float`` of what ``json.loads`` returns); ``ge``/``le`` are the ``MAX_ABS_VALUE`` check, and
  booleans and ``null`` are refused as values;
* fields: unknown fields are refused, ``user_id``/``day``/``values`` are required, an
  ``event_id`` of ``null`` is absent, and ``len(line) > MAX_EVENT_BYTES`` never reaches msgspec.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any

import msgspec
import numpy as np

from streamfilter.engine.contract import (
    MAX_ABS_VALUE,
    MAX_EVENT_BYTES,
    MAX_ID_CHARS,
    MAX_STRING_VALUE_CHARS,
    Event,
    Reject,
    _Category,
    _Id,
    _Number,
    _parse_day,
    parse_event,
)
from streamfilter.engine.lines import BlockLines, EventIdSpans
from streamfilter.engine.native import jsonl as _jsonl  # None: msgspec takes every batch

__all__ = ["SCANNER", "EventColumns", "day_ok", "parse_columns", "parse_events"]

#: which scanner takes the usual batch first: ``native`` (``engine/_jsonl.c``) or ``msgspec``
#: when the extension is not built (the daemon logs it at start)
SCANNER = "native" if _jsonl is not None else "msgspec"
_SCAN_LIMITS = (MAX_EVENT_BYTES, MAX_ID_CHARS, MAX_STRING_VALUE_CHARS, MAX_ABS_VALUE)

_decode = msgspec.json.Decoder(Event).decode
#: a whole chunk at once: ``[[line1],[line2],...]``, each inner array exactly one Event
_decode_chunk = msgspec.json.Decoder(list[tuple[Event]])
#: lines per chunk of the batch decoder (a chunk with any line it cannot accept is redone per line)
CHUNK_LINES = 256
_DAY = attrgetter("day")
_VALUES = attrgetter("values")
_USER = attrgetter("user_id")
_EVENT_ID = attrgetter("event_id")
#: day string → valid (``_parse_day`` passes); bounded, days are few
_DAY_OK: dict[str, bool] = {}
_DAY_CACHE_MAX = 4096


def day_ok(day: str) -> bool:
    """``_parse_day`` accepts ``day`` (cached)."""
    ok = _DAY_OK.get(day)
    if ok is None:
        try:
            _parse_day(day, "day")
            ok = True
        except Reject:
            ok = False
        if len(_DAY_OK) >= _DAY_CACHE_MAX:
            _DAY_OK.clear()
        _DAY_OK[day] = ok
    return ok


def _fast(line: bytes) -> Event | None:
    """The event if the decoder and the remaining checks accept ``line``, else None."""
    if len(line) > MAX_EVENT_BYTES:
        return None
    try:
        ev = _decode(line)
    except Exception:  # any refusal: parse_event is the authority on why
        return None
    if not day_ok(ev.day):
        return None
    if (b"=" in line or b"\\u" in line) and any("=" in name for name in ev.values):
        return None
    return ev


def _slow(line: bytes) -> Event | Reject:
    try:
        return parse_event(line)
    except Reject as rej:
        return rej


def _wrapped(lines: Sequence[bytes]) -> bytes:
    """``[[line1],[line2],...]`` in one join: the brackets go onto the first and last lines, as
    concatenating megabytes of joined lines afterwards costs more than the join itself."""
    parts = list(lines)
    parts[0] = b"[[" + parts[0]
    parts[-1] += b"]]"
    return b"],[".join(parts)


def _decode_wrapped(
    decoder: msgspec.json.Decoder[Any], lines: Sequence[bytes]
) -> tuple[list[Any], bytes] | None:
    """Each line decoded as one value by ``decoder`` (a ``list[tuple[T]]`` decoder) in one call,
    and the joined bytes; None when any line is refused or the wrapping cannot show that each
    line is exactly one value (``_fast_chunk``). The caller checks the days (``day_ok``)."""
    if max(map(len, lines)) > MAX_EVENT_BYTES:
        return None
    try:
        blob = b"".join(lines)
    except TypeError:  # not bytes (e.g. str lines): the per-line path handles them
        return None
    if b"[" in blob or b"]" in blob:
        return None
    try:
        wrapped = decoder.decode(_wrapped(lines))
    except Exception:  # a line it refuses: parse_event is the authority on why
        return None
    if len(wrapped) != len(lines):
        return None
    return list(map(itemgetter(0), wrapped)), blob


def _fast_chunk(lines: Sequence[bytes]) -> list[Event] | None:
    """Every line's event if the decoder and the remaining checks accept *every* line of the
    chunk, decoded in one call (no Python per line); else None.

    The chunk is decoded as ``[[line1],[line2],...]`` into ``list[tuple[Event]]``. When no line
    holds a ``[`` or ``]`` byte and the list has one element per line, each line is exactly one
    event, as if decoded alone: an event holds no array, so every bracket token of the document
    is a wrapper's; a line's unterminated string would swallow a ``],[`` wrapper, leaving fewer
    elements than lines; and ``tuple[Event]`` refuses an inner array of two values (``a},{b``).
    The document adds only brackets and commas between the lines, so the decoder sees each line's
    bytes in the same lexical state as alone (a BOM or UTF-16 line fails here and is redone).
    """
    decoded = _decode_wrapped(_decode_chunk, lines)
    if decoded is None:
        return None
    events, blob = decoded
    if not all(map(day_ok, set(map(_DAY, events)))):
        return None
    if (b"=" in blob or b"\\u" in blob) and any(
        "=" in name for name in chain.from_iterable(map(_VALUES, events))
    ):
        return None
    return events


def parse_events(lines: Sequence[bytes]) -> list[Event | Reject]:
    """Validate a batch of JSON lines; one ``Event`` or ``Reject`` per line, in order.

    Chunks of :data:`CHUNK_LINES` lines are decoded at once (``_fast_chunk``); a chunk with a line
    the fast path cannot accept is redone line by line (``_fast``, else ``parse_event``).
    """
    out: list[Event | Reject] = []
    for start in range(0, len(lines), CHUNK_LINES):
        chunk = lines[start : start + CHUNK_LINES]
        events = _fast_chunk(chunk)
        if events is not None:
            out.extend(events)
        else:
            out.extend([_fast(line) or _slow(line) for line in chunk])
    return out


@dataclass(frozen=True)
class EventColumns:
    """A batch of valid events as columns: every event has the same features (``features``, each
    all numbers or all categories: ``categorical``), one list per field and one per feature (a
    numeric feature's may be a float64 array)."""

    user_ids: list[str]
    days: list[str]
    event_ids: list[str | None] | EventIdSpans  # spans: a batch scanned in its block
    features: tuple[str, ...]
    categorical: tuple[bool, ...]
    columns: list[list[Any] | np.ndarray]

    def __len__(self) -> int:
        return len(self.user_ids)

    def slice(self, start: int, stop: int) -> EventColumns:
        return EventColumns(
            self.user_ids[start:stop],
            self.days[start:stop],
            self.event_ids[start:stop],
            self.features,
            self.categorical,
            [column[start:stop] for column in self.columns],
        )

    def events(self) -> list[Event]:
        """The same events as ``Event`` objects (per event: only off the hot path)."""
        columns = [c.tolist() if isinstance(c, np.ndarray) else c for c in self.columns]
        values = [dict(zip(self.features, row, strict=True)) for row in zip(*columns, strict=True)]
        if not self.features:
            values = [{} for _ in self.user_ids]
        return [
            Event(user_id=u, day=d, values=v, event_id=e)
            for u, d, v, e in zip(self.user_ids, self.days, values, self.event_ids, strict=True)
        ]


#: schema → chunk decoder, or None when msgspec cannot name a field so (a ``\\``, ``"`` or control
#: character in a feature name); bounded (a stream has few schemas)
_TYPED: dict[tuple[tuple[str, bool], ...], msgspec.json.Decoder[Any] | None] = {}
_TYPED_MAX = 64
_UNNAMEABLE = frozenset('\\"' + "".join(map(chr, range(32))))


def _typed_decoder(schema: tuple[tuple[str, bool], ...]) -> msgspec.json.Decoder[Any] | None:
    """A chunk decoder (``[[line],...]``) for events with exactly these features: the values
    object is a struct whose fields are the features — required, unknown ones refused, each
    with the contract's constraint of its kind (``Event``'s ``_Number`` or ``_Category``)."""
    if schema in _TYPED:
        return _TYPED[schema]
    if len(_TYPED) >= _TYPED_MAX:
        _TYPED.clear()
    decoder = None
    if not any(c in name for name, _ in schema for c in _UNNAMEABLE):
        values = msgspec.defstruct(
            "TypedValues",
            [(f"f{i}", _Category if cat else _Number) for i, (_, cat) in enumerate(schema)],
            rename={f"f{i}": name for i, (name, _) in enumerate(schema)},
            forbid_unknown_fields=True,
            frozen=True,
            gc=False,
        )
        event = msgspec.defstruct(
            "TypedEvent",
            [("user_id", _Id), ("day", str), ("values", values), ("event_id", _Id | None, None)],
            forbid_unknown_fields=True,
            frozen=True,
            gc=False,
        )
        decoder = msgspec.json.Decoder(list[tuple[event]])  # type: ignore[valid-type]
    _TYPED[schema] = decoder
    return decoder


def parse_columns(lines: Sequence[bytes]) -> EventColumns | None:
    """The batch as columns when ``parse_events`` would accept every line and every event has
    the first event's features with the first event's kinds; else None (then ``parse_events``).

    The first line is decoded as an ``Event`` (``_fast``); its features and kinds fix a schema,
    and the whole batch is decoded into that schema's struct (``_typed_decoder``) as in
    ``_fast_chunk``. A line the typed decoder accepts is one the ``Event`` decoder accepts with
    the same values: the same syntax and string rules, the same field constraints, the features
    exactly the schema's (a missing or unknown one is refused), each value of its kind (a
    category where a number is expected, or the reverse, is refused); the day is checked as in
    ``_fast_chunk``, and the schema's names passed the ``=`` check with the first line.
    """
    if not lines:
        return None
    first = _fast(lines[0]) if isinstance(lines[0], bytes) else None
    if first is None or not first.values:
        return None
    schema = tuple((name, isinstance(v, str)) for name, v in first.values.items())
    scanned = _scan_columns(lines, schema)
    if scanned is not None:
        return scanned
    decoder = _typed_decoder(schema)
    decoded = None if decoder is None else _decode_wrapped(decoder, lines)
    if decoded is None:
        return None
    events = decoded[0]
    days = list(map(_DAY, events))
    if not all(map(day_ok, set(days))):
        return None
    values = list(map(_VALUES, events))
    return EventColumns(
        list(map(_USER, events)),
        days,
        list(map(_EVENT_ID, events)),
        tuple(name for name, _ in schema),
        tuple(cat for _, cat in schema),
        [list(map(attrgetter(f"f{i}"), values)) for i in range(len(schema))],
    )


def _scan_columns(
    lines: Sequence[bytes], schema: tuple[tuple[str, bool], ...]
) -> EventColumns | None:
    """The batch as columns by the native scanner (``engine/_jsonl.c``), or None when it is not
    built or does not accept every line (then the msgspec path). The scanner accepts only the
    plain form of the contract (keys without escapes, each once; ASCII strings without escapes;
    numbers converted as ``float`` converts them; its header says why each value equals
    ``parse_event``'s); the days it returns are checked here, like the msgspec path's."""
    if _jsonl is None:
        return None
    names = tuple(name.encode() for name, _ in schema)
    kinds = bytes(cat for _, cat in schema)
    if isinstance(lines, BlockLines):  # read in place from the source's block, ids as spans
        scanned = _jsonl.scan_spans(
            lines.block, lines.starts, lines.ends, names, kinds, _SCAN_LIMITS, True
        )
    else:
        scanned = _jsonl.scan_columns(lines, names, kinds, _SCAN_LIMITS)
    if scanned is None:
        return None
    user_ids, days, ids, raw = scanned
    if not all(map(day_ok, set(days))):
        return None
    event_ids: list[str | None] | EventIdSpans
    if isinstance(ids, tuple):
        assert isinstance(lines, BlockLines)
        id_starts, id_lengths = ids
        event_ids = EventIdSpans(
            lines.block, np.frombuffer(id_starts, np.int64), np.frombuffer(id_lengths, np.int32)
        )
    else:
        event_ids = ids
    columns: list[list[Any] | np.ndarray] = [
        col if isinstance(col, list) else np.frombuffer(col, np.float64) for col in raw
    ]
    return EventColumns(
        user_ids,
        days,
        event_ids,
        tuple(name for name, _ in schema),
        tuple(cat for _, cat in schema),
        columns,
    )
