"""Lines of a read block (``engine/lines.py``): the native ``split_lines`` gives the same spans as
the Python rule for any bytes (blank lines, ``\\r``, whitespace, partial last lines, any
``need``); ``BlockLines`` is a sequence equal to the list of its lines; the scanner reading the
lines in place (``scan_spans``) gives what it gives for the same lines as ``bytes``, its event ids
as spans (``EventIdSpans``) a sequence equal to the list of the ids."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.engine import ingest, lines, native
from streamfilter.engine.lines import BlockLines, EventIdSpans, id_list
from streamfilter.engine.records import DayAccumulator
from tests.support.native_build import needs

built = needs(native.jsonl, "engine/_jsonl.c")


def reference(block: bytes, need: int, final: bool) -> tuple[list[bytes], int, int, int]:
    """The rule, line by line as ``FileSource.poll`` reads: (kept lines, taken, consumed,
    last_end)."""
    kept: list[bytes] = []
    taken = pos = 0
    last_end = -1
    while taken < need and pos < len(block):
        nl = block.find(b"\n", pos)
        if nl < 0 and not final:
            break
        stop, nxt = (nl, nl + 1) if nl >= 0 else (len(block), len(block))
        taken += 1
        body = block[pos:stop].rstrip(b"\r")
        if body.strip():
            kept.append(body)
            last_end = nxt
        pos = nxt
    return kept, taken, pos, last_end


def spans_to_lines(block: bytes, starts, ends) -> list[bytes]:
    s = np.frombuffer(starts, np.int64).tolist()
    e = np.frombuffer(ends, np.int64).tolist()
    return [block[a:b] for a, b in zip(s, e, strict=True)]


blocks = st.lists(
    st.sampled_from([b"\n", b"\r", b"\r\n", b" ", b"\t", b"\x0b", b"\x0c", b"a", b"{}", b"x y"]),
    max_size=40,
).map(b"".join)


@given(block=blocks, need=st.integers(0, 12), final=st.booleans())
@settings(max_examples=600, deadline=None)
def test_split_lines_follows_the_line_rule_natively_and_in_python(block, need, final):
    want_lines, taken, consumed, last_end = reference(block, need, final)
    results = [lines._split_lines_py(block, need, final)]
    if native.jsonl is not None:
        results.append(native.jsonl.split_lines(block, need, final))
    for starts, ends, got_taken, got_consumed, got_last in results:
        assert spans_to_lines(block, starts, ends) == want_lines
        assert (got_taken, got_consumed, got_last) == (taken, consumed, last_end)


def test_split_lines_refuses_a_negative_need():
    with pytest.raises(ValueError):
        lines.split_lines(b"a\n", -1, True)


def test_block_lines_is_the_list_of_its_lines():
    block = b'{"a":1}\r\n\n  \nxyz\nlast'
    starts, ends, *_ = lines.split_lines(block, 10, True)
    got = BlockLines(block, np.frombuffer(starts, np.int64), np.frombuffer(ends, np.int64))
    want = [b'{"a":1}', b"xyz", b"last"]
    assert len(got) == 3 and got[0] == want[0] and got[-1] == b"last"
    assert got == want and want == got and got == tuple(want) and got != want[:2]
    assert got[1:] == want[1:] and list(got) == want
    assert got.lengths().tolist() == [7, 3, 4]
    with pytest.raises(IndexError):
        got[3]
    with pytest.raises(TypeError):
        hash(got)


@pytest.mark.parametrize(("starts", "ends"), [([0], [9]), ([-1], [1]), ([2], [1]), ([0, 1], [1])])
def test_block_lines_refuses_spans_outside_the_block(starts, ends):
    with pytest.raises(ValueError):
        BlockLines(b"abcd", np.array(starts), np.array(ends))


@built
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["u1", "u2", "user-3"]),
            st.integers(0, 10**6),
            st.sampled_from(["free", "pro"]),
            st.sampled_from(["", " ", "\r"]),
            st.sampled_from(
                ['"event_id":"e{i}",', '"event_id": "x-{i}" ,', '"event_id":null,', ""]
            ),
        ),
        min_size=1,
        max_size=30,
    ),
    broken=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_scanning_in_place_equals_scanning_the_lines(events, broken):
    """``scan_spans`` reads the lines in place as ``scan_columns`` reads them as bytes; with
    ``id_spans`` the event ids are spans of the block, each the same text (``None``: a null or
    missing id), and ``parse_columns`` of the block's lines gives the same events either way."""
    text = [
        f'{{"user_id":"{u}","day":"2026-03-01",{eid.format(i=i)}"values":{{"m":{v / 100},'
        f'"plan":"{p}"}}}}{pad}'
        for i, (u, v, p, pad, eid) in enumerate(events)
    ]
    if broken:
        text[len(text) // 2] = text[len(text) // 2].replace('"m":', '"m":"')
    block = ("\n".join(text) + "\n").encode()
    starts, ends, *_ = lines.split_lines(block, len(text), True)
    in_place = BlockLines(block, np.frombuffer(starts, np.int64), np.frombuffer(ends, np.int64))
    assert native.jsonl is not None
    schema = ((b"m", 0), (b"plan", 1))
    names, kinds = tuple(n for n, _ in schema), bytes(k for _, k in schema)
    by_spans = native.jsonl.scan_spans(
        block, in_place.starts, in_place.ends, names, kinds, ingest._SCAN_LIMITS
    )
    by_lines = native.jsonl.scan_columns(in_place.lines(), names, kinds, ingest._SCAN_LIMITS)
    assert by_spans == by_lines
    assert (by_spans is None) == broken
    with_id_spans = native.jsonl.scan_spans(
        block, in_place.starts, in_place.ends, names, kinds, ingest._SCAN_LIMITS, True
    )
    if by_lines is None:
        assert with_id_spans is None
    else:
        assert with_id_spans is not None
        users, days, (id_starts, id_lengths), columns = with_id_spans
        assert (users, days, columns) == (by_lines[0], by_lines[1], by_lines[3])
        spans = EventIdSpans(
            block, np.frombuffer(id_starts, np.int64), np.frombuffer(id_lengths, np.int32)
        )
        assert spans.tolist() == by_lines[2] and spans.count(None) == by_lines[2].count(None)
    a, b = ingest.parse_columns(in_place), ingest.parse_columns(in_place.lines())
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        assert isinstance(a.event_ids, EventIdSpans) and isinstance(b.event_ids, list)
        assert a.events() == b.events()


@built
def test_scan_spans_refuses_spans_outside_the_block():
    assert native.jsonl is not None
    with pytest.raises(ValueError):
        native.jsonl.scan_spans(
            b"{}", np.array([0]), np.array([5]), (b"m",), b"\x00", ingest._SCAN_LIMITS
        )
    with pytest.raises(ValueError):
        native.jsonl.lines_of(b"{}", np.array([0, 1]), np.array([1]))


def test_event_id_spans_are_the_list_of_their_ids():
    block = b"..abc.d..xyz"
    spans = EventIdSpans(block, np.array([2, 6, 0, 9]), np.array([3, 1, -1, 3]))
    want = ["abc", "d", None, "xyz"]
    assert len(spans) == 4 and spans[0] == "abc" and spans[2] is None and spans[-1] == "xyz"
    assert spans == want and want == spans and spans == tuple(want) and spans != want[:3]
    assert list(spans) == want and spans.tolist() == want and id_list(spans) == want
    assert isinstance(spans[1:3], EventIdSpans) and spans[1:3] == ["d", None]
    assert spans.count(None) == spans.without_id() == 1 and spans.count("xyz") == 1
    assert spans.count("nope") == 0 and repr(spans).startswith("EventIdSpans(")
    assert id_list(want) is want and id_list(("a",)) == ["a"]
    with pytest.raises(IndexError):
        spans[4]
    with pytest.raises(TypeError):
        hash(spans)


@pytest.mark.parametrize(
    ("starts", "lengths"), [([0], [5]), ([-1], [1]), ([3], [2]), ([0], [-2]), ([0, 1], [1])]
)
def test_event_id_spans_refuse_spans_outside_the_block(starts, lengths):
    with pytest.raises(ValueError):
        EventIdSpans(b"abcd", np.array(starts), np.array(lengths))


@given(
    st.lists(
        st.one_of(st.none(), st.text(st.characters(max_codepoint=0x7F), max_size=9)), max_size=30
    ),
    st.lists(st.integers(0, 3), min_size=30, max_size=30),
)
@settings(max_examples=200, deadline=None)
def test_event_id_spans_make_the_same_list_natively_and_in_python(ids, gaps):
    block, starts, lengths = bytearray(), [], []
    for text, gap in zip(ids, gaps, strict=False):
        block += b"\x00" * gap
        starts.append(len(block) if text is not None else 0)
        lengths.append(-1 if text is None else len(text))
        block += (text or "").encode("ascii")
    spans = EventIdSpans(bytes(block), np.array(starts, np.int64), np.array(lengths, np.int32))
    saved = lines._jsonl
    try:
        lines._jsonl = None
        in_python = spans.tolist()
    finally:
        lines._jsonl = saved
    assert spans.tolist() == in_python == ids


@built
def test_ids_of_refuses_spans_outside_the_block_and_non_ascii():
    assert native.jsonl is not None
    ids_of = native.jsonl.ids_of
    one = np.array([1], np.int32)
    with pytest.raises(ValueError, match="outside"):
        ids_of(b"abc", np.array([3], np.int64), one)
    with pytest.raises(ValueError, match="outside"):
        ids_of(b"abc", np.array([0], np.int64), np.array([-2], np.int32))
    with pytest.raises(ValueError, match="ASCII"):
        ids_of("é".encode(), np.array([0], np.int64), one)
    with pytest.raises(ValueError, match="one each"):
        ids_of(b"abc", np.array([0, 1], np.int64), one)
    assert ids_of(b"abc", np.array([1, 0], np.int64), np.array([2, -1], np.int32)) == ["bc", None]


@built
@given(
    st.lists(
        st.tuples(
            st.integers(0, 4),  # user
            st.one_of(st.none(), st.integers(0, 3)),  # event id (None: the event has none)
            st.integers(0, 100),
        ),
        min_size=1,
        max_size=40,
    )
)
@settings(max_examples=100, deadline=None)
def test_a_day_takes_spans_as_it_takes_the_list_of_ids(events):
    """A block-scanned batch (its event ids spans, some events without one) and the same lines
    as bytes (ids as ``str``) give a day the same events, duplicates and records."""
    text = [
        f'{{"user_id":"u{u}","day":"2026-03-01",'
        + ("" if e is None else f'"event_id":"e{e}",')
        + f'"values":{{"m":{v}}}}}'
        for u, e, v in events
    ]
    block = ("\n".join(text) + "\n").encode()
    starts, ends, *_ = lines.split_lines(block, len(text), True)
    in_place = BlockLines(block, np.frombuffer(starts, np.int64), np.frombuffer(ends, np.int64))
    days = []
    for batch in (ingest.parse_columns(in_place), ingest.parse_columns(in_place.lines())):
        assert batch is not None
        acc = DayAccumulator("2026-03-01")
        acc.add_columns(batch)
        records = acc.finish()
        days.append(
            (
                acc.events,
                acc.duplicates,
                list(records.users),
                records.value.tolist(),
                records.user_pos.tolist(),
            )
        )
    assert days[0] == days[1]
