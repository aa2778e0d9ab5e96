"""The value that has left: departures from one query, paid inside each user's own filter.

A released sum covers the users the individual filter still admits; when heavy users run out
of budget the value falls although nobody left the platform. The population estimate of a
query (docs/design.md §2.12) adds back what the departed users contributed on the day they left.

Departure rule (per query of full cost ``c_q = floor(clip²/γ²)`` lattice units, a user whose
remaining budget before the query's step is ``R``; exact int64 comparisons):

* ``R >= 2·c_q``: **live** — admitted as usual (their vector ``r`` enters the release,
  ``‖r‖² <= c_q`` is charged); afterwards ``R − ‖r‖² >= c_q``.
* ``c_q <= R < 2·c_q``: **departs now** — the vector ``r`` of this step enters the *departed*
  counter instead of the release, and ``max(‖r‖², R − c_q + 1)`` is charged, which leaves
  ``R' <= c_q − 1``: the user never takes part in this query again.
* ``R < c_q``: gone (nothing is added, nothing charged).

Whether a user departs at a step depends only on their budget before it, never on the vector of
the step itself, so the departing vector is a fresh sample of that user's daily value (not biased
towards large values, as the vector that happened to exhaust them would be).

Privacy. The departed counter is the binary-tree mechanism (``privacy.continual``) over
*vectors* with epochs as :class:`~streamfilter.privacy.continual.EpochCounter`; epoch ``e`` has
``L_e`` levels and noise ``N_Z(0, L_e·s²)`` per node and coordinate, ``s²`` the release's.
A user departs from a query at most once, so their vector ``r`` shifts exactly ``L_e`` nodes of
one epoch, each by ``r``: by CKS 2020 (Thm 14 / Prop. 5, per node) and additivity over the nodes
their individual zCDP loss is ``L_e·‖r‖²/(2·L_e·s²) = ‖r‖²/(2s²)`` — exactly what the charge
``>= ‖r‖²`` pays in the same filter as every release. The decision and the charge use only the
user's own data and past outputs, so Feldman & Zrnic's Theorem 4.5 (per-node individual losses,
predictable once ``r`` is fixed, charged in advance) keeps the headline ``B/(2s²) <= ρ``.

Accuracy cost: the departed total after step t of an epoch carries ``popcount(t)`` nodes of
variance ``L_e·s²`` (plus one root per completed epoch), i.e. up to ``L_e`` times the release's
variance per level in the sum; and each user gives up at most ``2·c_q − 1`` units of budget that
the plain filter would have let them spend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamfilter.privacy.continual import MAX_HORIZON
from streamfilter.privacy.lattice import Lattice, round_to_lattice
from streamfilter.privacy.noise import RandomBits, discrete_gaussian

__all__ = [
    "DepartedCounter",
    "DepartedState",
    "DepartureStep",
    "filter_departures",
]


@dataclass(frozen=True)
class DepartureStep:
    """One query's step over a block of users under the departure rule (nothing is mutated).

    ``total_units`` (d,): exact sum of the live users' admitted vectors (the release);
    ``departed_units`` (d,): exact sum of the departing users' vectors (SENSITIVE);
    ``cost_units`` (n,): charged; ``admitted`` (n,): live and admitted; ``departed`` (n,).
    """

    total_units: np.ndarray
    departed_units: np.ndarray
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
) -> DepartureStep:
    """The departure rule of the module docstring over rows ``x`` (data units, (n, d))."""
    full = lattice.max_cost_units(clip)
    units, cost = round_to_lattice(x, clip, lattice.granularity, full)
    remaining = budget_units - np.asarray(spent_units, np.int64)
    if (remaining < 0).any():
        raise ValueError("spent_units exceeds the budget: the ledger is corrupt")
    alive = ~np.asarray(retired, bool)
    live = alive & (remaining >= 2 * full)
    leaving = alive & (remaining >= full) & ~live
    charge = np.where(live, cost, 0) + np.where(leaving, np.maximum(cost, remaining - full + 1), 0)
    return DepartureStep(
        total_units=units[live].sum(axis=0, dtype=np.int64),
        departed_units=units[leaving].sum(axis=0, dtype=np.int64),
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
    spans ``first_horizon·2^(e−1)`` steps with node noise ``N_Z(0, L_e·sigma2_units)``."""

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
