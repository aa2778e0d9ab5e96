"""Budgets read from a state with analysts (docs/design.md §2.13): ``budget-stats`` releases the
statistics of exactly the users' own entries — an analyst's entry is never counted as a user —
and, with ``--analyst``, of that analyst's spends against its sub-budget; ``budget --user``
splits a user's spend by analyst."""

import random

import pytest

from streamfilter.config import load_config
from streamfilter.errors import ConfigError
from streamfilter.privacy.budget_stats import BudgetStatsMechanism
from streamfilter.privacy.noise import SeededRandomBits
from streamfilter.runtime.notebook import PersistentMonitor
from streamfilter.runtime.user_budgets import budget_stats, user_budget

GAMMA = 2.0**-10
SHARES = {"growth": 0.3, "billing": 0.5}


@pytest.fixture
def state(tmp_path):
    """Six days of 50 users under two analysts and the default one, in a SQLite state."""
    path = tmp_path / "state.db"
    monitor = PersistentMonitor.open(
        path, 4.0, rho=0.5, granularity=GAMMA, test_seed=2, analysts=SHARES
    )
    for query_id, analyst, clip in (("g", "growth", 0.6), ("b", "billing", 0.9), ("d", None, 0.4)):
        query = {"query_id": query_id, "kind": "sum", "features": ["x"], "clip": clip}
        monitor.add_query(
            {**query, "from_day": "2026-01-01", **({"analyst": analyst} if analyst else {})}
        )
    rng = random.Random(3)
    for d in range(1, 7):
        day = f"2026-01-0{d}"
        events = [
            {"user_id": f"u{i}", "day": day, "values": {"x": rng.uniform(0, 1)}}
            for i in range(50)
            if rng.random() < 0.7
        ]
        monitor.close_day(day, events)
    engine = monitor.engine
    users = [u for u, _, _ in engine.ledger.items()]
    spends = {u: engine.analyst_spent_units(u) for u in users}
    global_spent = {u: engine.ledger.spent_units(u) for u in users}
    monitor.close()
    config = tmp_path / "c.toml"
    config.write_text(
        "[privacy]\nb_norm = 4.0\nrho = 0.5\ngranularity = 0.0009765625\n"
        f'[state]\npath = "{path}"\n[telemetry]\ncoverage = false\n'
        + "".join(f"[analysts.{a}]\nshare = {s}\n" for a, s in SHARES.items())
    )
    return load_config(config), spends, global_spent


def test_budget_stats_counts_each_user_once_and_per_analyst_their_sub_budget(state):
    settings, spends, global_spent = state
    quotas = settings.analyst_quotas()
    mechanism = BudgetStatsMechanism(rho=settings.telemetry.stats_rho)
    expected = mechanism.release(
        list(global_spent.values()), quotas.budget_units, SeededRandomBits(4)
    )
    out = budget_stats(settings, SeededRandomBits(4))
    assert out["users_noisy"] == expected.to_json_dict()["users_noisy"]
    assert out["mean_spent_fraction"] == expected.to_json_dict()["mean_spent_fraction"]
    for analyst in ("growth", "default"):
        own = [s[analyst] for s in spends.values()]
        assert max(own) > 0
        expected = mechanism.release(own, quotas.sub_budget_units[analyst], SeededRandomBits(5))
        out = budget_stats(settings, SeededRandomBits(5), analyst=analyst)
        assert out["analyst"] == analyst
        assert out["quantiles"] == expected.to_json_dict()["quantiles"]
        assert out["mean_spent_fraction"] == expected.to_json_dict()["mean_spent_fraction"]
    with pytest.raises(ConfigError, match="'ops' is not declared"):
        budget_stats(settings, SeededRandomBits(6), analyst="ops")


def test_budget_user_splits_the_spend_by_analyst(state):
    settings, spends, global_spent = state
    for user in ("u0", "u7"):
        out = user_budget(settings, user)
        by_analyst = {a: v["spent_units"] for a, v in out["analysts"].items()}
        assert by_analyst == spends[user]
        assert out["spent_units"] == global_spent[user] == sum(by_analyst.values())
        quotas = settings.analyst_quotas()
        for name, v in out["analysts"].items():
            assert v["remaining_units"] == min(
                quotas.budget_units - global_spent[user],
                quotas.sub_budget_units[name] - v["spent_units"],
            )
