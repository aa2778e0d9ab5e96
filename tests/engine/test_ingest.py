"""The batch decoder (``engine.ingest.parse_events``) agrees with ``parse_event`` on every line:
the same events accepted with bit-identical values, the same rejected with the same reason and
detail. ``_fast`` (the msgspec path alone) is checked separately: whatever it accepts,
``parse_event`` accepts with the same values — so the equivalence is not just the fallback's.
"""

from __future__ import annotations

import json
import math
import struct

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from streamfilter.engine import ingest
from streamfilter.engine.contract import (
    MAX_ABS_VALUE,
    MAX_EVENT_BYTES,
    MAX_FEATURE_CHARS,
    MAX_FEATURES_PER_EVENT,
    MAX_ID_CHARS,
    MAX_STRING_VALUE_CHARS,
    Event,
    Reject,
    parse_event,
)
from streamfilter.engine.ingest import parse_events


def _reference(line: bytes) -> Event | Reject:
    try:
        return parse_event(line)
    except Reject as rej:
        return rej


def _bits(value: float | str) -> object:
    return struct.pack("<d", value) if isinstance(value, float) else value


def _same(a: Event | Reject, b: Event | Reject) -> bool:
    if isinstance(a, Reject) or isinstance(b, Reject):
        return (
            isinstance(a, Reject)
            and isinstance(b, Reject)
            and (a.reason, a.detail) == (b.reason, b.detail)
        )
    return (
        (a.user_id, a.day, a.event_id) == (b.user_id, b.day, b.event_id)
        and list(a.values) == list(b.values)
        and all(type(a.values[k]) is type(b.values[k]) for k in a.values)
        and [_bits(v) for v in a.values.values()] == [_bits(v) for v in b.values.values()]
    )


def check_agrees(line: bytes, label: bool = True) -> None:
    expected = _reference(line)
    fast = ingest._fast(line)
    if fast is not None:
        assert _same(fast, expected), (line, fast, expected)
    if label:  # hypothesis statistics: how often each path decided
        path = "fast path accepted" if fast is not None else "fallback"
        event(f"{path}: {getattr(expected, 'reason', 'accepted')}")
    (got,) = parse_events([line])
    assert _same(got, expected), (line, got, expected)


# ------------------------------------------------------------------------------ strategies

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
good_texts = st.one_of(st.sampled_from(["u1", "u-17", "é", "😀", "a b"]), st.text(min_size=1))
texts = st.one_of(
    st.text(max_size=6),
    st.text(st.one_of(surrogates, st.characters()), max_size=4),
    st.sampled_from(["", "u1", "a=b", "x" * 128, "x" * 129, "y" * 256, "y" * 257, "é" * 257]),
    st.just("😀" * 256),
)
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.integers(min_value=-(10**12) - 2, max_value=10**12 + 2),
    st.floats(),
    st.floats(min_value=-MAX_ABS_VALUE * 1.01, max_value=MAX_ABS_VALUE * 1.01),
    st.sampled_from([1e12, -1e12, 5e-324, -0.0, 0.0, 1.7976931348623157e308]),
)
# number spellings json.dumps never writes
number_tokens = st.sampled_from(
    [
        "1e999", "-1e999", "1E+2", "1e-400", "-0", "-0.0", "0.1e1", "1000000000000.0000001",
        "1000000000000.0001", "999999999999.99999999", "18446744073709551616",
        "-9223372036854775809", "9" * 5000, "1." , ".5", "01", "+1", "NaN", "-Infinity",
        "Infinity", "1e12", "1E12", "100000000000e1", "0.000000000000000000001e33",
    ]
)  # fmt: skip
json_scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
BAD_DAYS = ["2026-02-30", "2026-1-05", "20260105", "2026-01-05T00:00", "", "1969-12-31",
            "9999-01-01", "0000-01-01", "２０２６-01-05", "2026-01-05 ", "2026-13-01"]  # fmt: skip
days = st.one_of(
    st.sampled_from(["2026-01-05", "2026-02-28", "1970-01-01", "9998-12-31"]),
    st.sampled_from(BAD_DAYS),
    st.dates().map(str),
    texts,
    json_scalars,
)


def _token(value: object, ascii_only: bool) -> str:
    return json.dumps(value, ensure_ascii=ascii_only)


@st.composite
def raw_lines(draw) -> bytes:
    """An event-ish JSON object written by hand: keys may repeat, numbers may be spelled in
    ways json.dumps never writes, text may be escaped or raw (lone surrogates included)."""
    ascii_only = draw(st.booleans())
    pairs: list[tuple[str, str]] = []
    required = ["user_id", "day", "values"]
    fields = draw(
        st.lists(
            st.sampled_from(["user_id", "day", "values", "event_id", "extra"]),
            min_size=0,
            max_size=6,
        )
        | st.permutations(required)
        | st.permutations([*required, "event_id"])
        | st.permutations([*required, "event_id"])
        | st.lists(st.sampled_from(required), min_size=3, max_size=5).map(lambda f: required + f)
    )
    # mostly valid pieces, so that the deeper checks and the acceptances are reached
    valid = draw(st.integers(0, 3)) > 0
    for name in fields:
        if name == "values":
            n = draw(st.integers(0, 4))
            items = []
            for _ in range(n):
                # in a mostly-valid line, one value in five is drawn from everything
                one_good = valid and draw(st.integers(0, 4)) > 0
                key = draw(
                    st.sampled_from(["active", "minutes", "plan", "é😀"])
                    if one_good
                    else st.one_of(st.sampled_from(["active", "minutes", "plan"]), texts)
                )
                good_value = st.one_of(
                    st.floats(-MAX_ABS_VALUE, MAX_ABS_VALUE, allow_nan=False).map(repr),
                    st.integers(-(10**12), 10**12).map(str),
                    good_texts.map(lambda v, a=ascii_only: _token(v, a)),
                )
                any_value = st.one_of(
                    numbers.map(lambda v, a=ascii_only: _token(v, a)),
                    number_tokens,
                    texts.map(lambda v, a=ascii_only: _token(v, a)),
                    json_values.map(lambda v, a=ascii_only: _token(v, a)),
                )
                value = draw(good_value if one_good else any_value)
                items.append(f"{_token(key, ascii_only)}: {value}")
            token = draw(
                st.one_of(
                    st.just("{" + ", ".join(items) + "}"),
                    st.just("{" + ", ".join(items) + "}") if valid else json_values.map(str),
                    json_values.map(lambda v, a=ascii_only: _token(v, a)),
                )
            )
        elif name == "day":
            token = _token(draw(st.sampled_from(["2026-01-05"]) if valid else days), ascii_only)
        elif name in ("user_id", "event_id"):
            ids = good_texts if valid else st.one_of(texts, texts, json_scalars)
            token = _token(draw(ids), ascii_only)
        else:
            token = _token(draw(json_values), ascii_only)
        pairs.append((name, token))
    body = "{" + ", ".join(f'"{k}": {v}' for k, v in pairs) + "}"
    raw = body.encode("utf-8", "surrogatepass")
    how = draw(st.sampled_from(["plain"] * 6 + ["bom", "utf16", "space", "mutate", "truncate"]))
    if how == "bom":
        raw = b"\xef\xbb\xbf" + raw
    elif how == "utf16":
        raw = body.encode("utf-16-le", "surrogatepass")
    elif how == "space":
        raw = b" \t" + raw + b" \r"
    elif how == "mutate" and raw:
        i = draw(st.integers(0, len(raw) - 1))
        raw = raw[:i] + draw(st.binary(min_size=0, max_size=3)) + raw[i + 1 :]
    elif how == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw


GOOD = {"user_id": "u-17", "day": "2026-01-05", "values": {"active": 1, "plan": "pro"}}


# ------------------------------------------------------------------------------ properties


@settings(max_examples=1500, deadline=None)
@given(raw_lines())
@example(b'{"user_id": "\\ud800", "day": "2026-01-05", "values": {}}')
@example(b'{"user_id": "\xed\xa0\x80", "day": "2026-01-05", "values": {}}')
@example(b'{"user_id": "u", "day": "2026-01-05", "values": {"a\\udfff": 1}}')
@example(b'{"user_id": "u", "day": "2026-01-05", "values": {"a": "\\udbff"}}')
@example(b'{"user_id": "u", "day": "2026-01-05", "values": {"a": 1}, "event_id": "\\ud800"}')
@example(b'{"user_id": "u", "user_id": 5, "day": "2026-01-05", "values": {}}')
@example(b'{"user_id": 5, "user_id": "u", "day": "2026-01-05", "values": {}}')
@example(b'{"user_id": "u", "day": "2026-01-05", "values": {"a": true, "a": 1}}')
@example(b'{"user_id": "u", "day": "2026-01-05", "values": {"a": 1, "a": "x"}}')
@example(b'{"user_id": "u", "day": "2026-01-05", "values": {"a": 1}, "values": {"b": 2}}')
@example(b'{"user_id": "u", "day": "2026-01-05", "values": {"a\\u003db": 1}}')
@example(b'{"user_id": "u", "day": "2026-01-05", "values": {"a": 1e999}}')
@example(b'{"user_id": "u", "day": "2026-01-05", "values": {"a": -0.0}}')
@example(b'{"user_id": "u", "day": "2026-01-05", "values": {"a": 1000000000001}}')
@example(b'{"user_id": "u", "day": "2026-01-05", "values": {"a": NaN}}')
@example(b'{"user_id": "u", "day": "2026-01-05", "values": {}, "event_id": null}')
@example(b'\xef\xbb\xbf{"user_id": "u", "day": "2026-01-05", "values": {}}')
@example('{"user_id": "u", "day": "2026-01-05", "values": {}}'.encode("utf-16"))
@example(b"")
@example(b"[" * 50_000)
def test_batch_path_agrees_with_parse_event_on_arbitrary_lines(line):
    check_agrees(line)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_batch_path_agrees_on_arbitrary_bytes(line):
    check_agrees(line)


@settings(max_examples=300, deadline=None)
@given(
    user=st.text(min_size=1, max_size=MAX_ID_CHARS),
    names=st.lists(st.text(min_size=1, max_size=MAX_FEATURE_CHARS), max_size=4),
    values=st.lists(
        st.one_of(
            st.floats(-MAX_ABS_VALUE, MAX_ABS_VALUE, allow_nan=False),
            st.integers(-(10**12), 10**12),
            st.text(max_size=MAX_STRING_VALUE_CHARS),
        ),
        min_size=4,
        max_size=4,
    ),
    event_id=st.none() | st.text(min_size=1, max_size=MAX_ID_CHARS),
    ascii_only=st.booleans(),
)
def test_valid_events_take_the_fast_path(user, names, values, event_id, ascii_only):
    obj = {"user_id": user, "day": "2026-01-05", "values": dict(zip(names, values, strict=False))}
    if event_id is not None:
        obj["event_id"] = event_id
    line = json.dumps(obj, ensure_ascii=ascii_only).encode()
    fast = ingest._fast(line)
    if any("=" in n for n in names):
        assert fast is None
    else:
        assert fast is not None
    check_agrees(line)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(raw_lines(), st.just(json.dumps(GOOD).encode())), max_size=20))
def test_a_batch_is_the_lines_one_by_one(lines):
    got = parse_events(lines)
    assert len(got) == len(lines)
    for line, item in zip(lines, got, strict=True):
        assert _same(item, _reference(line))


@pytest.mark.parametrize(
    ("obj", "accepted"),
    [
        ({**GOOD, "user_id": "x" * MAX_ID_CHARS}, True),
        ({**GOOD, "user_id": "x" * (MAX_ID_CHARS + 1)}, False),
        ({**GOOD, "values": {"f" * MAX_FEATURE_CHARS: 1}}, True),
        ({**GOOD, "values": {"f" * (MAX_FEATURE_CHARS + 1): 1}}, False),
        ({**GOOD, "values": {"c": "v" * MAX_STRING_VALUE_CHARS}}, True),
        ({**GOOD, "values": {"c": "v" * (MAX_STRING_VALUE_CHARS + 1)}}, False),
        ({**GOOD, "values": {f"f{i}": i for i in range(MAX_FEATURES_PER_EVENT)}}, True),
        ({**GOOD, "values": {f"f{i}": i for i in range(MAX_FEATURES_PER_EVENT + 1)}}, False),
        ({**GOOD, "values": {"a": MAX_ABS_VALUE, "b": -MAX_ABS_VALUE}}, True),
        ({**GOOD, "values": {"a": math.nextafter(MAX_ABS_VALUE, math.inf)}}, False),
        ({**GOOD, "day": "9998-12-31"}, True),
        ({**GOOD, "day": "9999-01-01"}, False),
        ({**GOOD, "day": "1969-12-31"}, False),
        ({**GOOD, "values": {"n": "a" * 70_000}}, False),
    ],
)
def test_limits(obj, accepted):
    line = json.dumps(obj).encode()
    assert len(line) > MAX_EVENT_BYTES or (ingest._fast(line) is not None) == accepted
    check_agrees(line, label=False)
    assert isinstance(parse_events([line])[0], Event) == accepted


# ------------------------------------------------------------------------ the chunk decoder

_E = '{"user_id": "u", "day": "2026-01-05", "values": {"a": 1}}'


@pytest.mark.parametrize(
    "lines",
    [
        # two lines that are one event only when joined
        ['{"user_id": "u", "day": "2026-01-05", "values": {"a": 1', '"b": 2}}'],
        # a string spanning a wrapper, compensated by a line of two events
        ['{"user_id": "a', 'b", "day": "2026-01-05", "values": {}}', f"{_E}],[{_E}"],
        [f"{_E}, {_E}", _E],  # two events on one line
        [f"{_E}]", f"[{_E}"],
        [_E, "", _E],  # an empty line
        [_E, " \t", _E],
        [_E, _E + " x"],
        [_E, "\ufeff" + _E],  # a BOM: parse_event accepts it, the chunk decoder does not
        [_E, _E.replace('"a"', '"a\\u003db"')],  # '=' in a feature name, escaped
        [_E, _E.replace('"a": 1', '"a": "[x]"')],  # brackets inside a string: accepted
    ],
)
def test_a_chunk_accepts_only_lines_that_are_events_alone(lines):
    raws = [line.encode("utf-8") for line in lines]
    fast = ingest._fast_chunk(raws)
    expected = [_reference(raw) for raw in raws]
    if fast is not None:
        assert all(isinstance(e, Event) for e in expected)
        assert all(_same(f, e) for f, e in zip(fast, expected, strict=True))
    got = parse_events(raws)
    assert all(_same(g, e) for g, e in zip(got, expected, strict=True))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(raw_lines(), st.just(json.dumps(GOOD).encode()), st.just(_E.encode())),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 8),
)
def test_mixed_batches_decoded_in_chunks_are_the_lines_one_by_one(lines, chunk_lines):
    """Chunks of every size over mixed valid/invalid lines: the same decisions, reasons and
    values as ``parse_event`` line by line (small chunks, so that whole chunks are accepted)."""
    saved = ingest.CHUNK_LINES
    ingest.CHUNK_LINES = chunk_lines
    try:
        got = parse_events(lines)
    finally:
        ingest.CHUNK_LINES = saved
    assert len(got) == len(lines)
    for line, item in zip(lines, got, strict=True):
        assert _same(item, _reference(line)), line
    for start in range(0, len(lines), chunk_lines):
        chunk = lines[start : start + chunk_lines]
        fast = ingest._fast_chunk(chunk)
        if fast is not None:
            event("chunk accepted")
            assert all(_same(f, _reference(x)) for f, x in zip(fast, chunk, strict=True))


# ------------------------------------------------------------------------ the columnar decoder

SCHEMA_LINE = '{"user_id": "u", "day": "2026-01-05", "values": {"a": 1.5, "plan": "pro"}}'
# lines that are one schema's events, or almost: a feature missing, unknown, repeated, of the
# other kind, an int, a bool, out of range, keys in another order, an '=' name, a bad day
NEAR_SCHEMA = [
    SCHEMA_LINE,
    '{"user_id": "v", "day": "2026-01-05", "values": {"plan": "free", "a": 2}, "event_id": "e"}',
    '{"user_id": "w", "day": "2026-01-06", "values": {"a": -0.0, "plan": ""}, "event_id": null}',
    '{"user_id": "u", "day": "2026-01-05", "values": {"a": 1.5}}',
    '{"user_id": "u", "day": "2026-01-05", "values": {"a": 1.5, "plan": "pro", "b": 1}}',
    '{"user_id": "u", "day": "2026-01-05", "values": {"a": "1.5", "plan": "pro"}}',
    '{"user_id": "u", "day": "2026-01-05", "values": {"a": 1.5, "plan": 3}}',
    '{"user_id": "u", "day": "2026-01-05", "values": {"a": true, "plan": "pro"}}',
    '{"user_id": "u", "day": "2026-01-05", "values": {"a": 1e13, "plan": "pro"}}',
    '{"user_id": "u", "day": "2026-01-05", "values": {"a": 1, "a": "x", "plan": "pro"}}',
    '{"user_id": "u", "day": "2026-01-05", "values": {"a": "x", "a": 1, "plan": "pro"}}',
    '{"user_id": "u", "day": "2026-02-30", "values": {"a": 1.5, "plan": "pro"}}',
    '{"user_id": "u", "day": "2026-01-05", "values": {"a=b": 1.5, "plan": "pro"}}',
    '{"user_id": "", "day": "2026-01-05", "values": {"a": 1.5, "plan": "pro"}}',
    '{"user_id": "u", "day": "2026-01-05", "values": {"a": 1.5, "plan": "pro"}, "x": 1}',
    '{"user_id": "u", "day": "2026-01-05", "values": {}}',
    '\ufeff{"user_id": "u", "day": "2026-01-05", "values": {"a": 1.5, "plan": "pro"}}',
]


unbracketed = good_texts.filter(lambda t: "[" not in t and "]" not in t)


def _same_event(a: Event, b: Event) -> bool:
    """Equal events: fields, the features (any order), each value's type and bits."""
    return (
        (a.user_id, a.day, a.event_id) == (b.user_id, b.day, b.event_id)
        and set(a.values) == set(b.values)
        and all(type(a.values[k]) is type(b.values[k]) for k in a.values)
        and all(_bits(a.values[k]) == _bits(b.values[k]) for k in a.values)
    )


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from(NEAR_SCHEMA).map(str.encode), raw_lines()),
        min_size=1,
        max_size=12,
    )
)
@example([SCHEMA_LINE.encode()] * 3)
@example([NEAR_SCHEMA[0].encode(), NEAR_SCHEMA[1].encode(), NEAR_SCHEMA[2].encode()])
@example([SCHEMA_LINE.encode(), SCHEMA_LINE.replace("2026-01-05", "2026-02-30").encode()])
@example([SCHEMA_LINE.encode(), SCHEMA_LINE.replace("2026-01-05", "1969-12-31").encode()])
def test_columns_are_the_events_parse_events_accepts(lines):
    """``parse_columns`` decides nothing of its own: when it returns columns, every line is an
    event ``parse_events`` accepts, with the same fields and values, bit for bit."""
    columns = ingest.parse_columns(lines)
    expected = parse_events(lines)
    event("columns" if columns is not None else "per event")
    if columns is not None:
        assert all(isinstance(e, Event) for e in expected)
        assert len(columns) == len(lines)
        got = columns.events()
        assert all(_same_event(g, e) for g, e in zip(got, expected, strict=True))


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.text(
            st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters='="\\[]'),
            min_size=1,
            max_size=8,
        ),
        st.booleans(),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.tuples(unbracketed, st.one_of(st.none(), unbracketed)), min_size=1, max_size=20),
    st.randoms(use_true_random=False),
)
def test_one_schema_batches_are_decoded_as_columns(schema, ids, rnd):
    """Valid events that share features and kinds take the columnar path (keys in any order;
    a ``[`` or ``]`` anywhere in the batch sends it per event, as for ``_fast_chunk``)."""
    lines = []
    for user, event_id in ids:
        values = {
            name: (rnd.choice(["a", "é", ""]) if cat else rnd.uniform(-1e12, 1e12))
            for name, cat in schema.items()
        }
        items = list(values.items())
        rnd.shuffle(items)
        obj = {"user_id": user, "day": "2026-01-05", "values": dict(items)}
        if event_id is not None:
            obj["event_id"] = event_id
        lines.append(json.dumps(obj, ensure_ascii=rnd.random() < 0.5).encode())
    columns = ingest.parse_columns(lines)
    assert columns is not None
    expected = parse_events(lines)
    assert all(_same_event(g, e) for g, e in zip(columns.events(), expected, strict=True))


@pytest.mark.parametrize("name", ["a\\b", 'a"b', "a\x1fb", "\x00"])
def test_a_feature_name_msgspec_cannot_rename_goes_per_event(name):
    lines = [json.dumps({"user_id": "u", "day": "2026-01-05", "values": {name: 1}}).encode()]
    assert ingest.parse_columns(lines) is None
    (got,) = parse_events(lines)
    assert isinstance(got, Event) and got.values == {name: 1.0}
