"""Data-independent privacy parameters of a run, derived once (docs/design.md §6.7).

σ, γ, the integer budget ``B`` and the integer noise variance ``s²`` depend only on the
configuration, never on the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

from streamfilter.privacy.accounting import (
    Guarantee,
    Mechanism,
    calibrate_rho,
    guarantee,
    rho_stated,
    sigma_for_rho,
)
from streamfilter.privacy.accuracy import gaussian_halfwidth, linf_bound_for_variance
from streamfilter.privacy.discrete_gaussian_moments import discrete_gaussian_halfwidth
from streamfilter.privacy.individual_filter import Exhaustion
from streamfilter.privacy.lattice import Lattice
from streamfilter.privacy.odometer import noise_variance_units, rho_of_units
from streamfilter.privacy.rounding import float_up

__all__ = ["LINF_FAILURE_PROBABILITY", "Mechanism", "PrivacyParams"]

DEFAULT_DELTA = 1e-6
#: the failure probability at which each release states Corollary 4.7's ℓ∞ bound
LINF_FAILURE_PROBABILITY = 0.05


@dataclass(frozen=True)
class PrivacyParams:
    """``b_norm`` (data units²), ``rho`` (zCDP), lattice step, exhaustion policy, mechanism.

    Build with :meth:`create`, which accepts either ``rho`` or ``epsilon`` + ``delta`` and then
    calibrates ρ with the tightest conversion proven for the mechanism.
    """

    b_norm: float
    rho: float
    granularity: float
    exhaustion: Exhaustion
    mechanism: Mechanism
    delta: float
    rho_method: str

    @classmethod
    def create(
        cls,
        *,
        b_norm: float,
        rho: float | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        granularity: float = 2.0**-10,
        exhaustion: str = "skip",
        mechanism: str = "discrete_gaussian",
    ) -> PrivacyParams:
        if mechanism not in ("discrete_gaussian", "gaussian"):
            raise ValueError(
                f"mechanism must be 'discrete_gaussian' or 'gaussian', got mechanism={mechanism!r}"
            )
        try:
            policy = Exhaustion(exhaustion)
        except ValueError:
            raise ValueError(
                f"exhaustion must be one of skip, retire, clip, got exhaustion={exhaustion!r}"
            ) from None
        if rho is not None and epsilon is not None:
            raise ValueError("give either rho or epsilon (with delta), not both")
        if rho is None:
            if epsilon is None or delta is None:
                raise ValueError("give rho, or epsilon and delta")
            rho, method = calibrate_rho(epsilon, delta, mechanism)  # type: ignore[arg-type]
        else:
            method = "configured"
            if not (math.isfinite(rho) and rho > 0):
                raise ValueError(f"rho must be a positive finite number, got rho={rho!r}")
        params = cls(
            b_norm=float(b_norm),
            rho=float(rho),
            granularity=float(granularity),
            exhaustion=policy,
            mechanism=mechanism,  # type: ignore[arg-type]
            delta=float(delta if delta is not None else DEFAULT_DELTA),
            rho_method=method,
        )
        params.check()
        return params

    def check(self) -> None:
        """Validate everything derived (lattice, budget and noise fit in 64-bit integers)."""
        lattice = self.lattice
        lattice.budget_units(self.b_norm)
        lattice.sigma2_units(self.sigma)
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got delta={self.delta!r}")

    @property
    def lattice(self) -> Lattice:
        return Lattice(self.granularity)

    @property
    def sigma(self) -> float:
        """Calibrated σ = sqrt(B_norm/(2ρ)) (Corollary 4.7), data units."""
        return sigma_for_rho(self.b_norm, self.rho)

    @cached_property
    def budget_units(self) -> int:
        return self.lattice.budget_units(self.b_norm)

    @cached_property
    def sigma2_units(self) -> int:
        """Noise variance in lattice units, ceil(σ²/γ²) (rounded up: conservative)."""
        return self.lattice.sigma2_units(self.sigma)

    @cached_property
    def sigma_released(self) -> float:
        """σ actually used, data units (≥ the calibrated σ by the upward rounding)."""
        if self.mechanism == "gaussian":
            return self.sigma
        return float(math.sqrt(Fraction(self.sigma2_units)) * self.granularity)

    @cached_property
    def noise_variance_units(self) -> Fraction:
        """Variance of the noise actually drawn, lattice units (``privacy.odometer``)."""
        return noise_variance_units(self.mechanism, self.sigma, self.granularity)

    @property
    def rho_effective(self) -> float:
        """The zCDP actually guaranteed, ``B/(2 s²) ≤ ρ`` with the integer budget and the variance
        of the noise drawn (:func:`rho_of_units`), rounded up."""
        return float_up(rho_of_units(self.budget_units, self.noise_variance_units))

    @cached_property
    def ci95_halfwidth(self) -> float:
        """95% half-width of one coordinate's noise, data units."""
        if self.mechanism == "gaussian":
            return gaussian_halfwidth(self.sigma, 0.95)
        return discrete_gaussian_halfwidth(self.sigma2_units, 0.95) * self.granularity

    @cached_property
    def noise_scale2(self) -> float:
        """The noise's variance (continuous) or sub-Gaussian variance proxy ``s²γ²`` (discrete),
        data units² — what Corollary 4.7's bound is computed from (``linf_bound``)."""
        if self.mechanism == "gaussian":
            return self.sigma**2
        return float(self.sigma2_units) * self.granularity**2

    def linf_bound(self, d: int, beta: float = LINF_FAILURE_PROBABILITY) -> float:
        """Corollary 4.7: every coordinate of a d-dimensional release is within this of the
        active set's exact (lattice-rounded) sum, except with probability ``beta``."""
        return linf_bound_for_variance(self.noise_scale2, d, beta, mechanism=self.mechanism)

    @property
    def rho_stated(self) -> float:
        """The ρ the guarantee states (``accounting.rho_stated``), without its (ε, δ)
        conversions (a root finder each: what the start-up line needs is ρ alone)."""
        return rho_stated(self.b_norm, self.rho, self.sigma_released)

    def guarantee(self) -> Guarantee:
        return guarantee(
            b_norm=self.b_norm,
            rho=self.rho,
            sigma=self.sigma_released,
            mechanism=self.mechanism,
            delta=self.delta,
        )
