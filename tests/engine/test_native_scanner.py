"""The native column scanner (``engine/_jsonl.c``, behind ``ingest._scan_columns``) decides
nothing of its own: whatever batch it returns as columns, ``parse_event`` accepts line by line
with the same fields and bit-identical values; everything else it leaves to the msgspec path.

Built by the project's install (``pip install -e .``); in CI a missing build is a failure.
"""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from streamfilter.engine import ingest
from streamfilter.engine.contract import (
    MAX_ABS_VALUE,
    MAX_EVENT_BYTES,
    MAX_ID_CHARS,
    MAX_STRING_VALUE_CHARS,
    Event,
    Reject,
    parse_event,
)
from tests.engine.test_ingest import number_tokens, raw_lines
from tests.support.native_build import check_built_in_ci, needs

native = needs(ingest._jsonl, "engine/_jsonl.c")
DAY = "2026-01-05"


def test_the_native_scanner_is_built_in_ci():
    check_built_in_ci(ingest._jsonl, "engine/_jsonl.c")
    assert ingest.SCANNER == "native"


def _reference(line: bytes) -> Event | Reject:
    try:
        return parse_event(line)
    except Reject as rej:
        return rej


def _bits(value: object) -> object:
    return struct.pack("<d", value) if isinstance(value, float) else (type(value), value)


def _row(ev: Event, schema: tuple[tuple[str, bool], ...]) -> tuple:
    return (ev.user_id, ev.day, ev.event_id, *(_bits(ev.values[name]) for name, _ in schema))


def _schema_of(line: bytes, fallback: tuple[tuple[str, bool], ...]) -> tuple[tuple[str, bool], ...]:
    ref = _reference(line)
    if isinstance(ref, Event) and ref.values:
        return tuple((name, isinstance(v, str)) for name, v in ref.values.items())
    return fallback


def check_scanned_batch(lines: list[bytes], schema: tuple[tuple[str, bool], ...]) -> bool:
    """If the scanner returns columns, each line is an event parse_event accepts with exactly
    the schema's features and the same values, bit for bit. Returns whether it did."""
    columns = ingest._scan_columns(lines, schema)
    if columns is None:
        return False
    assert len(columns) == len(lines)
    expected = [_reference(line) for line in lines]
    assert all(isinstance(e, Event) for e in expected), expected
    assert all(sorted(e.values) == sorted(n for n, _ in schema) for e in expected)
    got = columns.events()
    assert [_row(g, schema) for g in got] == [_row(e, schema) for e in expected]
    return True


SCHEMAS = [
    (("active", False), ("minutes", False), ("plan", True)),
    (("plan", True),),
    (("minutes", False),),
    (("é😀", False), ("plan", True)),
]


@native
@settings(max_examples=2000, deadline=None)
@given(raw_lines(), st.sampled_from(SCHEMAS))
def test_a_line_the_scanner_accepts_is_parse_events_event(line, fallback):
    accepted = check_scanned_batch([line], _schema_of(line, fallback))
    event("scanned" if accepted else "left to msgspec")


@st.composite
def near_plain_lines(draw) -> bytes:
    """Lines in or just outside the scanner's plain form: hand-written tokens (numbers spelled
    every way, ids at and past their limits, repeated or missing keys, odd whitespace), then
    perhaps one byte changed, inserted or dropped."""
    ws = st.sampled_from(["", " ", "\t", "\r\n", "  "])
    number = st.one_of(
        st.floats(-1.1e12, 1.1e12, allow_nan=False).map(repr),
        st.integers(-(10**16), 10**16).map(str),
        number_tokens,
    )
    text = st.one_of(
        st.sampled_from(["u", "", "x" * MAX_ID_CHARS, "x" * (MAX_ID_CHARS + 1), "é", 'a\\"b']),
        st.text(st.characters(max_codepoint=0x7F), max_size=5),
        ascii_ids.filter(lambda t: len(t) < 12),
        ascii_ids.filter(lambda t: len(t) < 12),
    )
    values = []
    for name in draw(st.permutations(["active", "minutes", "plan"]))[: draw(st.integers(1, 3))]:
        token = draw(text.map(json.dumps) if name == "plan" else number)
        values.append(f'"{name}"{draw(ws)}:{draw(ws)}{token}')
    if not draw(st.integers(0, 5)):
        values.append(values[0])  # a repeated feature
    fields = {
        "user_id": draw(text.map(json.dumps)),
        "day": json.dumps(
            draw(st.sampled_from([DAY] * 6 + ["2026-02-30", "2026-1-05", DAY + " "]))
        ),
        "values": "{" + ",".join(values) + "}",
        "event_id": draw(st.one_of(st.just("null"), text.map(json.dumps))),
    }
    keys = draw(st.lists(st.sampled_from([*fields, "extra"]), min_size=2, max_size=6))
    if draw(st.integers(0, 3)):
        keys = draw(st.permutations(list(fields)))
    body = ",".join(f'{draw(ws)}"{k}"{draw(ws)}:{draw(ws)}{fields.get(k, "1")}' for k in keys)
    raw = ("{" + body + draw(ws) + "}" + draw(ws)).encode()
    how = draw(st.sampled_from(["plain"] * 4 + ["change", "insert", "drop"]))
    i = draw(st.integers(0, len(raw) - 1))
    if how == "change":
        raw = raw[:i] + bytes([draw(st.integers(0, 255))]) + raw[i + 1 :]
    elif how == "insert":
        raw = raw[:i] + bytes([draw(st.integers(0, 255))]) + raw[i:]
    elif how == "drop":
        raw = raw[:i] + raw[i + 1 :]
    return raw


@native
@settings(max_examples=3000, deadline=None)
@given(near_plain_lines(), st.sampled_from(SCHEMAS))
def test_a_near_plain_line_the_scanner_accepts_is_parse_events_event(line, fallback):
    accepted = check_scanned_batch([line], _schema_of(line, fallback))
    event("scanned" if accepted else "left to msgspec")


@native
@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(SCHEMAS))
def test_arbitrary_bytes_are_never_accepted_wrongly(line, schema):
    check_scanned_batch([line], schema)


@native
@settings(max_examples=300, deadline=None)
@given(st.lists(raw_lines(), min_size=1, max_size=8), st.sampled_from(SCHEMAS))
def test_a_batch_is_scanned_only_when_every_line_is_an_event(lines, fallback):
    check_scanned_batch(lines, _schema_of(lines[0], fallback))


ascii_ids = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters='"\\'),
    min_size=1,
    max_size=MAX_ID_CHARS,
)


@native
@settings(max_examples=300, deadline=None)
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
    properties above are not vacuous) with parse_event's values."""
    lines = []
    for user, event_id, number, plan in rows:
        obj: dict = {"user_id": user, "day": DAY, "values": {"minutes": number, "plan": plan}}
        if event_id is not None or explicit_null:
            obj["event_id"] = event_id
        items = list(obj.items())
        rnd.shuffle(items)
        lines.append(json.dumps(dict(items), separators=separators).encode())
    schema = (("minutes", False), ("plan", True))
    assert check_scanned_batch(lines, schema)


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
    columns = ingest._scan_columns([_line(f'{{"a": {token}}}')], (("a", False),))
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
@settings(max_examples=3000, deadline=None)
@given(st.lists(decimals, min_size=1, max_size=20))
@example(["0.1", "-0.0", "999999999999.999", "0.000000000000001", "1.000000000000000"])
@example(["9007199254.740993", "0.3", "123456789012.345", "-0.30000000000000004"])
def test_decimals_are_floats_correctly_rounded(tokens):
    """A decimal without exponent — the common event value — is ``float(token)`` bit for bit,
    on the scanner's exact division (15 digits or fewer) and its strtod path (more)."""
    lines = [_line(f'{{"a": {t}}}') for t in tokens]
    columns = ingest._scan_columns(lines, (("a", False),))
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
        _line('{"a": 1}').ljust(MAX_EVENT_BYTES + 1),
    ],
)
def test_anything_but_the_plain_form_is_left_to_msgspec(line):
    assert ingest._scan_columns([line], (("a", False),)) is None
    assert ingest._scan_columns([_line('{"a": 1}'), line], (("a", False),)) is None


@native
@example(8)
@given(st.integers(1, 12))
def test_a_batch_of_more_days_than_the_scanner_tracks_is_left_to_msgspec(n_days):
    lines = [_line('{"a": 1}', day=f'"2026-01-{d + 1:02d}"') for d in range(n_days)] * 2
    columns = ingest._scan_columns(lines, (("a", False),))
    assert (columns is not None) == (n_days <= 8)
    if columns is not None:
        assert columns.days == [f"2026-01-{d + 1:02d}" for d in range(n_days)] * 2


@native
def test_lines_that_are_not_bytes_are_left_to_msgspec():
    assert ingest._scan_columns([_line('{"a": 1}').decode()], (("a", False),)) is None  # type: ignore[list-item]


@native
def test_the_daemons_batches_take_the_native_path():
    """``parse_columns`` (the daemon's call) hands a plain batch to the scanner: its numeric
    columns are the scanner's float64 arrays, not the msgspec path's lists."""
    lines = [_line('{"a": 1.5, "p": "x"}', event_id=f'"e{i}"') for i in range(100)]
    columns = ingest.parse_columns(lines)
    assert columns is not None
    assert type(columns.columns[0]).__name__ == "ndarray"
    assert columns.columns[1] == ["x"] * 100
