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

__all__ = ["DEFAULT_MIN_DAYS", "QueryCost", "affordability_warning", "overlaps", "query_cost"]

#: a query a user can afford at full norm on fewer days than this is warned about
DEFAULT_MIN_DAYS = 7


@dataclass(frozen=True)
class QueryCost:
    query_id: str
    clip: float
    cost: float  # clip² in data units², as charged (floor(clip²/γ²)·γ²)
    full_days: int  # floor(B_norm / cost): full-norm days a fresh user can afford

    def as_dict(self) -> dict[str, object]:
        return {
            "query_id": self.query_id,
            "clip": self.clip,
            "cost_full_contribution": self.cost,
            "full_days_affordable": self.full_days,
        }


def query_cost(query: AnyQuery, params: PrivacyParams) -> QueryCost:
    units = params.lattice.max_cost_units(query.clip)
    days = params.budget_units // units if units else params.budget_units
    return QueryCost(query.query_id, query.clip, units * params.granularity**2, int(days))


def affordability_warning(
    cost: QueryCost, params: PrivacyParams, min_days: int = DEFAULT_MIN_DAYS
) -> str | None:
    """The warning for one query, naming the numbers (None when it is affordable)."""
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
