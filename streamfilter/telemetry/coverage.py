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
from collections.abc import Sequence
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
from streamfilter.privacy.quotas import DEFAULT_ANALYST, AnalystQuotas, split_budgets
from streamfilter.privacy.rounding import float_up

__all__ = [
    "COVERAGE_NOISE_ID",
    "CoverageCounts",
    "CoverageDay",
    "CoverageSpec",
    "CoverageTracker",
    "analyst_backlog",
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
    remaining_before: np.ndarray | None = None,
    remaining_after: np.ndarray | None = None,
) -> CoverageCounts:
    """One day's exact counts from the day's users before and after it (users without a record
    cannot change, so the day's users suffice). Exact int64 comparisons in lattice units.

    The remaining budget is ``B − spent`` unless given: an analyst's counts (docs/design.md
    §2.13) pass the analyst's spend and ``min(B − spent, B_a − spent_a)``."""
    sb, sa = np.asarray(spent_before, np.int64), np.asarray(spent_after, np.int64)
    rb, ra = np.asarray(retired_before, bool), np.asarray(retired_after, bool)
    left_b = budget_units - sb if remaining_before is None else remaining_before
    left_a = budget_units - sa if remaining_after is None else remaining_after
    if (sa < sb).any() or (rb & ~ra).any() or (left_a > left_b).any():
        raise ValueError("the ledger went backwards: spent fell or a retirement was undone")
    counted = int(np.count_nonzero(((sa > 0) | ra) & ~((sb > 0) | rb)))
    departed = []
    for tau in thresholds_units:
        before = rb | (left_b < tau)
        after = ra | (left_a < tau)
        departed.append(int(np.count_nonzero(after & ~before)))
    return CoverageCounts(counted, tuple(departed))


def analyst_backlog(
    tracker: CoverageTracker,
    quotas: AnalystQuotas,
    budgets: Sequence[tuple[str, int, bool]],
) -> tuple[CoverageCounts, ...]:
    """The counts of every user a state already holds, one per analyst group of ``tracker``
    (docs/design.md §2.13): ``budgets`` are the stored entries, the users' and the named
    analysts' (``privacy.quotas.split_budgets``), each user counted once from a fresh state."""
    plain, named = split_budgets(budgets)
    users = [u for u, _, _ in plain]
    spent = np.array([s for _, s, _ in plain], np.int64)
    retired = np.array([r for _, _, r in plain], bool)
    index = {u: i for i, u in enumerate(users)}
    spent_of: dict[str, np.ndarray] = {}
    retired_of: dict[str, np.ndarray] = {}
    for name, entries in named.items():
        own, gone = np.zeros(len(users), np.int64), np.zeros(len(users), bool)
        for user, units, flag in entries:
            if user not in index:
                raise ValueError("an analyst's entry has no user entry: the ledger is corrupt")
            own[index[user]], gone[index[user]] = units, flag
        spent_of[name], retired_of[name] = own, gone
    spent_of[DEFAULT_ANALYST] = quotas.default_spent(spent, list(spent_of.values()))
    retired_of[DEFAULT_ANALYST] = retired
    zero = np.zeros(len(users), np.int64)
    out = []
    for group, thresholds in tracker.groups():
        if group is None:
            raise ValueError("the tracker has no analyst groups")
        name = group
        own = spent_of.get(name, zero)
        gone = retired_of.get(name, zero.astype(bool))
        out.append(
            coverage_counts(
                zero,
                zero.astype(bool),
                own,
                gone,
                quotas.budget_units,
                thresholds,
                quotas.remaining_units(name, zero, zero),
                quotas.remaining_units(name, spent, own),
            )
        )
    return tuple(out)


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
    """Immutable: the counters' description, the thresholds and one state per count stream.

    Without analysts, one ladder: ``states[0]`` counted users, ``states[1 + k]`` departures of
    threshold k. With analysts (``ladders``: each analyst's name and number of thresholds, in
    name order; docs/design.md §2.13), one such group of streams per analyst, one after the
    other, against the analyst's remaining sub-budget; ``thresholds_units`` is then the
    analysts' ladders one after the other."""

    counter: EpochCounter
    thresholds_units: tuple[int, ...]
    states: tuple[EpochState, ...]
    #: exact counts not yet stepped (SENSITIVE), one per group of streams: the users a state
    #: already held when coverage started on it; added to the next day's counts, so each user
    #: still adds 1 to each stream at most once (see :meth:`with_backlog`)
    backlog: tuple[CoverageCounts, ...] | None = None
    ladders: tuple[tuple[str, int], ...] = ()

    @classmethod
    def create(
        cls, spec: CoverageSpec, params: PrivacyParams, quotas: AnalystQuotas | None = None
    ) -> CoverageTracker:
        """One ladder on ``B``; with ``quotas`` declaring analysts, one ladder per analyst on its
        sub-budget (an analyst without a sub-budget gets none: its coverage is exactly 0)."""
        if quotas is None or not quotas.active:
            thresholds = coverage_thresholds_units(params.budget_units, spec.levels)
            counter = EpochCounter(spec.first_epoch_days, len(thresholds) + 1, spec.rho)
            return cls(counter, thresholds, (counter.initial_state(),) * (len(thresholds) + 1))
        ladders: list[tuple[str, int]] = []
        flat: list[int] = []
        for name in quotas.analysts:
            units = quotas.sub_budget_units[name]
            own = coverage_thresholds_units(units, spec.levels) if units > 0 else ()
            ladders.append((name, len(own)))
            flat.extend(own)
        streams = len(flat) + len(ladders)
        counter = EpochCounter(spec.first_epoch_days, streams, spec.rho)
        return cls(counter, tuple(flat), (counter.initial_state(),) * streams, None, tuple(ladders))

    @property
    def rho(self) -> float:
        """zCDP of the whole estimate, for ever: ``m · max_e L_e/(2s_e²) <= ρ_cov``."""
        return float_up(self.counter.counters * self.counter.rho_per_counter())

    def description(self) -> dict[str, Any]:
        """What must not change while the tracker runs (checked against the configuration)."""
        out = {**self.counter.to_json_dict(), "thresholds_units": list(self.thresholds_units)}
        if self.ladders:
            out["analysts"] = [[name, n] for name, n in self.ladders]
        return out

    def groups(self) -> list[tuple[str | None, tuple[int, ...]]]:
        """Each group of streams: its analyst (None: no analysts) and its thresholds."""
        if not self.ladders:
            return [(None, self.thresholds_units)]
        out: list[tuple[str | None, tuple[int, ...]]] = []
        at = 0
        for name, n in self.ladders:
            out.append((name, self.thresholds_units[at : at + n]))
            at += n
        return out

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
        return self.with_group_backlog((backlog,))

    def with_group_backlog(self, backlog: tuple[CoverageCounts, ...]) -> CoverageTracker:
        """A fresh tracker with exact counts (one per group) to add to the next day's: the
        users a state already held (each user's first and only contribution to each stream)."""
        if [len(c.departed) for c in backlog] != [len(t) for _, t in self.groups()]:
            raise ValueError("the backlog does not match the tracker's groups")
        return dataclasses.replace(self, backlog=backlog)

    def step(self, counts: CoverageCounts, bits: RandomBits) -> tuple[CoverageDay, CoverageTracker]:
        """:meth:`step_groups` of a tracker without analysts."""
        days, new = self.step_groups((counts,), bits)
        return days[0], new

    def step_groups(
        self, counts: tuple[CoverageCounts, ...], bits: RandomBits
    ) -> tuple[list[CoverageDay], CoverageTracker]:
        """Add one day's exact counts, one per group (checked first); one noise draw per
        stream, in a fixed order, whatever the counts. Nothing is mutated."""
        groups = self.groups()
        if [len(c.departed) for c in counts] != [len(t) for _, t in groups]:
            raise ValueError("coverage counts do not match the tracker's thresholds")
        if self.backlog is not None:
            counts = tuple(c + b for c, b in zip(counts, self.backlog, strict=True))
        for state in self.states:
            self.counter.check_state(state)
        values = [v for c in counts for v in (c.counted, *c.departed)]
        steps = [
            self.counter.step(state, count, bits)
            for state, count in zip(self.states, values, strict=True)
        ]
        days, at = [], 0
        for _name, thresholds in groups:
            own = steps[at : at + 1 + len(thresholds)]
            at += 1 + len(thresholds)
            days.append(
                CoverageDay(
                    counted=own[0].value,
                    counted_noise=own[0].noise,
                    departed=tuple(s.value for s in own[1:]),
                    departed_noise=tuple(s.noise for s in own[1:]),
                    thresholds_units=thresholds,
                )
            )
        new = CoverageTracker(
            self.counter,
            self.thresholds_units,
            tuple(s.state for s in steps),
            None,
            self.ladders,
        )
        return days, new

    # -- persistence (the state is sensitive: store it, never publish it) ----------------------
    def to_json(self) -> str:
        obj: dict[str, Any] = {
            "description": self.description(),
            "states": [s.to_json_dict() for s in self.states],
        }
        if self.backlog is not None:
            obj["backlog"] = [v for c in self.backlog for v in (c.counted, *c.departed)]
        return json.dumps(obj, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> CoverageTracker:
        obj: Any = json.loads(text)
        desc = obj["description"]
        counter = EpochCounter(desc["first_horizon"], desc["counters"], desc["rho"])
        thresholds = tuple(desc["thresholds_units"])
        ladders = tuple((str(name), int(n)) for name, n in desc.get("analysts", ()))
        groups = max(1, len(ladders))
        if (
            len(thresholds) + groups != counter.counters
            or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in thresholds)
            or (ladders and sum(n for _, n in ladders) != len(thresholds))
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
            sizes = [n for _, n in ladders] if ladders else [len(thresholds)]
            parts, at = [], 0
            for n in sizes:
                parts.append(CoverageCounts(values[at], tuple(values[at + 1 : at + 1 + n])))
                at += 1 + n
            backlog = tuple(parts)
        return cls(counter, thresholds, states, backlog, ladders)
