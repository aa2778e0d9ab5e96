"""Private population statistics of budget use (Yu et al. 2023 §3.4; docs/design.md §2).

Per-user spent fractions ``f_i = spent_i / B ∈ [0, 1]`` are sensitive (each is one user's
realized privacy loss). Their population mean and quantiles are released here only with noise,
from three independent discrete Gaussian mechanisms on integers (Canonne, Kamath & Steinke 2020):

====================  =========================================  ==============  ===========
statistic             exact integer                              L2 sensitivity  zCDP share
====================  =========================================  ==============  ===========
count                 ``n`` = users in the ledger                1               ρ/4
sum                   ``Σ_i floor(K·f_i)``, ``K = 2^16``         K               ρ/4
histogram             users per bin ``[b/m, (b+1)/m)``, m bins   1               ρ/2
====================  =========================================  ==============  ===========

Neighbouring datasets add or remove one user's entire stream. Conditional on everything published
before (the releases, hence the adaptively chosen queries), every other user's spent budget is a
function of that user's own data, so it is unchanged: the neighbour changes ``n`` by 1, the sum by
``floor(K·f_i) <= K`` and exactly one histogram bin by 1 (``f_i = 1`` falls in the last bin). A
discrete Gaussian ``N_Z(0, s²)`` on an integer vector with L2 sensitivity Δ is ``Δ²/(2s²)``-zCDP
(CKS 2020, Theorem 14); the three compose to the sum of their ρ (Bun & Steinke 2016, Lemma 2.3).
Each ``s²`` is rounded *up* to an integer, so the total ``rho_effective <= rho``.

The released mean ``S̃ / (K·max(ñ, 1))`` (clamped to [0, 1]) and the quantiles (linear
interpolation in the monotone running maximum of the noisy cumulative histogram) are
post-processing. ``floor`` biases each ``f_i`` down by less than ``1/K`` (< 1.6e-5).
Quantile resolution is the bin width ``1/m``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from streamfilter.privacy.discrete_gaussian_moments import discrete_gaussian_variance
from streamfilter.privacy.noise import (
    RandomBits,
    discrete_gaussian,
)
from streamfilter.privacy.rounding import float_up

__all__ = ["SPENT_FRACTION_SCALE", "BudgetStats", "BudgetStatsMechanism"]

#: K: spent fractions are summed as integers ``floor(K·f)``.
SPENT_FRACTION_SCALE = 1 << 16
_MAX_SIGMA2_UNITS = 1 << 62


def _sigma2_for(sensitivity: int, rho: Fraction) -> int:
    """Smallest integer ``s²`` with ``Δ²/(2s²) <= ρ``."""
    s2 = max(1, math.ceil(Fraction(sensitivity) ** 2 / (2 * rho)))
    if s2 > _MAX_SIGMA2_UNITS:
        raise ValueError(f"rho={float(rho)!r} is too small: noise variance {s2} exceeds 2^62")
    return s2


@dataclass(frozen=True)
class BudgetStats:
    """One release of population statistics (noisy; safe to publish)."""

    users_noisy: float
    mean_spent_fraction: float
    quantiles: dict[str, float | None]
    histogram_noisy: list[int]
    sigma_users: float
    sigma_sum_fraction: float
    sigma_histogram_bin: float
    rho: float
    mechanism: str = "discrete_gaussian"

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "users_noisy": self.users_noisy,
            "mean_spent_fraction": self.mean_spent_fraction,
            "quantiles": dict(self.quantiles),
            "bins": len(self.histogram_noisy),
            "histogram_noisy": list(self.histogram_noisy),
            "sigma": {
                "users": self.sigma_users,
                "sum_fraction": self.sigma_sum_fraction,
                "histogram_bin": self.sigma_histogram_bin,
            },
            "rho": self.rho,
            "mechanism": self.mechanism,
        }


@dataclass(frozen=True)
class BudgetStatsMechanism:
    """The mechanism of the module docstring for one call costing ``rho`` (zCDP)."""

    rho: float
    bins: int = 100

    def __post_init__(self) -> None:
        if isinstance(self.rho, bool) or not isinstance(self.rho, numbers.Real):
            raise ValueError(f"rho must be a real number, got rho={self.rho!r}")
        if not (math.isfinite(float(self.rho)) and float(self.rho) > 0.0):
            raise ValueError(f"rho must be finite and > 0, got rho={self.rho!r}")
        if (
            isinstance(self.bins, bool)
            or not isinstance(self.bins, int)
            or not 1 <= self.bins <= 10_000
        ):
            raise ValueError(f"bins must be an integer in [1, 10000], got bins={self.bins!r}")
        _ = self.sigma2_units  # validates the noise sizes

    @property
    def sigma2_units(self) -> tuple[int, int, int]:
        """Integer noise variances ``(count, sum, histogram)``."""
        r = Fraction(float(self.rho))
        return (
            _sigma2_for(1, r / 4),
            _sigma2_for(SPENT_FRACTION_SCALE, r / 4),
            _sigma2_for(1, r / 2),
        )

    @property
    def rho_effective(self) -> float:
        """``1/(2s_n²) + K²/(2s_S²) + 1/(2s_h²) <= rho`` (rounded up)."""
        c, s, h = self.sigma2_units
        exact = Fraction(1, 2 * c) + Fraction(SPENT_FRACTION_SCALE**2, 2 * s) + Fraction(1, 2 * h)
        return float_up(exact)

    def release(
        self,
        spent_units: Sequence[int] | np.ndarray,
        budget_units: int,
        bits: RandomBits,
        quantiles: Sequence[float] = (0.1, 0.5, 0.9),
    ) -> BudgetStats:
        """Noisy count, mean and quantiles of ``spent/B`` over the given users (one per entry).

        ``quantiles`` are post-processing and cost nothing extra; each must be in (0, 1).
        Exactly ``2 + bins`` noise values are drawn whatever the data.
        """
        if isinstance(budget_units, bool) or not isinstance(budget_units, numbers.Integral):
            raise ValueError(f"budget_units must be an integer, got {budget_units!r}")
        b = int(budget_units)
        if b < 1:
            raise ValueError(f"budget_units must be >= 1, got budget_units={budget_units!r}")
        qs = [float(q) for q in quantiles]
        for q in qs:
            if not 0.0 < q < 1.0:
                raise ValueError(f"quantiles must be in (0, 1), got {q!r}")
        spent = [min(max(int(s), 0), b) for s in np.asarray(spent_units, dtype=np.int64).tolist()]
        k = SPENT_FRACTION_SCALE
        n = len(spent)
        total = sum((s * k) // b for s in spent)  # exact Python integers (s·K may exceed 2^63)
        hist = np.zeros(self.bins, dtype=np.int64)
        if n:
            idx = np.fromiter(
                (min((s * self.bins) // b, self.bins - 1) for s in spent), np.int64, count=n
            )
            hist = np.bincount(idx, minlength=self.bins).astype(np.int64)
        c2, s2, h2 = self.sigma2_units
        users_noisy = n + int(discrete_gaussian(bits, c2, 1)[0])
        sum_noisy = total + int(discrete_gaussian(bits, s2, 1)[0])
        hist_noisy = hist + discrete_gaussian(bits, h2, self.bins)
        mean = min(1.0, max(0.0, sum_noisy / (k * max(users_noisy, 1))))
        return BudgetStats(
            users_noisy=float(users_noisy),
            mean_spent_fraction=mean,
            quantiles={f"{q:g}": _quantile(hist_noisy, q) for q in qs},
            histogram_noisy=[int(v) for v in hist_noisy],
            sigma_users=math.sqrt(discrete_gaussian_variance(c2)),
            sigma_sum_fraction=math.sqrt(discrete_gaussian_variance(s2)) / k,
            sigma_histogram_bin=math.sqrt(discrete_gaussian_variance(h2)),
            rho=self.rho_effective,
        )


def _quantile(hist_noisy: np.ndarray, q: float) -> float | None:
    """q-quantile on [0, 1] from the noisy histogram (post-processing).

    The cumulative of the *raw* noisy bins is unbiased (clamping each bin at 0 would add the
    positive part of every empty bin's noise, a bias of ~0.4·σ per bin). It is made monotone by a
    running maximum, the target rank is ``q`` times its last value, and the quantile is
    interpolated linearly inside the bin where the target is reached. ``None`` when the noisy
    total is not positive.
    """
    cum = np.maximum.accumulate(np.cumsum(np.asarray(hist_noisy, dtype=np.float64)))
    total = float(cum[-1])
    if total <= 0.0:
        return None
    target = q * total
    b = min(int(np.searchsorted(cum, target, side="left")), len(cum) - 1)
    below = max(float(cum[b - 1]), 0.0) if b > 0 else 0.0
    step = float(cum[b]) - below
    inside = (target - below) / step if step > 0.0 else 1.0
    return (b + min(max(inside, 0.0), 1.0)) / len(cum)
