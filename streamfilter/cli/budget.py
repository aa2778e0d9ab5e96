"""``streamfilter budget`` (one user's odometer) and ``streamfilter budget-stats`` (private
population statistics of budget use). See docs/odometer.md.

``budget --user ID`` — **the values are for that user alone.** A user's spent budget depends on
their own data, so it may be shown to that user and to nobody else (Feldman & Zrnic §4.4; Yu et
al. §3.4; docs/design.md §6.11). Showing it to its owner costs the *other* users nothing: it is a
function of the owner's data and of the published releases only. streamfilter serves these
values through no network endpoint; the command reads the state file, so whoever can run it can
read every user's value — deliver each result to its owner only.

It opens the state **read-only and without the writer's lock** (:class:`SQLiteStateReader`): the
daemon normally runs for ever, a read never changes the state, and a WAL reader sees exactly the
last committed day without blocking the writer. Taking the exclusive lock instead would make the
command useless while the daemon runs, and a daemon restarting during a lookup would be refused
(exit 3).

``budget-stats`` releases noisy statistics of the spent fractions ``spent/B`` over all users in the
ledger (:mod:`streamfilter.privacy.budget_stats`), charged to the ``[telemetry]`` budget. It writes
(the telemetry ledger), so it takes the exclusive lock like ``run``: with the daemon running it
exits 3 ("in use"); stop the daemon (SIGTERM drains it), run it, restart. A call that would exceed
``telemetry.rho`` is refused before any noise is drawn (exit 5); the ledger is checked again, and
the charge written, in one transaction before anything is printed.

Exit codes: as ``streamfilter`` (0, 2 configuration, 3 state in use, 4 store failure), and 5: the
telemetry budget would be exceeded (nothing released).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass
from streamfilter.runtime.user_budgets import budget_stats, user_budget


def _budget_text(b: dict[str, Any]) -> str:
    o = b["odometer"]
    return "\n".join(
        [
            f"budget of user {b['user_id']} — for this user only; do not show it to anyone else",
            f"  spent      {b['spent']:.6g} of B_norm = {b['b_norm']:g} (Σ‖q‖², data units; "
            f"{b['spent_fraction']:.2%}){'  [retired]' if b['retired'] else ''}",
            f"  remaining  {b['remaining']:.6g}",
            *(
                f"  analyst    {name}: spent {a['spent']:.6g} of its sub-budget "
                f"{a['sub_budget']:.6g} (share {a['share']:.4g}); remaining {a['remaining']:.6g}"
                f"{'  [retired]' if a['retired'] else ''}"
                for name, a in b.get("analysts", {}).items()
            ),
            f"  loss       {b['rho_spent']:.6g}-zCDP of the run's {b['rho_budget']:.6g}; "
            f"ε = {b['epsilon_spent']:.6g} at δ = {b['delta']:.3g} ({b['method']})",
            f"  odometer   Δ = {o['step']:.6g}: spent <= {o['spent']:.6g} → {o['rho']:.6g}-zCDP, "
            f"ε = {o['epsilon']:.6g} (Algorithm 5 / Cor. 4.11)",
            "  cost       none: this reads the state; no budget is spent by looking",
            (
                f"  as of the last closed day, {b['last_closed_day']}"
                if b["last_closed_day"] is not None
                else "  no day has closed yet: nothing has been spent from any budget"
            ),
        ]
    )


def _stats_text(s: dict[str, Any]) -> str:
    qs = ", ".join(
        f"{q}: {'n/a' if v is None else format(v, '.3f')}" for q, v in s["quantiles"].items()
    )
    return "\n".join(
        [
            (
                f"private budget statistics of analyst {s['analyst']} (its spent/B_a over users "
                "charged at least once; noisy)"
                if s.get("analyst")
                else "private budget statistics (spent/B over users charged at least once; noisy)"
            ),
            f"  users      ≈ {s['users_noisy']:.0f} (σ = {s['sigma']['users']:.3g})",
            f"  mean       {s['mean_spent_fraction']:.4f}",
            f"  quantiles  {qs} (bin width {1 / s['bins']:g})",
            f"  cost       {s['rho_charged']:g}-zCDP of telemetry.rho = {s['telemetry_rho_total']:g}; "
            f"remaining {s['telemetry_rho_remaining_shown']} "
            f"({s['budget_stats_calls_left']} more budget-stats call(s))",
            (
                f"  as of the last closed day, {s['last_closed_day']}"
                if s["last_closed_day"] is not None
                else "  no day has closed yet: every spent budget is 0"
            ),
        ]
    )


def cmd_budget(args: argparse.Namespace) -> int:
    from streamfilter.config import load_config

    result = user_budget(load_config(args.config), args.user, args.step)
    print(json.dumps(result, indent=2) if args.json else _budget_text(result))
    return 0


def cmd_budget_stats(args: argparse.Namespace) -> int:
    from streamfilter.config import load_config
    from streamfilter.errors import ConfigError

    try:
        qs = tuple(float(q) for q in args.quantiles.split(","))
    except ValueError:
        raise ConfigError(
            f"--quantiles: not a comma-separated list of numbers: {args.quantiles!r}"
        ) from None
    if not all(0.0 < q < 1.0 for q in qs):
        raise ConfigError(f"--quantiles: each must be in (0, 1), got {args.quantiles!r}")
    from streamfilter.runtime.app import kafka_errors_explained

    settings = load_config(args.config)
    with kafka_errors_explained(settings):  # Kafka TLS/SASL/ACL failures: one line, exit 6
        result = budget_stats(settings, quantiles=qs, analyst=args.analyst)  # exit 5: no budget
    print(json.dumps(result, indent=2) if args.json else _stats_text(result))
    return 0


def add_budget_commands(sub: Any) -> None:
    """Register ``budget`` and ``budget-stats`` on the CLI's subparsers."""
    bud = sub.add_parser(
        "budget", help="one user's spent budget and odometer (show it to that user only)"
    )
    bud.add_argument("--config", required=True)
    bud.add_argument("--user", required=True, help="user_id")
    bud.add_argument("--step", type=float, default=None, help="odometer Δ, data units (b_norm/100)")
    bud.add_argument("--json", action="store_true")
    bud.set_defaults(func=cmd_budget)

    sta = sub.add_parser(
        "budget-stats", help="noisy mean/quantiles of spent budgets, charged to [telemetry]"
    )
    sta.add_argument("--config", required=True)
    sta.add_argument("--quantiles", default="0.1,0.5,0.9", help="comma-separated, in (0, 1)")
    sta.add_argument(
        "--analyst",
        default=None,
        help="the spent fractions of this analyst's sub-budget (docs/design.md §2.13)",
    )
    sta.add_argument("--json", action="store_true")
    sta.set_defaults(func=cmd_budget_stats)
