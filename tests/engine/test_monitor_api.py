"""The notebook API is discoverable and forgiving in the right places."""

import datetime as dt

import pytest

import streamfilter
from streamfilter import Monitor

Q = {"query_id": "a", "kind": "sum", "features": ["active"], "clip": 0.25, "from_day": "2026-01-01"}


def test_monitor_is_discoverable_and_has_a_useful_repr_without_counts():
    assert {"Monitor", "Release"} <= set(dir(streamfilter))
    m = Monitor(b_norm=4.0, rho=0.5, test_seed=1)
    m.add_query(Q)
    m.close_day("2026-01-01", [{"user_id": "u", "day": "2026-01-01", "values": {"active": 1}}])
    text = repr(m)
    assert "0.5-zCDP" in text and "b_norm=4" in text and "σ=2" in text and "queries: a" in text
    assert "last closed day 2026-01-01" in text and "NOT private" in text
    assert "NOT private" not in repr(Monitor(b_norm=4.0, rho=0.5))


def test_days_accept_dates_and_skipped_days_close_as_the_daemon_closes_them():
    m = Monitor(b_norm=4.0, rho=0.5, test_seed=1)
    m.add_query(Q)
    m.close_day(dt.date(2026, 1, 1), [])
    (rel,) = m.close_day(dt.date(2026, 1, 4), [])
    assert rel.day == "2026-01-04"
    assert [r.day for r in m.releases] == ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"]
    with pytest.raises(ValueError, match="not after the last closed day"):
        m.close_day(dt.date(2026, 1, 2), [])


def test_a_monitor_is_saved_in_a_state_store_and_resumed(tmp_path):
    from streamfilter.errors import ConfigError
    from streamfilter.runtime.notebook import PersistentMonitor
    from streamfilter.runtime.store import SQLiteStateReader

    events = [{"user_id": f"u{i}", "day": "2026-01-01", "values": {"active": 1}} for i in range(5)]
    with PersistentMonitor.open(tmp_path / "nb.db", b_norm=4.0, rho=0.5, test_seed=1) as m:
        m.add_query(Q)
        first = m.close_day("2026-01-01", events)
        m.close_day("2026-01-02", [{**e, "day": "2026-01-02"} for e in events])
        spent = m.spent("u1")
    with PersistentMonitor.open(tmp_path / "nb.db", b_norm=4.0, rho=0.5, test_seed=1) as m:
        assert m.spent("u1") == spent == 2 * 0.25**2
        assert m.releases[0].to_json() == first[0].to_json()
        assert "queries: a" in repr(m) and "last closed day 2026-01-02" in repr(m)
        (rel,) = m.close_day("2026-01-03", [])  # the stored query still runs
        assert rel.day == "2026-01-03"
    reader = SQLiteStateReader(tmp_path / "nb.db")
    try:  # the same store code: the report and the budget tools read it
        assert len(reader.sent_releases()) == 3
    finally:
        reader.close()
    with pytest.raises(ConfigError, match="privacy settings differ"):
        PersistentMonitor.open(tmp_path / "nb.db", b_norm=8.0, rho=0.5)
