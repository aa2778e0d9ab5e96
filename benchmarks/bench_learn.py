"""Seconds per step of the learning systems, each beside the plain full-batch step.

Arms, on the same data and model (softmax regression), single process:

* ``plain``: one non-private full-batch gradient step (forward, backward, update);
* ``alg6``: private GD (Algorithm 6): per-example norms by the outer-product trick, clipping,
  the clipped sum and Gaussian noise from the OS CSPRNG;
* ``alg7``: private GD with individual filtering (Algorithm 7): as alg6 plus the exact integer
  admission (``filter_squared_norms``, policy clip) and the per-example ledger;
* ``dpsgd``: DP-SGD with Poisson sampling (expected batch 256) and individual accounting
  (norms of all examples every K steps, K = one epoch; RDP rounded up to a C/100 grid), per
  step amortised over two refreshes (2K steps), without the exact/unrounded comparisons;
* ``dpsgd_filter``: DP-SGD with individual Rényi filters (every active example's norm and
  charge at every step, the per-example multi-order filter), same q and steps as ``dpsgd``.

Data: the digits (1,438 × 64) and a synthetic 60,000 × 784 set (``learn.data.synthetic``;
``--quick``: 6,000 × 784). Each value is the median of the stated runs (after one warm-up), the
arms taking turns within each run; ratio = arm ÷ plain. Nothing here asserts a time.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from benchmarks.common import entry
from streamfilter.learn.data import Dataset, digits, one_hot, synthetic
from streamfilter.learn.dpsgd import DEFAULT_ORDERS, DPSGDConfig, dpsgd_individual
from streamfilter.learn.dpsgd_filter import dpsgd_with_individual_filters, worst_case_budgets
from streamfilter.learn.gd import private_gd, private_gd_filtered
from streamfilter.learn.models import SoftmaxRegression
from streamfilter.privacy.noise import SystemRandomBits


def _per_step_interleaved(arms: dict, steps: dict, runs: int) -> dict[str, float]:
    """Median seconds per step of each arm; the arms take turns within every run, so a change in
    the machine's load (it is shared) hits all arms alike."""
    for name, fn in arms.items():
        fn(1 if not name.startswith("dpsgd") else steps[name])  # warm-up
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(runs):
        for name, fn in arms.items():
            t0 = time.perf_counter()
            fn(steps[name])
            times[name].append((time.perf_counter() - t0) / steps[name])
    return {name: statistics.median(v) for name, v in times.items()}


def _arms(data: Dataset, steps: int, runs: int) -> dict[str, float]:
    x, y = data.x_train, data.y_train
    model = SoftmaxRegression(x.shape[1], data.classes)
    y1 = one_hot(y, data.classes)
    bits = SystemRandomBits()

    def plain(k: int) -> None:
        theta = model.init(np.random.default_rng(0))
        for _ in range(k):
            theta = theta - 0.5 * model.backward(theta, x, y1).weighted_gradient_sum(
                np.ones(len(x))
            ) / len(x)

    def alg6(k: int) -> None:
        private_gd(model, x, y, clip=1.0, sigma=10.0, learning_rate=0.5, steps=k, bits=bits)

    def alg7(k: int) -> None:
        private_gd_filtered(
            model, x, y, clip=1.0, sigma=10.0, learning_rate=0.5, b_norm=0.5 * k, k_max=k, bits=bits
        )

    epoch = max(1, math.ceil(len(x) / 256))

    def dpsgd(k: int) -> None:
        cfg = DPSGDConfig(
            clip=1.0,
            noise_multiplier=1.0,
            sampling_rate=min(1.0, 256 / len(x)),
            steps=k,
            learning_rate=0.5,
            norm_every=epoch,
        )
        dpsgd_individual(
            model, x, y, cfg, delta=1e-5, bits=bits, exact_sample=None, compare_unrounded=False
        )

    def dpsgd_filter(k: int) -> None:
        q = min(1.0, 256 / len(x))
        dpsgd_with_individual_filters(
            model,
            x,
            y,
            clip=1.0,
            noise_multiplier=1.0,
            sampling_rate=q,
            learning_rate=0.5,
            steps=k,
            budgets=worst_case_budgets(q, 1.0, k, DEFAULT_ORDERS),
            delta=1e-5,
            bits=bits,
        )

    arms = {
        "plain": plain,
        "alg6": alg6,
        "alg7": alg7,
        "dpsgd": dpsgd,
        "dpsgd_filter": dpsgd_filter,
    }
    counts = {
        "plain": steps,
        "alg6": steps,
        "alg7": steps,
        "dpsgd": 2 * epoch,
        "dpsgd_filter": 2 * epoch,
    }
    out = _per_step_interleaved(arms, counts, runs)
    out["dpsgd_steps"] = 2 * epoch
    return out


def run(quick: bool = False) -> list[dict[str, object]]:
    sets = [(digits(), 20 if quick else 100, 3 if quick else 7)]
    big = synthetic(n=7_000 if quick else 70_000, d=784, seed=0, test_fraction=1 / 7)
    sets.append((big, 2 if quick else 5, 2 if quick else 5))
    entries: list[dict[str, object]] = []
    for data, steps, runs in sets:
        arms = _arms(data, steps, runs)
        size = f"{data.n_train:,} × {data.x_train.shape[1]}, softmax ({(data.x_train.shape[1] + 1) * data.classes:,} params)"
        for arm, label in (
            ("alg6", "private GD (Algorithm 6)"),
            ("alg7", "private GD with individual filtering (Algorithm 7)"),
            ("dpsgd", "DP-SGD, Poisson q = 256/n, individual accounting every epoch"),
            ("dpsgd_filter", "DP-SGD, Poisson q = 256/n, individual Rényi filters every step"),
        ):
            entries.append(
                entry(
                    f"learn_{arm}_step_{data.name}",
                    value=round(arms[arm], 6),
                    unit="s/step",
                    baseline="plain full-batch gradient step (non-private)",
                    baseline_value=round(arms["plain"], 6),
                    ratio=round(arms[arm] / arms["plain"], 2),
                    ratio_definition="value ÷ baseline",
                    runs=runs,
                    size=size
                    + (
                        f", {arms['dpsgd_steps']} steps"
                        if arm.startswith("dpsgd")
                        else f", {steps} steps"
                    ),
                    detail=label,
                )
            )
    return entries
