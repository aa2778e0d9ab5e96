"""The device's side of one day, vectorised over devices (one device = a batch of one).

Remark 4.6 of Feldman & Zrnic: the individual filter's decision for user ``i`` depends only on
``i``'s own records and on what was already published, so each user can run it themselves and
the server needs no per-user state. ``answer_day`` is that decision: for every announced query of
the day, in announcement order, clip → lattice → exact integer cost → admit iff
``spent + c ≤ B`` (``privacy.individual_filter.filter_contributions``, the same function the central
engine calls), and the noise of the ``local_noise`` variant.

What leaves the device is only what the filter admitted with a non-zero vector. A refused (or
retired, or exhausted) device sends nothing, and so does one whose admitted vector is zero: the
server's sum is the same as if it had sent zeros, so the central sum is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

import numpy as np

from streamfilter.client.protocol import Announcement
from streamfilter.privacy.accounting import Mechanism, sigma_for_rho
from streamfilter.privacy.individual_filter import Exhaustion, filter_contributions, query_vectors
from streamfilter.privacy.lattice import Lattice
from streamfilter.privacy.noise import RandomBits, discrete_gaussian
from streamfilter.privacy.odometer import noise_variance_units, rho_of_units
from streamfilter.privacy.quotas import DEFAULT_ANALYST, AnalystQuotas
from streamfilter.privacy.rounding import float_up

__all__ = ["DayAnswers", "DeviceConfig", "Variant", "answer_day"]


class Variant(StrEnum):
    #: the device sends its exact admitted vector; the server adds N_Z(0, s²) once per release
    CENTRAL_NOISE = "central_noise"
    #: the device adds its own N_Z(0, s_local²) per coordinate; the server only sums
    LOCAL_NOISE = "local_noise"


@dataclass(frozen=True)
class DeviceConfig:
    """What a device is enrolled with; must equal the server's ``[privacy]``/``[local]``.

    ``sigma`` is the noise the device's loss is measured against, data units: the server's σ
    (``central_noise``) or the device's own ``sigma_local`` (``local_noise``).
    """

    b_norm: float
    granularity: float
    exhaustion: Exhaustion
    variant: Variant
    sigma: float
    delta: float = 1e-6
    #: the noise the loss is measured against: the server's ``[privacy] mechanism`` for
    #: ``central_noise``; always ``discrete_gaussian`` for ``local_noise``
    mechanism: str = "discrete_gaussian"
    #: the server's ``[analysts]`` shares, ``(name, share)`` by name (docs/design.md §2.13)
    analyst_shares: tuple[tuple[str, float], ...] = ()

    @classmethod
    def create(
        cls,
        *,
        b_norm: float,
        granularity: float = 2.0**-10,
        exhaustion: str = "skip",
        variant: str = "central_noise",
        rho: float | None = None,
        sigma_local: float | None = None,
        delta: float = 1e-6,
        mechanism: str = "discrete_gaussian",
        analysts: Mapping[str, float] | None = None,
    ) -> DeviceConfig:
        """``rho`` (the server's central ρ) for ``central_noise``; ``sigma_local`` for
        ``local_noise``; ``analysts`` the server's ``[analysts]`` shares. Validates the lattice
        and the shares exactly as the server does."""
        v = Variant(variant)
        if v is Variant.CENTRAL_NOISE:
            if rho is None:
                raise ValueError("central_noise needs rho (the server's zCDP parameter)")
            sigma = sigma_for_rho(b_norm, rho)
        else:
            if sigma_local is None or not (math.isfinite(sigma_local) and sigma_local > 0):
                raise ValueError("local_noise needs a positive finite sigma_local")
            sigma = float(sigma_local)
            mechanism = "discrete_gaussian"
        if mechanism not in ("discrete_gaussian", "gaussian"):
            raise ValueError("mechanism must be discrete_gaussian or gaussian")
        shares = tuple(sorted((str(a), float(x)) for a, x in (analysts or {}).items()))
        config = cls(
            float(b_norm),
            float(granularity),
            Exhaustion(exhaustion),
            v,
            sigma,
            delta,
            mechanism,
            shares,
        )
        config.lattice.budget_units(config.b_norm)
        config.lattice.sigma2_units(config.sigma)
        config.quotas  # noqa: B018 — refuses oversubscribed shares now
        return config

    @property
    def quotas(self) -> AnalystQuotas:
        """The analysts' per-user sub-budgets (``privacy.quotas``)."""
        return AnalystQuotas.from_shares(dict(self.analyst_shares), self.budget_units)

    @property
    def lattice(self) -> Lattice:
        return Lattice(self.granularity)

    @property
    def budget_units(self) -> int:
        return self.lattice.budget_units(self.b_norm)

    @property
    def sigma2_units(self) -> int:
        """``ceil(σ²/γ²)``: the server's s² (``central_noise``) or the device's own."""
        return self.lattice.sigma2_units(self.sigma)

    @property
    def noise_variance_units(self) -> Fraction:
        """Variance of the noise the loss is measured against, lattice units: the integer s² for
        the discrete Gaussian, exactly ``σ²/γ²`` for the continuous one
        (:func:`streamfilter.privacy.odometer.noise_variance_units`)."""
        mechanism: Mechanism = "gaussian" if self.mechanism == "gaussian" else "discrete_gaussian"
        return noise_variance_units(mechanism, self.sigma, self.granularity)

    @property
    def rho(self) -> float:
        """The zCDP this enrolment guarantees, ``B/(2 s²)`` (Theorem 4.5, integer units), rounded
        up."""
        return float_up(rho_of_units(self.budget_units, self.noise_variance_units))

    def fingerprint(self) -> dict[str, object]:
        return {
            "granularity": self.granularity,
            "budget_units": self.budget_units,
            "sigma2_units": self.sigma2_units,
            "exhaustion": str(self.exhaustion),
            "variant": str(self.variant),
            "mechanism": self.mechanism,
            **({"analysts": [list(a) for a in self.analyst_shares]} if self.analyst_shares else {}),
        }


@dataclass(frozen=True)
class DayAnswers:
    """For each answered query: which batch rows send (indices) and what (int64 units)."""

    query_ids: list[str]
    senders: list[np.ndarray]
    units: list[np.ndarray]
    spent_units: np.ndarray
    retired: np.ndarray
    #: each named analyst's spend and retirement after the day (docs/design.md §2.13)
    analyst_spent: dict[str, np.ndarray] = field(default_factory=dict)
    analyst_retired: dict[str, np.ndarray] = field(default_factory=dict)


def answer_day(
    config: DeviceConfig,
    queries: Sequence[Announcement],
    matrices: Sequence[np.ndarray],
    spent_units: np.ndarray,
    retired: np.ndarray,
    bits: RandomBits | None,
    analyst_spent: Mapping[str, np.ndarray] | None = None,
    analyst_retired: Mapping[str, np.ndarray] | None = None,
) -> DayAnswers:
    """One day for a batch of devices. ``matrices[j]`` is the (n × k_j) record matrix of the
    coordinates ``queries[j]`` reads; ``spent_units``/``retired`` are the devices' states before
    the day. Nothing is mutated; the caller persists the returned state before sending.

    ``local_noise`` draws one batch of ``d`` noise values per sending device and query from
    ``bits`` (CKS 2020 exact sampler); the device's messages are then ``B/(2 s_local²)``-zCDP
    against whoever reads them (Theorem 4.5 applied to the device's own Gaussian mechanism).

    With analysts enrolled, a query's contribution must also fit its analyst's sub-budget,
    exactly as on the server (``privacy.quotas``): ``analyst_spent``/``analyst_retired`` are
    the named analysts' states before the day (absent: nothing spent), the default analyst's
    spend the rest of the global one and its retirement the global flag.
    """
    spent = np.asarray(spent_units, dtype=np.int64)
    gone = np.asarray(retired, dtype=bool)
    quotas = config.quotas
    own_spent = {a: np.zeros(len(spent), np.int64) for a in quotas.named}
    own_gone = {a: np.zeros(len(spent), bool) for a in quotas.named}
    for a, v in (analyst_spent or {}).items():
        own_spent[a] = np.asarray(v, np.int64)
    for a, v in (analyst_retired or {}).items():
        own_gone[a] = np.asarray(v, bool)
    default_spent = quotas.default_spent(spent, list(own_spent.values()))
    out_ids: list[str] = []
    out_senders: list[np.ndarray] = []
    out_units: list[np.ndarray] = []
    for query, matrix in zip(queries, matrices, strict=True):
        x = query_vectors(matrix, query.weight_matrix())
        owner = quotas.owner(query.analyst)
        if quotas.active:  # the filter against min(B − spent, B_a − spent_a)
            mine = default_spent if owner == DEFAULT_ANALYST else own_spent[owner]
            mine_gone = gone if owner == DEFAULT_ANALYST else own_gone[owner]
            remaining = quotas.remaining_units(owner, spent, mine)
            step = filter_contributions(
                x,
                query.clip,
                config.lattice,
                config.budget_units - remaining,
                mine_gone,
                config.budget_units,
                config.exhaustion,
            )
            if owner == DEFAULT_ANALYST:
                default_spent = default_spent + step.cost_units
                gone = gone | step.newly_retired
            else:
                own_spent[owner] = own_spent[owner] + step.cost_units
                own_gone[owner] = own_gone[owner] | step.newly_retired
        else:
            step = filter_contributions(
                x,
                query.clip,
                config.lattice,
                spent,
                gone,
                config.budget_units,
                config.exhaustion,
            )
            gone = gone | step.newly_retired
        spent = spent + step.cost_units
        senders = np.flatnonzero(step.admitted & (step.units != 0).any(axis=1))
        units = step.units[senders]
        if config.variant is Variant.LOCAL_NOISE and len(senders):
            if bits is None:
                raise ValueError("local_noise needs a source of random bits")
            noise = discrete_gaussian(bits, config.sigma2_units, units.size)
            units = units + noise.reshape(units.shape)
        out_ids.append(query.query_id)
        out_senders.append(senders)
        out_units.append(units)
    return DayAnswers(out_ids, out_senders, out_units, spent, gone, own_spent, own_gone)
