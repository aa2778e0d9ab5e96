"""DP-SGD with Poisson sampling and individual privacy accounting (Yu et al., Algorithms 1–2).

Training is plain DP-SGD (Abadi et al. 2016): each step samples every example independently
with probability q, clips the sampled gradients to norm C, adds ``N(0, σ²C²·I)`` and steps by
``η·(sum + noise)/(q·n)``. Its worst-case guarantee is the subsampled Gaussian's RDP at noise
multiplier σ, composed over the steps.

Individual accounting (Algorithm 2) runs beside it and never changes the update (Remark 1).
Every ``K`` steps the gradient norms of *all* examples are re-estimated at the current model;
example i's estimate ``Z_i = min(‖g_i‖, C)`` is **rounded up** to the grid ``{r, 2r, …, C}``
(``r = grid_fraction·C``; Yu et al. round to the nearest point, we round up so the estimate is
never below the measured norm), and each step adds, per order α, the RDP of the subsampled
Gaussian with noise multiplier ``σC/Z_i`` (:func:`streamfilter.privacy.subsampled.
rdp_poisson_gaussian`) to the example's ledger. Rounding bounds the number of distinct RDP
evaluations by ``⌈C/r⌉`` for the whole run (each is cached); without it every refresh evaluates
n of them. As in the paper, between refreshes the norms are estimates: Theorem 3.1's exact
guarantee needs ``K = 1`` without rounding, which :func:`dpsgd_individual` also computes (the
``exact`` ledger, norms at every step) so the two can be compared.

Who may see what (Yu et al. §3.4): an example's ε is released only to its owner
(:meth:`IndividualLedger.epsilon_for`, which needs that example's owner token); aggregate
statistics are released with Gaussian noise charged to a stated zCDP budget
(:func:`release_epsilon_statistics`).
"""

from __future__ import annotations

import hmac
import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from streamfilter.privacy.accounting import calibrate_rho, epsilon_from_rho_gdp, sigma_for_rho
from streamfilter.privacy.filters import ZCDPFilter
from streamfilter.privacy.noise import RandomBits, SystemRandomBits, gaussian
from streamfilter.privacy.subsampled import epsilon_from_rdp, rdp_poisson_gaussian

from .data import one_hot
from .models import Model

__all__ = [
    "DEFAULT_ORDERS",
    "HISTOGRAM_SENSITIVITY",
    "STATISTICS_ADJACENCY",
    "DPSGDConfig",
    "DPSGDRun",
    "EpsilonStatistics",
    "IndividualLedger",
    "dpsgd_individual",
    "release_epsilon_statistics",
]

#: Rényi orders tracked (integer orders: binomial sum; fractional ones: quadrature, rounded up).
DEFAULT_ORDERS: tuple[float, ...] = (
    1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0,
)  # fmt: skip


@dataclass(frozen=True)
class DPSGDConfig:
    """DP-SGD and accounting parameters. ``noise_multiplier`` σ: noise std ÷ C.
    ``norm_every`` K: steps between gradient-norm refreshes. ``grid_fraction``: r/C."""

    clip: float
    noise_multiplier: float
    sampling_rate: float
    steps: int
    learning_rate: float
    norm_every: int = 10
    grid_fraction: float = 0.01
    orders: tuple[float, ...] = DEFAULT_ORDERS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be > 0, got clip={self.clip!r}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(
                f"noise_multiplier must be > 0, got noise_multiplier={self.noise_multiplier!r}"
            )
        if not 0.0 < self.sampling_rate <= 1.0:
            raise ValueError(f"sampling_rate must be in (0, 1], got {self.sampling_rate!r}")
        if self.steps < 1 or self.norm_every < 1:
            raise ValueError(
                f"steps and norm_every must be >= 1, got steps={self.steps}, "
                f"norm_every={self.norm_every}"
            )
        if not 0.0 < self.grid_fraction <= 1.0:
            raise ValueError(f"grid_fraction must be in (0, 1], got {self.grid_fraction!r}")


class IndividualLedger:
    """Per-example accumulated RDP (n × orders); each ε is shown to its owner only.

    :meth:`issue_tokens` returns one secret token per example, once (the caller hands each to
    that example's owner); :meth:`epsilon_for` needs the token. The accumulated RDP and the ε
    of any example are functions of the private data: nothing here returns them in bulk except
    :meth:`epsilons_nonprivate`, for studies on public benchmark data (the reproduction), and
    :func:`release_epsilon_statistics`, which adds noise and charges a budget.
    """

    def __init__(self, n: int, orders: Sequence[float], delta: float) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got n={n}")
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got delta={delta!r}")
        self._orders = tuple(float(a) for a in orders)
        self._delta = float(delta)
        self._rdp = np.zeros((n, len(self._orders)))
        self._tokens: list[str] | None = None
        self._issued = False

    @property
    def n(self) -> int:
        return int(self._rdp.shape[0])

    @property
    def orders(self) -> tuple[float, ...]:
        return self._orders

    @property
    def delta(self) -> float:
        return self._delta

    def add(self, rdp_rows: np.ndarray) -> None:
        """Compose one step: add each example's per-order RDP (n × orders, >= 0)."""
        rows = np.asarray(rdp_rows, dtype=np.float64)
        if rows.shape != self._rdp.shape or np.any(~(rows >= 0)):
            raise ValueError(f"rdp_rows must be {self._rdp.shape} and >= 0, got {rows.shape}")
        self._rdp += rows

    def issue_tokens(self) -> list[str]:
        """One secret token per example (its owner's credential). Issued once."""
        if self._issued:
            raise RuntimeError("owner tokens were already issued")
        self._issued = True
        self._tokens = [secrets.token_urlsafe(16) for _ in range(self.n)]
        return list(self._tokens)

    def epsilon_for(self, index: int, token: str) -> float:
        """Example ``index``'s ε at the ledger's δ (CKS conversion, best order) — for its owner.

        Raises ``PermissionError`` unless ``token`` is that example's owner token.
        """
        if self._tokens is None or not 0 <= index < self.n:
            raise PermissionError("no owner token was issued for this example")
        if not hmac.compare_digest(self._tokens[index].encode(), str(token).encode()):
            raise PermissionError(f"the token is not the owner token of example {index}")
        return float(epsilon_from_rdp(self._rdp[index], self._orders, self._delta))

    def epsilons_nonprivate(self, *, public_benchmark_data: bool = False) -> np.ndarray:
        """Every example's ε. NOT PRIVATE: for studies on public benchmark data only.

        The caller must say so (``public_benchmark_data=True``); otherwise ``PermissionError``.
        """
        if public_benchmark_data is not True:
            raise PermissionError(
                "individual ε values are private; pass public_benchmark_data=True only for "
                "studies on public benchmark data, or use epsilon_for / release_epsilon_statistics"
            )
        return self._epsilons()

    def _epsilons(self) -> np.ndarray:
        return np.asarray(epsilon_from_rdp(self._rdp, self._orders, self._delta))


@dataclass
class DPSGDRun:
    """A finished run: the model, the ledgers and what the accounting cost.

    ``ledger``: the estimated individual RDP (norms every K steps, rounded up to the grid);
    ``exact_rdp``: (len(exact_indices), orders), norms at every step, unrounded (Theorem 3.1's
    accounting) for the examples ``exact_indices``;
    ``evaluations``/``accounting_seconds``: RDP evaluations and seconds spent on them, with
    rounding (``"rounded"``) and, for the same norms, without (``"unrounded"``).
    """

    params: np.ndarray
    ledger: IndividualLedger
    exact_rdp: np.ndarray | None
    exact_indices: np.ndarray
    worst_case_epsilon: float
    evaluations: dict[str, int] = field(default_factory=dict)
    accounting_seconds: dict[str, float] = field(default_factory=dict)
    unrounded_epsilons: np.ndarray | None = None


def _grid_index(norms: np.ndarray, clip: float, grid: float) -> np.ndarray:
    """Index k of the grid point ``k·r`` that rounds ``min(norm, C)`` *up* (k <= ⌈C/r⌉)."""
    top = math.ceil(clip / grid - 1e-12)
    idx = np.ceil(np.minimum(norms, clip) / grid).astype(np.int64)
    return np.minimum(idx, top)


def dpsgd_individual(
    model: Model,
    x: np.ndarray,
    y: np.ndarray,
    config: DPSGDConfig,
    *,
    delta: float,
    bits: RandomBits | None = None,
    params: np.ndarray | None = None,
    exact_sample: int | None = 300,
    compare_unrounded: bool = True,
) -> DPSGDRun:
    """Run DP-SGD (Yu et al. Algorithm 1) with individual accounting (Algorithm 2, rounded up).

    ``exact_sample``: also keep the exact ledger (norm at every step, no rounding) for that many
    examples chosen with a fixed public seed (all if larger than n; None: none) — Yu et al.
    §3.3 sample 1,000 examples the same way.
    ``compare_unrounded``: at each refresh also evaluate the unrounded RDP of the same norms,
    timed separately (the cost of rounding), and keep the resulting ε.
    """
    bits = SystemRandomBits() if bits is None else bits
    n = x.shape[0]
    c, q, sigma = config.clip, config.sampling_rate, config.noise_multiplier
    orders = config.orders
    y1 = one_hot(y, model.classes)
    theta = model.init(np.random.default_rng(0)) if params is None else params.copy()
    ledger = IndividualLedger(n, orders, delta)
    unrounded = np.zeros((n, len(orders))) if compare_unrounded else None
    exact_rdp = None
    exact_idx = np.zeros(0, np.int64)
    if exact_sample is not None:
        exact_idx = np.sort(np.random.default_rng(1).permutation(n)[: min(exact_sample, n)])
        exact_rdp = np.zeros((exact_idx.size, len(orders)))
    grid = config.grid_fraction * c
    cache: dict[int, np.ndarray] = {}
    evaluations = {"rounded": 0, "unrounded": 0, "exact": 0}
    seconds = {"rounded": 0.0, "unrounded": 0.0, "exact": 0.0}
    threshold = np.uint64(min(int(q * 2.0**64), 2**64 - 1))
    # Algorithm 1: estimates start at C (every example assumed worst case until measured)
    step_rdp = np.broadcast_to(rdp_poisson_gaussian(q, sigma, orders), (n, len(orders)))
    step_unrounded = step_rdp
    for t in range(config.steps):
        need_norms = t % config.norm_every == 0
        if need_norms:
            norms = np.sqrt(model.backward(theta, x, y1).grad_norm2())
            t0 = time.perf_counter()
            idx = _grid_index(norms, c, grid)
            missing = np.setdiff1d(np.unique(idx), np.fromiter(cache, np.int64, len(cache)))
            if missing.size:
                with np.errstate(divide="ignore"):
                    z = sigma * c / (missing * grid)
                for k, row in zip(missing, rdp_poisson_gaussian(q, z, orders), strict=True):
                    cache[int(k)] = row
                evaluations["rounded"] += int(missing.size)
            table = np.zeros((int(idx.max()) + 1, len(orders)))
            for k in np.unique(idx):
                table[k] = cache[int(k)]
            step_rdp = table[idx]
            seconds["rounded"] += time.perf_counter() - t0
            if unrounded is not None:
                t0 = time.perf_counter()
                with np.errstate(divide="ignore"):
                    step_unrounded = rdp_poisson_gaussian(
                        q, sigma * c / np.minimum(norms, c), orders
                    )
                evaluations["unrounded"] += n
                seconds["unrounded"] += time.perf_counter() - t0
        ledger.add(step_rdp)
        if unrounded is not None:
            unrounded += step_unrounded
        if exact_rdp is not None:
            sub = np.sqrt(model.backward(theta, x[exact_idx], y1[exact_idx]).grad_norm2())
            t0 = time.perf_counter()
            with np.errstate(divide="ignore"):
                exact_rdp += rdp_poisson_gaussian(q, sigma * c / np.minimum(sub, c), orders)
            evaluations["exact"] += int(exact_idx.size)
            seconds["exact"] += time.perf_counter() - t0
        # DP-SGD step (unchanged by the accounting)
        batch = np.flatnonzero(bits.uint64(n) < threshold) if q < 1.0 else np.arange(n)
        total = np.zeros(theta.size)
        if batch.size:
            step = model.backward(theta, x[batch], y1[batch])
            bn = np.sqrt(step.grad_norm2())
            scale = np.where(bn > c, c / np.maximum(bn, 1e-300), 1.0)
            total = step.weighted_gradient_sum(scale)
        noise = gaussian(bits, sigma * c, theta.size)
        theta = theta - config.learning_rate * (total + noise) / (q * n)
    worst = float(
        epsilon_from_rdp(config.steps * rdp_poisson_gaussian(q, sigma, orders), orders, delta)
    )
    return DPSGDRun(
        params=theta,
        ledger=ledger,
        exact_rdp=exact_rdp,
        exact_indices=exact_idx,
        worst_case_epsilon=worst,
        evaluations=evaluations,
        accounting_seconds=seconds,
        unrounded_epsilons=None
        if unrounded is None
        else np.asarray(epsilon_from_rdp(unrounded, orders, delta)),
    )


#: The adjacency of the released ε statistics: two data sets of the same (public) size n that
#: differ in one example's record.
STATISTICS_ADJACENCY = "replace-one"
#: L2 sensitivity of the ε histogram under replace-one: one count −1, another +1.
HISTOGRAM_SENSITIVITY = math.sqrt(2.0)


@dataclass(frozen=True)
class EpsilonStatistics:
    """Privately released statistics of the individual ε values, and what they cost.

    ``mean``: noisy mean of the ε values clipped to ``[0, epsilon_max]``; ``quantiles``: from a
    noisy histogram on a public grid of ``bins`` bins over ``[0, epsilon_max]``. ``rho``: the
    zCDP charged (``rho_mean + rho_histogram``) under ``adjacency`` (replace-one);
    ``epsilon``: the (ε, δ) it amounts to (GDP); ``noisy_histogram``: the released counts.
    """

    mean: float
    quantiles: dict[float, float]
    rho: float
    epsilon: float
    delta: float
    noisy_histogram: tuple[float, ...] = ()
    adjacency: str = STATISTICS_ADJACENCY


def release_epsilon_statistics(
    ledger: IndividualLedger,
    budget: ZCDPFilter,
    *,
    rho: float,
    epsilon_max: float,
    quantiles: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9),
    bins: int = 200,
    delta: float = 1e-5,
    bits: RandomBits | None = None,
) -> EpsilonStatistics:
    """Release the mean and quantiles of the individual ε values with ``rho``-zCDP in total.

    Adjacency: **replace-one** (n is public — it sets DP-SGD's sampling rate — and divides the
    sum). Each ε_i is a function of example i's record and of the training iterates at which its
    norms were measured; the iterates are DP-SGD's output (already released and paid for), so
    given them, replacing example i changes ε_i alone. Gaussian mechanism twice, half of ``rho``
    each: the sum of ``min(ε_i, epsilon_max)`` has sensitivity ``epsilon_max`` (one term moves
    within ``[0, epsilon_max]``); the histogram's counts have L2 sensitivity √2 (one count −1,
    another +1). Quantiles are post-processing of the noisy histogram (negative counts set to 0,
    cumulative sums). ``epsilon_max`` must be public — the run's worst-case ε bounds every
    individual ε. The ``rho`` is charged to ``budget`` (check, then commit): if it does not fit,
    ``ValueError`` and nothing is released.
    """
    if not (math.isfinite(rho) and rho > 0):
        raise ValueError(f"rho must be > 0, got rho={rho!r}")
    if not (math.isfinite(epsilon_max) and epsilon_max > 0):
        raise ValueError(f"epsilon_max must be > 0, got epsilon_max={epsilon_max!r}")
    if bins < 1 or any(not 0.0 < p < 1.0 for p in quantiles):
        raise ValueError(f"bins must be >= 1 and quantiles in (0, 1), got {bins}, {quantiles!r}")
    if not budget.would_continue(rho):
        raise ValueError(
            f"rho={rho!r} does not fit the statistics budget (remaining {budget.remaining!r})"
        )
    bits = SystemRandomBits() if bits is None else bits
    eps = np.minimum(ledger._epsilons(), epsilon_max)  # inside the privacy boundary: noised below
    half = rho / 2.0
    sigma_sum = sigma_for_rho(epsilon_max**2, half)  # ε_max²/(2σ²) = ρ/2
    sigma_hist = sigma_for_rho(HISTOGRAM_SENSITIVITY**2, half)  # 2/(2σ²) = ρ/2
    noisy_mean = (float(eps.sum()) + float(gaussian(bits, sigma_sum, 1)[0])) / ledger.n
    counts, edges = np.histogram(eps, bins=bins, range=(0.0, epsilon_max))
    released_counts = counts + gaussian(bits, sigma_hist, bins)
    noisy = np.maximum(released_counts, 0.0)
    cdf = np.cumsum(noisy) / max(float(noisy.sum()), 1e-300)
    released = {
        float(p): float(edges[min(int(np.searchsorted(cdf, p)) + 1, bins)]) for p in quantiles
    }
    assert budget.spend(rho)  # checked above
    return EpsilonStatistics(
        mean=float(np.clip(noisy_mean, 0.0, epsilon_max)),
        quantiles=released,
        rho=rho,
        epsilon=epsilon_from_rho_gdp(rho, delta),
        delta=delta,
        noisy_histogram=tuple(float(c) for c in released_counts),
    )


def statistics_rho(epsilon: float, delta: float) -> float:
    """The zCDP budget of an (ε, δ) statistics budget (GDP conversion: Gaussian releases)."""
    return calibrate_rho(epsilon, delta, "gaussian")[0]
