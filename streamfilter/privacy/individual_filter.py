"""The individual privacy filter (Feldman & Zrnic, Algorithm 3), vectorised over users.

For one query and a batch of users, each user's contribution is clipped and rounded to the
lattice (``lattice.round_to_lattice``), its exact integer cost ``c = ‖r‖²`` is compared with the
user's remaining integer budget, and only admitted users add ``r`` to the sum.

Privacy argument (why the whole run is ρ-zCDP for every user)
-------------------------------------------------------------
With noise ``N_Z(0, s²)`` per coordinate on the integer sum (``s² = sigma2_units``), a user whose
admitted vector is ``r`` shifts the sum by ``r``; by CKS 2020 (Prop. 5 / Thm. 15, integer shifts)
that release is ``‖r‖²/(2s²)``-zCDP for that user, the same as the continuous Gaussian. Hence the
user's individual Rényi loss at order α is ``α·c/(2s²)`` and the admission rule
``spent + c ≤ B`` is the Rényi filter of Theorem 4.3 applied per user (Remark 4.4 makes it
α-independent); Theorem 4.5 then gives ``(α, α·B/(2s²))``-RDP for all α, i.e.
``B/(2s²)``-zCDP, and ``B/(2s²) ≤ B_norm/(2σ²) = ρ`` because ``B = floor(B_norm/γ²)`` and
``s² = ceil(σ²/γ²)``. The decision uses only the user's own record and their own past admitted
costs (which depend on earlier *published* queries only), never other users — docs/design.md §6.6.

Exhaustion policies
-------------------
``skip``   exactly Algorithm 3: a refused user contributes nothing now but may be admitted by a
           later, cheaper query.
``retire`` after the first refusal the user never contributes again (a post-processing of the
           Algorithm 3 state, so the same guarantee holds).
``clip``   Algorithm 7: a contribution that does not fit is re-clipped to the remaining budget
           (radius ``sqrt(B − spent)`` lattice units) so it fits exactly; the cost charged is the
           squared norm of the re-rounded vector, so the filter invariant is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

import numpy as np

from streamfilter._native import load
from streamfilter.privacy.lattice import Lattice, round_to_lattice

if TYPE_CHECKING:  # the block filter's native twin (privacy/_filter.c), identical results
    from streamfilter.privacy import _filter
else:  # None where the Python path runs (streamfilter._native: STREAMFILTER_IMPL)
    _filter = load("privacy._filter")

__all__ = [
    "Exhaustion",
    "FilterStep",
    "FilterTotals",
    "NormFilterStep",
    "filter_contributions",
    "filter_squared_norms",
    "filter_totals",
    "query_vectors",
    "totals_of",
]


class Exhaustion(StrEnum):
    SKIP = "skip"
    RETIRE = "retire"
    CLIP = "clip"


@dataclass(frozen=True)
class FilterStep:
    """Result of one query's admission over a batch of users (nothing is mutated).

    ``units``: (n, d) int64 vectors actually added (zero rows for refused users);
    ``cost_units``: (n,) int64 charged = ``‖units‖²`` row-wise; ``admitted``: (n,) bool;
    ``newly_retired``: (n,) bool (policy ``retire`` only).
    """

    units: np.ndarray
    cost_units: np.ndarray
    admitted: np.ndarray
    newly_retired: np.ndarray


def query_vectors(records: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Each row's unclipped vector ``Σ_k records[:, k]·weights[k]`` (data units, (n, d)).

    ``records``: (n, k) values of the query's coordinates; ``weights``: (k, d). Identity weights
    (``sum``, ``histogram``) select the columns; otherwise each output is summed over ``k`` left
    to right with one IEEE rounding per product and per addition (no BLAS, no fused
    multiply-add, whose use depends on the BLAS build and the number of rows), so the server
    and every device compute the same bits, whatever their numpy build.
    """
    records = np.asarray(records, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    k, d = weights.shape
    if records.ndim != 2 or records.shape[1] != k:
        raise ValueError(f"records must be (n, {k}), got shape {records.shape}")
    if k == d and np.array_equal(weights, np.eye(d)):
        return records
    out = np.empty((records.shape[0], d), dtype=np.float64, order="F")
    for j in range(d):
        col = records[:, 0] * weights[0, j]
        for i in range(1, k):
            col = col + records[:, i] * weights[i, j]
        out[:, j] = col
    return out


def filter_contributions(
    x: np.ndarray,
    clip: float,
    lattice: Lattice,
    spent_units: np.ndarray,
    retired: np.ndarray,
    budget_units: int,
    policy: Exhaustion,
) -> FilterStep:
    """Admit rows of ``x`` (data units, (n, d)) under the individual filter.

    ``spent_units`` (n,) int64 and ``retired`` (n,) bool describe each user's state *before* this
    query; the caller commits ``spent_units + cost_units`` only when the whole day commits
    (check, then commit).
    """
    units, cost = round_to_lattice(x, clip, lattice.granularity, lattice.max_cost_units(clip))
    remaining = _remaining_units(spent_units, budget_units)
    decision = _admission(cost, remaining, retired, policy)
    if decision.reclip.any():  # policy clip: re-clip to the remaining budget so it fits exactly
        u2, c2 = round_to_lattice(
            x[decision.reclip], clip, lattice.granularity, remaining[decision.reclip]
        )
        units[decision.reclip] = u2
        cost[decision.reclip] = c2
    units *= decision.admitted[:, None]  # refused rows add nothing ...
    cost *= decision.admitted  # ... and are charged nothing
    return FilterStep(
        units=units,
        cost_units=cost,
        admitted=decision.admitted,
        newly_retired=decision.newly_retired,
    )


@dataclass(frozen=True)
class FilterTotals:
    """What a day close keeps of one query's :class:`FilterStep` over a block of users.

    ``total_units``: (d,) int64, the exact sum of the admitted rows' lattice vectors;
    ``cost_units``, ``admitted``, ``newly_retired``: as in :class:`FilterStep`;
    ``admitted_nonzero`` / ``refused_nonzero``: admitted / refused rows whose ``x`` is not all
    zero (the release's exact counts, never published raw).
    """

    total_units: np.ndarray
    cost_units: np.ndarray
    admitted: np.ndarray
    newly_retired: np.ndarray
    admitted_nonzero: int
    refused_nonzero: int


def totals_of(step: FilterStep, x: np.ndarray) -> FilterTotals:
    """The :class:`FilterTotals` of a :class:`FilterStep` over the rows ``x``."""
    nonzero = (np.asarray(x) != 0).any(axis=1)
    return FilterTotals(
        total_units=step.units.sum(axis=0, dtype=np.int64),
        cost_units=step.cost_units,
        admitted=step.admitted,
        newly_retired=step.newly_retired,
        admitted_nonzero=int(np.count_nonzero(step.admitted & nonzero)),
        refused_nonzero=int(np.count_nonzero(~step.admitted & nonzero)),
    )


#: the policies' codes in privacy/_filter.c
_POLICY_CODE = {Exhaustion.SKIP: 0, Exhaustion.RETIRE: 1, Exhaustion.CLIP: 2}


def filter_totals(
    x: np.ndarray,
    clip: float,
    lattice: Lattice,
    spent_units: np.ndarray,
    retired: np.ndarray,
    budget_units: int,
    policy: Exhaustion,
) -> FilterTotals:
    """:func:`filter_contributions` over a block of users, summed (nothing is mutated).

    The day close's form: it keeps each row's cost and decision and only the sum of the admitted
    lattice vectors. With ``privacy/_filter.c`` built, the rows go 256 at a time through the
    same IEEE operations in the same order and the same exact int64 costs as
    ``round_to_lattice`` and ``_admission``, so the result is identical
    (tests/privacy/test_filter.py), without the (n, d) temporaries; else
    ``totals_of(filter_contributions(...))``.
    """
    x = np.asarray(x, dtype=np.float64)
    if _filter is None or x.ndim != 2:
        step = filter_contributions(x, clip, lattice, spent_units, retired, budget_units, policy)
        return totals_of(step, x)
    total, cost, admitted, newly, n_admitted, n_refused = _filter.filter_totals(
        x,
        float(clip),
        float(lattice.granularity),
        lattice.max_cost_units(clip),
        np.ascontiguousarray(spent_units, dtype=np.int64),
        np.ascontiguousarray(retired, dtype=bool),
        int(budget_units),
        _POLICY_CODE[policy],
    )
    return FilterTotals(
        total_units=np.frombuffer(total, np.int64),
        cost_units=np.frombuffer(cost, np.int64),
        admitted=np.frombuffer(admitted, bool),
        newly_retired=np.frombuffer(newly, bool),
        admitted_nonzero=n_admitted,
        refused_nonzero=n_refused,
    )


@dataclass(frozen=True)
class NormFilterStep:
    """Result of :func:`filter_squared_norms` (nothing is mutated).

    ``scale``: (n,) float64 factor in [0, 1] to multiply each row's vector by (0 for refused
    rows); ``cost_units``: (n,) int64 charged, an upper bound on ``‖scale·x‖²/γ²`` (see the
    function); ``admitted``, ``newly_retired``: as in :class:`FilterStep`.
    """

    scale: np.ndarray
    cost_units: np.ndarray
    admitted: np.ndarray
    newly_retired: np.ndarray


#: The clip radius is shrunk by this relative amount, and uncapped costs grown by twice it, so
#: that the float error of a computed norm (≤ d·2^-53 relative for d ≤ 2^20 terms, far below
#: 2^-30) cannot make the true squared norm of ``scale·x`` exceed the integer cost charged.
_NORM_SLACK = 2.0**-30


def filter_squared_norms(
    norm2: np.ndarray,
    clip: float,
    lattice: Lattice,
    spent_units: np.ndarray,
    retired: np.ndarray,
    budget_units: int,
    policy: Exhaustion,
) -> NormFilterStep:
    """The admission of :func:`filter_contributions` for rows known only by ``‖x_i‖²``.

    For vectors too large to materialise (a model's per-example gradients: n × d with d in the
    thousands), the caller passes each row's squared norm (data units², (n,) float64) and gets
    back a scale factor per row; the caller adds ``Σ_i scale_i·x_i`` itself. The same integer
    rule decides admission (:func:`_admission`, shared with the vector path): each row is clipped
    to ``γ·sqrt(cap)`` with ``cap = floor(C²/γ²)`` lattice units, costs ``c`` units, and is
    admitted iff ``spent + c <= B`` (exact int64), or, under policy ``clip`` (Algorithm 7),
    re-clipped to ``γ·sqrt(B − spent)`` so it fits exactly.

    Cost of a row (why it bounds what is added): ``scale = min(1, sqrt(cap)·(1 − 2^-30)/‖x/γ‖)``
    and ``cost = min(cap, ceil(scale²·‖x/γ‖²·(1 + 2^-29)))``. Both terms of the ``min`` are
    upper bounds on the true ``‖scale·x‖²/γ²``: the first because the radius was shrunk below
    ``sqrt(cap)`` by more than the norm's float error, the second because it was grown by more
    than that error. So the charge is never below the squared norm actually added, and exceeds
    it by at most one unit plus the relative slack.

    Rows with a non-finite norm contribute nothing and are charged nothing (as in
    :func:`~streamfilter.privacy.lattice.round_to_lattice`).
    """
    norm2 = np.asarray(norm2, dtype=np.float64)
    if norm2.ndim != 1:
        raise ValueError(f"norm2 must be a 1-D array of squared norms, got shape {norm2.shape}")
    if (norm2 < 0).any():
        raise ValueError(f"norm2 must be >= 0, got min(norm2)={float(norm2.min())!r}")
    cap = lattice.max_cost_units(clip)
    y2 = norm2 / (lattice.granularity * lattice.granularity)
    scale, cost = _scale_to_cap(y2, np.full(norm2.shape, cap, np.int64))
    remaining = _remaining_units(spent_units, budget_units)
    decision = _admission(cost, remaining, retired, policy)
    if decision.reclip.any():
        s2, c2 = _scale_to_cap(y2[decision.reclip], remaining[decision.reclip])
        scale[decision.reclip] = s2
        cost[decision.reclip] = c2
    scale *= decision.admitted
    cost *= decision.admitted
    return NormFilterStep(
        scale=scale,
        cost_units=cost,
        admitted=decision.admitted,
        newly_retired=decision.newly_retired,
    )


def _scale_to_cap(y2: np.ndarray, cap_units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row scale to radius ``sqrt(cap)·(1 − slack)`` and its integer cost (see above)."""
    broken = ~np.isfinite(y2)
    y2 = np.where(broken, 0.0, y2)
    cap_f = cap_units.astype(np.float64)
    radius = np.sqrt(cap_f) * (1.0 - _NORM_SLACK)
    norm = np.sqrt(y2)
    scale = np.ones_like(y2)
    over = norm > radius
    scale[over] = radius[over] / norm[over]
    scale[broken] = 0.0
    grown = np.ceil(scale * scale * y2 * (1.0 + 2.0 * _NORM_SLACK))
    # ``grown < float(cap)`` implies grown <= cap as integers (see lattice caps <= 2^62)
    below = grown < cap_f
    cost = np.where(below, grown, 0.0).astype(np.int64)
    cost = np.where(below, cost, cap_units)
    return scale, np.minimum(cost, cap_units)


@dataclass(frozen=True)
class _Decision:
    admitted: np.ndarray
    newly_retired: np.ndarray
    reclip: np.ndarray


def _remaining_units(spent_units: np.ndarray, budget_units: int) -> np.ndarray:
    remaining: np.ndarray = budget_units - np.asarray(spent_units, dtype=np.int64)
    if (remaining < 0).any():
        raise ValueError("spent_units exceeds the budget: the ledger is corrupt")
    return remaining


def _admission(
    cost: np.ndarray, remaining: np.ndarray, retired: np.ndarray, policy: Exhaustion
) -> _Decision:
    """The one admission rule (Algorithm 3 / Algorithm 7), on exact int64 costs.

    A row fits iff ``cost <= remaining`` (i.e. ``spent + c <= B``). ``skip``: admit rows that fit.
    ``retire``: the same, and rows that do not fit retire. ``clip``: admit every live row; the
    rows that do not fit are returned in ``reclip`` for the caller to re-clip to ``remaining``.
    Retired rows are never admitted.
    """
    retired = np.asarray(retired, dtype=bool)
    fits = cost <= remaining  # exact int64 comparison: spent + c ≤ B
    newly_retired = np.zeros(cost.shape, dtype=bool)
    if policy is Exhaustion.CLIP:
        admitted = ~retired
        reclip = ~fits & admitted
    else:
        admitted = fits & ~retired
        reclip = np.zeros(cost.shape, dtype=bool)
        if policy is Exhaustion.RETIRE:
            newly_retired = ~fits & ~retired
    return _Decision(admitted=admitted, newly_retired=newly_retired, reclip=reclip)
