"""The stopping policy: standing queries stop once the *published* active fraction is too low."""

import json
import logging

import pytest

from streamfilter import Monitor, Release
from streamfilter.config import load_config
from streamfilter.policies import active_fraction, stop_when_inactive
from streamfilter.runtime.app import build_daemon
from streamfilter.telemetry.active_set import ActiveSetSpec

COUNT = {
    "query_id": "c",
    "kind": "sum",
    "features": ["active"],
    "clip": 1.0,
    "from_day": "2026-01-01",
}
POPULATION = 200


def day(n):
    return f"2026-01-{n:02d}"


def estimate(d, departed, half=10.0):
    return Release(
        day=day(d),
        query_id="_active_set",
        labels=["departed_cumulative"],
        value=[float(departed)],
        sigma=half / 1.96,
        ci95=[half],
        mechanism="binary_tree_discrete_gaussian",
        granularity=1.0,
    )


def test_active_fraction_is_post_processing_of_one_release():
    f = active_fraction(estimate(1, 50, half=10), population=200)
    assert f == (0.75, 0.7, 0.8)
    assert active_fraction(estimate(1, -30), 200).estimate == 1.0  # clamped
    assert active_fraction(estimate(1, 500), 200).high == 0.0
    with pytest.raises(ValueError, match="_active_set"):
        active_fraction(Release(**{**estimate(1, 0).__dict__, "query_id": "c"}), 200)


def test_the_policy_runs_templates_day_by_day_until_the_fraction_drops(caplog):
    policy = stop_when_inactive([COUNT], population=200, min_active_fraction=0.5)
    assert policy([], day(1)) == [
        {**COUNT, "query_id": "c:2026-01-01", "from_day": day(1), "until_day": day(1)}
    ]
    history = [estimate(1, 20), estimate(2, 95)]  # 0.9, then 0.525 (interval 0.475..0.575)
    assert [q["query_id"] for q in policy(history, day(3))] == ["c:2026-01-03"]
    history.append(estimate(3, 115))  # 0.425, interval up to 0.475 < 0.5: confidently below
    with caplog.at_level(logging.WARNING, logger="streamfilter.policies"):
        assert policy(history, day(4)) == []
    assert len(caplog.records) == 1 and "stopping 1 standing queries" in caplog.text
    caplog.clear()
    history.append(estimate(4, 40))  # noise says "back up": stopping is final
    with caplog.at_level(logging.WARNING, logger="streamfilter.policies"):
        assert policy(history, day(5)) == []
    assert caplog.records == []  # warned once


def test_confident_stopping_waits_for_the_whole_interval():
    history = [estimate(1, 105, half=10)]  # 0.475, interval 0.425..0.525
    assert stop_when_inactive([COUNT], population=200, min_active_fraction=0.5)(history, day(2))
    assert (
        stop_when_inactive([COUNT], population=200, min_active_fraction=0.5, confident=False)(
            history, day(2)
        )
        == []
    )


def test_template_windows_are_respected():
    bounded = {**COUNT, "query_id": "b", "from_day": day(3), "until_day": day(4)}
    policy = stop_when_inactive([COUNT, bounded], population=10, min_active_fraction=0.1)
    assert [q["query_id"] for q in policy([], day(2))] == ["c:2026-01-02"]
    assert [q["query_id"] for q in policy([], day(4))] == ["c:2026-01-04", "b:2026-01-04"]
    assert [q["query_id"] for q in policy([], day(5))] == ["c:2026-01-05"]
    with pytest.raises(ValueError):
        stop_when_inactive([COUNT], population=0, min_active_fraction=0.5)
    with pytest.raises(ValueError):
        stop_when_inactive([COUNT], population=10, min_active_fraction=0.0)


def active_users(d):
    return range(0, POPULATION) if d % 2 else range(0, POPULATION, 2)


def test_with_the_monitor_the_query_stops_after_the_active_set_shrinks():
    """Users pay 1 per active day out of B_norm = 3 (min_remaining 1): most leave after 2-4 days.
    The policy sees only releases; it stops within a few days of the true fraction crossing."""
    m = Monitor(
        b_norm=3.0,
        rho=0.5,
        test_seed=2,
        active_set=ActiveSetSpec(rho=0.5, horizon_days=32, min_remaining=1.0),
    )
    policy = stop_when_inactive([COUNT], population=POPULATION, min_active_fraction=0.5)
    asked, true_fraction = [], []
    for d in range(1, 13):
        for q in policy(m.releases, day(d)):
            m.add_query(q)
        released = m.close_day(
            day(d),
            [
                {"user_id": f"u-{i}", "day": day(d), "values": {"active": 1}}
                for i in active_users(d)
            ],
        )
        asked.append(any(r.query_id.startswith("c:") for r in released))
        b = m.params.budget_units
        left = sum(1 for _, s, r in m.engine.ledger.items() if r or b - s < 2**20)
        true_fraction.append(1 - left / POPULATION)
    first_off = asked.index(False)
    assert all(asked[:first_off]) and not any(asked[first_off:])  # stops for good
    crossed = next(i for i, f in enumerate(true_fraction) if f < 0.5)
    assert crossed < first_off <= crossed + 4  # after the true crossing, not long after


POLICY = stop_when_inactive([COUNT], population=60, min_active_fraction=0.5)

CONFIG = """
[privacy]
b_norm = 2.0
rho = 0.5
[source]
kind = "file"
path = "events.jsonl"
[queries]
kind = "policy"
policy = "tests.system.test_stopping:POLICY"
[sink]
kind = "file"
path = "releases.jsonl"
[state]
path = "state.db"
[testing]
noise_seed = 1
[telemetry]
rho = 1.0
active_set = true
active_set_rho = 1.0
active_set_horizon = 16
coverage = false  # the whole telemetry budget goes to the estimate the policy reads
population = false  # the plain filter's arithmetic of the comments below
"""


def test_through_the_daemon_the_policy_stops_registering(tmp_path):
    (tmp_path / "streamfilter.toml").write_text(CONFIG)
    with open(tmp_path / "events.jsonl", "w") as fh:
        for d in range(1, 9):
            for i in range(60):
                fh.write(
                    json.dumps({"user_id": f"u-{i}", "day": day(d), "values": {"active": 1}}) + "\n"
                )
    parts = build_daemon(
        load_config(tmp_path / "streamfilter.toml"), follow=False, allow_test_seed=True
    )
    try:
        parts.daemon.run(until_end=True)
    finally:
        parts.close()
    rel = [json.loads(line) for line in (tmp_path / "releases.jsonl").read_text().splitlines()]
    days_asked = sorted({r["day"] for r in rel if r["query_id"].startswith("c:")})
    # everyone is active daily and pays 1 of B_norm = 2: all have left after day 1 (remaining 1
    # is not < 1) ... after day 2 (remaining 0 < 1); the day-2 estimate stops the policy
    assert days_asked == [day(1), day(2)]
    assert len([r for r in rel if r["query_id"] == "_active_set"]) == 8
