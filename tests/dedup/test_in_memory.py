"""The in-memory event-id index (``dedup/in_memory.py``): an exact set of a day's
``(user code, event id)`` pairs at scale and under colliding keys, keyed as the batch path keys
them. The index contract every tier runs is ``tests/dedup/test_index.py``."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.dedup import in_memory


def test_seen_event_ids_at_scale_through_filter_rebuilds():
    """200,000 pairs in batches, 5% of them repeating a pair of an earlier batch: exactly a
    set's answers while the runs merge and the Bloom filter is rebuilt bigger many times (a
    key whose bit were lost would let a repeated event count twice)."""
    rng = np.random.default_rng(7)
    seen, model = in_memory.SeenEventIds(), set()
    held: list[tuple[int, str]] = []
    for b in range(20):
        fresh = [(int(u), f"e{b}-{i}") for i, u in enumerate(rng.integers(0, 5000, 10_000))]
        again = [held[int(j)] for j in rng.integers(0, len(held), 500)] if held else []
        batch = fresh + again
        expected = [k not in model for k in batch]
        for k in batch:
            model.add(k)
        users = np.array([u for u, _ in batch], np.int64)
        assert seen.insert(users, [e for _, e in batch]).tolist() == expected
        held += fresh
    assert len(seen) == len(model) == 200_000
    assert seen._filter.nbytes * 8 >= seen.FILTER_BITS * len(seen)
    probe = [*held[::97], (1, "absent"), (4999, "e0-0x")]
    assert [k in seen for k in probe] == [k in model for k in probe]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 3), st.text(max_size=3)), max_size=8),
        max_size=8,
    ),
    st.booleans(),
    st.integers(1, 4),
)
def test_seen_event_ids_is_a_set(batches, colliding, pending_max):
    """Batches (``insert``) and single pairs (``add``) alike: membership is exactly a Python
    set's, including when every key collides with others (keys cut to 2 bits)."""
    saved_keys, saved_max = in_memory._pair_keys, in_memory.SeenEventIds.PENDING_MAX
    saved_key = in_memory._pair_key
    if colliding:
        in_memory._pair_keys = lambda users, ids: saved_keys(users, ids) & 3
        in_memory._pair_key = lambda user, event_id: saved_key(user, event_id) & 3
    in_memory.SeenEventIds.PENDING_MAX = pending_max
    try:
        seen, model = in_memory.SeenEventIds(), set()
        for b, batch in enumerate(batches):
            assert [k in seen for k in batch] == [k in model for k in batch]
            if b % 3 == 2:  # one pair at a time
                for k in batch:
                    if k not in seen:
                        seen.add(k)
                    model.add(k)
                continue
            expected = []
            for k in batch:
                expected.append(k not in model)
                model.add(k)
            users = np.array([u for u, _ in batch], np.int64)
            assert seen.insert(users, [e for _, e in batch]).tolist() == expected
        assert len(seen) == len(model)
        probe = [k for b in batches for k in b] + [(0, "zz"), (9, "")]
        assert [k in seen for k in probe] == [k in model for k in probe]
    finally:
        in_memory._pair_keys, in_memory.SeenEventIds.PENDING_MAX = saved_keys, saved_max
        in_memory._pair_key = saved_key


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**31 - 1), st.text(max_size=12))
def test_one_pairs_key_is_the_batch_key(user, event_id):
    """The per-event look-up keys a pair in Python ints exactly as the batch path does."""
    from streamfilter.dedup.index import pair_key, pair_keys

    assert pair_key(user, event_id) == int(pair_keys(np.array([user], np.int32), [event_id])[0])
