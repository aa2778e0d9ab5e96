import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.dedup import in_memory
from streamfilter.engine import cell_table, records
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
    st.booleans(),
    st.booleans(),
)
def test_add_many_and_folding_are_add_one_by_one(items, batch, fold_often, by_schema, numpy_cells):
    """Batches (``add_many``: a batch of a few schemas one schema at a time, or every value on
    its own), per-event ``add`` and category folding at any point give the same records, bit
    for bit, and the same counts of events and duplicates — in the native cell table (when
    built) and in numpy's."""
    events = [ev(u, vals, eid) for u, vals, eid in items]
    one = DayAccumulator("2026-01-05", cells=cell_table.NumpyCells() if numpy_cells else None)
    added_one = [one.add(e) for e in events]
    saved, cell_table._FOLD_MIN = cell_table._FOLD_MIN, (1 if fold_often else 1 << 20)
    saved_ids = in_memory.SeenEventIds.PENDING_MAX
    saved_schemas = records._SCHEMAS_MAX
    in_memory.SeenEventIds.PENDING_MAX = 1 if fold_often else 1 << 12
    records._SCHEMAS_MAX = saved_schemas if by_schema else 1
    try:
        many = DayAccumulator("2026-01-05")
        steps = range(0, len(events), batch)
        added_many = sum(many.add_many(events[i : i + batch]) for i in steps)
    finally:
        cell_table._FOLD_MIN = saved
        in_memory.SeenEventIds.PENDING_MAX = saved_ids
        records._SCHEMAS_MAX = saved_schemas
    assert added_many == sum(added_one)
    assert (many.events, many.duplicates) == (one.events, one.duplicates)
    _records_equal(many.finish(), one.finish())


def test_categories_fold_into_cells():
    cells = cell_table.NumpyCells()
    acc = DayAccumulator("2026-01-05", cells=cells)
    for i in range(3000):
        acc.add_many([ev(f"u{i % 10}", {"c": "ab"[(i // 10) % 2]})])
        cells.fold_hits()
    assert len(cells._folded[1]) == 20 and cells._cat_buffered == 0
    rec = acc.finish()
    assert rec.matrix(["c=a", "c=b"]).sum() == 3000


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5), st.integers(0, 3), st.sampled_from([0.5, 1.0, 0.1, 1e16, -1e16, 3.0])
        ),
        max_size=40,
    ),
    st.booleans(),
)
def test_from_codes_is_from_columns(cells, collide):
    """Integer-coded cells give the records of the same cells decoded, bit for bit — users
    without a cell and unused coordinates left out, colliding hashes ordered by id."""
    users = ["u0", "é", "u2", "", "u4", "u5"]
    coords = ["x", "c=a", "", "b"]
    hasher = (lambda ids: np.zeros(len(ids), np.int64)) if collide else records.python_hash
    u = np.array([c[0] for c in cells], np.int64)
    k = np.array([c[1] for c in cells], np.int64)
    v = np.array([c[2] for c in cells], np.float64)
    coded = records.DayRecords.from_codes("2026-01-05", users, coords, u, k, v, hasher)
    decoded = records.DayRecords.from_columns(
        "2026-01-05",
        records._objects([users[i] for i in u.tolist()]),
        records._objects([coords[i] for i in k.tolist()]),
        v,
        hasher,
    )
    _records_equal(coded, decoded)
    assert np.array_equal(coded.user_hash, decoded.user_hash)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["u0", "u1", "u2", "u3"]),
            st.floats(-1e6, 1e6, allow_nan=False),
            st.sampled_from(["a", "b", "c"]),
            st.one_of(st.none(), st.sampled_from(["e1", "e2", "e3"])),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 9),
)
def test_add_columns_is_add_many(items, batch):
    """A batch decoded as columns adds what the same batch of events adds, bit for bit."""
    import json

    from streamfilter.engine.ingest import parse_columns, parse_events

    lines = []
    for user, x, c, eid in items:
        obj = {"user_id": user, "day": "2026-01-05", "values": {"x": x, "c": c}}
        if eid is not None:
            obj["event_id"] = eid
        lines.append(json.dumps(obj).encode())
    cols, many = DayAccumulator("2026-01-05"), DayAccumulator("2026-01-05")
    for i in range(0, len(lines), batch):
        columns = parse_columns(lines[i : i + batch])
        assert columns is not None
        assert cols.add_columns(columns) == many.add_many(parse_events(lines[i : i + batch]))
    assert (cols.events, cols.duplicates) == (many.events, many.duplicates)
    assert len(cols._users) == len(set(cols._users)) == len({u for u, *_ in items})  # one str each
    _records_equal(cols.finish(), many.finish())


def test_a_finished_day_gives_the_same_records_again_and_takes_no_more_events():
    acc = DayAccumulator("2026-01-05")
    acc.add_many([ev("a", {"x": 1.5, "c": "p"}, "e1"), ev("b", {"x": 2.0}, "e1")])
    first = acc.finish()
    _records_equal(acc.finish(), first)
    with pytest.raises(RuntimeError, match="finished"):
        acc.add(ev("c", {"x": 1.0}))
    with pytest.raises(RuntimeError, match="finished"):
        acc.add_many([ev("c", {"x": 1.0})])
