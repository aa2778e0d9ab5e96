"""``streamfilter guarantee``: the privacy guarantee a configuration gives every user."""

from __future__ import annotations

import argparse
import json

from streamfilter.config import load_config
from streamfilter.engine.params import LINF_FAILURE_PROBABILITY


def cmd_guarantee(args: argparse.Namespace) -> int:
    settings = load_config(args.config)
    params = settings.privacy_params()
    g = params.guarantee()
    out = g.to_json_dict()
    out.update(
        {
            "granularity": params.granularity,
            "budget_units": params.budget_units,
            "sigma_calibrated": params.sigma,
            "rho_effective": params.rho_effective,
            "exhaustion": str(params.exhaustion),
            "rho_calibration": params.rho_method,
            "ci95_halfwidth": params.ci95_halfwidth,
            # Corollary 4.7: one coordinate (d = 1) within this of the active set's exact sum
            "linf_bound_d1": params.linf_bound(1),
            "linf_failure_probability": LINF_FAILURE_PROBABILITY,
        }
    )
    out["mode"] = settings.mode.kind
    if settings.mode.kind == "central":
        out.update(with_telemetry(float(out["rho"]), settings.telemetry.rho, params.delta))
        if settings.telemetry.coverage:  # paid from the telemetry budget (docs/design.md §2.11)
            out["rho_coverage"] = settings.telemetry.coverage_rho
        if settings.telemetry.population:  # paid inside each user's filter (§2.12): no ρ
            out["rho_population"] = 0.0
    if settings.mode.kind == "local":
        out["local_variant"] = settings.local.variant
        s2_local = settings.sigma2_local_units()
        if s2_local is not None:
            # each device's messages against the server itself: Theorem 4.5 with the device's
            # own noise, B/(2·s_l²)-zCDP (client.core); the release is post-processing of them
            from fractions import Fraction

            from streamfilter.privacy.accounting import epsilon_from_rho_cks

            rho_local = float(Fraction(params.budget_units, 2 * s2_local))
            out["rho_local_per_device"] = rho_local
            out["epsilon_local_per_device"] = epsilon_from_rho_cks(rho_local, params.delta)
            out["sigma_local"] = settings.local.sigma_local
            # what each release reports (engine.local.local_noise_release): the server adds no
            # noise, so a release's σ is that of the sum of ñ ≥ n devices' noise, ñ = n rounded
            # up to a power of two: σ = sqrt(ñ · variance_local). No central σ applies.
            from streamfilter.privacy.discrete_gaussian_moments import discrete_gaussian_variance

            var_units = discrete_gaussian_variance(s2_local)
            out["variance_local"] = float(var_units) * params.granularity**2
            out["release_sigma"] = "sqrt(n_bucket * variance_local)"
            for key in ("sigma", "ci95_halfwidth", "linf_bound_d1", "sigma_calibrated"):
                out.pop(key, None)
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(_guarantee_text(out))
    return 0


def with_telemetry(rho: float, telemetry_rho: float, delta: float) -> dict[str, float]:
    """The run's guarantee including the ``[telemetry]`` budget (coverage, ``budget-stats`` and
    the active-set estimate, each charged to it and refused beyond it): zCDP composes additively
    (Bun & Steinke 2016, Lemma 2.3), so each user's total is at most ``ρ + telemetry.rho``.
    The sum is rounded up, never down."""
    from fractions import Fraction

    from streamfilter.privacy.accounting import epsilon_from_rho_cks
    from streamfilter.privacy.rounding import float_up

    total = float_up(Fraction(rho) + Fraction(telemetry_rho))
    return {
        "rho_telemetry_max": telemetry_rho,
        "rho_total_max": total,
        "epsilon_total_max": epsilon_from_rho_cks(total, delta),
    }


def _guarantee_text(g: dict[str, object]) -> str:
    eps = g["epsilon_by_method"]
    assert isinstance(eps, dict)
    lines = ["streamfilter guarantee — per user, over the whole run, for any number of queries"]
    if "rho_total_max" in g:  # the headline is the TOTAL: the queries and the [telemetry] budget
        lines.append(
            f"  TOTAL {g['rho_total_max']:.6g}-zCDP, ({g['epsilon_total_max']:.6g}, "
            f"{g['delta']:.3g})-DP by cks = queries {g['rho']:.6g} + telemetry "
            f"{g['rho_telemetry_max']:.6g} (zCDP composition, Bun & Steinke 2016 Lemma 2.3)"
        )
    lines += [
        f"  queries: {g['rho']:.6g}-zCDP (Feldman & Zrnic Thm 4.5 / Cor 4.7; effective "
        f"{g['rho_effective']:.6g}), ({g['epsilon']:.6g}, {g['delta']:.3g})-DP by {g['method']}",
    ]
    for method, value in sorted(eps.items()):
        lines.append(f"      ε by {method:<6}: {value:.6g}")
    if "sigma" in g:  # central noise (local_noise: each release states its own σ)
        lines += [
            f"  mechanism {g['mechanism']}, σ = {g['sigma']:.6g} per coordinate (95% ± {g['ci95_halfwidth']:.6g})",
            f"  accuracy (Corollary 4.7): each answer is within {g['linf_bound_d1']:.6g} of the "
            f"exact sum over the active set (users whose budget still admits the query) in every "
            f"coordinate, except with probability {g['linf_failure_probability']:g} (d = 1; each "
            "release states its own for its d)",
        ]
    lines += [
        f"  budget Σ‖q‖² ≤ B_norm = {g['b_norm']:g} per user, lattice γ = {g['granularity']!r}, "
        f"exhaustion {g['exhaustion']}",
    ]
    if "rho_total_max" in g:
        coverage = (
            f"coverage with every release {g['rho_coverage']:.6g} for the whole run, "
            if "rho_coverage" in g
            else ""
        )
        lines.append(
            f"  telemetry ({coverage}budget-stats, active-set estimate): at most "
            f"{g['rho_telemetry_max']:.6g}-zCDP over the state's life ([telemetry] rho)"
        )
    if "rho_population" in g:
        lines.append(
            "  population estimate with every release: no extra ρ (each departing value is "
            "paid inside its user's own filter, docs/design.md §2.12)"
        )
    if g.get("mode") == "local":
        lines.append(f"  local mode, variant {g['local_variant']}: devices run the filter")
        if "rho_local_per_device" in g:
            lines[1:2] = [
                f"  each device's messages: {g['rho_local_per_device']:.6g}-zCDP against the "
                f"server itself (σ_local = {g['sigma_local']:g}; "
                f"ε = {g['epsilon_local_per_device']:.6g} at δ = {g['delta']:.3g}, CKS)",
                "  (the server adds no noise; releases are sums of the devices' noisy messages)",
            ]
            lines = [
                x for x in lines if not x.startswith(("  mechanism", "  accuracy", "      ε by"))
            ]
            lines.insert(
                3,
                f"  noise: each device adds N_Z(0, σ_local²) per coordinate (variance "
                f"{g['variance_local']:.6g}); a release summing n contributions reports σ = "
                "sqrt(ñ · variance), ñ = n rounded up to a power of two (n is not published)",
            )
    return "\n".join(lines)
