import random

import numpy as np

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
