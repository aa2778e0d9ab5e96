"""Wiring of coverage with every release (``[telemetry] coverage``, on by default) for the daemon.

On the first start with coverage on, its whole cost (``telemetry.coverage_rho``, for the whole
unbounded run: docs/design.md §2.11) is charged to the telemetry ledger and the fresh tracker is
stored, in one transaction; a charge that does not fit the telemetry budget refuses to start
(exit 2, naming ``coverage = false`` as the way out). Later starts resume the stored tracker (it
is committed with every day) and refuse a configuration whose thresholds, epochs or noise differ.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from streamfilter.config import Settings
from streamfilter.engine.coverage import CoverageSpec, CoverageTracker
from streamfilter.engine.params import PrivacyParams
from streamfilter.errors import ConfigError
from streamfilter.runtime.store import StateStore, TelemetryBudgetError, TelemetryCharge

__all__ = ["coverage_spec", "load_coverage"]


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
    t = settings.telemetry
    if not t.coverage:
        return None
    try:
        fresh = CoverageTracker.create(coverage_spec(settings), params)
    except ValueError as exc:
        raise ConfigError(f"telemetry.coverage_rho: {exc}") from None
    if stored is not None:
        tracker = CoverageTracker.from_json(stored)
        if tracker.description() != fresh.description():
            raise ConfigError(
                "telemetry.coverage_rho, coverage_levels and coverage_epoch_days differ from "
                f"those the coverage of this state was started with ({tracker.description()}); "
                "they cannot change during a run"
            )
        return tracker
    if budgets:  # coverage started mid-run: the users the state already holds
        _, spent, retired = zip(*budgets, strict=True)
        fresh = fresh.with_backlog(
            np.array(spent, np.int64), np.array(retired, bool), params.budget_units
        )
    record = json.dumps({**fresh.description(), "rho_effective": fresh.rho}).encode()
    try:
        store.charge_telemetry(
            TelemetryCharge(kind="coverage", rho=t.coverage_rho, record=record),
            t.rho,
            coverage_state=fresh.to_json().encode(),
        )
    except TelemetryBudgetError as exc:
        raise ConfigError(
            f"telemetry.coverage_rho: {exc}; set [telemetry] coverage = false to run without "
            "coverage"
        ) from None
    return fresh
