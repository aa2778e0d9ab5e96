"""Wiring of the telemetry releases for the daemon: coverage with every release (``[telemetry]
coverage``, on by default; docs/design.md §2.11) and the opt-in active-set estimate
(``[telemetry] active_set = true``).

Each is one tracker with one fixed cost for the whole run, and both follow one routine
(:func:`_resume_or_charge`): on the first start with the tracker on, its whole cost is charged
to the telemetry ledger and the fresh tracker is stored, in one transaction; a charge that does
not fit the telemetry budget refuses to start (exit 2). Later starts resume the stored tracker
(it is committed with every day it changes) and refuse a configuration whose parameters differ
from it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, Literal, Protocol, TypeVar

import numpy as np

from streamfilter.config import Settings
from streamfilter.engine.params import PrivacyParams
from streamfilter.errors import ConfigError
from streamfilter.privacy.continual import BinaryTreeCounter
from streamfilter.privacy.quotas import split_budgets
from streamfilter.runtime.store import StateStore, TelemetryBudgetError, TelemetryCharge
from streamfilter.telemetry.active_set import ActiveSetSpec, ActiveSetTracker
from streamfilter.telemetry.coverage import CoverageSpec, CoverageTracker, analyst_backlog

__all__ = ["coverage_spec", "load_active_set", "load_coverage"]

log = logging.getLogger("streamfilter.telemetry")


class _Tracker(Protocol):
    @property
    def rho(self) -> float: ...

    def description(self) -> dict[str, Any]: ...

    def to_json(self) -> str: ...


_T = TypeVar("_T", bound=_Tracker)


def _resume_or_charge(
    fresh: _T,
    stored: _T | None,
    *,
    kind: Literal["active_set", "coverage"],
    what: str,
    settings_named: str,
    settings: Settings,
    store: StateStore,
    way_out: str = "",
) -> _T:
    """The stored tracker if there is one (refusing a changed specification), else ``fresh``,
    its cost ``telemetry.<kind>_rho`` charged and its state stored in one transaction."""
    if stored is not None:
        if stored.description() != fresh.description():
            raise ConfigError(
                f"{settings_named} differ from those the {what} of this state was started with "
                f"({stored.description()}); they cannot change during a run"
            )
        return stored
    t = settings.telemetry
    rho = t.active_set_rho if kind == "active_set" else t.coverage_rho
    record = json.dumps({**fresh.description(), "rho_effective": fresh.rho}).encode()
    state = fresh.to_json().encode()
    try:
        store.charge_telemetry(
            TelemetryCharge(kind=kind, rho=rho, record=record),
            t.rho,
            active_set_state=state if kind == "active_set" else None,
            coverage_state=state if kind == "coverage" else None,
        )
    except TelemetryBudgetError as exc:
        raise ConfigError(f"telemetry.{kind}_rho: {exc}{way_out}") from None
    return fresh


def coverage_spec(settings: Settings) -> CoverageSpec:
    t = settings.telemetry
    return CoverageSpec(
        rho=t.coverage_rho, levels=t.coverage_levels, first_epoch_days=t.coverage_epoch_days
    )


def load_coverage(
    settings: Settings,
    params: PrivacyParams,
    store: StateStore,
    stored: bytes | None,
    budgets: Sequence[tuple[str, int, bool]] = (),
) -> CoverageTracker | None:
    """The tracker the engine should run, or ``None`` when coverage is off. ``stored`` is the
    tracker the state holds (``StoredState.coverage_state``); a first start charges for it.
    ``budgets`` (the state's ledger) seed a first start on a state that already has users: they
    are counted with the next day (``CoverageTracker.with_backlog``)."""
    if not settings.telemetry.coverage:
        return None
    quotas = settings.analyst_quotas(params)
    try:
        fresh = CoverageTracker.create(coverage_spec(settings), params, quotas)
    except ValueError as exc:
        raise ConfigError(f"telemetry.coverage_rho: {exc}") from None
    resumed = None if stored is None else CoverageTracker.from_json(stored)
    if resumed is not None and resumed.ladders != fresh.ladders:
        # the analysts or their shares changed: a new tracker over new streams, charged again
        # (zCDP composes; the ledger refuses a charge beyond telemetry.rho), the old one ends
        log.info("coverage restarts for the analysts now declared (charged again)")
        resumed = None
    if resumed is None and budgets:  # coverage started mid-run: the users the state already holds
        if fresh.ladders:
            fresh = fresh.with_group_backlog(analyst_backlog(fresh, quotas, budgets))
        else:
            plain, _ = split_budgets(budgets)
            spent = np.array([s for _, s, _ in plain], np.int64)
            retired = np.array([r for _, _, r in plain], bool)
            fresh = fresh.with_backlog(spent, retired, params.budget_units)
    return _resume_or_charge(
        fresh,
        resumed,
        kind="coverage",
        what="coverage",
        settings_named="telemetry.coverage_rho, coverage_levels and coverage_epoch_days",
        settings=settings,
        store=store,
        way_out="; set [telemetry] coverage = false to run without coverage",
    )


def load_active_set(
    settings: Settings, params: PrivacyParams, store: StateStore, stored: bytes | None
) -> ActiveSetTracker | None:
    """The tracker the engine should run, or ``None`` when the estimate is off. ``stored`` is
    the tracker the state holds (``StoredState.active_set_state``); a first start charges the
    telemetry budget for it."""
    t = settings.telemetry
    if not t.active_set:
        return None
    spec = ActiveSetSpec(
        rho=t.active_set_rho,
        horizon_days=t.active_set_horizon,
        min_remaining=t.active_min_remaining,
    )
    try:
        BinaryTreeCounter.for_rho(spec.horizon_days, spec.rho)
    except ValueError as exc:
        raise ConfigError(f"telemetry.active_set_rho: {exc}") from None
    try:
        fresh = ActiveSetTracker.create(spec, params)
    except ValueError as exc:
        raise ConfigError(f"telemetry.active_min_remaining: {exc}") from None
    return _resume_or_charge(
        fresh,
        None if stored is None else ActiveSetTracker.from_json(stored),
        kind="active_set",
        what="active-set estimate",
        settings_named="telemetry.active_set_rho, active_set_horizon and active_min_remaining",
        settings=settings,
        store=store,
    )
