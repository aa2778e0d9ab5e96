"""What a query costs a user, and how long a user can afford it: no unanswerable query unnoticed.

Pure arithmetic on public settings — the clip, ``B_norm``, the lattice — never on data. A user
who contributes a full-norm vector (‖r‖ = clip) to a query pays ``clip²`` of ``B_norm`` per day
(exactly ``floor(clip²/γ²)`` lattice units, :func:`~streamfilter.privacy.lattice.max_cost_units`),
so ``floor(B_norm/clip²)`` such days exhaust them. Two warnings follow (``run``, ``Monitor`` and
``streamfilter check`` show them; the query is still registered: a small-valued user can still
be answered by it):

* ``clip² > B_norm`` under ``skip``/``retire``: no user's full contribution can ever be admitted;
  only users whose vectors are small stay in the answer (under ``retire`` a refusal retires them);
* fewer than ``min_days`` full days: a user active every day leaves the active set that fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.queries import AnyQuery
from streamfilter.privacy.quotas import AnalystQuotas

__all__ = [
    "DEFAULT_MIN_DAYS",
    "AnalystCost",
    "QueryCost",
    "affordability_warning",
    "analyst_costs",
    "overlaps",
    "query_cost",
]

#: a query a user can afford at full norm on fewer days than this is warned about
DEFAULT_MIN_DAYS = 7


@dataclass(frozen=True)
class QueryCost:
    query_id: str
    clip: float
    cost: float  # clip² in data units², as charged (floor(clip²/γ²)·γ²)
    full_days: int  # floor(budget / cost): full-norm days a fresh user can afford
    #: with analysts declared, the query's analyst and its per-user sub-budget (data units²)
    analyst: str | None = None
    sub_budget: float | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "query_id": self.query_id,
            "clip": self.clip,
            "cost_full_contribution": self.cost,
            "full_days_affordable": self.full_days,
        }
        if self.analyst is not None:
            out["analyst"] = self.analyst
        return out


def query_cost(
    query: AnyQuery, params: PrivacyParams, quotas: AnalystQuotas | None = None
) -> QueryCost:
    """The query's full cost and the full days a fresh user affords: of ``B``, or with analysts
    declared of the query's analyst's sub-budget ``floor(share·B)`` (docs/design.md §2.13)."""
    units = params.lattice.max_cost_units(query.clip)
    gamma2 = params.granularity**2
    if quotas is None or not quotas.active:
        days = params.budget_units // units if units else params.budget_units
        return QueryCost(query.query_id, query.clip, units * gamma2, int(days))
    analyst = quotas.owner(query.analyst)
    own = quotas.sub_budget_units[analyst]
    days = own // units if units else own
    return QueryCost(query.query_id, query.clip, units * gamma2, int(days), analyst, own * gamma2)


@dataclass(frozen=True)
class AnalystCost:
    """One analyst's quota and what a user active in all of its queries pays a day."""

    analyst: str
    share: float
    sub_budget: float  # floor(share·B)·γ², data units²
    queries: tuple[str, ...]
    cost: float  # Σ of its queries' full costs, data units²
    full_days: int  # floor(sub-budget / cost) (the sub-budget's units when it has no query)

    def as_dict(self) -> dict[str, object]:
        return {
            "analyst": self.analyst,
            "share": self.share,
            "sub_budget": self.sub_budget,
            "queries": list(self.queries),
            "cost_full_contribution": self.cost,
            "full_days_affordable": self.full_days,
        }


def analyst_costs(
    queries: Sequence[AnyQuery], params: PrivacyParams, quotas: AnalystQuotas
) -> list[AnalystCost]:
    """Per analyst (name order): the cost of one full contribution to each of its queries and
    the full days a fresh user's sub-budget affords (exact lattice units)."""
    out = []
    gamma2 = params.granularity**2
    for name in quotas.analysts:
        own = [q for q in queries if quotas.owner(q.analyst) == name]
        units = sum(params.lattice.max_cost_units(q.clip) for q in own)
        budget = quotas.sub_budget_units[name]
        days = budget // units if units else budget
        out.append(
            AnalystCost(
                name,
                float(quotas.shares[name]),
                budget * gamma2,
                tuple(q.query_id for q in own),
                units * gamma2,
                int(days),
            )
        )
    return out


def affordability_warning(
    cost: QueryCost, params: PrivacyParams, min_days: int = DEFAULT_MIN_DAYS
) -> str | None:
    """The warning for one query, naming the numbers (None when it is affordable)."""
    if cost.analyst is not None and cost.sub_budget is not None:
        if cost.full_days == 0 and str(params.exhaustion) != "clip":
            return (
                f"query {cost.query_id}: clip² = {cost.cost:g} exceeds analyst "
                f"{cost.analyst}'s sub-budget {cost.sub_budget:g} (of b_norm = "
                f"{params.b_norm:g}); no user's full contribution can ever be admitted — lower "
                "the clip or raise the analyst's share"
            )
        if cost.full_days < min_days:
            return (
                f"query {cost.query_id}: one full contribution costs clip² = {cost.cost:g} of "
                f"analyst {cost.analyst}'s sub-budget {cost.sub_budget:g}, so a user active every "
                f"day is exhausted for it after {cost.full_days} day(s) (fewer than {min_days}); "
                "lower the clip or raise the analyst's share"
            )
        return None
    if cost.full_days == 0 and str(params.exhaustion) != "clip":
        return (
            f"query {cost.query_id}: clip² = {cost.cost:g} exceeds b_norm = {params.b_norm:g}; "
            f"no user's full contribution can ever be admitted (exhaustion "
            f"{params.exhaustion}): only users whose vectors have norm ≤ {params.b_norm**0.5:g} "
            "are answered — lower the clip or raise b_norm"
        )
    if cost.full_days < min_days:
        return (
            f"query {cost.query_id}: one full contribution costs clip² = {cost.cost:g} of "
            f"b_norm = {params.b_norm:g}, so a user active every day is exhausted after "
            f"{cost.full_days} day(s) (fewer than {min_days}); lower the clip or raise b_norm"
        )
    return None


def overlaps(queries: Sequence[AnyQuery]) -> list[tuple[str, str, list[str]]]:
    """Pairs of queries that read a common coordinate (a user active in both pays both)."""
    out = []
    for a, b in combinations(queries, 2):
        common = sorted(set(a.coordinates()) & set(b.coordinates()))
        if common:
            out.append((a.query_id, b.query_id, common))
    return out
