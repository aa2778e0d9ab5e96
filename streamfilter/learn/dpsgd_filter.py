"""DP-SGD with individual Rényi filters (Feldman & Zrnic Algorithm 3 and Remark 4.4 in DP-SGD).

Each step samples every *active* example with probability q (Poisson), clips the sampled
gradients to C, adds ``N(0, σ²C²·I)`` and steps by ``η·(sum + noise)/(q·n)`` — plain DP-SGD —
and, before sampling, charges every active example the RDP its step will cost it:

* example i's gradient norm ``‖g_i(θ_{t−1})‖`` is measured for *every* active example at the
  current iterate, sampled or not (whether i is sampled is exactly what the subsampling hides:
  charging only sampled examples would make the ledger, and so the drop time, depend on it);
* its clipped norm ``min(‖g_i‖, C)`` is rounded *up* to the grid ``{C/100, 2C/100, …, C}``,
  ``Δ̄_i``, and the charge at order α is ``rdp_poisson_gaussian(q, σC/Δ̄_i, α)``, the
  subsampled Gaussian's RDP for sensitivity Δ̄_i (Mironov, Talwar & Zhang 2019; non-decreasing in
  the sensitivity, so rounding up gives an upper bound);
* :class:`streamfilter.privacy.filters.IndividualMultiOrderFilters` (Remark 4.4 per example)
  continues iff the charge fits at every order; an example that does not fit is *dropped*:
  excluded from this and every later step, its ledger unchanged.

Guarantee (docs/learning.md, "DP-SGD with individual filters", has the proof): with per-order
budgets ``B_α``, the run is ``(α, B_α)``-RDP for every tracked α (add/remove adjacency) for any
number of steps, hence (ε, δ)-DP with ``ε = epsilon_from_rdp(B, orders, δ)``. Choosing
``B_α = T·⌈rdp(q, σ, α)⌉`` makes the first T steps plain DP-SGD (no example can be dropped
before step T: each step costs at most the worst-case row) with plain DP-SGD's guarantee; after
T the examples with small gradients keep training.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamfilter.privacy.filters import IndividualMultiOrderFilters
from streamfilter.privacy.noise import RandomBits, SeededRandomBits, SystemRandomBits, gaussian
from streamfilter.privacy.subsampled import epsilon_from_rdp, rdp_poisson_gaussian

from .data import Dataset, digits, one_hot, synthetic
from .dpsgd import DEFAULT_ORDERS
from .models import Model, SoftmaxRegression

__all__ = [
    "FilteredDPSGDRun",
    "compare_filtered_dpsgd",
    "dpsgd_with_individual_filters",
    "worst_case_budgets",
]

#: Grid of sensitivities: ``C/GRID_STEPS`` apart.
GRID_STEPS = 100


@dataclass
class FilteredDPSGDRun:
    """``params``: the last iterate. ``epsilon``: the run's guarantee at ``delta`` (from the
    budgets). ``active``: active examples after each step and ``dropped_at``: the step each
    example was dropped at (0: never) and ``spent``: the (n, orders) charged RDP — functions of
    the private data, diagnostics for public benchmark data only."""

    params: np.ndarray
    steps: int
    budgets: np.ndarray
    epsilon: float
    delta: float
    active: list[int] = field(default_factory=list)
    dropped_at: np.ndarray | None = None
    spent: np.ndarray | None = None


def _charge_table(
    filters: IndividualMultiOrderFilters, q: float, sigma: float, orders: tuple[float, ...]
) -> np.ndarray:
    """Row k: the units charged for a clipped norm in ((k−1)·C/100, k·C/100] (row 0: norm 0)."""
    k = np.arange(GRID_STEPS + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        z = sigma * GRID_STEPS / k  # σC/(k·C/100)
    return filters.units(rdp_poisson_gaussian(q, z, orders))


def worst_case_budgets(
    sampling_rate: float, noise_multiplier: float, steps: int, orders: tuple[float, ...]
) -> np.ndarray:
    """``B_α = T·⌈rdp(q, σ, α)⌉`` (in the filters' units, rounded up): plain DP-SGD's T steps.

    Plain DP-SGD with T steps is ``(α, T·rdp(q, σ, α))``-RDP <= these budgets, so both arms of
    a comparison are stated at the same (ε, δ)."""
    probe = IndividualMultiOrderFilters(1, orders, np.zeros(len(orders)))
    per_step = probe.units(rdp_poisson_gaussian(sampling_rate, noise_multiplier, orders))
    out: np.ndarray = steps * per_step.astype(np.float64) * 2.0**-40
    return out


def dpsgd_with_individual_filters(
    model: Model,
    x: np.ndarray,
    y: np.ndarray,
    *,
    clip: float,
    noise_multiplier: float,
    sampling_rate: float,
    learning_rate: float,
    steps: int,
    budgets: np.ndarray,
    delta: float,
    orders: tuple[float, ...] = DEFAULT_ORDERS,
    bits: RandomBits | None = None,
    params: np.ndarray | None = None,
) -> FilteredDPSGDRun:
    """Run ``steps`` steps of DP-SGD with one multi-order Rényi filter per example (module
    docstring). ``(α, budgets[α])``-RDP for every order, whatever ``steps`` is."""
    if not (math.isfinite(clip) and clip > 0 and noise_multiplier > 0):
        raise ValueError(
            f"need clip > 0 and noise_multiplier > 0, got {clip!r}, {noise_multiplier!r}"
        )
    if not 0.0 < sampling_rate <= 1.0 or steps < 1:
        raise ValueError(
            f"need 0 < sampling_rate <= 1 and steps >= 1, got {sampling_rate!r}, {steps}"
        )
    bits = SystemRandomBits() if bits is None else bits
    n = x.shape[0]
    y1 = one_hot(y, model.classes)
    filters = IndividualMultiOrderFilters(n, orders, budgets)
    table = _charge_table(filters, sampling_rate, noise_multiplier, orders)
    grid = clip / GRID_STEPS
    threshold = np.uint64(min(int(sampling_rate * 2.0**64), 2**64 - 1))
    theta = model.init(np.random.default_rng(0)) if params is None else params.copy()
    active = np.arange(n)
    dropped_at = np.zeros(n, np.int64)
    run = FilteredDPSGDRun(
        params=theta,
        steps=steps,
        budgets=np.asarray(filters.budgets),
        epsilon=float(epsilon_from_rdp(np.asarray(filters.budgets), orders, delta)),
        delta=delta,
    )
    for t in range(1, steps + 1):
        total = np.zeros(theta.size)
        if active.size:
            step = model.backward(theta, x[active], y1[active])
            norms = np.sqrt(step.grad_norm2())
            k = np.minimum(np.ceil(np.minimum(norms, clip) / grid), GRID_STEPS).astype(np.int64)
            ok = filters.spend(active, table[k])  # charged whether sampled or not
            dropped_at[active[~ok]] = t
            # Poisson sampling among the examples that continue (fresh bits every step)
            sampled = ok & (bits.uint64(active.size) < threshold) if sampling_rate < 1 else ok
            scale = np.where(norms > clip, clip / np.maximum(norms, 1e-300), 1.0) * sampled
            total = step.weighted_gradient_sum(scale)
            active = active[ok]
        noise = gaussian(bits, noise_multiplier * clip, theta.size)
        theta = theta - learning_rate * (total + noise) / (sampling_rate * n)
        run.active.append(int(active.size))
    run.params = theta
    run.dropped_at = dropped_at
    run.spent = filters.spent()
    return run


#: Per data set: (clip, noise multiplier, expected batch, plain steps T, learning rate).
CONFIGS: dict[str, tuple[float, float, int, int, float]] = {
    "digits": (1.0, 2.0, 256, 120, 2.0),
    "synthetic": (1.0, 1.2, 1024, 120, 2.0),
}
DELTA = 1e-5


def _dataset(name: str) -> Dataset:
    if name == "digits":
        return digits()
    if name == "synthetic":
        # ≥ 60,000 training examples, 64 features (small model, vectorised numpy)
        return synthetic(n=70_000, d=64, seed=0, test_fraction=1 / 7)
    raise ValueError(f"dataset must be 'digits' or 'synthetic', got dataset={name!r}")


def compare_filtered_dpsgd(
    dataset: str,
    *,
    trials: int,
    extra_factor: float = 2.0,
    clip_factor: float = 1.0,
    seed: int | None = None,
) -> dict[str, Any]:
    """Plain DP-SGD (T steps) against DP-SGD with individual filters (``extra_factor·T`` steps)
    at the same (ε, δ): the budgets ``B_α = T·⌈rdp(q, σ, α)⌉`` for both. ``clip_factor``
    multiplies the configured C (noise multiplier, hence ε, unchanged: a mistuned, too large
    clip). Test accuracy (%) mean and standard deviation over ``trials``, and the active
    examples over time (non-private diagnostic: public benchmark data)."""
    if trials < 1 or extra_factor < 1.0:
        raise ValueError(f"need trials >= 1 and extra_factor >= 1, got {trials}, {extra_factor}")
    data = _dataset(dataset)
    clip, sigma, batch, steps, lr = CONFIGS[dataset]
    clip *= clip_factor
    q = batch / data.n_train
    orders = DEFAULT_ORDERS
    budgets = worst_case_budgets(q, sigma, steps, orders)
    model = SoftmaxRegression(data.x_train.shape[1], data.classes)
    k_max = math.ceil(extra_factor * steps)
    arms: dict[str, list[float]] = {"plain": [], "filtered": []}
    actives: list[list[int]] = []
    first_drop: list[int] = []
    started = time.perf_counter()
    epsilon = math.nan
    for trial in range(trials):
        for arm, k in (("plain", steps), ("filtered", k_max)):
            bits: RandomBits = (
                SystemRandomBits()
                if seed is None
                else SeededRandomBits(seed + 2 * trial + (arm == "filtered"))
            )
            run = dpsgd_with_individual_filters(
                model,
                data.x_train,
                data.y_train,
                clip=clip,
                noise_multiplier=sigma,
                sampling_rate=q,
                learning_rate=lr,
                steps=k,
                budgets=budgets,
                delta=DELTA,
                orders=orders,
                bits=bits,
            )
            epsilon = run.epsilon
            acc = 100.0 * float(np.mean(model.predict(run.params, data.x_test) == data.y_test))
            arms[arm].append(acc)
            if arm == "plain":
                assert run.active[-1] == data.n_train  # nobody is dropped within T steps
            else:
                actives.append(run.active)
                assert run.dropped_at is not None
                dropped = run.dropped_at[run.dropped_at > 0]
                first_drop.append(int(dropped.min()) if dropped.size else 0)
    marks = (math.ceil(steps * f) for f in (1.25, 1.5, 1.75))
    checkpoints = sorted({steps, *(c for c in marks if c <= k_max), k_max})
    mean_active = np.mean(np.asarray(actives, dtype=np.float64), axis=0)
    plain_eps = float(
        epsilon_from_rdp(steps * rdp_poisson_gaussian(q, sigma, orders), orders, DELTA)
    )
    return {
        "dataset": data.name,
        "model": "softmax regression",
        "n_train": data.n_train,
        "clip": clip,
        "clip_factor": clip_factor,
        "noise_multiplier": sigma,
        "sampling_rate": q,
        "learning_rate": lr,
        "plain_steps": steps,
        "filtered_steps": k_max,
        "delta": DELTA,
        "epsilon": epsilon,
        "epsilon_plain_exact_rdp": plain_eps,
        "orders": list(orders),
        "trials": trials,
        "plain_mean": statistics.fmean(arms["plain"]),
        "plain_std": statistics.stdev(arms["plain"]) if trials > 1 else 0.0,
        "filtered_mean": statistics.fmean(arms["filtered"]),
        "filtered_std": statistics.stdev(arms["filtered"]) if trials > 1 else 0.0,
        "first_drop_step_mean": statistics.fmean(first_drop),
        "active_fraction_at_step": {
            str(c): float(mean_active[c - 1]) / data.n_train for c in checkpoints
        },
        "seconds": time.perf_counter() - started,
    }
