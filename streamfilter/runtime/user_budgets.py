"""Per-user budgets read from the state: one user's odometer, and private population statistics
of budget use charged to the ``[telemetry]`` budget (docs/odometer.md).

A user's spent budget depends on their own data, so it may be shown to that user and to nobody
else (Feldman & Zrnic §4.4; Yu et al. §3.4; docs/design.md §6.11). :func:`user_budget` opens the
state read-only and without the writer's lock (:class:`SQLiteStateReader`), so it works while the
daemon runs. :func:`budget_stats` writes (the telemetry ledger), so it takes the writer's lock; a
call that would exceed ``telemetry.rho`` is refused before any noise is drawn
(``TelemetryBudgetError``), and the charge is written in one transaction before anything is shown.
"""

from __future__ import annotations

import json
import logging
import math
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from streamfilter.privacy.quotas import (
    DEFAULT_ANALYST,
    AnalystQuotas,
    analyst_key,
    split_budgets,
)
from streamfilter.privacy.rounding import float_down, float_up

if TYPE_CHECKING:
    from streamfilter.config import Settings
    from streamfilter.engine.params import PrivacyParams
    from streamfilter.privacy.noise import RandomBits


log = logging.getLogger("streamfilter.budget")

#: default odometer step Δ as a fraction of B_norm (fixed in advance, as Corollary 4.11 needs)
DEFAULT_STEP_FRACTION = Fraction(1, 100)


def _float_down(value: Fraction) -> float:
    """``float_down`` clamped at 0 (a remaining budget is never shown negative)."""
    return max(float_down(value), 0.0)


def _shown(rho: Fraction, total: float) -> str:
    """A remaining ρ for people: rounded down, and 0 below a trillionth of the total (what
    float shares of a budget leave over, e.g. 1.7e-18 after five fifths)."""
    value = _float_down(rho)
    return "0" if value < total * 1e-12 else f"{value:.6g}"


def _check_fingerprint(stored: str | None, params: PrivacyParams, settings: Settings) -> None:
    from streamfilter.config import config_fingerprint
    from streamfilter.errors import ConfigError

    if settings.mode.kind == "local":
        raise ConfigError(
            "local mode keeps no per-user budgets on the server: each device shows its own "
            "(streamfilter.client.LocalFilter.odometer)"
        )
    if stored is not None and stored != config_fingerprint(params):
        raise ConfigError(
            f"[privacy] differs from the configuration the state {settings.state.path} was "
            "created with; budgets can only be read with that configuration"
        )


def user_budget(settings: Settings, user_id: str, step: float | None = None) -> dict[str, Any]:
    """One user's realized loss and discretised odometer. SENSITIVE: for that user alone.

    ``step`` is the odometer's Δ in data units (Σ‖q‖², like ``b_norm``; default ``b_norm/100``),
    rounded up to whole lattice units ``γ²``. The odometer is ``min(ceil(spent/Δ)·Δ, B)``
    (:func:`streamfilter.privacy.odometer.discretised_odometer`; B is the filter's own bound).
    """
    from streamfilter.errors import ConfigError
    from streamfilter.privacy.odometer import discretised_odometer, rho_of_units, user_loss
    from streamfilter.runtime.store import SQLiteStateReader

    params = settings.privacy_params()
    gamma2 = Fraction(params.granularity) ** 2
    step_data = Fraction(params.b_norm) * DEFAULT_STEP_FRACTION if step is None else None
    if step is not None:
        if not (math.isfinite(step) and step > 0.0):
            raise ConfigError(f"--step must be a positive number (data units), got {step!r}")
        step_data = Fraction(step)
    assert step_data is not None
    step_units = max(1, math.ceil(step_data / gamma2))
    quotas = settings.analyst_quotas(params)
    with SQLiteStateReader(settings.state.require_sqlite("budget")) as reader:
        _check_fingerprint(reader.config_fingerprint(), params, settings)
        row, *rows = reader.entries([user_id, *(analyst_key(a, user_id) for a in quotas.named)])
        named = dict(zip(quotas.named, rows, strict=True))
        last_closed_day = reader.last_closed_day()
    spent_units, retired = row if row is not None else (0, False)
    budget_units = params.budget_units
    odometer_units = min(discretised_odometer(spent_units, step_units), budget_units)
    remaining_units = budget_units - spent_units
    variance = params.noise_variance_units
    loss = user_loss(spent_units, params.granularity, variance, params.delta, params.mechanism)
    odo = user_loss(odometer_units, params.granularity, variance, params.delta, params.mechanism)
    return {
        "user_id": user_id,
        "spent": loss.spent,
        "spent_units": spent_units,
        "spent_fraction": float_up(Fraction(spent_units, budget_units)),
        "b_norm": params.b_norm,
        "budget_units": budget_units,
        "remaining": _float_down(remaining_units * gamma2),
        "remaining_units": remaining_units,
        "retired": retired,
        "rho_spent": loss.rho_spent,
        "epsilon_spent": loss.epsilon_spent,
        "delta": params.delta,
        "method": loss.method,
        "rho_budget": params.rho_effective,
        "rho_remaining": _float_down(rho_of_units(remaining_units, params.noise_variance_units)),
        "odometer": {
            "step": float_up(step_units * gamma2),
            "step_units": step_units,
            "spent": odo.spent,
            "spent_units": odometer_units,
            "rho": odo.rho_spent,
            "epsilon": odo.epsilon_spent,
        },
        "mechanism": params.mechanism,
        "last_closed_day": last_closed_day,
        "scope": "this user only: do not show to anyone else",
        **_per_analyst(quotas, spent_units, retired, named, gamma2),
    }


def _spent_of(
    budgets: list[tuple[str, int, bool]], quotas: AnalystQuotas, analyst: str | None
) -> tuple[np.ndarray, int]:
    """Every user's spend (one entry per user charged at least once) and the budget it is a
    fraction of: the global one, or with ``analyst`` that analyst's spend and sub-budget."""
    plain, named = split_budgets(budgets)
    spent = np.array([s for _, s, _ in plain], np.int64)
    if analyst is None:
        return spent, quotas.budget_units
    index = {u: i for i, (u, _, _) in enumerate(plain)}
    of: dict[str, np.ndarray] = {}
    for name, entries in named.items():
        own = np.zeros(len(plain), np.int64)
        for user, units, _retired in entries:
            own[index[user]] = units
        of[name] = own
    own_spent = of.get(analyst) if analyst != DEFAULT_ANALYST else None
    if own_spent is None:
        own_spent = (
            quotas.default_spent(spent, list(of.values()))
            if analyst == DEFAULT_ANALYST
            else np.zeros(len(plain), np.int64)
        )
    return own_spent, quotas.sub_budget_units[analyst]


def _per_analyst(
    quotas: AnalystQuotas,
    spent_units: int,
    retired: bool,
    named: dict[str, tuple[int, bool] | None],
    gamma2: Fraction,
) -> dict[str, Any]:
    """With analysts declared, the user's spend on each analyst's sub-budget (docs/design.md
    §2.13): the named analysts' stored entries, the default analyst's the rest."""
    if not quotas.active:
        return {}
    rows: dict[str, tuple[int, bool]] = {a: v or (0, False) for a, v in named.items()}
    rows[DEFAULT_ANALYST] = (spent_units - sum(v for v, _ in rows.values()), retired)
    out = {}
    for name in quotas.analysts:
        units, gone = rows[name]
        own = quotas.sub_budget_units[name]
        left = int(quotas.remaining_units(name, np.array(spent_units), np.array(units)))
        out[name] = {
            "share": float(quotas.shares[name]),
            "sub_budget": _float_down(own * gamma2),
            "spent": float_up(units * gamma2),
            "spent_units": units,
            "remaining": _float_down(left * gamma2),
            "remaining_units": left,
            "retired": gone,
        }
    return {"analysts": out}


def budget_stats(
    settings: Settings,
    bits: RandomBits | None = None,
    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9),
    analyst: str | None = None,
) -> dict[str, Any]:
    """Release noisy mean and quantiles of the spent fractions, charged to ``[telemetry]``;
    with ``analyst``, of that analyst's sub-budget, ``spent_a/B_a`` over the same users
    (docs/design.md §2.13; one call, one release, one charge).

    Order: 1. open the state (exclusive lock), 2. dry-run the telemetry charge (refuse before
    drawing noise), 3. draw the release, 4. charge the ledger with the release as its record
    (re-checked in the transaction), 5. return it. ``bits``: noise source (default: OS CSPRNG).
    """
    from streamfilter.errors import ConfigError
    from streamfilter.privacy.budget_stats import BudgetStatsMechanism
    from streamfilter.privacy.noise import SystemRandomBits
    from streamfilter.runtime.store import TelemetryBudgetError, TelemetryCharge
    from streamfilter.runtime.store.open import open_store

    params = settings.privacy_params()
    quotas = settings.analyst_quotas(params)
    if analyst is not None:
        if not quotas.active or analyst not in quotas.sub_budget_units:
            raise ConfigError(f"--analyst: {analyst!r} is not declared in [analysts]")
        if quotas.sub_budget_units[analyst] < 1:
            raise ConfigError(f"--analyst: {analyst!r} has no sub-budget (its share is 0)")
    t = settings.telemetry
    mechanism = BudgetStatsMechanism(rho=t.stats_rho)
    store = open_store(settings.state)
    try:
        state = store.load()
        _check_fingerprint(state.config_fingerprint, params, settings)
        spent = sum((Fraction(c.rho) for c in store.telemetry_ledger()), Fraction(0))
        left = Fraction(t.rho) - spent
        if Fraction(t.stats_rho) > left:  # 2. dry run (no noise drawn)
            raise TelemetryBudgetError(
                f"telemetry budget exceeded: budget-stats costs telemetry.stats_rho = "
                f"{t.stats_rho:g} but {_shown(left, t.rho)} "
                f"of telemetry.rho = {t.rho:g} remains (spent by earlier telemetry); nothing "
                "was released — a state's telemetry budget is not renewed"
            )
        log.info(
            "budget-stats spends telemetry.stats_rho = %g of the %s left of telemetry.rho = %g",
            t.stats_rho,
            _shown(left, t.rho),
            t.rho,
        )
        spent_units, budget_units = _spent_of(state.budgets, quotas, analyst)
        stats = mechanism.release(  # 3. the noisy release
            spent_units,
            budget_units,
            bits if bits is not None else SystemRandomBits(),
            quantiles,
        )
        out = stats.to_json_dict()
        if analyst is not None:
            out["analyst"] = analyst
        out["rho_charged"] = t.stats_rho
        out["last_closed_day"] = state.last_closed_day
        balance = store.charge_telemetry(  # 4. check again and commit, then release
            TelemetryCharge("budget_stats", t.stats_rho, json.dumps(out, sort_keys=True).encode()),
            t.rho,
        )
    finally:
        store.close()
    out["telemetry_rho_total"] = balance.total
    out["telemetry_rho_spent"] = balance.spent
    out["telemetry_rho_remaining"] = balance.remaining
    remaining = Fraction(t.rho) - spent - Fraction(t.stats_rho)
    out["telemetry_rho_remaining_shown"] = _shown(remaining, t.rho)
    out["budget_stats_calls_left"] = max(0, math.floor(remaining / Fraction(t.stats_rho)))
    out["population"] = "users charged at least once (the rows of the budget ledger)"
    return out
