"""Yu et al.'s findings at small scale: individual ε of DP-SGD on the digits data.

:func:`individual_study` trains softmax regression with DP-SGD (Poisson sampling) and
individual accounting (:mod:`.dpsgd`) and measures, on public benchmark data (so the per-example
values may be looked at by the experimenter; a deployment shows each ε only to its owner):

1. the distribution of individual ε (histogram) against the worst-case ε (Yu et al. §4.1);
2. its correlation with the final per-example training loss (Pearson r of ε and log loss, §4.2);
3. per-class mean ε against per-class test accuracy (§5);
4. estimated ε (norms every K steps, rounded up to a grid of C/100) against ε with exact norms
   at every step (Pearson r, mean and worst absolute error; §3.3);
5. the cost of rounding: RDP evaluations and seconds with and without (Table 1);
6. the mean and quantiles of ε released privately, charged to a stated budget (Table 2).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from streamfilter.privacy.filters import ZCDPFilter
from streamfilter.privacy.noise import RandomBits, SeededRandomBits, SystemRandomBits
from streamfilter.privacy.subsampled import epsilon_from_rdp

from .data import digits
from .dpsgd import DPSGDConfig, dpsgd_individual, release_epsilon_statistics, statistics_rho
from .models import SoftmaxRegression

__all__ = ["DEFAULT_CONFIG", "individual_study"]

#: Batch ≈ 256 of 1,438 (q ≈ 0.178), σ = 2, 120 steps (≈ 21 epochs), norms every 6 steps
#: (≈ once per epoch, Yu et al.'s γ = 1): worst-case ε ≈ 5.4 at δ = 1e-5.
DEFAULT_CONFIG = {
    "clip": 1.0,
    "noise_multiplier": 2.0,
    "batch": 256,
    "steps": 120,
    "learning_rate": 2.0,
    "norm_every": 6,
}
DELTA = 1e-5
STATS_EPSILON = 0.5


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    if a.size < 2 or np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def individual_study(
    *,
    steps: int | None = None,
    exact_sample: int = 300,
    seed: int | None = None,
    stats_epsilon: float = STATS_EPSILON,
) -> dict[str, Any]:
    """Run the study on digits; returns a JSON-ready dict (the ``--json`` format)."""
    data = digits()
    cfg = DEFAULT_CONFIG | ({} if steps is None else {"steps": steps})
    config = DPSGDConfig(
        clip=float(cfg["clip"]),
        noise_multiplier=float(cfg["noise_multiplier"]),
        sampling_rate=float(cfg["batch"]) / data.n_train,
        steps=int(cfg["steps"]),
        learning_rate=float(cfg["learning_rate"]),
        norm_every=int(cfg["norm_every"]),
    )
    bits: RandomBits = SystemRandomBits() if seed is None else SeededRandomBits(seed)
    model = SoftmaxRegression(data.x_train.shape[1], data.classes)
    started = time.perf_counter()
    run = dpsgd_individual(
        model, data.x_train, data.y_train, config, delta=DELTA, bits=bits, exact_sample=exact_sample
    )
    train_seconds = time.perf_counter() - started
    eps = run.ledger.epsilons_nonprivate(public_benchmark_data=True)
    losses = model.losses(run.params, data.x_train, data.y_train)
    test_pred = model.predict(run.params, data.x_test)
    counts, edges = np.histogram(eps, bins=30, range=(0.0, run.worst_case_epsilon * 1.0001))
    per_class = []
    for k in range(data.classes):
        mask, tmask = data.y_train == k, data.y_test == k
        per_class.append(
            {
                "class": k,
                "mean_epsilon": float(eps[mask].mean()),
                "test_accuracy": float(np.mean(test_pred[tmask] == k)) * 100.0,
                "n_train": int(mask.sum()),
            }
        )
    assert run.exact_rdp is not None
    exact = np.asarray(epsilon_from_rdp(run.exact_rdp, config.orders, DELTA))
    estimated = eps[run.exact_indices]
    budget = ZCDPFilter(statistics_rho(stats_epsilon, DELTA))
    released = release_epsilon_statistics(
        run.ledger,
        budget,
        rho=budget.rho_budget,
        epsilon_max=run.worst_case_epsilon,
        quantiles=(0.1, 0.3, 0.5, 0.7, 0.9),
        bins=40,
        delta=DELTA,
        bits=bits,
    )
    return {
        "dataset": data.name,
        "model": "softmax regression",
        "n_train": data.n_train,
        "delta": DELTA,
        "config": {**cfg, "sampling_rate": config.sampling_rate, "orders": list(config.orders)},
        "test_accuracy": float(np.mean(test_pred == data.y_test)) * 100.0,
        "worst_case_epsilon": run.worst_case_epsilon,
        "seconds": train_seconds,
        "epsilon": {
            "min": float(eps.min()),
            "median": float(np.median(eps)),
            "mean": float(eps.mean()),
            "max": float(eps.max()),
            "fraction_at_worst_case": float(np.mean(eps >= run.worst_case_epsilon * (1 - 1e-9))),
            "histogram": {"edges": edges.tolist(), "counts": counts.tolist()},
        },
        "loss_correlation": {
            "pearson_r_epsilon_log_loss": _pearson(eps, np.log(losses)),
            "epsilon": eps.tolist(),
            "log_loss": np.log(losses).tolist(),
        },
        "per_class": per_class,
        "per_class_pearson_r": _pearson(
            np.array([c["mean_epsilon"] for c in per_class]),
            np.array([c["test_accuracy"] for c in per_class]),
        ),
        "estimated_vs_exact": {
            "examples": int(run.exact_indices.size),
            "pearson_r": _pearson(estimated, exact),
            "mean_abs_error": float(np.mean(np.abs(estimated - exact))),
            "max_abs_error": float(np.max(np.abs(estimated - exact))),
            "fraction_estimate_at_least_exact": float(np.mean(estimated >= exact)),
            "estimated": estimated.tolist(),
            "exact": exact.tolist(),
        },
        "rounding_cost": {
            "rdp_evaluations_rounded": run.evaluations["rounded"],
            "rdp_evaluations_unrounded": run.evaluations["unrounded"],
            "seconds_rounded": run.accounting_seconds["rounded"],
            "seconds_unrounded": run.accounting_seconds["unrounded"],
            "rdp_evaluations_exact_every_step": run.evaluations["exact"],
            "seconds_exact_every_step": run.accounting_seconds["exact"],
            "pearson_r_rounded_vs_unrounded": _pearson(eps, np.asarray(run.unrounded_epsilons)),
        },
        "released_statistics": {
            "budget_epsilon": stats_epsilon,
            "budget_delta": DELTA,
            "rho": released.rho,
            "mean": released.mean,
            "quantiles": {str(p): v for p, v in released.quantiles.items()},
            "nonprivate_mean": float(eps.mean()),
            "nonprivate_quantiles": {
                str(p): float(np.quantile(eps, p)) for p in released.quantiles
            },
        },
    }
