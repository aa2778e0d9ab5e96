"""Batch event validation: JSON lines → validated events (the daemon's hot path).

One reference and one fast path. The reference is ``parse_event`` (``engine.contract``): it
defines and explains every accept and every reject. The fast path is the native scanner
(``engine/_jsonl.c``): it reads the plain form of the contract (keys without escapes, each
once; ASCII strings without escapes; numbers converted as ``float`` converts them; its header
says why each value equals ``parse_event``'s) straight into columns, and it only ever
*accepts*: every line it does not take goes to ``parse_event``, which gives the event or the
reason. The Kafka source's batches (a list of ``bytes``) and the file source's (``BlockLines``,
read in place) take the same scanner. Without it (not built, or ``STREAMFILTER_IMPL=python``:
``streamfilter._native``) every line goes to ``parse_event``.

``parse_events(lines)`` returns, for each line, exactly what ``parse_event(line)`` returns or
raises: an equal ``Event``, or a ``Reject`` with the same reason and detail (returned, not
raised): the scanner reads each line of any schema (``scan_events``). ``parse_columns(lines)``
gives the same events as columns when the scanner accepts every line in the first line's
schema (the usual batch: ``scan_columns``, no object per number); else None. Both take the
registered queries' feature kinds (``contract.FeatureKinds``): the scanner takes a line only
when each value has its feature's kind (``parse_columns``: the first line passed
``parse_event`` with them and every line has its kinds), so a value of the other type always
reaches ``parse_event`` (``wrong_type``).
``tests/engine/test_ingest.py`` checks the agreement on mixed batches of valid and invalid lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamfilter.engine.contract import (
    MAX_ABS_VALUE,
    MAX_EVENT_BYTES,
    MAX_FEATURE_CHARS,
    MAX_ID_CHARS,
    MAX_STRING_VALUE_CHARS,
    Event,
    FeatureKinds,
    Reject,
    _parse_day,
    parse_event,
)
from streamfilter.engine.lines import BlockLines, EventIdSpans
from streamfilter.engine.native import jsonl as _jsonl  # None: parse_event takes every line

__all__ = ["SCANNER", "EventColumns", "day_ok", "parse_columns", "parse_events"]

#: which path validates events: ``native`` (``engine/_jsonl.c``), or ``python`` (``parse_event``
#: alone) when the extension is not built or not chosen (the daemon logs it at start)
SCANNER = "native" if _jsonl is not None else "python"
_SCAN_LIMITS = (MAX_EVENT_BYTES, MAX_ID_CHARS, MAX_STRING_VALUE_CHARS, MAX_ABS_VALUE)
_EVENT_LIMITS = (*_SCAN_LIMITS, MAX_FEATURE_CHARS)
#: day string → valid (``_parse_day`` passes); bounded, days are few
_DAY_OK: dict[str, bool] = {}
_DAY_CACHE_MAX = 4096

Schema = tuple[tuple[str, bool], ...]


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


def _reference(line: bytes, kinds: FeatureKinds | None) -> Event | Reject:
    try:
        return parse_event(line, kinds)
    except Reject as rej:
        return rej


def _schema(event: Event) -> Schema:
    return tuple((name, isinstance(v, str)) for name, v in event.values.items())


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


def _scan(lines: Sequence[bytes], schema: Schema) -> EventColumns | None:
    """The lines scanned in ``schema`` (``engine/_jsonl.c``): all of them, or None. The file
    source's block is read in place, its event ids kept as spans. The days are not checked
    here (``day_ok``)."""
    assert _jsonl is not None
    names = tuple(name.encode() for name, _ in schema)
    kinds = bytes(cat for _, cat in schema)
    if isinstance(lines, BlockLines):
        scanned = _jsonl.scan_spans(
            lines.block, lines.starts, lines.ends, names, kinds, _SCAN_LIMITS, True
        )
    else:
        scanned = _jsonl.scan_columns(lines, names, kinds, _SCAN_LIMITS)
    if scanned is None:
        return None
    user_ids, days, ids, raw = scanned
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


def parse_events(lines: Sequence[bytes], kinds: FeatureKinds | None = None) -> list[Event | Reject]:
    """Validate a batch of JSON lines; one ``Event`` or ``Reject`` per line, in order.

    The scanner reads each line of any schema (``scan_events``: the values as a dict, each
    value of the kind ``kinds`` names for its feature); a line it does not take, and a line of an
    invalid day, goes to ``parse_event``.
    """
    if _jsonl is None:
        return [_reference(line, kinds) for line in lines]
    kinds = {} if kinds is None else dict(kinds)
    if isinstance(lines, BlockLines):  # read in place from the source's block
        scanned, days = _jsonl.scan_event_spans(
            lines.block, lines.starts, lines.ends, Event, kinds, _EVENT_LIMITS
        )
    else:
        scanned, days = _jsonl.scan_events(lines, Event, kinds, _EVENT_LIMITS)
    out: list[Any] = scanned  # each None (and each event of a refused day) replaced below
    bad_days = {day for day in days if not day_ok(day)}
    if bad_days or None in out:
        for i, item in enumerate(out):
            if item is None or item.day in bad_days:
                out[i] = _reference(lines[i], kinds)
    return out


def parse_columns(lines: Sequence[bytes], kinds: FeatureKinds | None = None) -> EventColumns | None:
    """The batch as columns when ``parse_events`` would accept every line and every event has
    the first event's features with the first event's kinds; else None (then ``parse_events``).

    The first line is validated by ``parse_event`` (with ``kinds``); its features and their
    kinds fix the schema the scanner reads the whole batch in (the file source's block in place,
    its event ids as spans); the days it returns are checked here. None as well without the
    scanner.
    """
    if _jsonl is None or not lines or not isinstance(lines[0], bytes):
        return None
    first = _reference(lines[0], kinds)
    if isinstance(first, Reject) or not first.values:
        return None
    scanned = _scan(lines, _schema(first))
    if scanned is None or not all(map(day_ok, set(scanned.days))):
        return None
    return scanned
