"""The population estimate's part of the empirical audit (``verify.audit``, docs/design.md
§2.12): its accounting recomputed from the counters the engine draws from, and the broken
build ``population_noise_per_node`` (auditor-only; no configuration of the product builds it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.queries import AnyQuery
from streamfilter.privacy.continual import MAX_HORIZON
from streamfilter.privacy.departed import DepartedCounter, DepartureRule
from streamfilter.privacy.rounding import float_up
from streamfilter.telemetry.population import PopulationSpec, PopulationTracker

__all__ = ["population_accounting", "population_tracker"]


class _PerNodeCounter(DepartedCounter):
    """BUG (auditor-only): node noise ``N_Z(0, s²)``, not ``N_Z(0, L_e·s²)``."""

    def node_sigma2_units(self, epoch: int) -> int:
        self.horizon(epoch)
        return self.sigma2_units


@dataclasses.dataclass(frozen=True)
class _PerNodeTracker(PopulationTracker):
    """BUG (auditor-only): the departed counters of :class:`_PerNodeCounter`."""

    def counter(self, dims: int) -> DepartedCounter:
        return _PerNodeCounter(self.spec.first_epoch_days, dims, self.sigma2_units)


def population_tracker(
    first_epoch_days: int | None, params: PrivacyParams, bug: str | None
) -> PopulationTracker | None:
    """The audited run's population tracker (None: off); under ``population_noise_per_node``
    the broken one."""
    if first_epoch_days is None:
        return None
    tracker = PopulationTracker.create(PopulationSpec(first_epoch_days), params)
    if bug == "population_noise_per_node":
        return _PerNodeTracker(tracker.spec, tracker.sigma2_units)
    return tracker


def population_accounting(
    tracker: PopulationTracker, queries: Sequence[AnyQuery], params: PrivacyParams
) -> dict[str, Any]:
    """Recompute what the population counters' noise costs a departing user, against what the
    departure rule charges them, for every query and every epoch up to the 2^30-step cap.

    Departed counter: ``L_e`` nodes of variance ``v_e`` cost a vector ``r`` ``L_e·‖r‖²/(2v_e)``,
    i.e. ``L_e·s²/v_e`` lattice units per unit of ``‖r‖²`` charged (must be ``<= 1``). Squares
    counter: at most ``L_e·s²·max‖u‖²/w_e`` units against the ``E`` the rule reserves, with
    ``max‖u‖² <= F·Σu <= F·c`` (``g = 1``) or ``F·(floor(c/g) + d)`` (CKS 2020 Prop. 5 per
    node, additive over nodes). Exact rationals; ``ok`` iff both hold everywhere."""
    s2 = params.sigma2_units
    worst_r, worst_u, epochs = Fraction(0), Fraction(0), 0
    for query in queries:
        full = params.lattice.max_cost_units(query.clip)
        dims = query.weights().shape[1]
        rule = DepartureRule.of(full, dims, s2)
        departed, squares = tracker.counter(dims), tracker.squares_counter(rule)
        sum_u = full if rule.shift == 0 else (full >> rule.shift) + dims
        norm2_u = rule.square_max * sum_u if full else 0
        for e in range(1, MAX_HORIZON.bit_length() + 1):
            try:
                levels = departed.horizon(e).bit_length()
            except ValueError:
                break
            epochs = max(epochs, e)
            worst_r = max(worst_r, Fraction(levels * s2, departed.node_sigma2_units(e)))
            if rule.extra_max:
                cost = Fraction(levels * s2 * norm2_u, squares.node_sigma2_units(e))
                worst_u = max(worst_u, cost / rule.extra_max)
    return {
        "queries": len(queries),
        "epochs_checked": epochs,
        "departed_loss_per_charged_unit": float_up(worst_r),
        "squares_loss_per_reserved_unit": float_up(worst_u),
        "ok": worst_r <= 1 and worst_u <= 1,
    }
