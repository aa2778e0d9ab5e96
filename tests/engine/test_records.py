import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.engine import records
from streamfilter.engine.contract import parse_event
from streamfilter.engine.records import DayAccumulator


def ev(user, values, event_id=None):
    obj = {"user_id": user, "day": "2026-01-05", "values": values}
    if event_id:
        obj["event_id"] = event_id
    return parse_event(obj)


def test_numbers_summed_categories_counted_event_id_once():
    acc = DayAccumulator("2026-01-05")
    assert acc.add(ev("a", {"minutes": 10, "plan": "pro"}, "e1"))
    assert acc.add(ev("a", {"minutes": 2.5, "plan": "pro"}, "e2"))
    assert not acc.add(ev("a", {"minutes": 100}, "e1"))  # repeated event_id: ignored
    assert acc.add(ev("b", {"plan": "free"}, "e1"))  # same event_id, other user: counts
    rec = acc.finish()
    m = rec.matrix(["minutes", "plan=pro", "plan=free", "absent"])
    rows = dict(zip(rec.users.tolist(), m.tolist(), strict=True))  # users are in hash order
    assert rows == {"a": [12.5, 2.0, 0.0, 0.0], "b": [0.0, 0.0, 1.0, 0.0]}
    assert acc.duplicates == 1


def test_arrival_order_does_not_matter():
    rng = random.Random(3)
    events = [
        ev(f"u{rng.randrange(50)}", {"x": rng.uniform(-1e6, 1e6), "c": rng.choice("abc")})
        for _ in range(2000)
    ]
    mats = []
    for _ in range(3):
        rng.shuffle(events)
        acc = DayAccumulator("2026-01-05")
        for e in events:
            acc.add(e)
        rec = acc.finish()
        mats.append((rec.users.tolist(), rec.matrix(["x", "c=a", "c=b"])))
    for users, m in mats[1:]:
        assert users == mats[0][0]
        assert np.array_equal(m, mats[0][1])  # bit-identical, not approximately equal


def test_empty_day():
    rec = DayAccumulator("2026-01-05").finish()
    assert rec.n_users == 0 and rec.matrix(["x"]).shape == (0, 1)


def _records_equal(a, b):
    assert a.users.tolist() == b.users.tolist()
    assert a.coord_names.tolist() == b.coord_names.tolist()
    assert np.array_equal(a.user_pos, b.user_pos) and np.array_equal(a.coord, b.coord)
    assert a.value.tobytes() == b.value.tobytes()  # bit-identical


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["u0", "u1", "u2", "é", "u4"]),
            st.dictionaries(
                st.sampled_from(["x", "y", "c", "d"]),
                st.one_of(
                    st.floats(-1e6, 1e6, allow_nan=False),
                    st.integers(-5, 5),
                    st.sampled_from(["a", "b", "é"]),
                ),
                max_size=3,
            ),
            st.one_of(st.none(), st.sampled_from(["e1", "e2", "e3"])),
        ),
        max_size=60,
    ),
    st.integers(1, 7),
    st.booleans(),
)
def test_add_many_and_folding_are_add_one_by_one(items, batch, fold_often):
    """Batches (``add_many``), per-event ``add`` and category folding at any point give the
    same records, bit for bit, and the same counts of events and duplicates."""
    events = [ev(u, vals, eid) for u, vals, eid in items]
    one = DayAccumulator("2026-01-05")
    added_one = [one.add(e) for e in events]
    saved, records._FOLD_MIN = records._FOLD_MIN, (1 if fold_often else 1 << 20)
    saved_ids = records.SeenEventIds.COMPACT_MIN
    records.SeenEventIds.COMPACT_MIN = 1 if fold_often else 1 << 18
    try:
        many = DayAccumulator("2026-01-05")
        steps = range(0, len(events), batch)
        added_many = sum(many.add_many(events[i : i + batch]) for i in steps)
    finally:
        records._FOLD_MIN = saved
        records.SeenEventIds.COMPACT_MIN = saved_ids
    assert added_many == sum(added_one)
    assert (many.events, many.duplicates) == (one.events, one.duplicates)
    _records_equal(many.finish(), one.finish())


def test_categories_fold_into_cells():
    acc = DayAccumulator("2026-01-05")
    for i in range(3000):
        acc.add_many([ev(f"u{i % 10}", {"c": "ab"[(i // 10) % 2]})])
        acc._fold()
    assert len(acc._folded[2]) == 20 and acc._cat_buffered == 0
    rec = acc.finish()
    assert rec.matrix(["c=a", "c=b"]).sum() == 3000


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from(["a", "b", "é", ""]), st.text(max_size=3)), max_size=8),
        max_size=8,
    ),
    st.integers(1, 4),
)
def test_seen_event_ids_is_a_set(batches, compact_min):
    """Recent and compacted pairs alike: membership is exactly a Python set's."""
    saved = records.SeenEventIds.COMPACT_MIN
    records.SeenEventIds.COMPACT_MIN = compact_min
    try:
        seen, model = records.SeenEventIds(), set()
        for batch in batches:
            assert seen.contains_many(batch).tolist() == [k in model for k in batch]
            assert all((k in seen) == (k in model) for k in batch)
            seen.update(batch)
            model.update(batch)
        seen.compact()
        probe = [k for b in batches for k in b] + [("a", "zz"), ("zz", "a")]
        assert seen.contains_many(probe).tolist() == [k in model for k in probe]
    finally:
        records.SeenEventIds.COMPACT_MIN = saved
