"""Coverage with every release: how many users a value covers (docs/design.md §2.11).

A released sum is over the users the filter still admits; when heavy users run out of budget the
value falls although nobody left the platform. Each release therefore carries a private estimate
of the users it covers. For a fixed, data-independent ladder of thresholds

    τ_k = floor(B / 2^k)   lattice units,   k = 0 … levels − 1   (distinct, positive)

a user **departs** level k on the first day after which ``retired or B − spent < τ_k`` holds, and
is **counted** on the first day after which ``spent > 0 or retired`` holds (they entered an
answer, or were refused for good). All of these are monotone (spent only grows, retirement is
final), so each user adds 1 to each of the ``m = levels + 1`` count streams at most once, and a
departed user has always been counted (``τ_k <= B``). The day's exact counts are sums over users
(:func:`coverage_counts`: a partitioned releaser adds the partitions' counts) and exist only in
the day close; :meth:`CoverageTracker.step` feeds them to ``m`` unbounded continual counters
(:class:`~streamfilter.privacy.continual.EpochCounter`) whose total cost is ``ρ_cov`` for the
whole, unbounded run, charged once to the telemetry budget.

A query of full cost ``c = floor(clip²/γ²)`` uses the smallest ``τ_k >= c`` (the conservative
side: whoever has ``τ_k`` left can afford ``c``), and its coverage on day t is
``counted(t) − departed_k(t)``: users counted so far who can still afford a full contribution at
the close of day t — hence at every point of day t. A query with ``c > B`` has coverage exactly 0
(nobody can ever afford it; public, so no noise). The counters' state holds exact partial sums:
stored with the day like the ledger, never published.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamfilter.engine.contract import Coverage
from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.queries import COVERAGE_NOISE_ID
from streamfilter.privacy.continual import (
    EpochCounter,
    EpochState,
    noise_halfwidth,
    noise_variance,
)
from streamfilter.privacy.noise import RandomBits
from streamfilter.privacy.rounding import float_up

__all__ = [
    "COVERAGE_NOISE_ID",
    "CoverageCounts",
    "CoverageDay",
    "CoverageSpec",
    "CoverageTracker",
    "coverage_counts",
    "coverage_thresholds_units",
]


@dataclass(frozen=True)
class CoverageSpec:
    """``rho``: zCDP of the whole estimate over an unbounded run; ``levels``: thresholds on the
    ladder ``B/2^k``; ``first_epoch_days``: the first epoch's length (a power of two)."""

    rho: float
    levels: int = 8
    first_epoch_days: int = 128


def coverage_thresholds_units(budget_units: int, levels: int) -> tuple[int, ...]:
    """``floor(B/2^k)`` for ``k < levels``, distinct and positive, ascending (public)."""
    if isinstance(levels, bool) or not isinstance(levels, int) or not 1 <= levels <= 62:
        raise ValueError(f"levels must be an integer in [1, 62], got levels={levels!r}")
    if budget_units < 1:
        raise ValueError(f"budget_units must be >= 1, got budget_units={budget_units}")
    return tuple(sorted({budget_units >> k for k in range(levels)} - {0}))


@dataclass(frozen=True)
class CoverageCounts:
    """Exact counts of one day (SENSITIVE): users counted for the first time, and users who
    departed each threshold. Sums over users: partitions' counts add (``+``)."""

    counted: int
    departed: tuple[int, ...]

    def __add__(self, other: CoverageCounts) -> CoverageCounts:
        if len(self.departed) != len(other.departed):
            raise ValueError("coverage counts over different thresholds cannot be added")
        pairs = zip(self.departed, other.departed, strict=True)
        return CoverageCounts(self.counted + other.counted, tuple(a + b for a, b in pairs))


def coverage_counts(
    spent_before: np.ndarray,
    retired_before: np.ndarray,
    spent_after: np.ndarray,
    retired_after: np.ndarray,
    budget_units: int,
    thresholds_units: tuple[int, ...],
) -> CoverageCounts:
    """One day's exact counts from the day's users before and after it (users without a record
    cannot change, so the day's users suffice). Exact int64 comparisons in lattice units."""
    sb, sa = np.asarray(spent_before, np.int64), np.asarray(spent_after, np.int64)
    rb, ra = np.asarray(retired_before, bool), np.asarray(retired_after, bool)
    if (sa < sb).any() or (rb & ~ra).any():
        raise ValueError("the ledger went backwards: spent fell or a retirement was undone")
    counted = int(np.count_nonzero(((sa > 0) | ra) & ~((sb > 0) | rb)))
    departed = []
    for tau in thresholds_units:
        before = rb | (budget_units - sb < tau)
        after = ra | (budget_units - sa < tau)
        departed.append(int(np.count_nonzero(after & ~before)))
    return CoverageCounts(counted, tuple(departed))


@dataclass(frozen=True)
class CoverageDay:
    """The noisy running totals after one day and their noise (``(s², k)`` pairs)."""

    counted: int
    counted_noise: tuple[tuple[int, int], ...]
    departed: tuple[int, ...]
    departed_noise: tuple[tuple[tuple[int, int], ...], ...]
    thresholds_units: tuple[int, ...]

    def for_cost(self, cost_units: int, granularity: float) -> Coverage:
        """The coverage of a query whose full contribution costs ``cost_units``."""
        counted_ci95 = noise_halfwidth(self.counted_noise)
        defined = self.counted > counted_ci95
        k = next((i for i, t in enumerate(self.thresholds_units) if t >= cost_units), None)
        if k is None:  # nobody can ever afford it: public, exactly 0
            return Coverage(0, 0.0, 0.0, 0.0 if defined else None, self.counted, None)
        users = self.counted - self.departed[k]
        noise = _merge(self.counted_noise, self.departed_noise[k])
        fraction = min(1.0, max(0.0, users / self.counted)) if defined else None
        return Coverage(
            users=users,
            sigma=math.sqrt(noise_variance(noise)),
            ci95=float(noise_halfwidth(noise)),
            fraction=fraction,
            counted_users=self.counted,
            threshold=self.thresholds_units[k] * granularity**2,
        )


def _merge(*noises: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """The noise of a sum of independent totals: their ``(s², k)`` pairs, equal ``s²`` merged."""
    out: dict[int, int] = {}
    for noise in noises:
        for s2, k in noise:
            out[s2] = out.get(s2, 0) + k
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class CoverageTracker:
    """Immutable: the counters' description, the thresholds and one state per count stream
    (``states[0]`` counted users, ``states[1 + k]`` departures of threshold k)."""

    counter: EpochCounter
    thresholds_units: tuple[int, ...]
    states: tuple[EpochState, ...]
    #: exact counts not yet stepped (SENSITIVE): the users a state already held when coverage
    #: started on it; added to the next day's counts, so each user still adds 1 to each stream
    #: at most once (see :meth:`with_backlog`)
    backlog: CoverageCounts | None = None

    @classmethod
    def create(cls, spec: CoverageSpec, params: PrivacyParams) -> CoverageTracker:
        thresholds = coverage_thresholds_units(params.budget_units, spec.levels)
        counter = EpochCounter(spec.first_epoch_days, len(thresholds) + 1, spec.rho)
        return cls(counter, thresholds, (counter.initial_state(),) * (len(thresholds) + 1))

    @property
    def rho(self) -> float:
        """zCDP of the whole estimate, for ever: ``m · max_e L_e/(2s_e²) <= ρ_cov``."""
        return float_up(self.counter.counters * self.counter.rho_per_counter())

    def description(self) -> dict[str, Any]:
        """What must not change while the tracker runs (checked against the configuration)."""
        return {**self.counter.to_json_dict(), "thresholds_units": list(self.thresholds_units)}

    def with_backlog(
        self, spent_units: np.ndarray, retired: np.ndarray, budget_units: int
    ) -> CoverageTracker:
        """A fresh tracker started on a state that already has users (coverage turned on, or
        the software upgraded, mid-run): their counted/departed events are counted as if they
        all happened on the next day — each user's first and only contribution to each stream,
        so the guarantee of docs/design.md §2.11 is unchanged."""
        fresh = np.zeros(len(spent_units), np.int64)
        backlog = coverage_counts(
            fresh, fresh.astype(bool), spent_units, retired, budget_units, self.thresholds_units
        )
        return dataclasses.replace(self, backlog=backlog)

    def step(self, counts: CoverageCounts, bits: RandomBits) -> tuple[CoverageDay, CoverageTracker]:
        """Add one day's exact counts (checked first); one noise draw per stream, in a fixed
        order. Nothing is mutated."""
        if len(counts.departed) != len(self.thresholds_units):
            raise ValueError("coverage counts do not match the tracker's thresholds")
        if self.backlog is not None:
            counts = counts + self.backlog
        for state in self.states:
            self.counter.check_state(state)
        steps = [
            self.counter.step(state, count, bits)
            for state, count in zip(self.states, (counts.counted, *counts.departed), strict=True)
        ]
        day = CoverageDay(
            counted=steps[0].value,
            counted_noise=steps[0].noise,
            departed=tuple(s.value for s in steps[1:]),
            departed_noise=tuple(s.noise for s in steps[1:]),
            thresholds_units=self.thresholds_units,
        )
        new = CoverageTracker(self.counter, self.thresholds_units, tuple(s.state for s in steps))
        return day, new

    # -- persistence (the state is sensitive: store it, never publish it) ----------------------
    def to_json(self) -> str:
        obj: dict[str, Any] = {
            "description": self.description(),
            "states": [s.to_json_dict() for s in self.states],
        }
        if self.backlog is not None:
            obj["backlog"] = [self.backlog.counted, *self.backlog.departed]
        return json.dumps(obj, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> CoverageTracker:
        obj: Any = json.loads(text)
        desc = obj["description"]
        counter = EpochCounter(desc["first_horizon"], desc["counters"], desc["rho"])
        thresholds = tuple(desc["thresholds_units"])
        if len(thresholds) + 1 != counter.counters or any(
            isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in thresholds
        ):
            raise ValueError("coverage thresholds do not match the counters")
        states = tuple(EpochState.from_json_dict(s) for s in obj["states"])
        if len(states) != counter.counters:
            raise ValueError("coverage state has the wrong number of counters")
        for state in states:
            counter.check_state(state)
        backlog = None
        if "backlog" in obj:
            values = obj["backlog"]
            if len(values) != counter.counters or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values
            ):
                raise ValueError("coverage backlog must be one count per stream")
            backlog = CoverageCounts(values[0], tuple(values[1:]))
        return cls(counter, thresholds, states, backlog)
