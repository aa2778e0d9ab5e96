"""The compact ledger: exact per-user state whatever the hash function (collisions included)."""

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.engine.contract import parse_query
from streamfilter.engine.day import SeededPerRelease, close_day
from streamfilter.engine.ledger import BudgetLedger, KeyedUsers, UserKeys, python_hash
from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.records import DayRecords
from streamfilter.runtime.store import DayCommit, Position, SQLiteStateStore
from tests.support.native_build import check_built_in_ci


def weak_hash(users):
    """Collides on purpose: ids of equal length share a hash."""
    return np.array([len(u) % 3 for u in users], dtype=np.int64)


def constant_hash(users):
    return np.zeros(len(users), dtype=np.int64)


HASHERS = [python_hash, weak_hash, constant_hash]
IDS = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40
) | st.sampled_from(["a", "b", "ab", "ba", "a\x00", "\x00", "é", "e\u0301", "x" * 256, "😀" * 3])


#: days of (id, spent units, retired) changes, ids repeated within and across them
BATCHES = st.lists(
    st.lists(st.tuples(IDS, st.integers(0, 2**61), st.booleans()), max_size=30), max_size=6
)


def arr(users):
    return np.array(users, dtype=object)


@pytest.mark.parametrize("hasher", HASHERS, ids=lambda h: h.__name__)
def test_basic_state_apply_items(hasher):
    led = BudgetLedger(hasher)
    assert len(led) == 0 and led.state(arr(["a"]))[0].tolist() == [0]
    led.apply(arr(["b", "a", "long-user-id-é"]), np.array([5, 7, 9]), np.array([0, 1, 0], bool))
    spent, retired = led.state(arr(["a", "zz", "b", "long-user-id-é", "c"]))
    assert spent.tolist() == [7, 0, 5, 9, 0]
    assert retired.tolist() == [True, False, False, False, False]
    led.apply(arr(["a", "c"]), np.array([8, 1]), np.array([1, 0], bool))
    assert led.spent_units("a") == 8 and led.retired("a") and led.spent_units("c") == 1
    assert led.spent_units("nobody") == 0 and not led.retired("nobody")
    assert sorted(led.items()) == [
        ("a", 8, True),
        ("b", 5, False),
        ("c", 1, False),
        ("long-user-id-é", 9, False),
    ]
    assert len(led) == 4 and led.max_spent_units() == 9


@pytest.mark.parametrize("hasher", [weak_hash, constant_hash], ids=lambda h: h.__name__)
def test_colliding_users_never_share_a_budget(hasher):
    """Equal hashes, different ids: each keeps its own budget; an unknown one has none."""
    led = BudgetLedger(hasher)
    assert hasher(arr(["aa", "bb", "cc"])).tolist() == [hasher(arr(["aa"]))[0]] * 3
    led.apply(arr(["aa"]), np.array([100]), np.array([True]))  # exhausted and retired
    spent, retired = led.state(arr(["bb", "aa", "cc"]))
    assert spent.tolist() == [0, 100, 0] and retired.tolist() == [False, True, False]
    led.apply(arr(["bb"]), np.array([3]), np.array([False]))
    led.apply(arr(["cc", "aa"]), np.array([4, 101]), np.array([False, True]))
    assert led.state(arr(["cc", "bb", "aa", "dd"]))[0].tolist() == [4, 3, 101, 0]
    assert len(led) == 3
    assert sorted(led.items()) == [("aa", 101, True), ("bb", 3, False), ("cc", 4, False)]


def test_ids_differing_only_after_a_shared_prefix_or_by_trailing_nul():
    led = BudgetLedger(constant_hash)
    ids = ["", "\x00", "a", "a\x00", "a" * 8, "a" * 8 + "\x00", "a" * 9, "a" * 7 + "b" + "a"]
    led.apply(arr(ids), np.arange(1, len(ids) + 1), np.zeros(len(ids), bool))
    assert led.state(arr(ids[::-1]))[0].tolist() == list(range(len(ids), 0, -1))
    assert led.state(arr(["\x00\x00", "a" * 10, "b"]))[0].tolist() == [0, 0, 0]


def test_a_user_listed_twice_gets_its_last_state():
    for hasher in HASHERS:
        led = BudgetLedger(hasher)
        led.apply(arr(["a", "b", "a"]), np.array([1, 2, 3]), np.zeros(3, bool))
        assert sorted(led.items()) == [("a", 3, False), ("b", 2, False)]
        led.apply(arr(["b", "b"]), np.array([5, 6]), np.zeros(2, bool))
        assert sorted(led.items()) == [("a", 3, False), ("b", 6, False)]


@settings(max_examples=60, deadline=None)
@given(batches=BATCHES, queries=st.lists(IDS, max_size=30), hasher=st.sampled_from(HASHERS))
def test_matches_a_dict(batches, queries, hasher):
    led, model = BudgetLedger(hasher), {}
    for batch in batches:
        users = [u for u, _, _ in batch]
        led.apply(
            arr(users),
            np.array([s for _, s, _ in batch], np.int64),
            np.array([r for _, _, r in batch], bool),
        )
        model.update({u: (s, r) for u, s, r in batch})
        probe = queries + users
        spent, retired = led.state(arr(probe))
        assert spent.tolist() == [model.get(u, (0, False))[0] for u in probe]
        assert retired.tolist() == [model.get(u, (0, False))[1] for u in probe]
    assert sorted(led.items()) == sorted((u, s, r) for u, (s, r) in model.items())
    assert len(led) == len(model)


def test_given_keys_and_unsorted_input():
    led = BudgetLedger()
    users = arr([f"user-{i}" for i in range(1000)])
    led.apply(users[::-1], np.arange(1000)[::-1], np.zeros(1000, bool))
    assert led.state(users, UserKeys.of(users, python_hash))[0].tolist() == list(range(1000))
    # keys under another hasher are not used
    assert led.state(users, UserKeys.of(users, weak_hash))[0].tolist() == list(range(1000))
    with pytest.raises(ValueError, match="one key per user"):
        led.state(users, UserKeys.of(users[:3], python_hash))
    keyed = KeyedUsers.wrap(users[:10], UserKeys.of(users[:10], python_hash))
    assert not keyed.flags.writeable and keyed.keys is not None and keyed[2:].keys is None
    led.apply(keyed, np.full(10, 7), np.ones(10, bool))
    assert led.state(users[:12])[0].tolist() == [7] * 10 + [10, 11]


@settings(max_examples=150, deadline=None)
@given(users=st.lists(IDS, max_size=30), picks=st.lists(st.integers(0, 29), max_size=30))
def test_the_budget_log_row_of_keyed_users_is_the_row_of_their_ids(users, picks):
    """``PackedBudgets.of`` reuses the engine's UTF-8 of a ``KeyedUsers`` (``UserKeys.utf8``,
    subsets taken with ``take`` included): the same bytes as encoding the ids afresh."""
    from streamfilter.runtime.store.schema import PackedBudgets

    keys = UserKeys.of(arr(users), python_hash)
    idx = np.array([p for p in picks if p < len(users)], dtype=np.int64)
    for ids, k in ((arr(users), keys), (arr(users)[idx], keys.take(idx))):
        spent, retired = np.arange(len(ids)), np.zeros(len(ids), bool)
        keyed = PackedBudgets.of(KeyedUsers.wrap(ids, k), spent, retired)
        assert keyed == PackedBudgets.of(np.array(ids.tolist(), dtype=object), spent, retired)
        assert keyed.ids == "".join(ids.tolist()).encode("utf-8", "surrogatepass")


def test_keyed_utf8_in_several_steps(monkeypatch):
    import streamfilter.engine.ledger as ledger

    ids = arr(["a", "", "é" * 9, "user-12345678901", "😀", "x" * 300, "b\x00", "c"])
    whole = UserKeys.of(ids, python_hash).utf8()
    monkeypatch.setattr(ledger, "_UTF8_CHUNK_IDS", 3)
    steps = UserKeys.of(ids, python_hash).utf8()
    assert steps[0] == whole[0] == "".join(ids.tolist()).encode()
    assert steps[1].tolist() == whole[1].tolist() == [len(u.encode()) for u in ids]


def test_memory_is_compact():
    led = BudgetLedger()
    n = 20_000
    led.apply(arr([f"u-{i:07d}" for i in range(n)]), np.ones(n, np.int64), np.zeros(n, bool))
    # key 8 + spent 8 + retired 1 + length 2 + offset 8 + 9-byte id in two words 16
    assert led.nbytes == 43 * n


# -- records and the day close ----------------------------------------------------------------


def test_records_split_colliding_ids_and_order_them_by_id():
    users = arr(["bb", "aa", "cc", "aa", "bb", "x", "zz"])
    coords = arr(["v", "v", "v", "v", "w", "v", "v"])
    values = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    rec = DayRecords.from_columns("2026-01-05", users, coords, values, hasher=weak_hash)
    # hash 1 (length 1): x; hash 2 (length 2): aa, bb, cc, zz by id
    assert rec.users.tolist() == ["x", "aa", "bb", "cc", "zz"]
    assert rec.user_hash.tolist() == [1, 2, 2, 2, 2]
    assert rec.matrix(["v", "w"]).tolist() == [[6, 0], [6, 0], [1, 5], [3, 0], [7, 0]]


def test_records_canonical_whatever_the_arrival_order_and_str_objects():
    rng = np.random.default_rng(1)
    base = [(f"u{i % 50}", f"c{i % 7}", float(rng.normal())) for i in range(600)]
    out = []
    for hasher in (python_hash, weak_hash):
        for k in range(3):
            cells = [base[j] for j in rng.permutation(len(base))] if k else base
            # fresh, equal but not identical str objects for some cells
            users = arr([u if j % 2 else "".join(list(u)) for j, (u, _, _) in enumerate(cells)])
            rec = DayRecords.from_columns(
                "2026-01-05",
                users,
                arr([c for _, c, _ in cells]),
                np.array([v for _, _, v in cells]),
                hasher=hasher,
            )
            assert len(rec.users) == 50
            m = rec.matrix([f"c{j}" for j in range(7)])
            out.append(dict(zip(rec.users.tolist(), map(tuple, m.tolist()), strict=True)))
            hs = rec.user_hash
            assert (hs[1:] >= hs[:-1]).all() and hs.tolist() == hasher(rec.users).tolist()
    assert all(o == out[0] for o in out)  # bit-identical sums


def _day(users, day="2026-01-05"):
    n = len(users)
    return (
        arr(list(users) * 2),
        arr(["active"] * n + ["minutes"] * n),
        np.r_[np.ones(n), np.linspace(0, 50, n)],
    )


PARAMS = PrivacyParams.create(b_norm=2.0, rho=0.5, granularity=2.0**-8)
QUERIES = [
    parse_query(
        {
            "query_id": "mix",
            "kind": "linear",
            "weights": {"active": [1, 0], "minutes": [0, 0.05]},
            "clip": 1.0,
            "from_day": "2026-01-01",
        }
    ),
    parse_query(
        {
            "query_id": "a",
            "kind": "sum",
            "features": ["active"],
            "clip": 1.0,
            "from_day": "2026-01-01",
        }
    ),
]


def _run_days(hasher, records_hasher, days=4):
    led = BudgetLedger(hasher)
    releases = []
    users = [f"user-{i}" for i in range(60)] + ["aa", "bb", "ab", "é", "x" * 30]
    rng = np.random.default_rng(3)
    for d in range(days):
        day = f"2026-01-0{d + 5}"
        present = [u for u in users if rng.random() < 0.7]
        rec = DayRecords.from_columns(day, *_day(present), hasher=records_hasher)
        out = close_day(rec, QUERIES, led, PARAMS, SeededPerRelease(11))
        led.apply(out.changed_users, out.spent_units, out.retired)
        releases.append([r.to_json() for r in out.releases])
    return releases, sorted(led.items())


def test_day_close_is_the_same_under_a_colliding_hash():
    reference = _run_days(python_hash, python_hash)
    assert _run_days(weak_hash, weak_hash) == reference
    assert _run_days(constant_hash, constant_hash) == reference
    assert _run_days(weak_hash, python_hash) == reference  # ledger rehashes the day's users


def test_state_store_round_trip(tmp_path):
    """Budgets written per day by the store rebuild the same ledger (as the daemon does)."""
    led = BudgetLedger()
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        users = [f"user-{i}" for i in range(200)] + ["é-ü", "a\x00b"]
        rng = np.random.default_rng(5)
        for d in range(3):
            day = f"2026-01-0{d + 5}"
            present = [u for u in users if rng.random() < 0.6]
            rec = DayRecords.from_columns(day, *_day(present))
            out = close_day(rec, QUERIES, led, PARAMS, SeededPerRelease(2))
            store.commit_day(
                DayCommit(
                    day=day,
                    releases=[(r.query_id, r.to_json().encode()) for r in out.releases],
                    changed_users=out.changed_users,
                    spent_units=out.spent_units,
                    retired=out.retired,
                    positions={"p0": Position(d, d)},
                )
            )
            led.apply(out.changed_users, out.spent_units, out.retired)
        budgets = store.load().budgets
    finally:
        store.close()
    rebuilt = BudgetLedger(weak_hash)
    names, spent, retired = zip(*budgets, strict=True)
    rebuilt.apply(arr(names), np.array(spent, np.int64), np.array(retired, bool))
    assert sorted(rebuilt.items()) == sorted(led.items()) == sorted(budgets)
    assert len(led) > 150


def test_located_users_are_committed_without_a_second_lookup_only_while_current():
    led = BudgetLedger(weak_hash)
    led.apply(arr(["aa", "b"]), np.array([1, 2]), np.zeros(2, bool))
    users = arr(["bb", "aa", "c"])
    keys = led.keys_of(users)
    located = led.locate(users, keys)
    assert located.entries[0] == -1 and located.entries[1] >= 0
    assert led.state_at(located)[0].tolist() == [0, 1, 0]
    keyed = KeyedUsers.wrap(users, keys, located)
    led.apply(keyed, np.array([5, 6, 7]), np.zeros(3, bool))
    assert sorted(led.items()) == [
        ("aa", 6, False),
        ("b", 2, False),
        ("bb", 5, False),
        ("c", 7, False),
    ]
    with pytest.raises(ValueError, match="changed since"):
        led.state_at(located)
    # a stale location is not trusted: the users are looked up again
    led.apply(keyed, np.array([8, 9, 10]), np.zeros(3, bool))
    assert sorted(led.items()) == [
        ("aa", 9, False),
        ("b", 2, False),
        ("bb", 8, False),
        ("c", 10, False),
    ]
    other = copy.deepcopy(led)
    with pytest.raises(ValueError, match="changed since"):
        other.state_at(led.locate(users))


def test_blocks_of_users_change_nothing(monkeypatch):
    """The day close runs on blocks of users: any block size gives the same day."""
    import streamfilter.engine.day as day_module

    def outcome():
        led = BudgetLedger()
        users = [f"user-{i}" for i in range(300)]
        rec = DayRecords.from_columns("2026-01-05", *_day(users))
        led.apply(rec.users[::3], np.full(100, PARAMS.budget_units - 70_000), np.zeros(100, bool))
        out = close_day(rec, QUERIES, led, PARAMS, SeededPerRelease(4))
        return (
            [r.to_json() for r in out.releases],
            sorted(zip(out.changed_users.tolist(), out.spent_units.tolist(), strict=True)),
            out.exact_stats,
        )

    reference = outcome()
    for block in (1, 7, 64):
        monkeypatch.setattr(day_module, "BLOCK_USERS", block)
        assert outcome() == reference


def test_matrix_of_a_range_of_users():
    users = arr(["c", "a", "b", "a", "d", "b"])
    coords = arr(["x", "y", "x", "x", "y", "y"])
    rec = DayRecords.from_columns("2026-01-05", users, coords, np.arange(1.0, 7.0))
    full = rec.matrix(["y", "x"])
    for order in ("C", "F"):
        assert np.array_equal(rec.matrix(["y", "x"], order=order), full)
        for a in range(5):
            for b in range(a, 5):
                part = rec.matrix(["y", "x"], order=order, rows=(a, b))
                assert np.array_equal(part, full[a:b])
    with pytest.raises(ValueError, match="out of range"):
        rec.matrix(["x"], rows=(2, 9))


def _numpy_path(call):
    """Run ``call`` with the ledger's native helpers hidden (its numpy path)."""
    from streamfilter.engine import ledger as ledger_module

    saved = ledger_module._packed_ids
    ledger_module._packed_ids = None
    try:
        return call()
    finally:
        ledger_module._packed_ids = saved


COLUMNS = ("_key", "_spent", "_retired", "_len", "_woff", "_words")


@settings(max_examples=120, deadline=None)
@given(batches=BATCHES, queries=st.lists(IDS, max_size=30), hasher=st.sampled_from(HASHERS))
def test_the_native_merge_walk_and_merge_are_the_numpy_path(batches, queries, hasher):
    """``_packed_ids.locate_sorted`` and ``merge_entries`` (engine/ledger.py's lookup and insert
    when built) give the numpy path's answers and columns bit for bit, colliding hashes and
    users listed twice included."""
    from streamfilter.engine import ledger as ledger_module

    check_built_in_ci(ledger_module._packed_ids, "engine/_packed_ids.c")
    native, numpy_ = BudgetLedger(hasher), BudgetLedger(hasher)
    for batch in batches:
        users = arr([u for u, _, _ in batch])
        spent = np.array([s for _, s, _ in batch], np.int64)
        retired = np.array([r for _, _, r in batch], bool)
        probe = arr(queries + list(users))
        located = native.locate(probe)
        want = _numpy_path(lambda: numpy_.locate(probe))  # noqa: B023
        assert np.array_equal(located.entries, want.entries)
        assert np.array_equal(located.slots, want.slots)
        native.apply(users, spent, retired)
        _numpy_path(lambda: numpy_.apply(users, spent, retired))  # noqa: B023
        for name in COLUMNS:
            a, b = getattr(native, name), getattr(numpy_, name)
            assert a.dtype == b.dtype and np.array_equal(a, b), name


def test_the_native_ledger_refuses_columns_that_do_not_fit():
    from streamfilter.engine import ledger as ledger_module

    helpers = ledger_module._packed_ids
    check_built_in_ci(helpers, "engine/_packed_ids.c")
    assert helpers is not None
    key, length = np.array([1, 2], np.int64), np.array([3, 3], np.uint16)
    woff, words = np.array([0, 1], np.int64), np.zeros(2, np.uint64)
    one = np.ones(1, np.int64)
    with pytest.raises(ValueError, match="not sorted"):
        helpers.locate_sorted(
            key,
            length,
            woff,
            words,
            np.array([2, 1]),
            one.repeat(2) * 3,
            np.zeros(2, np.int64),
            words,
        )
    with pytest.raises(ValueError, match="outside"):  # the entry's word past the words
        helpers.locate_sorted(
            key, length, np.array([0, 5], np.int64), words, 2 * one, 3 * one, 0 * one, words
        )
    with pytest.raises(ValueError, match="different lengths"):
        helpers.locate_sorted(key, length[:1], woff, words, one, one, one, words)
    ledger_columns = (key, key, np.zeros(2, bool), length, woff, words)
    new = (np.array([5], np.int64), one, np.zeros(1, bool))
    with pytest.raises(ValueError, match="65535"):
        helpers.merge_entries(*ledger_columns, *new, np.array([70_000]), 0 * one, words)
    with pytest.raises(ValueError, match="outside"):  # 2 words from word 1 of 2
        helpers.merge_entries(*ledger_columns, *new, np.array([9]), one, words)
    unsorted = (np.array([5, 4], np.int64), one.repeat(2), np.zeros(2, bool))
    with pytest.raises(ValueError, match="not sorted"):
        helpers.merge_entries(
            *ledger_columns, *unsorted, one.repeat(2), np.zeros(2, np.int64), words
        )


@settings(max_examples=150, deadline=None)
@given(batches=BATCHES, hasher=st.sampled_from(HASHERS))
def test_the_monotone_merge_is_the_join_of_the_records(batches, hasher):
    """``merge_monotone`` of records, in any order and with any repeats, gives per user the
    largest spend and retired if any record says so (a dict's join); merging a record of lower
    spends or revived users afterwards changes nothing."""
    want: dict[str, tuple[int, bool]] = {}
    for batch in batches:
        for u, s, r in batch:
            s0, r0 = want.get(u, (0, False))
            want[u] = (max(s0, s), r0 or r)
    for records in (batches, batches[::-1], [[e for b in batches for e in b]]):
        ledger = BudgetLedger(hasher)
        for batch in records:
            if batch:
                users, spent, retired = zip(*batch, strict=True)
                ledger.merge_monotone(arr(list(users)), np.array(spent), np.array(retired))
        assert {u: (s, r) for u, s, r in ledger.items()} == want
        if want:
            lower = list(want)
            ledger.merge_monotone(arr(lower), np.zeros(len(lower)), np.zeros(len(lower), bool))
            assert {u: (s, r) for u, s, r in ledger.items()} == want
