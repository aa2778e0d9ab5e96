"""The batch decoder (``engine.ingest``: the native scanner, ``engine/_jsonl.c``, with
``parse_event`` for every line it does not take) agrees with the reference ``parse_event`` on
every line: the same events accepted with bit-identical values, the same lines rejected with the
same reason and detail — on mixed batches of valid and invalid lines, as the Kafka source hands
them (a list of ``bytes``) and as the file source does (``BlockLines``), with and without the
registered queries' feature kinds. Without the scanner the decoder is ``parse_event`` itself.
"""

from __future__ import annotations

import json
import math
import random
import struct

import numpy as np
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
from streamfilter.engine.lines import BlockLines


def _reference(line: bytes, kinds=None) -> Event | Reject:
    try:
        return parse_event(line, kinds)
    except Reject as rej:
        return rej


def _bits(value: float | str) -> object:
    return struct.pack("<d", value) if isinstance(value, float) else value


def _same(a: Event | Reject, b: Event | Reject) -> bool:
    """The same reject (reason and detail), or the same event: fields, features (a mapping: any
    order), each value's type and bits."""
    if isinstance(a, Reject) or isinstance(b, Reject):
        return (
            isinstance(a, Reject)
            and isinstance(b, Reject)
            and (a.reason, a.detail) == (b.reason, b.detail)
        )
    return (
        (a.user_id, a.day, a.event_id) == (b.user_id, b.day, b.event_id)
        and set(a.values) == set(b.values)
        and all(type(a.values[k]) is type(b.values[k]) for k in a.values)
        and all(_bits(a.values[k]) == _bits(b.values[k]) for k in a.values)
    )


def as_block(lines: list[bytes]) -> BlockLines:
    """The lines as the file source holds them: spans of one block (newline-separated)."""
    block = b"\n".join(lines) + b"\n"
    ends = np.cumsum([len(line) + 1 for line in lines], dtype=np.int64) - 1
    return BlockLines(block, ends - [len(line) for line in lines], ends)


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


GOOD = {"user_id": "u-17", "day": "2026-01-05", "values": {"active": 1, "plan": "pro"}}
DAY = "2026-01-05"

ascii_ids = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters='"\\'),
    min_size=1,
    max_size=MAX_ID_CHARS,
)


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


def plain_events(rnd, n: int) -> list[bytes]:
    """What producers write: ``json.dumps`` of valid events with ASCII text (the scanner's
    form), keys in any order, now and then a feature of the other kind or a missing one; long
    runs of these make the scanner read whole windows. Drawn from ``rnd``: cheap to generate."""
    lines = []
    for _ in range(n):
        values: dict[str, object] = {
            "active": rnd.randrange(4),
            "minutes": rnd.uniform(-1e12, 1e12) if rnd.random() < 0.5 else rnd.randrange(100),
            "plan": rnd.choice(["free", "pro", ""]),
        }
        if rnd.random() < 0.03:
            values["plan"] = 1
        if rnd.random() < 0.03:
            del values["active"]
        items = list(values.items())
        if rnd.random() < 0.1:
            rnd.shuffle(items)
        obj: dict[str, object] = {
            "user_id": f"u{rnd.randrange(1000)}",
            "day": DAY if rnd.random() < 0.9 else "2026-01-06",
            "values": dict(items),
        }
        if rnd.random() < 0.5:
            obj["event_id"] = rnd.choice([None, f"e{rnd.randrange(10**6)}"])
        lines.append(json.dumps(obj).encode())
    return lines


#: the registered queries' feature kinds the decoder is checked under: none; agreeing with the
#: plain events; disagreeing (so that typed rejects meet scanned runs)
KINDS = [None, {"minutes": False, "plan": True}, {"active": True}, {"plan": False, "a": False}]

EXAMPLES = [
    b'{"user_id": "\\ud800", "day": "2026-01-05", "values": {}}',
    b'{"user_id": "\xed\xa0\x80", "day": "2026-01-05", "values": {}}',
    b'{"user_id": "u", "day": "2026-01-05", "values": {"a\\udfff": 1}}',
    b'{"user_id": "u", "day": "2026-01-05", "values": {"a": "\\udbff"}}',
    b'{"user_id": "u", "day": "2026-01-05", "values": {"a": 1}, "event_id": "\\ud800"}',
    b'{"user_id": "u", "user_id": 5, "day": "2026-01-05", "values": {}}',
    b'{"user_id": 5, "user_id": "u", "day": "2026-01-05", "values": {}}',
    b'{"user_id": "u", "day": "2026-01-05", "values": {"a": true, "a": 1}}',
    b'{"user_id": "u", "day": "2026-01-05", "values": {"a": 1, "a": "x"}}',
    b'{"user_id": "u", "day": "2026-01-05", "values": {"a": 1}, "values": {"b": 2}}',
    b'{"user_id": "u", "day": "2026-01-05", "values": {"a\\u003db": 1}}',
    b'{"user_id": "u", "day": "2026-01-05", "values": {"a": 1e999}}',
    b'{"user_id": "u", "day": "2026-01-05", "values": {"a": -0.0}}',
    b'{"user_id": "u", "day": "2026-01-05", "values": {"a": 1000000000001}}',
    b'{"user_id": "u", "day": "2026-01-05", "values": {"a": NaN}}',
    b'{"user_id": "u", "day": "2026-01-05", "values": {}, "event_id": null}',
    b'{"user_id": "u\x7f", "day": "2026-01-05", "values": {"a": 1}}',
    b'{"user_id": "u", "day": "2026-02-30", "values": {"a": 1}}',
    b'\xef\xbb\xbf{"user_id": "u", "day": "2026-01-05", "values": {}}',
    '{"user_id": "u", "day": "2026-01-05", "values": {}}'.encode("utf-16"),
    b"",
    b"[" * 50_000,
]
_A = b'{"user_id": "u", "day": "2026-01-05", "values": {"a": 1}}'


def check_agrees(lines: list[bytes], kinds, label: bool = True) -> None:
    """``parse_events`` and ``parse_columns``, on the list and on its block, against the
    reference line by line."""
    expected = [_reference(line, kinds) for line in lines]
    for form in (lines, as_block(lines)):
        got = parse_events(form, kinds)
        assert len(got) == len(lines)
        for line, g, e in zip(lines, got, expected, strict=True):
            assert _same(g, e), (line, g, e)
        columns = ingest.parse_columns(form, kinds)
        if columns is not None:
            assert len(columns) == len(lines)
            assert all(_same(g, e) for g, e in zip(columns.events(), expected, strict=True))
    if not label:
        return
    accepted = sum(isinstance(e, Event) for e in expected)
    event(f"accepted: {accepted * 4 // max(1, len(lines))}/4 of the lines")
    event(f"{len(lines) // 100 * 100}+ lines")


# ------------------------------------------------------------------------------ the agreement


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.one_of(raw_lines(), near_plain_lines(), st.binary(max_size=80)), max_size=8),
    st.integers(0, 200),
    st.sampled_from(KINDS),
    st.integers(0, 2**32),
)
@example([*EXAMPLES, _A, _A], 0, None, None)
@example([_A, _A.replace(b"2026-01-05", b"2026-02-30"), _A], 0, None, None)
@example([_A, _A.replace(b"2026-01-05", b"1969-12-31")], 0, {"a": False}, None)
@example([_A, _A.replace(b"1}", b'"1"}'), _A], 0, {"a": False}, None)
def test_the_decoder_agrees_with_the_reference_on_mixed_batches(odd, n_plain, kinds, seed):
    """Invalid and unusual lines shuffled into runs of plain events (so that the scanner reads
    whole windows, stops mid-window and starts again): every line decides as ``parse_event``
    decides, on both sources' batch forms and under each set of feature kinds."""
    lines = list(odd)
    if seed is not None:  # the plain runs from a seeded generator: cheap to draw
        rnd = random.Random(seed)
        lines += plain_events(rnd, n_plain)
        rnd.shuffle(lines)
        if rnd.random() < 0.5:  # or the odd lines in one place, the plain runs left long
            lines.sort(key=lambda line: line not in odd)
    check_agrees(lines, kinds)


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
    """At each limit and one past it, on the scanner (a batch of the line twice) and alone."""
    line = json.dumps(obj).encode()
    check_agrees([line, line], None, label=False)
    assert isinstance(parse_events([line, line])[1], Event) == accepted
    if ingest.SCANNER == "native" and len(line) <= MAX_EVENT_BYTES:
        assert (ingest.parse_columns([line, line]) is not None) == accepted


@pytest.mark.parametrize("name", ["a\\b", 'a"b', "a\x1fb", "\x00"])
def test_a_feature_name_the_scanner_cannot_take_goes_to_the_reference(name):
    lines = [json.dumps({"user_id": "u", "day": "2026-01-05", "values": {name: 1}}).encode()]
    assert ingest.parse_columns(lines) is None
    (got,) = parse_events(lines)
    assert isinstance(got, Event) and got.values == {name: 1.0}


# --------------------------------------------------------------- control characters in user ids
#: user ids holding a control character (Unicode category Cc: C0, DEL, C1), as JSON text: escaped,
#: and, for the ones JSON allows raw, as the raw byte
CONTROL_USER_IDS = [
    b'"\\u0000"',
    b'"a\\u0000b"',
    b'"u\\u001f"',
    b'"tab\\there"',
    b'"\\n"',
    b'"u\x7f"',
    b'"u\\u007f"',
    b'"u\\u0085"',
    b'"u\xc2\x9f"',
]


def _with_user(user: bytes) -> bytes:
    return b'{"user_id": ' + user + b', "day": "2026-01-05", "values": {"a": 1, "b": "x"}}'


@pytest.mark.parametrize("user", CONTROL_USER_IDS)
def test_a_control_character_in_a_user_id_is_refused_on_every_path(tmp_path, user):
    """The reference, the batch decoder, the column path on a Kafka batch (a list of bytes) and
    on a file source's block (``BlockLines``, read by the real ``FileSource``) all refuse it as
    ``invalid_user_id``; the lines around it are accepted."""
    from streamfilter.runtime.io.files import FileSource

    bad = _with_user(user)
    good = _with_user(b'"u1"')
    with pytest.raises(Reject) as exc:
        parse_event(bad)
    assert exc.value.reason == "invalid_user_id"
    batch = [good, bad, good]
    parsed = parse_events(batch)
    assert isinstance(parsed[0], Event) and isinstance(parsed[2], Event)
    assert isinstance(parsed[1], Reject) and parsed[1].reason == "invalid_user_id"
    assert ingest.parse_columns(batch) is None  # the daemon then takes parse_events
    assert ingest.parse_columns([bad]) is None
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(batch) + b"\n")
    source = FileSource(path)
    source.seek({})
    (read,) = source.poll_batches(10)
    source.close()
    assert list(read.values) == batch
    assert ingest.parse_columns(read.values) is None
    from_file = parse_events(read.values)
    assert [getattr(p, "reason", None) for p in from_file] == [None, "invalid_user_id", None]


# ------------------------------------------------------------------------------ typed features
SUM_SESSIONS = {"query_id": "s", "kind": "sum", "features": ["sessions"], "clip": 5.0}
PLANS = {"query_id": "p", "kind": "histogram", "feature": "plan", "categories": ["1", "pro"]}


def _typed_engine():
    from streamfilter.engine.contract import parse_query
    from streamfilter.engine.engine import Engine
    from streamfilter.engine.params import PrivacyParams
    from streamfilter.privacy.noise import SeededRandomBits

    engine = Engine(PrivacyParams.create(b_norm=4.0, rho=0.5), SeededRandomBits(1))
    for q in (SUM_SESSIONS, {**PLANS, "clip": 1.0}):
        engine.register_query(parse_query({**q, "from_day": "2026-01-01"}))
    return engine


def _typed(sessions: object, plan: object) -> bytes:
    values = {"sessions": sessions, "plan": plan, "other": "x"}
    return json.dumps({"user_id": "u", "day": DAY, "values": values}).encode()


@pytest.mark.parametrize("form", ["kafka", "file"])
def test_a_value_of_the_type_no_registered_query_reads_is_refused(form):
    """A sum over ``sessions`` refuses ``"sessions": "1"`` (it would be the category
    ``sessions=1``, adding 0 to the sum); a histogram over ``plan`` refuses ``"plan": 1`` (a
    number no category matches) — both as ``wrong_type``, on the scanner's batches (Kafka's list,
    the file source's block) and on the reference; a feature no query reads takes any type."""
    engine = _typed_engine()
    good = _typed(2, "pro")
    lines = [good, good, _typed("1", "pro"), good, _typed(2, 1), _typed(2, "pro")]
    batch = lines if form == "kafka" else as_block(lines)
    parsed = engine.parse_records(batch)
    assert [getattr(p, "reason", None) for p in parsed] == [
        None,
        None,
        "wrong_type",
        None,
        "wrong_type",
        None,
    ]
    assert "sessions" in parsed[2].detail and "plan" in parsed[4].detail
    assert engine.parse_columns(batch) is None
    assert engine.parse_columns(as_block([good] * 3) if form == "file" else [good] * 3) is not None
    for line, item in zip(lines, parsed, strict=True):
        try:
            ref = engine.parse_record(line)
        except Reject as rej:
            ref = rej
        assert _same(item, ref)
    assert engine.parse_columns([_typed("1", "pro"), good]) is None


def test_a_query_reading_a_feature_as_the_other_type_is_refused():
    from streamfilter.engine.contract import parse_query

    engine = _typed_engine()
    as_category = {"query_id": "h", "kind": "histogram", "feature": "sessions", "categories": ["1"]}
    with pytest.raises(Reject) as exc:
        engine.register_query(parse_query({**as_category, "clip": 1.0, "from_day": "2026-01-01"}))
    assert exc.value.reason == "invalid_query" and "sessions" in exc.value.detail
