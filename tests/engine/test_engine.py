"""The engine's day step (``engine/engine.py``): each engine opens days of its own input type,
``prepare_day`` changes nothing and ``commit_day`` applies exactly what it prepared; a new day's
tables are sized for the days before it."""

import numpy as np
import pytest

from streamfilter.engine import cell_table, records
from streamfilter.engine.contract import parse_event
from streamfilter.engine.engine import Engine, EngineCore
from streamfilter.engine.local import CENTRAL_NOISE, ContributionAccumulator, LocalEngine
from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.records import DayAccumulator
from streamfilter.privacy.noise import SeededRandomBits

PARAMS = PrivacyParams.create(b_norm=4.0, rho=0.5)
QUERY = {"query_id": "x", "kind": "sum", "features": ["x"], "clip": 1.0, "from_day": "2026-01-01"}


def ev(user, values, event_id=None, day="2026-01-05"):
    obj = {"user_id": user, "day": day, "values": values}
    if event_id:
        obj["event_id"] = event_id
    return parse_event(obj)


def test_each_engine_opens_days_of_its_own_input_type():
    assert isinstance(Engine(PARAMS, SeededRandomBits(1)).new_day("2026-01-05"), DayAccumulator)
    local = LocalEngine(PARAMS, SeededRandomBits(1), CENTRAL_NOISE)
    assert isinstance(local.new_day("2026-01-05"), ContributionAccumulator)
    with pytest.raises(TypeError, match="abstract"):
        EngineCore(PARAMS, SeededRandomBits(1))  # type: ignore[abstract]


def test_prepare_changes_nothing_and_commit_applies_the_prepared_day():
    eng = Engine(PARAMS, SeededRandomBits(2))
    eng.register_query(eng.parse_query(QUERY))
    acc = eng.new_day("2026-01-05")
    acc.add_many([ev(f"u{i}", {"x": 1.0}, f"e{i}") for i in range(50)])
    outcome = eng.prepare_day(acc)
    assert len(eng.ledger) == 0 and eng.last_closed_day is None and eng.history == []
    assert [r.query_id for r in outcome.releases] == ["x"] and len(outcome.changed_users) == 50
    eng.commit_day(outcome)
    assert eng.last_closed_day == "2026-01-05" and eng.history == outcome.releases
    assert len(eng.ledger) == 50
    with pytest.raises(ValueError, match="not after the last closed day"):
        eng.prepare_day(eng.new_day("2026-01-05"))


def test_a_new_day_is_sized_for_the_days_before_it():
    """``Engine.new_day`` reserves the newest open day's size (then the last prepared
    day's) for the next day: one allocation instead of a chain of growths, the same records."""
    eng = Engine(PARAMS, SeededRandomBits(1))
    first = eng.new_day("2026-01-05")
    assert first.size() == records.DaySize(0, 0)
    events = [ev(f"u{i}", {"x": 1.0, "c": "a"}, f"e{i}") for i in range(3000)]
    first.add_many(events)
    assert first.size() == records.DaySize(3000, 6000)
    second = eng.new_day("2026-01-06")
    if isinstance(second._cells, cell_table.NativeCells):
        assert second._cells._table.nbytes >= 6000 * 32  # allocated for the first day's cells
    second.add_many([ev(e.user_id, e.values, e.event_id) for e in events])
    mat = second.finish().matrix(["x", "c=a"])
    plain = DayAccumulator("2026-01-06")
    plain.add_many(events)
    assert np.array_equal(mat, plain.finish().matrix(["x", "c=a"]))
    eng.prepare_day(first)  # the last prepared day's size holds once the open days are gone
    del first, second
    assert eng._expected_size() == records.DaySize(3000, 6000)
