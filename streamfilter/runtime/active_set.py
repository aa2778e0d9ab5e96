"""Wiring of the opt-in active-set estimate (``[telemetry] active_set = true``) for the daemon.

On the first start with the estimate on, its whole cost (``telemetry.active_set_rho``, for
``telemetry.active_set_horizon`` days) is charged to the telemetry ledger and the fresh tracker is
stored, in one transaction; a charge that does not fit the telemetry budget refuses to start.
Later starts resume the stored tracker (it is committed with every day it changes) and refuse a
configuration whose horizon, noise or threshold differ from it.
"""

from __future__ import annotations

import json

from streamfilter.config import Settings
from streamfilter.engine.active_set import ActiveSetSpec, ActiveSetTracker
from streamfilter.engine.params import PrivacyParams
from streamfilter.errors import ConfigError
from streamfilter.privacy.continual import BinaryTreeCounter
from streamfilter.runtime.store import StateStore, TelemetryBudgetError, TelemetryCharge

__all__ = ["load_active_set"]


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
    if stored is not None:
        tracker = ActiveSetTracker.from_json(stored)
        if tracker.description() != fresh.description():
            raise ConfigError(
                "telemetry.active_set_rho, active_set_horizon and active_min_remaining differ "
                f"from those the active-set estimate of this state was started with "
                f"({tracker.description()}); they cannot change during a run"
            )
        return tracker
    record = json.dumps({**fresh.description(), "rho_effective": fresh.rho}).encode()
    try:
        store.charge_telemetry(
            TelemetryCharge(kind="active_set", rho=t.active_set_rho, record=record),
            t.rho,
            active_set_state=fresh.to_json().encode(),
        )
    except TelemetryBudgetError as exc:
        raise ConfigError(f"telemetry.active_set_rho: {exc}") from None
    return fresh
