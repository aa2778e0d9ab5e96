"""Per-analyst sub-budgets in exact lattice units (streamfilter/privacy/quotas.py)."""

from fractions import Fraction

import numpy as np
import pytest

from streamfilter.privacy.quotas import (
    DEFAULT_ANALYST,
    AnalystQuotas,
    analyst_key,
    analyst_keys,
    split_budgets,
)


@pytest.mark.parametrize("budget", [1, 7, 10, 999, 2**20 * 3 + 1, 2**61])
def test_sub_budgets_are_floors_and_never_exceed_the_budget(budget):
    quotas = AnalystQuotas.from_shares({"a": 0.3, "b": 0.45}, budget)
    assert quotas.sub_budget_units["a"] == (3 * budget) // 10  # exact, never above 0.3·B
    assert quotas.sub_budget_units["b"] == (45 * budget) // 100
    assert sum(quotas.sub_budget_units.values()) == budget  # the default gets the rest
    assert quotas.shares[DEFAULT_ANALYST] == Fraction(1, 4)


def test_a_declared_default_share_is_floored_like_the_others():
    quotas = AnalystQuotas.from_shares({"a": 0.5, "default": 0.25}, 101)
    assert quotas.sub_budget_units == {"a": 50, "default": 25}
    assert quotas.named == ("a",) and quotas.analysts == ("a", "default")


def test_oversubscription_and_bad_shares_are_refused():
    with pytest.raises(ValueError, match=r"sum to 1\.2 > 1"):
        AnalystQuotas.from_shares({"a": 0.6, "b": 0.6}, 100)
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="must be in"):
            AnalystQuotas.from_shares({"a": bad}, 100)
    with pytest.raises(ValueError, match="must be a number"):
        AnalystQuotas.from_shares({"a": True}, 100)


def test_remaining_is_the_smaller_remainder_never_negative():
    quotas = AnalystQuotas.from_shares({"a": 0.5}, 100)
    spent = np.array([0, 40, 90, 100, 30])
    own = np.array([0, 40, 0, 0, 30])
    assert quotas.remaining_units("a", spent, own).tolist() == [50, 10, 10, 0, 20]
    default_spent = quotas.default_spent(spent, [own])
    assert default_spent.tolist() == [0, 0, 90, 100, 0]
    # a state from before analysts: the default's spend may exceed its sub-budget (50)
    assert quotas.remaining_units("default", spent, default_spent).tolist() == [50, 50, 0, 0, 50]
    with pytest.raises(ValueError, match="corrupt"):
        quotas.default_spent(np.array([5]), [np.array([6])])


def test_undeclared_analysts_are_refused_and_none_is_the_default():
    quotas = AnalystQuotas.from_shares({"a": 0.5}, 100)
    assert quotas.owner(None) == DEFAULT_ANALYST and quotas.owner("a") == "a"
    with pytest.raises(ValueError, match="'b' is not declared"):
        quotas.owner("b")
    assert not AnalystQuotas.single(100).active and quotas.active


def test_analyst_entries_split_from_the_users_own():
    keys = analyst_keys("a", np.array(["u1", "u\u00e9"], dtype=object))
    assert keys.tolist() == [analyst_key("a", "u1"), analyst_key("a", "u\u00e9")]
    stored = [("u1", 9, False), (keys[0], 4, True), ("u\u00e9", 3, False), (keys[1], 1, False)]
    plain, named = split_budgets(stored)
    assert plain == [("u1", 9, False), ("u\u00e9", 3, False)]
    assert named == {"a": [("u1", 4, True), ("u\u00e9", 1, False)]}
