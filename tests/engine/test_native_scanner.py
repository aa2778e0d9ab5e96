"""The native column scanner (``engine/_jsonl.c``, behind ``ingest._scan``) in detail: its
numbers are the contract's floats bit for bit, it takes only the plain form (everything else is
left to the reference, ``parse_event``), in one schema (``scan_columns``) as line by line in any
(``scan_events``). That it decides nothing of its own on arbitrary batches is the agreement test
of ``tests/engine/test_ingest.py``.

Built by the project's install (``pip install -e .``); in CI a missing build is a failure.
"""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamfilter.engine import ingest
from streamfilter.engine.contract import (
    MAX_ABS_VALUE,
    MAX_EVENT_BYTES,
    MAX_ID_CHARS,
    MAX_STRING_VALUE_CHARS,
    Event,
    parse_event,
)
from tests.engine.test_ingest import ascii_ids
from tests.support.native_build import check_built_in_ci, needs

native = needs(ingest._jsonl, "engine/_jsonl.c")
DAY = "2026-01-05"


def test_the_native_scanner_is_built_in_ci():
    check_built_in_ci(ingest._jsonl, "engine/_jsonl.c")
    assert ingest.SCANNER == "native"


def _bits(value: object) -> object:
    return struct.pack("<d", value) if isinstance(value, float) else (type(value), value)


def _scan_columns(lines: list[bytes], schema):
    """The scan, and the days checked as ``parse_columns`` checks them."""
    columns = ingest._scan(lines, schema)
    if columns is not None and not all(map(ingest.day_ok, set(columns.days))):
        return None
    return columns


def _scan_events(lines: list[bytes], kinds=None):
    assert ingest._jsonl is not None
    events, days = ingest._jsonl.scan_events(lines, Event, kinds or {}, ingest._EVENT_LIMITS)
    assert days == {e.day for e in events if e is not None}
    assert all(e is None or type(e) is Event for e in events)
    return events


@native
@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            ascii_ids,
            st.one_of(st.none(), ascii_ids),
            st.floats(-1e12, 1e12, allow_nan=False) | st.integers(-(10**12), 10**12),
            st.sampled_from(["free", "pro", "", "a b", "x" * MAX_STRING_VALUE_CHARS]),
        ),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from([(", ", ": "), (",", ":")]),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_plain_events_are_scanned(rows, separators, explicit_null, rnd):
    """What producers write — ``json.dumps`` of valid events with ASCII text, any key order,
    compact or spaced, ``event_id`` absent, null or a string — takes the native path (so the
    agreement test of ``tests/engine/test_ingest.py`` is not vacuous) with parse_event's values."""
    lines = []
    for user, event_id, number, plan in rows:
        obj: dict = {"user_id": user, "day": DAY, "values": {"minutes": number, "plan": plan}}
        if event_id is not None or explicit_null:
            obj["event_id"] = event_id
        items = list(obj.items())
        rnd.shuffle(items)
        lines.append(json.dumps(dict(items), separators=separators).encode())
    columns = _scan_columns(lines, (("minutes", False), ("plan", True)))
    assert columns is not None
    got = [
        (e.user_id, e.event_id, _bits(e.values["minutes"]), e.values["plan"])
        for e in columns.events()
    ]
    want = [parse_event(line) for line in lines]
    assert got == [
        (e.user_id, e.event_id, _bits(e.values["minutes"]), e.values["plan"]) for e in want
    ]


def _line(values: str, **fields: str) -> bytes:
    head = {"user_id": '"u"', "day": f'"{DAY}"', **fields}
    return (
        "{" + ", ".join(f'"{k}": {v}' for k, v in head.items()) + f', "values": {values}}}'
    ).encode()


@native
@pytest.mark.parametrize(
    ("token", "value"),
    [
        ("-0", 0.0),  # json.loads gives int 0, the contract float(0): +0.0
        ("-0.0", -0.0),
        ("0", 0.0),
        ("1000000000000", 1e12),
        ("-1000000000000", -1e12),
        ("1e12", 1e12),
        ("999999999999999e-3", 999999999999.999),
        ("0.1", 0.1),
        ("2.5E-3", 0.0025),
        ("1e-400", 0.0),
        ("123456789012345e-3", 123456789012.345),
    ],
)
def test_numbers_are_the_contracts_floats(token, value):
    columns = _scan_columns([_line(f'{{"a": {token}}}')], (("a", False),))
    assert columns is not None
    (got,) = columns.events()
    assert struct.pack("<d", got.values["a"]) == struct.pack("<d", value)
    assert _bits(got.values["a"]) == _bits(parse_event(_line(f'{{"a": {token}}}')).values["a"])


decimals = st.builds(
    lambda sign, whole, frac: f"{sign}{whole}.{frac}",
    st.sampled_from(["", "-"]),
    st.one_of(st.just("0"), st.integers(1, 10**12 - 1).map(str)),
    st.text("0123456789", min_size=1, max_size=15),
)


@native
@settings(max_examples=500, deadline=None)
@given(st.lists(decimals, min_size=1, max_size=20))
@example(["0.1", "-0.0", "999999999999.999", "0.000000000000001", "1.000000000000000"])
@example(["9007199254.740993", "0.3", "123456789012.345", "-0.30000000000000004"])
def test_decimals_are_floats_correctly_rounded(tokens):
    """A decimal without exponent — the common event value — is ``float(token)`` bit for bit,
    on the scanner's exact division (15 digits or fewer) and its strtod path (more)."""
    lines = [_line(f'{{"a": {t}}}') for t in tokens]
    columns = _scan_columns(lines, (("a", False),))
    inside = [abs(float(t)) <= MAX_ABS_VALUE for t in tokens]
    if not all(inside):
        assert columns is None
        return
    assert columns is not None
    got = [_bits(e.values["a"]) for e in columns.events()]
    assert got == [_bits(float(t)) for t in tokens]


@native
@pytest.mark.parametrize(
    "line",
    [
        _line('{"a": 1000000000001}'),  # beyond the bound: parse_event's reason
        _line('{"a": 1000000000000.0001}'),
        _line('{"a": 1e999}'),
        _line('{"a": 1234567890123456}'),  # 16 digits
        _line('{"a": 01}'),
        _line('{"a": 1.}'),
        _line('{"a": .5}'),
        _line('{"a": +1}'),
        _line('{"a": NaN}'),
        _line('{"a": true}'),
        _line('{"a": null}'),
        _line('{"a": "1"}'),
        _line('{"a": 1, "a": 2}'),  # a repeated key
        _line('{"a": 1, "b": 2}'),  # a feature the schema lacks
        _line("{}"),
        _line('{"\\u0061": 1}'),  # an escaped key
        _line('{"a": 1}', user_id='"\\u0075"'),  # an escaped value
        _line('{"a": 1}', user_id='"é"'),  # non-ASCII text
        _line('{"a": 1}', user_id='""'),
        _line('{"a": 1}', user_id='"' + "u" * (MAX_ID_CHARS + 1) + '"'),
        _line('{"a": 1}', event_id='""'),
        _line('{"a": 1}', event_id="5"),
        _line('{"a": 1}', day="20260105"),
        _line('{"a": 1}', day='"2026-02-30"'),
        _line('{"a": 1}', extra="1"),
        _line('{"a": 1}', user_id='"u", "user_id": "v"'),
        _line('{"a": 1}') + b" x",
        _line('{"a": 1}')[:-1],
        b"\xef\xbb\xbf" + _line('{"a": 1}'),
        b'{"day": "2026-01-05", "values": {"a": 1}}',
        _line('{"a": 1}').replace(b'"u"', b'"u\x01"'),
        _line('{"a": 1}').replace(b'"u"', b'"u\x7f"'),  # DEL in a user id: invalid_user_id
        _line('{"a": 1}').ljust(MAX_EVENT_BYTES + 1),
    ],
)
def test_anything_but_the_plain_form_is_left_to_the_reference(line):
    assert _scan_columns([line], (("a", False),)) is None
    assert _scan_columns([_line('{"a": 1}'), line], (("a", False),)) is None


@native
@example(8)
@given(st.integers(1, 12))
def test_a_batch_of_more_days_than_the_scanner_tracks_is_left_to_the_reference(n_days):
    lines = [_line('{"a": 1}', day=f'"2026-01-{d + 1:02d}"') for d in range(n_days)] * 2
    columns = _scan_columns(lines, (("a", False),))
    assert (columns is not None) == (n_days <= 8)
    if columns is not None:
        assert columns.days == [f"2026-01-{d + 1:02d}" for d in range(n_days)] * 2


@native
def test_lines_that_are_not_bytes_are_left_to_the_reference():
    assert _scan_columns([_line('{"a": 1}').decode()], (("a", False),)) is None  # type: ignore[list-item]


@native
def test_the_daemons_batches_take_the_native_path():
    """``parse_columns`` (the daemon's call) hands a plain batch to the scanner: its numeric
    columns are the scanner's float64 arrays."""
    lines = [_line('{"a": 1.5, "p": "x"}', event_id=f'"e{i}"') for i in range(100)]
    columns = ingest.parse_columns(lines)
    assert columns is not None
    assert type(columns.columns[0]).__name__ == "ndarray"
    assert columns.columns[1] == ["x"] * 100


@native
@pytest.mark.parametrize(
    "line",
    [
        _line('{"a": 1, "a": 2}'),
        _line('{"a=b": 1}'),
        _line('{"": 1}'),
        _line('{"' + "f" * 129 + '": 1}'),
        _line('{"\\u0061": 1}'),
        _line('{"é": 1}'),
        _line('{"a": "é"}'),
        _line('{"a": true}'),
        _line('{"a": 1e13}'),
        _line('{"a": {}}'),
        _line('{"a": 1}', user_id='"u\x7f"'),
        _line('{"a": 1}', user_id="null"),
        _line('{"a": 1}', event_id='""'),
        _line('{"a": 1}', day="5"),
        _line('{"a": 1}', extra="1"),
        _line('{"a": 1}', user_id='"u", "user_id": "v"'),
        b'{"day": "2026-01-05", "values": {"a": 1}}',
        _line('{"a": 1}') + b",",
        _line('{"a": 1}').ljust(MAX_EVENT_BYTES + 1),
    ],
)
def test_scan_events_leaves_the_lines_not_in_the_plain_form(line):
    good = _line('{"b": 2, "c": "x"}', event_id="null")
    assert _scan_events([good, line, good]) == [
        ("u", DAY, {"b": 2.0, "c": "x"}, None),
        None,
        ("u", DAY, {"b": 2.0, "c": "x"}, None),
    ]


@native
def test_scan_events_takes_any_schema_and_holds_values_to_their_kinds():
    lines = [
        _line("{}"),
        _line('{"a": 1, "p": "x"}', event_id='"e"'),
        _line('{"p": "y"}'),
        _line('{"p": 3}'),
        _line('{"a": "1"}'),
        _line('{"z": -0, "w": 1.5}'),
    ]
    got = _scan_events(lines, {"a": False, "p": True})
    assert got == [
        ("u", DAY, {}, None),
        ("u", DAY, {"a": 1.0, "p": "x"}, "e"),
        ("u", DAY, {"p": "y"}, None),
        None,  # p is read as a category
        None,  # a is read as a number
        ("u", DAY, {"z": 0.0, "w": 1.5}, None),
    ]
    assert _scan_events(lines)[3:5] == [("u", DAY, {"p": 3.0}, None), ("u", DAY, {"a": "1"}, None)]
