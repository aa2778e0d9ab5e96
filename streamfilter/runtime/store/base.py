"""The state store's interface, its records and its errors (docs/design.md §5).

The store is the durable source of truth. One transaction per closed day holds the budget debits,
the day's releases (noise already drawn, unique per ``(day, query_id)``) and the input positions.
Releases leave through the outbox: they are published from the store and marked sent only after
the sink acknowledged, so a restart republishes the stored bytes and never draws noise twice.

``StateStore`` is the interface every backend implements (``tests/runtime/store/test_store_contract.py``
is its contract suite); ``streamfilter.runtime.store.sqlite`` is the embedded default.
"""

from __future__ import annotations

import abc
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from streamfilter.errors import StaleStoreError, StoreError, TelemetryBudgetError
from streamfilter.privacy.rounding import float_down, float_up

if TYPE_CHECKING:
    from streamfilter.runtime.io.base import Sink


@dataclass(frozen=True)
class TelemetryCharge:
    """One debit of the telemetry budget: ``kind`` (e.g. ``budget_stats``, ``active_set``), its
    zCDP ``rho`` and the ``record`` kept with it (the released statistics, or a description)."""

    kind: str
    rho: float
    record: bytes


@dataclass(frozen=True)
class TelemetryBalance:
    """``total`` telemetry ρ; ``spent`` (rounded up) and ``remaining`` (rounded down)."""

    total: float
    spent: float
    remaining: float


def telemetry_balance(total: float, charges: list[float]) -> TelemetryBalance:
    spent = sum((Fraction(r) for r in charges), Fraction(0))
    return TelemetryBalance(
        total=total,
        spent=float_up(spent),
        remaining=max(0.0, float_down(Fraction(total) - spent)),
    )


def check_telemetry_arguments(charge: TelemetryCharge, rho_total: float) -> None:
    """A charge and a total must be positive and finite (checked before any transaction)."""
    if not (math.isfinite(charge.rho) and charge.rho > 0.0):
        raise TelemetryBudgetError(f"a telemetry charge must be > 0, got rho={charge.rho!r}")
    if not (math.isfinite(rho_total) and rho_total > 0.0):
        raise TelemetryBudgetError(f"telemetry.rho must be > 0, got {rho_total!r}")


def check_telemetry_charge(
    charge: TelemetryCharge,
    rho_total: float,
    pinned_total: str | None,
    earlier: list[float],
    state: str,
) -> None:
    """The telemetry filter, the same rule for every backend (inside the writer's transaction):
    the first charge pins ``rho_total`` for the state; a charge is admitted iff the exact sum of
    all charges stays within it (zCDP composition, Bun & Steinke 2016 Lemma 2.3; exact rational
    arithmetic on the float values). Raises ``TelemetryBudgetError``; writes nothing."""
    if pinned_total is not None and float(pinned_total) != rho_total:
        raise TelemetryBudgetError(
            f"telemetry.rho = {rho_total!r} differs from {float(pinned_total)!r}, the total this "
            f"state's telemetry ledger was started with (state {state}); it cannot change during "
            "a run"
        )
    if sum(map(Fraction, earlier), Fraction(charge.rho)) > Fraction(rho_total):
        before = telemetry_balance(rho_total, earlier)
        raise TelemetryBudgetError(
            f"telemetry budget exceeded: {charge.kind} costs rho={charge.rho!r} but only "
            f"{before.remaining!r} of telemetry.rho={rho_total!r} remains "
            f"({len(earlier)} earlier charges); nothing was released"
        )


@dataclass(frozen=True)
class Position:
    """Where to resume one input partition.

    ``resume_offset``: seek here on start (no event of a still-open day lies before it).
    ``high_offset``: everything before it was already read; on replay, records below it that
    belong to closed days (or were rejected) are skipped silently.
    """

    resume_offset: int
    high_offset: int


@dataclass(frozen=True)
class DayCommit:
    """One closed day, written in a single transaction."""

    day: str
    releases: list[tuple[str, bytes]]  # (query_id, payload) in publication order
    changed_users: np.ndarray
    spent_units: np.ndarray
    retired: np.ndarray
    positions: dict[str, Position]
    active_set_state: bytes | None = None  # opt-in telemetry tracker after this day (sensitive)
    coverage_state: bytes | None = None  # coverage tracker after this day (sensitive)
    population_state: bytes | None = None  # population counters after this day (sensitive)


@dataclass
class StoredState:
    config_fingerprint: str | None
    last_closed_day: str | None
    seq: int
    budgets: list[tuple[str, int, bool]] = field(default_factory=list)
    queries: list[bytes] = field(default_factory=list)  # canonical JSON, registration order
    positions: dict[str, Position] = field(default_factory=dict)
    releases: list[bytes] = field(default_factory=list)  # every stored release, day order
    active_set_state: bytes | None = None  # the opt-in active-set tracker, if ever started
    coverage_state: bytes | None = None  # the coverage tracker, if ever started
    population_state: bytes | None = None  # the population counters, if ever started


class StateStore(abc.ABC):
    """Durable run state. Every method either completes or raises ``StoreError``."""

    @abc.abstractmethod
    def load(self) -> StoredState: ...

    @abc.abstractmethod
    def set_config_fingerprint(self, fingerprint: str) -> None: ...

    def add_query(self, canonical_json: bytes) -> None:
        """Register one query (idempotent by ``query_id``)."""
        self.add_queries([canonical_json])

    @abc.abstractmethod
    def add_queries(self, canonical_jsons: Sequence[bytes]) -> None:
        """Register queries in order, in one transaction; an already stored ``query_id`` is
        kept as it is (idempotent). A backlog read from a feed costs one commit, not one each."""

    @abc.abstractmethod
    def commit_day(self, commit: DayCommit) -> int:
        """Write the day atomically; return the new monotonic sequence number."""

    @abc.abstractmethod
    def save_positions(self, positions: dict[str, Position]) -> None: ...

    @abc.abstractmethod
    def unsent_releases(self) -> list[tuple[str, str, bytes]]:
        """(day, query_id, payload) not yet acknowledged, in publication order."""

    @abc.abstractmethod
    def sent_releases_after(self, day: str | None) -> list[tuple[str, str, bytes]]:
        """(day, query_id, payload) acknowledged by the sink, of the days after ``day`` (None:
        every day), in publication order: what to publish again, with its stored noise, when
        the sink lost them (a releases topic deleted or recreated)."""

    @abc.abstractmethod
    def mark_sent(self, keys: list[tuple[str, str]]) -> None:
        """Mark releases ``(day, query_id)`` as acknowledged by the sink (one transaction)."""

    @abc.abstractmethod
    def spent_units(self, user_id: str) -> tuple[int, bool] | None: ...

    def size_bytes(self) -> int | None:
        """On-disk size of the state, if the store knows it."""
        return None

    def compact(self, max_entries: int) -> int:
        """Upkeep between batches: fold at most ``max_entries`` budget entries kept aside by
        earlier commits into their final place, in transactions of their own; return how many
        are left. Never changes what ``load`` or ``spent_units`` return. A store that writes
        budgets in place (PostgreSQL) has nothing to fold."""
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        return 0

    def telemetry_ledger(self) -> list[TelemetryCharge]:
        """Every telemetry charge so far, oldest first (a store without a ledger has none)."""
        return []

    def charge_telemetry(
        self,
        charge: TelemetryCharge,
        rho_total: float,
        *,
        active_set_state: bytes | None = None,
        coverage_state: bytes | None = None,
    ) -> TelemetryBalance:
        """Debit ``charge`` iff all charges still sum to at most ``rho_total``; else raise
        ``TelemetryBudgetError`` and write nothing. The first charge pins ``rho_total`` for the
        state (a later, different total is refused). ``active_set_state`` / ``coverage_state``
        are stored in the same transaction. Stores without a telemetry ledger refuse every
        charge."""
        raise StoreError(f"{type(self).__name__} keeps no telemetry ledger")

    @abc.abstractmethod
    def close(self) -> None: ...


def check_sink_not_ahead(
    state_path: str | os.PathLike[str], last_closed_day: str | None, sink: Sink
) -> str | None:
    """Refuse a state whose last closed day is before a day the release sink already holds: the
    published releases are a mirror of the sequence the state cannot roll back (a stale copy
    restored together with its ``.seq`` file is caught here). Checked before the sink fences
    the instance publishing now (a stale copy never stops a healthy instance) and again once
    it has (``Sink.take_over``: nothing can be published in between any more); the sink is
    this state's publisher only if both pass. Returns the latest day the sink holds."""
    _refuse_ahead(state_path, last_closed_day, sink.last_published_day())
    held = sink.take_over()
    _refuse_ahead(state_path, last_closed_day, held)
    return held


def _refuse_ahead(
    state_path: str | os.PathLike[str], last_closed_day: str | None, published_day: str | None
) -> None:
    if published_day is not None and (last_closed_day is None or published_day > last_closed_day):
        raise StaleStoreError(
            f"state store {state_path} is stale: the release sink already holds releases of "
            f"{published_day}, after the state's last closed day ({last_closed_day or 'none'}); "
            "resuming would re-draw noise for released days and forget spent budget — restore "
            "the newest copy of the state, or start a new run with a new [state] path and sink"
        )
