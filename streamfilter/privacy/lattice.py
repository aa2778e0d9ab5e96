"""The contribution lattice: clipping, rounding and exact integer costs.

Every contribution lives on the lattice ``γ·Z^d`` with ``γ = 2^k`` (``granularity``). A
contribution ``x`` (data units) is first clipped to L2 norm ``≤ C`` and then rounded to an
integer vector ``r`` (lattice units) whose cost ``‖r‖²`` is an exact integer. Budgets are integers
``B = floor(B_norm / γ²)`` and sums are exact integer sums, so no floating-point comparison ever
decides admission (docs/design.md §2 "Lattice").

Why the rounding never exceeds the clip (the argument the filter relies on)
---------------------------------------------------------------------------
``round_to_lattice`` returns integer rows ``r`` with ``‖r‖² ≤ max_cost_units`` *checked in exact
integer arithmetic* (``_enforce_cost_cap``): nearest rounding is tried first (unbiased in the
bulk); rows where it would exceed the cap are re-scaled to the radius minus ½·sqrt(d) before
rounding (rounding moves a vector by at most ½·sqrt(d)); any row still over the cap (possible
only through floating-point error) has its largest coordinate stepped toward zero until the exact
integer cost fits. So the
cost charged is the squared norm of *exactly* the integer vector that is added to the sum, and it is
at most ``floor(C²/γ²)``, computed from the exact binary values of ``C`` and ``γ``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

__all__ = [
    "MAX_BUDGET_UNITS",
    "MAX_COORDINATE_UNITS",
    "Lattice",
    "cost_units",
    "max_cost_units",
    "norm2_rows",
    "round_to_lattice",
]

#: |r_j| ≤ C/γ ≤ 2^31 keeps every cost ‖r‖² ≤ d·2^62 ... we bound the *cost*, see below.
MAX_COORDINATE_UNITS = 2**31
#: B ≤ 2^61 and every single cost ≤ 2^62 keep ``spent + cost`` below 2^63 (no int64 overflow).
MAX_BUDGET_UNITS = 2**61
#: a single contribution's cost is capped by floor(C²/γ²) ≤ 2^62.
MAX_COST_UNITS = 2**62


def _check_power_of_two(granularity: float) -> int:
    if not (
        isinstance(granularity, float | int) and math.isfinite(granularity) and granularity > 0
    ):
        raise ValueError(
            f"granularity must be a positive power of two, got granularity={granularity!r}"
        )
    mantissa, exponent = math.frexp(float(granularity))
    if mantissa != 0.5:
        raise ValueError(f"granularity must be a power of two, got granularity={granularity!r}")
    return exponent - 1


@dataclass(frozen=True)
class Lattice:
    """The lattice ``γ·Z^d`` with ``γ = granularity = 2^k`` (an exact binary float)."""

    granularity: float

    def __post_init__(self) -> None:
        exponent = _check_power_of_two(self.granularity)
        if not -60 <= exponent <= 30:
            raise ValueError(
                f"granularity must be between 2^-60 and 2^30, got granularity={self.granularity!r}"
            )

    @property
    def gamma(self) -> Fraction:
        return Fraction(self.granularity)

    def budget_units(self, b_norm: float) -> int:
        """``B = floor(B_norm / γ²)`` exactly; refuses budgets that could overflow int64."""
        if not (math.isfinite(b_norm) and b_norm > 0):
            raise ValueError(f"b_norm must be a positive finite number, got b_norm={b_norm!r}")
        units = math.floor(Fraction(b_norm) / self.gamma**2)
        if units < 1:
            raise ValueError(
                f"b_norm={b_norm!r} is below one lattice unit γ²={self.granularity**2!r}; "
                "use a finer granularity"
            )
        if units > MAX_BUDGET_UNITS:
            raise ValueError(
                f"b_norm/granularity² = {units} exceeds 2^61 and could overflow 64-bit budgets; "
                "use a coarser granularity or a smaller b_norm"
            )
        return units

    def sigma2_units(self, sigma: float) -> int:
        """Noise variance in lattice units, rounded *up* to an integer: ``ceil(σ²/γ²)``.

        Rounding up only adds noise, so the zCDP guarantee computed from the configured σ still
        holds (a larger variance gives a smaller Rényi divergence, CKS 2020 Prop. 5).
        """
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"sigma must be a positive finite number, got sigma={sigma!r}")
        units = math.ceil(Fraction(sigma) ** 2 / self.gamma**2)
        if units > 2**62:
            raise ValueError(f"sigma/granularity is too large: sigma2_units={units} > 2^62")
        return max(units, 1)

    def max_cost_units(self, clip: float) -> int:
        return max_cost_units(clip, self.granularity)

    def to_units(self, x: np.ndarray, clip: float) -> tuple[np.ndarray, np.ndarray]:
        """Clip rows of ``x`` (data units) to norm ``clip`` and round: (r int64, cost int64)."""
        cap = self.max_cost_units(clip)
        return round_to_lattice(x, clip, self.granularity, np.full(x.shape[0], cap, np.int64))

    def to_data(self, units: np.ndarray | int) -> np.ndarray:
        return np.asarray(units, dtype=np.float64) * self.granularity


def max_cost_units(clip: float, granularity: float) -> int:
    """``floor(C²/γ²)`` exactly, from the binary values of ``C`` and ``γ``; refuses overflow."""
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be a positive finite number, got clip={clip!r}")
    cap = math.floor(Fraction(clip) ** 2 / Fraction(granularity) ** 2)
    if cap > MAX_COST_UNITS:
        raise ValueError(
            f"clip/granularity = {clip / granularity:.3g} exceeds 2^31 and could overflow "
            "64-bit sums; use a coarser granularity or a smaller clip"
        )
    return cap


def cost_units(r: np.ndarray) -> np.ndarray:
    """Exact integer ``‖r‖²`` per row (int64; callers guarantee ``|r_j| ≤ 2^31``)."""
    r = np.asarray(r, dtype=np.int64)
    return np.einsum("ij,ij->i", r, r) if r.ndim == 2 else np.dot(r, r)


def round_to_lattice(
    x: np.ndarray, clip: float, granularity: float, cap_units: np.ndarray | int
) -> tuple[np.ndarray, np.ndarray]:
    """Clip each row of ``x`` and round it to integer lattice units with ``‖r‖² ≤ cap_units``.

    ``x``: (n, d) float64 in data units. ``cap_units``: (n,) int64 per-row integer cost cap (the
    query's ``floor(C²/γ²)``, or a smaller remaining budget for exhaustion policy ``clip``), or
    one integer for every row. The clip radius of row i is ``min(C, γ·sqrt(cap_i))``. Returns
    ``(r, cost)`` with ``r`` int64 (n, d) and ``cost = ‖r‖²`` int64 (n,), exactly.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"x must be a 2-D array (users × d), got shape {x.shape}")
    cap_units = np.asarray(cap_units, dtype=np.int64)
    n = x.shape[0]
    if n == 0:
        return np.zeros(x.shape, np.int64), np.zeros(0, np.int64)
    # Clip in lattice units: y = x/γ scaled to norm ≤ radius = min(C/γ, sqrt(cap)).
    y = x / granularity
    radius = np.minimum(clip / granularity, np.sqrt(cap_units.astype(np.float64)))
    norm = np.sqrt(norm2_rows(y))
    broken = ~np.isfinite(norm)
    if broken.any():  # a vector that overflowed float64 contributes nothing (cost 0)
        y[broken] = 0.0
        norm[broken] = 0.0
    clipped = norm > radius
    if clipped.any():  # rows beyond the radius scale by radius/norm (norm > radius ≥ 0)
        y *= np.divide(radius, norm, out=np.ones_like(norm), where=clipped)[:, None]
    r = np.rint(y).astype(np.int64)
    cost = cost_units(r)
    over = cost > cap_units
    if over.any():
        # ‖rint(z)‖ ≤ ‖z‖ + ½·sqrt(d): shrinking the radius by ½·sqrt(d) makes rounding fit
        d = y.shape[1]
        caps = np.broadcast_to(cap_units, (n,))
        yo = y[over]
        shrunk = np.maximum(np.broadcast_to(radius, (n,))[over] - 0.5 * np.sqrt(d), 0.0)
        norm_o = np.sqrt(norm2_rows(yo))
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = np.where(norm_o > shrunk, shrunk / norm_o, 1.0)
        r[over] = np.rint(yo * factor[:, None]).astype(np.int64)
        cost[over] = cost_units(r[over])
        _enforce_cost_cap(r, cost, caps)
    return r, cost


def norm2_rows(y: np.ndarray) -> np.ndarray:
    """``Σ_j y_j²`` per row, summed left to right (columns in order, one IEEE rounding per
    operation, no pairwise or SIMD reassociation as ``einsum`` may do): the clipping decision is
    then the same bits on the server and on every device. Overflow gives ``inf``, which
    :func:`round_to_lattice` handles."""
    with np.errstate(over="ignore"):
        out: np.ndarray = y[:, 0] * y[:, 0] if y.shape[1] else np.zeros(y.shape[0])
        for j in range(1, y.shape[1]):
            out = out + y[:, j] * y[:, j]
    return out


def _enforce_cost_cap(r: np.ndarray, cost: np.ndarray, cap_units: np.ndarray) -> None:
    """Step the largest coordinate toward zero until ``‖r‖² ≤ cap`` (exact; rare fallback)."""
    for i in np.flatnonzero(cost > cap_units):
        row = r[i]
        while int(np.dot(row, row)) > int(cap_units[i]):
            j = int(np.argmax(np.abs(row)))
            row[j] -= np.sign(row[j])
        cost[i] = int(np.dot(row, row))
