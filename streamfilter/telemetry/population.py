"""A population estimate with every release (docs/design.md §2.12).

With population on, each query's users follow the departure rule of
:mod:`streamfilter.privacy.departed`: a user whose remaining budget falls below two full
contributions gives their next vector to the query's *departed* counter instead of the release,
once, and leaves the query. The release then covers the live users and the departed counter
the users who left, so

    population(t) = release(t) + departed(t)

estimates the query's value over every user counted so far under one model (:data:`MODEL`).
Its 95% interval covers the noise and the model's own error: a departed user is counted at
their departure value, not today's, and under the stationary model the gap has mean zero and
variance at most twice the user's second moment, which a second counter (the departing
vectors' squares) estimates privately (docs/design.md §2.12). Each departing vector and its
squares are charged to the user's own filter (no extra ρ: the headline guarantee is unchanged);
the counters' noise comes from per-query keys of their own, so no other released value moves.
The counters' state holds exact partial sums: stored with the day, never published.
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
from streamfilter.privacy.departed import DepartedCounter, DepartedState, DepartureRule
from streamfilter.privacy.noise import RandomBits

__all__ = ["MODEL", "POPULATION_NOISE_PREFIX", "PopulationSpec", "PopulationTracker"]

#: the model every population estimate rests on, in one phrase
MODEL = "a user who has left keeps contributing what they contributed on the day they left"
#: per-query noise key of the departed counters: ``_population:<query_id>``
POPULATION_NOISE_PREFIX = "_population:"
#: the standard normal's 97.5% quantile: the model term's interval is ±Z95·sd (CLT)
Z95 = 1.959963984540054


@dataclass(frozen=True)
class PopulationSpec:
    """``first_epoch_days``: the departed counters' first epoch (a power of two); shorter
    epochs have fewer levels, hence less noise early on (module docstring of privacy.departed)."""

    first_epoch_days: int = 32


@dataclass(frozen=True)
class PopulationTracker:
    """Per query (created on its first day) the departed counter's state and the squares
    counter's."""

    spec: PopulationSpec
    sigma2_units: int
    states: dict[str, DepartedState] = field(default_factory=dict)
    squares: dict[str, DepartedState] = field(default_factory=dict)
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

    def squares_counter(self, rule: DepartureRule) -> DepartedCounter:
        sigma2 = rule.squares_sigma2_units(self.sigma2_units)
        return DepartedCounter(self.spec.first_epoch_days, rule.dims, sigma2)

    def step(
        self,
        release: Release,
        departed_units: np.ndarray,
        squares_units: np.ndarray,
        rule: DepartureRule,
        params: PrivacyParams,
        bits: RandomBits,
    ) -> tuple[Release, DepartedState, DepartedState]:
        """The release with its population estimate, and the query's two counter states after
        it. ``ci95``: the exact 95% half-width of the noise, or ``Z95·sqrt(noise variance +
        model variance)`` where larger; the model variance is ``2·g·(Q + h_Q)``, ``Q`` the
        noisy total of the departed squares and ``h_Q`` its own 95% half-width (an upper
        estimate of ``Σ_departed E‖x_i‖²``; docs/design.md §2.12)."""
        qid = release.query_id
        counter, squares = self.counter(len(release.value)), self.squares_counter(rule)
        state = self.states.get(qid) or counter.initial_state()
        total, noise, after = counter.step(state, departed_units, bits)
        sq_state = self.squares.get(qid) or squares.initial_state()
        sq_total, sq_noise, sq_after = squares.step(sq_state, squares_units, bits)
        gamma = params.granularity
        merged = dict(noise)
        merged[params.sigma2_units] = merged.get(params.sigma2_units, 0) + 1
        pairs = tuple(sorted(merged.items()))
        noise_var = noise_variance(pairs)
        noise_half = noise_halfwidth(pairs)
        sq_half = noise_halfwidth(sq_noise) if sq_noise else 0
        g = 1 << rule.shift
        model_var = [2.0 * g * max(0, q + sq_half) for q in sq_total]
        half = [max(noise_half, Z95 * math.sqrt(noise_var + m)) * gamma for m in model_var]
        estimate = Population(
            value=[v + d * gamma for v, d in zip(release.value, total, strict=True)],
            sigma=math.sqrt(noise_var) * gamma,
            model_sigma=[math.sqrt(m) * gamma for m in model_var],
            ci95=half,
            model=MODEL,
        )
        return replace(release, population=estimate), after, sq_after

    def advanced(
        self,
        states: dict[str, DepartedState],
        squares: dict[str, DepartedState],
        pending: np.ndarray,
    ) -> PopulationTracker:
        pending_ids = tuple(str(u) for u in np.asarray(pending, dtype=object).tolist())
        return type(self)(
            self.spec,
            self.sigma2_units,
            {**self.states, **states},
            {**self.squares, **squares},
            pending_ids,
        )

    # -- persistence (the state is sensitive: store it, never publish it) ----------------------
    def to_json(self) -> str:
        obj: dict[str, Any] = {
            "first_epoch_days": self.spec.first_epoch_days,
            "sigma2_units": self.sigma2_units,
            "states": {q: s.to_json_dict() for q, s in self.states.items()},
            "squares": {q: s.to_json_dict() for q, s in self.squares.items()},
            "pending": list(self.pending),
        }
        return json.dumps(obj, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> PopulationTracker:
        obj = json.loads(text)
        if "squares" not in obj:
            raise ValueError(
                "the stored population counters predate the estimate's model term (the squares "
                "counter) and cannot be extended; start the population estimate afresh"
            )
        states = {q: DepartedState.from_json_dict(s) for q, s in obj["states"].items()}
        squares = {q: DepartedState.from_json_dict(s) for q, s in obj["squares"].items()}
        pending = tuple(str(u) for u in obj.get("pending", []))
        spec = PopulationSpec(obj["first_epoch_days"])
        return cls(spec, obj["sigma2_units"], states, squares, pending)
