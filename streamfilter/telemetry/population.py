"""A population estimate with every release (docs/design.md §2.12).

With population on, each query's users follow the departure rule of
:mod:`streamfilter.privacy.departed`: a user whose remaining budget falls below two full
contributions gives their next vector to the query's *departed* counter instead of the release,
once, and leaves the query. The release then covers the live users and the departed counter
the users who left, so

    population(t) = release(t) + departed(t)

estimates the query's value over every user counted so far under one model (:data:`MODEL`).
Each departing vector is charged to its user's own filter (no extra ρ: the headline guarantee
is unchanged); the counters' noise comes from per-query keys of their own, so no other released
value moves. The counters' state holds exact partial sums: stored with the day, never published.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from streamfilter.engine.contract import Population, Release
from streamfilter.engine.params import PrivacyParams
from streamfilter.privacy.continual import noise_halfwidth, noise_variance
from streamfilter.privacy.departed import DepartedCounter, DepartedState
from streamfilter.privacy.noise import RandomBits

__all__ = ["MODEL", "POPULATION_NOISE_PREFIX", "PopulationSpec", "PopulationTracker"]

#: the model every population estimate rests on, in one phrase
MODEL = "a user who has left keeps contributing what they contributed on the day they left"
#: per-query noise key of the departed counters: ``_population:<query_id>``
POPULATION_NOISE_PREFIX = "_population:"


@dataclass(frozen=True)
class PopulationSpec:
    """``first_epoch_days``: the departed counters' first epoch (a power of two); shorter
    epochs have fewer levels, hence less noise early on (module docstring of privacy.departed)."""

    first_epoch_days: int = 32


@dataclass(frozen=True)
class PopulationTracker:
    """One departed counter state per query (created on the query's first day)."""

    spec: PopulationSpec
    sigma2_units: int
    states: dict[str, DepartedState] = field(default_factory=dict)
    #: users due to depart some query at their next step (SENSITIVE: stored, never published):
    #: if they send no record that day they leave with a zero vector (``engine.day``)
    pending: tuple[str, ...] = ()

    @classmethod
    def create(cls, spec: PopulationSpec, params: PrivacyParams) -> PopulationTracker:
        if params.mechanism != "discrete_gaussian":
            raise ValueError("the population estimate needs mechanism = 'discrete_gaussian'")
        return cls(spec, params.sigma2_units)

    def counter(self, dims: int) -> DepartedCounter:
        return DepartedCounter(self.spec.first_epoch_days, dims, self.sigma2_units)

    def step(
        self,
        release: Release,
        departed_units: np.ndarray,
        params: PrivacyParams,
        bits: RandomBits,
    ) -> tuple[Release, DepartedState]:
        """The release with its population estimate, and the query's counter state after it."""
        counter = self.counter(len(release.value))
        state = self.states.get(release.query_id) or counter.initial_state()
        total, noise, after = counter.step(state, departed_units, bits)
        gamma = params.granularity
        merged = dict(noise)
        merged[params.sigma2_units] = merged.get(params.sigma2_units, 0) + 1
        pairs = tuple(sorted(merged.items()))
        half = noise_halfwidth(pairs) * gamma
        estimate = Population(
            value=[v + d * gamma for v, d in zip(release.value, total, strict=True)],
            sigma=math.sqrt(noise_variance(pairs)) * gamma,
            ci95=[half] * len(total),
            model=MODEL,
        )
        return replace(release, population=estimate), after

    def advanced(self, states: dict[str, DepartedState], pending: np.ndarray) -> PopulationTracker:
        pending_ids = tuple(str(u) for u in np.asarray(pending, dtype=object).tolist())
        return PopulationTracker(
            self.spec, self.sigma2_units, {**self.states, **states}, pending_ids
        )

    # -- persistence (the state is sensitive: store it, never publish it) ----------------------
    def to_json(self) -> str:
        obj: dict[str, Any] = {
            "first_epoch_days": self.spec.first_epoch_days,
            "sigma2_units": self.sigma2_units,
            "states": {q: s.to_json_dict() for q, s in self.states.items()},
            "pending": list(self.pending),
        }
        return json.dumps(obj, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> PopulationTracker:
        obj = json.loads(text)
        states = {q: DepartedState.from_json_dict(s) for q, s in obj["states"].items()}
        pending = tuple(str(u) for u in obj.get("pending", []))
        return cls(PopulationSpec(obj["first_epoch_days"]), obj["sigma2_units"], states, pending)
