"""Command line: ``streamfilter run | guarantee | simulate-local | demo`` and more.

Exit codes: 0 success (also after SIGTERM), 2 configuration error, 3 state owned by another
process, 4 state store failure (fail closed: nothing was released), 1 anything unexpected.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from streamfilter import __version__
from streamfilter.budget import add_budget_commands
from streamfilter.config import ConfigError, load_config
from streamfilter.runtime.store import StoreError, StoreLockedError

EXIT_CONFIG, EXIT_LOCKED, EXIT_STORE = 2, 3, 4


def _err(msg: str) -> None:
    print(f"streamfilter: {msg}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    import threading

    # SIGTERM/SIGINT are handled from the first moment: a stop requested while the store, the
    # source and the sinks are still opening is honoured as soon as the daemon exists.
    stop_requested = threading.Event()
    daemon_ref: list[object] = []

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()
        for d in daemon_ref:
            d.stop()  # type: ignore[attr-defined]

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    from streamfilter.runtime.app import build_daemon

    settings = load_config(args.config)
    parts = build_daemon(settings, follow=not args.until_end, allow_test_seed=args.testing)
    daemon_ref.append(parts.daemon)
    if stop_requested.is_set():
        parts.daemon.stop()
    try:
        summary = parts.daemon.run(until_end=args.until_end)
    finally:
        parts.close()
    print(json.dumps({"summary": summary.as_dict()}), file=sys.stderr)
    return 0


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
        }
    )
    out["mode"] = settings.mode.kind
    if settings.mode.kind == "central":
        out.update(_with_telemetry(float(out["rho"]), settings.telemetry.rho, params.delta))
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
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(_guarantee_text(out))
    return 0


def _with_telemetry(rho: float, telemetry_rho: float, delta: float) -> dict[str, float]:
    """The run's guarantee including the ``[telemetry]`` budget (``budget-stats`` and the
    active-set estimate, each charged to it and refused beyond it): zCDP composes additively
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
    lines = [
        "streamfilter guarantee — per user, over the whole run, for any number of queries",
        f"  {g['rho']:.6g}-zCDP (Feldman & Zrnic Thm 4.5 / Cor 4.7; effective {g['rho_effective']:.6g})",
        f"  ({g['epsilon']:.6g}, {g['delta']:.3g})-DP by {g['method']}",
    ]
    for method, value in sorted(eps.items()):
        lines.append(f"      ε by {method:<6}: {value:.6g}")
    lines += [
        f"  mechanism {g['mechanism']}, σ = {g['sigma']:.6g} per coordinate (95% ± {g['ci95_halfwidth']:.6g})",
        f"  budget Σ‖q‖² ≤ B_norm = {g['b_norm']:g} per user, lattice γ = {g['granularity']!r}, "
        f"exhaustion {g['exhaustion']}",
    ]
    if "rho_total_max" in g:
        lines.append(
            f"  with the [telemetry] budget (budget-stats, active-set estimate) at most "
            f"{g['rho_total_max']:.6g}-zCDP, ε = {g['epsilon_total_max']:.6g} "
            "(ρ + telemetry.rho; zCDP composition, Bun & Steinke 2016 Lemma 2.3)"
        )
    if g.get("mode") == "local":
        lines.append(f"  local mode, variant {g['local_variant']}: devices run the filter")
        if "rho_local_per_device" in g:
            lines[1:3] = [
                f"  each device's messages: {g['rho_local_per_device']:.6g}-zCDP against the "
                f"server itself (σ_local = {g['sigma_local']:g}; "
                f"ε = {g['epsilon_local_per_device']:.6g} at δ = {g['delta']:.3g}, CKS)",
                "  (the server adds no noise; releases are sums of the devices' noisy messages)",
            ]
    return "\n".join(lines)


def cmd_topics(args: argparse.Namespace) -> int:
    from streamfilter.runtime.app import topic_specs
    from streamfilter.runtime.kafka import create_topics

    settings = load_config(args.config)
    specs = topic_specs(settings)
    if not specs:
        _err("no section of this configuration uses kind = 'kafka'")
        return EXIT_CONFIG
    created = create_topics(settings.kafka.client_config(), specs)
    for spec in specs:
        state = "created" if spec.name in created else "exists"
        print(
            f"{spec.name}\t{spec.role}\tpartitions={spec.partitions}\treplication={spec.replication_factor}\t{state}"
        )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from streamfilter.report import write_report

    path = write_report(load_config(args.config), args.out)
    print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_simulate_local(args: argparse.Namespace) -> int:
    from streamfilter.simulate import simulate_local, write_summary

    summary = simulate_local(load_config(args.config), allow_test_seed=args.testing)
    print(write_summary(summary), file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from streamfilter.demo import run_demo

    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="streamfilter-demo-"))
    return run_demo(out_dir, users=args.users, days=args.days, p_active=args.p_active)


def _testing_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--testing",
        action="store_true",
        help="allow [testing] noise_seed (releases are NOT private)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamfilter", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"streamfilter {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log day closes")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the stream processor")
    run.add_argument("--config", required=True, help="TOML configuration file")
    run.add_argument(
        "--until-end", action="store_true", help="close every open day at end of input and exit"
    )
    _testing_flag(run)
    run.set_defaults(func=cmd_run)

    gua = sub.add_parser("guarantee", help="print the privacy guarantee of a configuration")
    gua.add_argument("--config", required=True)
    gua.add_argument("--json", action="store_true")
    gua.set_defaults(func=cmd_guarantee)

    add_budget_commands(sub)  # budget, budget-stats (streamfilter/budget.py)

    topics = sub.add_parser("topics", help="manage the Kafka topics a configuration names")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_sub.add_parser("create", help="create missing topics")
    create.add_argument("--config", required=True)
    create.set_defaults(func=cmd_topics)

    rep = sub.add_parser("report", help="write a self-contained HTML report of the releases")
    rep.add_argument("--config", required=True)
    rep.add_argument("--out", default="report.html", help="output file (default: report.html)")
    rep.set_defaults(func=cmd_report)

    sim = sub.add_parser(
        "simulate-local",
        help="local mode: one simulated device (own filter) per user of [source], driving the "
        "local-mode server",
    )
    sim.add_argument("--config", required=True, help="TOML configuration with [mode] kind=local")
    _testing_flag(sim)
    sim.set_defaults(func=cmd_simulate_local)

    demo = sub.add_parser("demo", help="synthetic sparse-monitoring stream on the embedded default")
    demo.add_argument("--users", type=int, default=100_000)
    demo.add_argument("--days", type=int, default=60)
    demo.add_argument("--p-active", type=float, default=0.1)
    demo.add_argument(
        "--out", help="directory for config, state and releases (default: a temp dir)"
    )
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except ConfigError as exc:
        _err(str(exc))
        return EXIT_CONFIG
    except StoreLockedError as exc:
        _err(str(exc))
        return EXIT_LOCKED
    except StoreError as exc:
        _err(f"{exc}; failing closed, nothing was released past the last committed day")
        return EXIT_STORE
    except FileNotFoundError as exc:
        _err(f"file not found: {exc.filename}")
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
