import json

import pytest

from streamfilter.engine.contract import Reject, Release, parse_event, parse_query

GOOD = {
    "user_id": "u-17",
    "day": "2026-01-05",
    "values": {"active": 1, "minutes": 12.5, "plan": "pro"},
    "event_id": "e-991",
}


def test_contract_example_event_is_accepted():
    ev = parse_event(json.dumps(GOOD))
    assert ev.user_id == "u-17" and ev.day == "2026-01-05" and ev.event_id == "e-991"
    assert ev.values == {"active": 1.0, "minutes": 12.5, "plan": "pro"}


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "malformed_json"),
        (b"\xff\xfe", "malformed_json"),
        (b"[1, 2]", "not_an_object"),
        (json.dumps({**GOOD, "extra": 1}), "unknown_field"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "day"}), "missing_field"),
        (json.dumps({**GOOD, "user_id": ""}), "invalid_user_id"),
        (json.dumps({**GOOD, "user_id": 17}), "invalid_user_id"),
        (json.dumps({**GOOD, "user_id": "x" * 257}), "invalid_user_id"),
        (json.dumps({**GOOD, "day": "2026-02-30"}), "invalid_day"),
        (json.dumps({**GOOD, "day": "20260105"}), "invalid_day"),
        (json.dumps({**GOOD, "day": 20260105}), "invalid_day"),
        (json.dumps({**GOOD, "values": [1]}), "invalid_values"),
        (json.dumps({**GOOD, "values": {"a": True}}), "invalid_values"),
        (json.dumps({**GOOD, "values": {"a": None}}), "invalid_values"),
        (json.dumps({**GOOD, "values": {"a": [1]}}), "invalid_values"),
        (json.dumps({**GOOD, "values": {"a=b": 1}}), "invalid_values"),
        (b'{"user_id": "u", "day": "2026-01-05", "values": {"a": NaN}}', "invalid_number"),
        (b'{"user_id": "u", "day": "2026-01-05", "values": {"a": Infinity}}', "invalid_number"),
        (b'{"user_id": "u", "day": "2026-01-05", "values": {"a": 1e999}}', "invalid_number"),
        (json.dumps({**GOOD, "values": {"a": 10**40}}), "invalid_number"),
        (json.dumps({**GOOD, "event_id": 5}), "invalid_event_id"),
        (b"{" + b" " * 70000 + b"}", "oversized"),
    ],
)
def test_bad_events_are_rejected_with_a_reason(raw, reason):
    with pytest.raises(Reject) as info:
        parse_event(raw)
    assert info.value.reason == reason


def test_reject_detail_never_quotes_the_value():
    secret = "s3cr3t-value-123"
    for obj in (
        {**GOOD, "user_id": secret * 30},
        {**GOOD, "values": {"a": [secret]}},
        {**GOOD, "day": secret},
        {**GOOD, secret: 1},
    ):
        with pytest.raises(Reject) as info:
            parse_event(json.dumps(obj))
        assert "s3cr3t" not in str(info.value) or info.value.reason == "unknown_field"


def test_queries_of_each_kind():
    s = parse_query(
        {
            "query_id": "active",
            "kind": "sum",
            "features": ["active"],
            "clip": 1.0,
            "from_day": "2026-01-01",
        }
    )
    assert s.coordinates() == ["active"] and s.labels() == ["active"] and s.applies_to("2030-01-01")
    h = parse_query(
        {
            "query_id": "plans",
            "kind": "histogram",
            "feature": "plan",
            "categories": ["free", "pro", "team"],
            "clip": 1.0,
            "from_day": "2026-01-10",
            "until_day": "2026-01-20",
        }
    )
    assert h.coordinates() == ["plan=free", "plan=pro", "plan=team"]
    assert (
        h.applies_to("2026-01-20")
        and not h.applies_to("2026-01-21")
        and not h.applies_to("2026-01-09")
    )
    m = parse_query(
        {
            "query_id": "mix",
            "kind": "linear",
            "weights": {"active": [1, 0], "minutes": [0, 0.01]},
            "clip": 2.0,
            "from_day": "2026-01-10",
            "until_day": "2026-01-10",
        }
    )
    assert m.weights().tolist() == [[1, 0], [0, 0.01]] and len(m.labels()) == 2


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (
            {"query_id": "q", "kind": "median", "clip": 1, "from_day": "2026-01-01"},
            "unknown_query_kind",
        ),
        (
            {
                "query_id": "q",
                "kind": "sum",
                "features": ["a"],
                "clip": 0,
                "from_day": "2026-01-01",
            },
            "invalid_query",
        ),
        (
            {
                "query_id": "q",
                "kind": "sum",
                "features": ["a"],
                "clip": 1,
                "from_day": "2026-01-05",
                "until_day": "2026-01-01",
            },
            "invalid_query",
        ),
        (
            {"query_id": "q", "kind": "sum", "features": [], "clip": 1, "from_day": "2026-01-01"},
            "invalid_query",
        ),
        (
            {
                "query_id": "q",
                "kind": "sum",
                "features": ["a", "a"],
                "clip": 1,
                "from_day": "2026-01-01",
            },
            "invalid_query",
        ),
        (
            {
                "query_id": "q",
                "kind": "linear",
                "weights": {"a": [1], "b": [1, 2]},
                "clip": 1,
                "from_day": "2026-01-01",
            },
            "invalid_query",
        ),
        (
            {
                "query_id": "q",
                "kind": "sum",
                "features": ["a"],
                "clip": 1,
                "from_day": "2026-13-01",
            },
            "invalid_query",
        ),
        (
            {
                "query_id": "q",
                "kind": "sum",
                "features": ["a"],
                "clip": 1,
                "from_day": "2026-01-01",
                "x": 1,
            },
            "invalid_query",
        ),
    ],
)
def test_bad_queries(obj, reason):
    with pytest.raises(Reject) as info:
        parse_query(obj)
    assert info.value.reason == reason
    with pytest.raises(Reject):
        parse_query(b'{"kind": "sum", "clip": NaN}')


def test_release_json_shape_and_key_order():
    r = Release(
        "2026-01-05", "active", ["active"], [1204.0], 3.16, [6.2], "discrete_gaussian", 0.0009765625
    )
    text = r.to_json()
    assert list(json.loads(text)) == [
        "day",
        "query_id",
        "labels",
        "value",
        "sigma",
        "ci95",
        "mechanism",
        "granularity",
    ]
    assert Release.from_json(text) == r
