"""The private active-set estimate (Feldman & Zrnic §5; docs/design.md §2 "Stopping and telemetry").

The exact number of users still in the analysis is a count over users: publishing it leaks. This
module keeps a *noisy* count instead, by continual counting over the days: a user **leaves** the
active set on the first day after which

    retired   or   remaining budget (B − spent) < ``min_remaining``   (data units²)

holds. Both conditions are monotone (spent only grows, retirement is final, ``min_remaining`` is
fixed for the run), so every user leaves at most once and adds 1 to the count of exactly one day.
Whether a user has left depends only on that user's own ledger entry (their data and the
published query schedule), never on other users. The counts of users leaving each day feed a
:class:`~streamfilter.privacy.continual.BinaryTreeCounter`; each day releases the noisy
*cumulative* number of departures since the tracker started, as the release ``_active_set``
(labels ``["departed_cumulative"]``, granularity 1). Its cost ``ρ = L/(2s²)`` is charged to the
separate telemetry budget once, when the tracker is created; it composes with the run's ρ (a
user's total guarantee is the sum of the two, zCDP composition).

The exact count of the day exists only inside :meth:`ActiveSetTracker.step`, where it is added to
the counter and dropped; the returned tracker state holds the counter's exact partial sums
(sensitive, like the ledger; stored, never published). After ``horizon_days`` steps the tracker
releases nothing more (a data-independent schedule).
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from streamfilter.engine.contract import Release
from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.queries import RESERVED_QUERY_ID
from streamfilter.privacy.continual import BinaryTreeCounter, CounterState
from streamfilter.privacy.noise import RandomBits

__all__ = [
    "ACTIVE_SET_LABEL",
    "ACTIVE_SET_MECHANISM",
    "ACTIVE_SET_QUERY_ID",
    "ActiveSetSpec",
    "ActiveSetTracker",
    "departures",
    "left_active_set",
]

ACTIVE_SET_QUERY_ID = RESERVED_QUERY_ID  # "_active_set": the query book refuses it
ACTIVE_SET_LABEL = "departed_cumulative"
ACTIVE_SET_MECHANISM = "binary_tree_discrete_gaussian"


@dataclass(frozen=True)
class ActiveSetSpec:
    """Configuration of the estimate: telemetry ``rho`` for the whole horizon, the horizon in
    days, and ``min_remaining`` (data units², ``0 < min_remaining <= b_norm``): a user whose
    remaining budget falls below it counts as having left (1.0 = one full contribution of a
    ``clip = 1`` query)."""

    rho: float
    horizon_days: int = 1024
    min_remaining: float = 1.0


def left_active_set(
    spent_units: np.ndarray, retired: np.ndarray, budget_units: int, min_remaining_units: int
) -> np.ndarray:
    """Per user: has left the active set (``retired`` or ``B − spent < min_remaining``).

    Exact int64 comparison in lattice units.
    """
    spent = np.asarray(spent_units, dtype=np.int64)
    return np.asarray(retired, dtype=bool) | (budget_units - spent < min_remaining_units)


def departures(
    spent_before: np.ndarray,
    retired_before: np.ndarray,
    spent_after: np.ndarray,
    retired_after: np.ndarray,
    budget_units: int,
    min_remaining_units: int,
) -> int:
    """Number of users who left the active set during one day (SENSITIVE: an exact count).

    Arrays are per user, before and after the day (users without a record that day cannot
    change, so the day's users suffice). Monotonicity makes each user count at most once.
    """
    before = left_active_set(spent_before, retired_before, budget_units, min_remaining_units)
    after = left_active_set(spent_after, retired_after, budget_units, min_remaining_units)
    if (before & ~after).any():
        raise ValueError("a user re-entered the active set: the ledger went backwards")
    return int((after & ~before).sum())


def _min_remaining_units(min_remaining: float, params: PrivacyParams) -> int:
    """``ceil(min_remaining/γ²)``: ``remaining·γ² < min_remaining`` iff ``remaining < this``."""
    if isinstance(min_remaining, bool) or not isinstance(min_remaining, numbers.Real):
        raise ValueError(
            f"min_remaining must be a real number, got min_remaining={min_remaining!r}"
        )
    value = float(min_remaining)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(
            f"min_remaining must be finite and > 0, got min_remaining={min_remaining!r}"
        )
    units = math.ceil(Fraction(value) / Fraction(params.granularity) ** 2)
    if units > params.budget_units:
        raise ValueError(
            f"min_remaining={min_remaining!r} exceeds the per-user budget b_norm={params.b_norm!r}: "
            "every user would count as having left"
        )
    return units


@dataclass(frozen=True)
class ActiveSetTracker:
    """Immutable: the counter description, the departure threshold and the counter state."""

    counter: BinaryTreeCounter
    min_remaining_units: int
    state: CounterState

    @classmethod
    def create(cls, spec: ActiveSetSpec, params: PrivacyParams) -> ActiveSetTracker:
        counter = BinaryTreeCounter.for_rho(spec.horizon_days, spec.rho)
        units = _min_remaining_units(spec.min_remaining, params)
        return cls(counter=counter, min_remaining_units=units, state=counter.initial_state())

    @property
    def rho(self) -> float:
        """zCDP of the whole estimate over its horizon (``L/(2s²)``, rounded up)."""
        return self.counter.rho

    @property
    def exhausted(self) -> bool:
        return self.state.t >= self.counter.horizon

    def description(self) -> dict[str, int]:
        """What must not change while the tracker runs (checked against the configuration)."""
        return {**self.counter.to_json_dict(), "min_remaining_units": self.min_remaining_units}

    def step(
        self,
        day: str,
        spent_before: np.ndarray,
        retired_before: np.ndarray,
        spent_after: np.ndarray,
        retired_after: np.ndarray,
        budget_units: int,
        bits: RandomBits,
    ) -> tuple[Release | None, ActiveSetTracker]:
        """Count the day's departures into the counter; return the release and the new tracker.

        Nothing is mutated. After the horizon: ``(None, self)``.
        """
        if self.exhausted:
            return None, self
        left = departures(
            spent_before,
            retired_before,
            spent_after,
            retired_after,
            budget_units,
            self.min_remaining_units,
        )
        result = self.counter.step(self.state, left, bits)
        t = result.state.t
        release = Release(
            day=day,
            query_id=ACTIVE_SET_QUERY_ID,
            labels=[ACTIVE_SET_LABEL],
            value=[float(result.value)],
            sigma=self.counter.sigma(t),
            ci95=[float(self.counter.halfwidth(t))],
            mechanism=ACTIVE_SET_MECHANISM,
            granularity=1.0,
        )
        return release, ActiveSetTracker(self.counter, self.min_remaining_units, result.state)

    # -- persistence (the state is sensitive: store it, never publish it) ----------------------
    def to_json(self) -> str:
        return json.dumps(
            {"description": self.description(), "state": json.loads(self.state.to_json())},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> ActiveSetTracker:
        obj: Any = json.loads(text)
        desc = obj["description"]
        counter = BinaryTreeCounter(horizon=desc["horizon"], sigma2_units=desc["sigma2_units"])
        state = CounterState.from_json(json.dumps(obj["state"]))
        counter.check_state(state)
        units = desc["min_remaining_units"]
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise ValueError("min_remaining_units must be a positive integer")
        return cls(counter=counter, min_remaining_units=units, state=state)
