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

import numpy as np

from streamfilter.privacy.lattice import Lattice, round_to_lattice

__all__ = ["Exhaustion", "FilterStep", "filter_contributions", "query_vectors"]


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
    n = x.shape[0]
    units, cost = round_to_lattice(x, clip, lattice.granularity, lattice.max_cost_units(clip))
    remaining = budget_units - np.asarray(spent_units, dtype=np.int64)
    if (remaining < 0).any():
        raise ValueError("spent_units exceeds the budget: the ledger is corrupt")
    retired = np.asarray(retired, dtype=bool)
    newly_retired = np.zeros(n, dtype=bool)

    if policy is Exhaustion.CLIP:
        over = cost > remaining
        if over.any():
            u2, c2 = round_to_lattice(x[over], clip, lattice.granularity, remaining[over])
            units[over] = u2
            cost[over] = c2
        admitted = ~retired
    else:
        fits = cost <= remaining  # exact int64 comparison: spent + c ≤ B
        admitted = fits & ~retired
        if policy is Exhaustion.RETIRE:
            newly_retired = ~fits & ~retired
    units *= admitted[:, None]  # refused rows add nothing ...
    cost *= admitted  # ... and are charged nothing
    return FilterStep(units=units, cost_units=cost, admitted=admitted, newly_retired=newly_retired)
