"""The server of local mode: validate untrusted contributions, sum them, release (no I/O).

In local mode each device runs its own filter (``streamfilter.client``) and sends only admitted
vectors. The server keeps **no per-user state**: per open day it keeps one running list of
contributions per query and the nonces it has seen (to drop a resent duplicate). The day close
and the exactly-once machinery (one store transaction per day, the outbox) are the central ones;
:class:`LocalEngine` only swaps the input and the release step of the central ``Engine``
(both are ``engine.engine.EngineCore``s).

Clients are untrusted, so every contribution is checked before it can reach a sum — dimension,
integer lattice units, and norm — and refused with a reason otherwise (never clipped silently):

``central_noise``  ``‖u‖² ≤ floor(C²/γ²)``, the exact integer bound the device's own rounding
                   guarantees (``privacy.lattice``); the server then adds ``N_Z(0, s²)`` once per
                   coordinate exactly as in central mode (``engine.day.noisy_release``).
``local_noise``    ``u = r + Z`` with ``‖r‖² ≤ floor(C²/γ²)`` and ``Z ~ N_Z(0, s_l²)^d``. Each
                   coordinate of Z is ``s_l²``-subgaussian (CKS 2020), so ``E exp(λZ_j²) ≤
                   (1−2λs_l²)^{-1/2}`` and the Laurent–Massart χ² bound gives
                   ``P(‖Z‖² ≥ s_l²(d + 2√(dt) + 2t)) ≤ e^{-t}``. With t = 50 an honest device is
                   refused with probability below 2·10⁻²²; a dishonest one can shift a sum by at
                   most ``C + s_l·sqrt(d + 2√(50d) + 100)`` per message, never more.

Release of ``local_noise``: the value is ``γ·Σu``. Its noise is the sum of the devices' noises,
variance ``n·Var(N_Z(0, s_l²))`` for n contributions. Publishing that σ exactly would publish n,
an exact count over users, so the reported σ uses n rounded up to a power of two (an upper
bound, at most √2 too large) and the 95% half-width is the subgaussian bound
``sqrt(2·ñ·s_l²·ln(2/0.05))`` for that ñ (conservative).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np

from streamfilter.engine.contract import Reject, Release, _parse_day, load_object
from streamfilter.engine.day import DayOutcome, ExactDayStats, noisy_release
from streamfilter.engine.engine import EngineCore, InputRecord
from streamfilter.engine.ingest import day_ok
from streamfilter.engine.params import LINF_FAILURE_PROBABILITY, PrivacyParams
from streamfilter.engine.queries import AnyQuery
from streamfilter.privacy.accuracy import linf_bound_for_variance
from streamfilter.privacy.discrete_gaussian_moments import discrete_gaussian_variance
from streamfilter.privacy.noise import RandomBits
from streamfilter.privacy.quotas import AnalystQuotas

__all__ = [
    "CENTRAL_NOISE",
    "LOCAL_NOISE",
    "ContributionAccumulator",
    "ContributionRecord",
    "LocalEngine",
    "local_noise_release",
    "parse_contribution",
]

CENTRAL_NOISE, LOCAL_NOISE = "central_noise", "local_noise"
MAX_CONTRIBUTION_BYTES = 65_536
_KEYS = frozenset({"day", "query_id", "units", "nonce"})
_QUERY_ID_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
_NONCE_RE = re.compile(r"^[0-9a-f]{32}$")
_INT64_MAX = 2**63 - 1
#: Laurent–Massart exponent of the local-noise norm check (refusal probability ≤ e^-50)
_TAIL_T = 50.0


class ContributionRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """A contribution whose shape is valid (``parse_contribution``); decoded by msgspec on the
    batch path (``parse_contributions``), which only ever accepts — every line it refuses, or
    that fails a check it cannot express, is re-parsed by ``parse_contribution`` for the reason.
    """

    day: str
    query_id: str
    units: list[int]
    nonce: str


_decode = msgspec.json.Decoder(ContributionRecord).decode


def _fast(line: bytes) -> ContributionRecord | None:
    """The record if the decoder and the shape checks accept ``line``, else None."""
    if len(line) > MAX_CONTRIBUTION_BYTES:
        return None
    try:
        rec = _decode(line)
    except Exception:  # any refusal: parse_contribution is the authority on why
        return None
    units = rec.units
    if (
        not units
        or not day_ok(rec.day)
        or not _QUERY_ID_RE.match(rec.query_id)
        or not _NONCE_RE.match(rec.nonce)
        or max(units) > _INT64_MAX
        or min(units) < -_INT64_MAX
    ):
        return None
    return rec


def parse_contributions(lines: Sequence[bytes]) -> list[ContributionRecord | Reject]:
    """``parse_contribution`` of each line, a ``Reject`` returned in its place (batch path)."""
    out: list[ContributionRecord | Reject] = []
    for line in lines:
        rec = _fast(line)
        if rec is None:
            try:
                rec = parse_contribution(line)
            except Reject as rej:
                out.append(rej)
                continue
        out.append(rec)
    return out


def parse_contribution(raw: bytes | str) -> ContributionRecord:
    """Validate the shape of one contribution line (see ``client.protocol``); raise ``Reject``.
    The query-dependent checks (dimension, norm) are :meth:`LocalEngine.parse_record`'s."""
    obj = load_object(raw, "contribution", MAX_CONTRIBUTION_BYTES)
    extra = obj.keys() - _KEYS
    if extra:
        raise Reject("unknown_field", "unknown field(s) in a contribution")
    for key in ("day", "query_id", "units", "nonce"):
        if key not in obj:
            raise Reject("missing_field", f"missing required field {key}")
    day = _parse_day(obj["day"], "day")
    query_id = obj["query_id"]
    if not isinstance(query_id, str) or not _QUERY_ID_RE.match(query_id):
        raise Reject("invalid_query_id", "query_id must match [A-Za-z0-9_.:-]{1,128}")
    nonce = obj["nonce"]
    if not isinstance(nonce, str) or not _NONCE_RE.match(nonce):
        raise Reject("invalid_nonce", "nonce must be 32 lowercase hex characters")
    units = obj["units"]
    if not isinstance(units, list) or not units:
        raise Reject("invalid_units", "units must be a non-empty list of integers")
    for u in units:
        if type(u) is not int:  # bools, floats and strings are refused
            raise Reject("invalid_units", "units must be integers (lattice units)")
        if not -_INT64_MAX <= u <= _INT64_MAX:
            raise Reject("invalid_units", "units must fit in 64-bit integers")
    return ContributionRecord(day, query_id, units, nonce)


@dataclass
class ContributionAccumulator:
    """One open day of contributions: per query the validated unit vectors, and seen nonces."""

    day: str
    _units: dict[str, list[list[int]]] = field(default_factory=dict)
    _nonces: set[tuple[str, str]] = field(default_factory=set)
    events: int = 0
    duplicates: int = 0

    def add(self, record: ContributionRecord) -> bool:
        """Add a validated contribution of this day; False for a resent one (same nonce)."""
        key = (record.query_id, record.nonce)
        if key in self._nonces:
            self.duplicates += 1
            return False
        self._nonces.add(key)
        self._units.setdefault(record.query_id, []).append(record.units)
        self.events += 1
        return True

    def add_many(self, records: Sequence[ContributionRecord]) -> int:
        """``add`` each record in order; the number that were new."""
        return sum(map(self.add, records))

    def count(self, query_id: str) -> int:
        return len(self._units.get(query_id, ()))

    def total_units(self, query_id: str, dim: int) -> np.ndarray:
        """Exact integer sum of the query's contributions (Python integers: no overflow)."""
        rows = self._units.get(query_id, [])
        totals = [sum(col) for col in zip(*rows, strict=True)] if rows else [0] * dim
        if any(abs(t) > _INT64_MAX for t in totals):
            raise ValueError("a sum of contributions does not fit in 64-bit integers")
        return np.array(totals, dtype=np.int64)


def _bucket(n: int) -> int:
    """n rounded up to a power of two (at least 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def local_noise_release(
    day: str,
    query: AnyQuery,
    total_units: np.ndarray,
    n_contributions: int,
    granularity: float,
    sigma2_local_units: int,
) -> Release:
    """The ``local_noise`` release: ``γ·Σu`` with σ and half-width for ñ = bucket(n) (module
    docstring: ñ ≥ n, so both are upper bounds and n itself is not published)."""
    n_bound = _bucket(n_contributions)
    d = len(total_units)
    sigma_units = math.sqrt(n_bound * discrete_gaussian_variance(sigma2_local_units))
    half_units = math.sqrt(2.0 * n_bound * sigma2_local_units * math.log(2.0 / 0.05))
    return Release(
        day=day,
        query_id=query.query_id,
        labels=query.labels(),
        value=[float(int(t)) * granularity for t in total_units],
        sigma=sigma_units * granularity,
        ci95=[half_units * granularity] * d,
        mechanism="local_discrete_gaussian",
        granularity=granularity,
        # the sum of ñ ≥ n devices' N_Z(0, s_l²) is (ñ·s_l²)-sub-Gaussian: Corollary 4.7's form
        linf_bound=linf_bound_for_variance(
            float(n_bound * sigma2_local_units) * granularity**2,
            d,
            LINF_FAILURE_PROBABILITY,
            mechanism="discrete_gaussian",
        ),
        linf_failure_probability=LINF_FAILURE_PROBABILITY,
        analyst=query.analyst,
    )


class LocalEngine(EngineCore[ContributionAccumulator]):
    """The engine of ``[mode] kind = "local"``: no ledger use, contributions in, same releases.

    ``sigma2_local_units`` (``local_noise`` only) is the devices' ``ceil(σ_local²/γ²)``.
    """

    def __init__(
        self,
        params: PrivacyParams,
        bits: RandomBits,
        variant: str,
        sigma2_local_units: int | None = None,
        quotas: AnalystQuotas | None = None,
    ) -> None:
        """``quotas``: the analysts the queries may name (each device holds them to their
        sub-budgets: ``client.core.answer_day``)."""
        super().__init__(params, bits, quotas=quotas)
        if variant not in (CENTRAL_NOISE, LOCAL_NOISE):
            raise ValueError("variant must be central_noise or local_noise")
        if variant == LOCAL_NOISE and not sigma2_local_units:
            raise ValueError("local_noise needs sigma2_local_units")
        self.variant = variant
        self.sigma2_local_units = sigma2_local_units
        self._limit_cache: dict[str, tuple[AnyQuery, int, int]] = {}

    def max_norm2_units(self, query: AnyQuery) -> int:
        """Largest ``‖u‖²`` accepted for one contribution to ``query`` (module docstring)."""
        cap = self.params.lattice.max_cost_units(query.clip)
        if self.variant == CENTRAL_NOISE:
            return cap
        assert self.sigma2_local_units is not None
        d = len(query.labels())
        tail2 = self.sigma2_local_units * (d + 2 * math.sqrt(d * _TAIL_T) + 2 * _TAIL_T)
        return math.ceil((math.sqrt(cap) + math.sqrt(tail2)) ** 2)

    def _limits(self, query_id: str) -> tuple[AnyQuery, int, int] | None:
        """(query, d, largest accepted ‖u‖²), cached: a registered query never changes."""
        hit = self._limit_cache.get(query_id)
        if hit is None:
            query = self.queries.get(query_id)
            if query is None:
                return None
            hit = self._limit_cache[query_id] = (
                query,
                len(query.labels()),
                self.max_norm2_units(query),
            )
        return hit

    def check_contribution(self, rec: ContributionRecord) -> ContributionRecord:
        """The query-dependent checks of an untrusted contribution; raise ``Reject``."""
        limits = self._limits(rec.query_id)
        if limits is None:
            raise Reject("unknown_query", "query_id is not a registered query")
        query, dim, max_norm2 = limits
        if not query.applies_to(rec.day):
            raise Reject("inactive_query", "the query does not apply to the contribution's day")
        if len(rec.units) != dim:
            raise Reject("invalid_dimension", "units must have the query's dimension d")
        if sum(u * u for u in rec.units) > max_norm2:  # exact Python integers
            reason = "over_clip" if self.variant == CENTRAL_NOISE else "implausible_norm"
            raise Reject(reason, "the contribution's norm exceeds what the query's clip allows")
        return rec

    def parse_record(self, raw: bytes | str) -> InputRecord:
        return self.check_contribution(parse_contribution(raw))

    def parse_records(self, raws: Sequence[bytes]) -> Sequence[InputRecord | Reject]:
        out: list[InputRecord | Reject] = []
        for rec in parse_contributions(raws):
            if isinstance(rec, Reject):
                out.append(rec)
                continue
            try:
                out.append(self.check_contribution(rec))
            except Reject as rej:
                out.append(rej)
        return out

    def new_day(self, day: str) -> ContributionAccumulator:
        return ContributionAccumulator(day)

    def prepare_day(self, acc: ContributionAccumulator) -> DayOutcome:
        """The local day close: per query of the day (registration order) the exact sum of its
        contributions, then one noise batch of size d (``central_noise``) or none."""
        self.check_day(acc.day)
        releases: list[Release] = []
        counts: dict[str, int] = {}
        for query in self.queries.for_day(acc.day):
            d = len(query.labels())
            total = acc.total_units(query.query_id, d)
            counts[query.query_id] = acc.count(query.query_id)
            if self.variant == CENTRAL_NOISE:
                releases.append(noisy_release(acc.day, query, total, self.params, self.bits))
            else:
                assert self.sigma2_local_units is not None
                releases.append(
                    local_noise_release(
                        acc.day,
                        query,
                        total,
                        counts[query.query_id],
                        self.params.granularity,
                        self.sigma2_local_units,
                    )
                )
        empty_users = np.array([], dtype=object)
        return DayOutcome(
            day=acc.day,
            releases=releases,
            changed_users=empty_users,
            spent_units=np.zeros(0, np.int64),
            retired=np.zeros(0, bool),
            # SENSITIVE like every ExactDayStats: exported only to trusted operators
            exact_stats=ExactDayStats(users_with_records=acc.events, admitted_per_query=counts),
        )
