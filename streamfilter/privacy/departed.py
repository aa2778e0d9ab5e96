"""The value that has left: departures from one query, paid inside each user's own filter.

A released sum covers the users the individual filter still admits; when heavy users run out
of budget the value falls although nobody left the platform. The population estimate of a
query (docs/design.md §2.12) adds back what the departed users contributed on the day they left,
and states how far that can be from what they contribute today.

Departure rule (per query of full cost ``c = floor(clip²/γ²)`` lattice units, its
:class:`DepartureRule` ``D = c + E``, ``E`` the most the model term below can charge; a user
whose remaining budget before the query's step is ``R``; exact int64 comparisons):

* ``R >= c + D``: **live** — admitted as usual (their vector ``r`` enters the release,
  ``‖r‖² <= c`` is charged); afterwards ``R − ‖r‖² >= D``.
* ``D <= R < c + D``: **departs now** — ``r`` enters the query's *departed* counter instead of
  the release, its squares ``u_k = ceil(r_k²/g)`` (``g = 2^shift``, see below) enter the
  *squares* counter, and ``max(‖r‖² + e(u), R − D + 1)`` is charged, which leaves
  ``R' <= D − 1``: the user never takes part in this query again.
* ``R < D``: gone (nothing is added, nothing charged).

Whether a user departs at a step depends only on their budget before it, never on the vector of
the step itself, so the departing vector is a fresh sample of that user's daily value (not biased
towards large values, as the vector that happened to exhaust them would be), and its squares a
fresh sample of the user's second moment: the squares counter's total estimates (from above) the
variance of the gap between the departed users' departure values and today's values.

Privacy. Both counters are the binary-tree mechanism (``privacy.continual``) over *vectors* with
epochs as :class:`~streamfilter.privacy.continual.EpochCounter`; epoch ``e`` has ``L_e`` levels.
The departed counter adds ``N_Z(0, L_e·s²)`` per node and coordinate (``s²`` the release's); a
user departs from a query at most once, so ``r`` shifts exactly ``L_e`` nodes of one epoch, each
by ``r``: by CKS 2020 (Thm 14 / Prop. 5, per node) and additivity over the nodes their loss is
``‖r‖²/(2s²)``. The squares counter adds ``N_Z(0, L_e·κ·F·s²)`` (``F = ceil(c/g)``, the
largest ``u_k``; ``κ`` = :data:`SQUARES_KAPPA`); its loss is ``‖u‖²/(2κFs²)``, i.e.
``e(u) = ceil(‖u‖²/(κF))`` lattice units of the same filter. The charge ``>= ‖r‖² + e(u)`` pays
both, so Feldman & Zrnic's Theorem 4.5 (per-node individual losses, predictable once ``r`` is
fixed, charged in advance) keeps the headline ``B/(2s²) <= ρ``.

Bounds: with ``g = 1``, ``u_k = r_k²`` and ``‖u‖² = Σ r_k⁴ <= c·‖r‖²``, so ``e <= ceil(‖r‖²/κ)
<= E = ceil(c/κ)``: a departure costs at most ``1 + 1/κ`` full contributions. ``g > 1`` only
when the squares counter's node variance would pass the sampler's ``2^62`` (very fine lattices);
then ``Σ u_k <= floor(c/g) + d`` and ``E = ceil((floor(c/g) + d)/κ)``.

Accuracy cost: the departed total after step t of an epoch carries ``popcount(t)`` nodes of
variance ``L_e·s²`` (plus one root per completed epoch); and each user gives up at most
``c + D − 1`` units of budget that the plain filter would have let them spend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamfilter.privacy.continual import MAX_HORIZON
from streamfilter.privacy.lattice import Lattice, round_to_lattice
from streamfilter.privacy.noise import RandomBits, discrete_gaussian

__all__ = [
    "SQUARES_KAPPA",
    "DepartedCounter",
    "DepartedState",
    "DepartureRule",
    "DepartureStep",
    "filter_departures",
]

#: the squares counter's noise is ``κ·F`` times the departed counter's per unit of square, so a
#: departure's model term costs at most ``1/κ`` of a full contribution (module docstring)
SQUARES_KAPPA = 4
#: the most levels an epoch can have (horizon at most 2^30)
_MAX_LEVELS = MAX_HORIZON.bit_length()
_MAX_SIGMA2 = 1 << 62


@dataclass(frozen=True)
class DepartureRule:
    """The departure rule of one query (module docstring): ``full`` = ``c`` lattice units,
    ``dims`` = ``d``, squares in units of ``g = 2^shift`` lattice units²."""

    full: int
    dims: int
    shift: int

    @classmethod
    def of(cls, full: int, dims: int, sigma2_units: int) -> DepartureRule:
        """The rule with the smallest ``g`` whose squares counter fits the sampler in every
        epoch (``L·κ·F·s² <= 2^62``) and whose squares fit int64 (``F <= 2^30``)."""
        if full < 0 or dims < 1 or sigma2_units < 1:
            raise ValueError("full must be >= 0, dims and sigma2_units >= 1")
        shift = 0
        while True:
            rule = cls(full, dims, shift)
            top = rule.square_max
            if top <= 1 << 30 and _MAX_LEVELS * SQUARES_KAPPA * top * sigma2_units <= _MAX_SIGMA2:
                return rule
            if top == 1:
                raise ValueError(
                    "the population estimate's squares counter cannot be calibrated: the release "
                    f"noise s² = {sigma2_units} lattice units is above 2^62/{_MAX_LEVELS * 4}"
                )
            shift += 1

    @property
    def square_max(self) -> int:
        """``F = ceil(c/g)``: the largest ``u_k`` (at least 1)."""
        return max(1, ((self.full - 1) >> self.shift) + 1) if self.full else 1

    @property
    def extra_max(self) -> int:
        """``E``: the most the squares counter charges one departure (module docstring)."""
        if self.full == 0:
            return 0
        total = self.full if self.shift == 0 else (self.full >> self.shift) + self.dims
        return -(-total // SQUARES_KAPPA)

    @property
    def depart_at(self) -> int:
        """``D``: a user with ``D <= R < c + D`` departs at the step."""
        return self.full + self.extra_max if self.full else 0

    @property
    def live_at(self) -> int:
        """``c + D``: a user with ``R >= c + D`` is live."""
        return self.full + self.depart_at

    def squares_sigma2_units(self, sigma2_units: int) -> int:
        """``κ·F·s²``: the squares counter's per-node variance before the ``L_e`` factor."""
        return SQUARES_KAPPA * self.square_max * sigma2_units

    def squares(self, units: np.ndarray) -> np.ndarray:
        """``u_k = ceil(r_k²/g)`` of lattice vectors ``units`` (n, d), int64."""
        sq = np.square(np.asarray(units, np.int64))
        if self.shift == 0:
            return sq
        return np.where(sq > 0, ((sq - 1) >> self.shift) + 1, 0)

    def extra(self, squares: np.ndarray) -> np.ndarray:
        """``e(u) = ceil(‖u‖²/(κF))`` per row of ``squares`` (n, d): the squares counter's loss
        in lattice units of the filter (exact integers: ``Σ u_k² <= F·Σ u_k`` fits int64 as ``F <= 2^30``)."""
        norm2 = np.square(squares).sum(axis=1, dtype=np.int64)
        den = SQUARES_KAPPA * self.square_max
        return -(-norm2 // den)


@dataclass(frozen=True)
class DepartureStep:
    """One query's step over a block of users under the departure rule (nothing is mutated).

    ``total_units`` (d,): exact sum of the live users' admitted vectors (the release);
    ``departed_units`` (d,): exact sum of the departing users' vectors (SENSITIVE);
    ``squares_units`` (d,): exact sum of their squares ``u`` (units of ``g``; SENSITIVE);
    ``cost_units`` (n,): charged; ``admitted`` (n,): live and admitted; ``departed`` (n,).
    """

    total_units: np.ndarray
    departed_units: np.ndarray
    squares_units: np.ndarray
    cost_units: np.ndarray
    admitted: np.ndarray
    departed: np.ndarray


def filter_departures(
    x: np.ndarray,
    clip: float,
    lattice: Lattice,
    spent_units: np.ndarray,
    retired: np.ndarray,
    budget_units: int,
    rule: DepartureRule,
) -> DepartureStep:
    """The departure rule of the module docstring over rows ``x`` (data units, (n, d))."""
    full = lattice.max_cost_units(clip)
    if full != rule.full:
        raise ValueError(f"the rule is for full cost {rule.full}, the query's is {full}")
    units, cost = round_to_lattice(x, clip, lattice.granularity, full)
    remaining = budget_units - np.asarray(spent_units, np.int64)
    if (remaining < 0).any():
        raise ValueError("spent_units exceeds the budget: the ledger is corrupt")
    alive = ~np.asarray(retired, bool)
    live = alive & (remaining >= rule.live_at)
    leaving = alive & (remaining >= rule.depart_at) & ~live
    squares = rule.squares(units[leaving])
    paid = cost[leaving] + rule.extra(squares)
    charge = np.where(live, cost, 0)
    charge[leaving] = np.maximum(paid, remaining[leaving] - rule.depart_at + 1)
    return DepartureStep(
        total_units=units[live].sum(axis=0, dtype=np.int64),
        departed_units=units[leaving].sum(axis=0, dtype=np.int64),
        squares_units=squares.sum(axis=0, dtype=np.int64),
        cost_units=charge.astype(np.int64),
        admitted=live,
        departed=leaving,
    )


@dataclass(frozen=True)
class DepartedState:
    """After ``t`` steps of epoch ``epoch``: ``carry`` (noisy total of completed epochs, public),
    ``exact``/``noisy`` per level and coordinate (``exact`` SENSITIVE: stored, never published)."""

    epoch: int
    t: int
    carry: tuple[int, ...]
    exact: tuple[tuple[int, ...], ...]
    noisy: tuple[tuple[int, ...], ...]

    def to_json_dict(self) -> dict[str, object]:
        return {
            "epoch": self.epoch,
            "t": self.t,
            "carry": list(self.carry),
            "exact": [list(v) for v in self.exact],
            "noisy": [list(v) for v in self.noisy],
        }

    @classmethod
    def from_json_dict(cls, obj: dict[str, object]) -> DepartedState:
        def ints(v: object) -> tuple[int, ...]:
            if not isinstance(v, list) or any(
                isinstance(i, bool) or not isinstance(i, int) for i in v
            ):
                raise ValueError("departed counter state values must be integer lists")
            return tuple(v)

        exact, noisy = obj["exact"], obj["noisy"]
        if not isinstance(exact, list) or not isinstance(noisy, list):
            raise ValueError("departed counter state exact/noisy must be lists")
        epoch, t = obj["epoch"], obj["t"]
        if not isinstance(epoch, int) or not isinstance(t, int):
            raise ValueError("departed counter state epoch/t must be integers")
        return cls(epoch, t, ints(obj["carry"]), tuple(map(ints, exact)), tuple(map(ints, noisy)))


@dataclass(frozen=True)
class DepartedCounter:
    """The vector binary-tree mechanism over an unbounded run (module docstring): epoch ``e``
    spans ``first_horizon·2^(e−1)`` steps with node noise ``N_Z(0, L_e·sigma2_units)``
    (``sigma2_units`` is ``s²`` for the departed counter, ``κ·F·s²`` for the squares)."""

    first_horizon: int
    dims: int
    sigma2_units: int

    def __post_init__(self) -> None:
        h = self.first_horizon
        if isinstance(h, bool) or not isinstance(h, int) or h < 1 or h & (h - 1):
            raise ValueError(f"first_horizon must be a power of two, got {h!r}")
        if self.dims < 1 or self.sigma2_units < 1:
            raise ValueError("dims and sigma2_units must be >= 1")

    def horizon(self, epoch: int) -> int:
        h = self.first_horizon << (epoch - 1)
        if h > MAX_HORIZON:
            raise ValueError(f"epoch {epoch} would exceed the largest horizon 2^30")
        return h

    def node_sigma2_units(self, epoch: int) -> int:
        """``L_e·s²``: a departing vector's ``L_e`` nodes then cost ``‖r‖²/(2s²)`` in all."""
        return self.horizon(epoch).bit_length() * self.sigma2_units

    def initial_state(self) -> DepartedState:
        levels = self.horizon(1).bit_length()
        zeros = ((0,) * self.dims,) * levels
        return DepartedState(1, 0, (0,) * self.dims, zeros, zeros)

    def noise(self, epoch: int, t: int) -> tuple[tuple[int, int], ...]:
        """The noise of each coordinate of the running total, as ``(s², k)`` pairs."""
        out: dict[int, int] = {}
        for e in range(1, epoch):
            s2 = self.node_sigma2_units(e)
            out[s2] = out.get(s2, 0) + 1
        if t:
            s2 = self.node_sigma2_units(epoch)
            out[s2] = out.get(s2, 0) + t.bit_count()
        return tuple(sorted(out.items()))

    def step(
        self, state: DepartedState, units: np.ndarray, bits: RandomBits
    ) -> tuple[list[int], tuple[tuple[int, int], ...], DepartedState]:
        """Add one step's exact vector; returns the noisy running total, its noise and the new
        state. Draws exactly ``dims`` noise values (one node completes per step)."""
        vec = [int(v) for v in np.asarray(units, np.int64).tolist()]
        if len(vec) != self.dims:
            raise ValueError(f"departed vector has {len(vec)} coordinates, counter {self.dims}")
        horizon = self.horizon(state.epoch)
        levels = horizon.bit_length()
        if len(state.exact) != levels or state.t >= horizon:
            raise ValueError("departed counter state does not match its epoch")
        t = state.t + 1
        i = (t & -t).bit_length() - 1
        exact = [list(v) for v in state.exact]
        noisy = [list(v) for v in state.noisy]
        exact[i] = [sum(exact[j][k] for j in range(i)) + vec[k] for k in range(self.dims)]
        for j in range(i):
            exact[j] = [0] * self.dims
            noisy[j] = [0] * self.dims
        z = discrete_gaussian(bits, self.node_sigma2_units(state.epoch), self.dims)
        noisy[i] = [a + int(n) for a, n in zip(exact[i], z, strict=True)]
        value = [
            state.carry[k] + sum(noisy[j][k] for j in range(levels) if (t >> j) & 1)
            for k in range(self.dims)
        ]
        noise = self.noise(state.epoch, t)
        if t < horizon:
            new = DepartedState(
                state.epoch, t, state.carry, tuple(map(tuple, exact)), tuple(map(tuple, noisy))
            )
        else:  # the epoch is complete: its prefix is the root alone; carry it, open the next
            nxt = self.horizon(state.epoch + 1).bit_length()
            zeros = ((0,) * self.dims,) * nxt
            new = DepartedState(state.epoch + 1, 0, tuple(value), zeros, zeros)
        return value, noise, new
