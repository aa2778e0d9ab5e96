"""``streamfilter learn reproduce|individual|dpsgd-filter``: argparse wiring for the CLI.

:func:`add_learn_commands` registers a ``learn`` subcommand on the CLI's subparsers (as
``streamfilter.budget.add_budget_commands`` does); each leaf sets ``func`` to a function
``(args) -> int`` returning the exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .grid import EPSILONS, PROTOCOLS, REGIMES

__all__ = ["add_learn_commands", "cmd_dpsgd_filter", "cmd_individual", "cmd_reproduce"]


def _write_json(data: dict[str, Any], path: str | None) -> None:
    text = json.dumps(data, indent=1, sort_keys=False)
    if path is None or path == "-":
        sys.stdout.write(text + "\n")
    else:
        Path(path).write_text(text + "\n", encoding="utf-8")


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Feldman & Zrnic §5.1 on digits: the rows selected by --epsilon / --regime."""
    from .reproduce import reproduce

    result = reproduce(
        args.trials,
        epsilons=args.epsilon or EPSILONS,
        regimes=args.regime or REGIMES,
        protocols=PROTOCOLS if args.protocol == "both" else (args.protocol,),
        seed=args.seed,
        dataset=args.dataset,
        checks=args.checks,
        check_fraction=args.check_fraction,
    )
    _write_json(result, args.json)
    if args.json not in (None, "-"):
        for row in result["rows"]:
            note = "" if row["checks_private"] else "  [checks exact: not private]"
            print(
                f"{row['protocol']:<14} ε={row['epsilon']:<4} {row['regime']:<17} "
                f"n·√(2ρ)={row['snr']:7.0f}  private GD {row['gd_mean']:6.2f} ± "
                f"{row['gd_std']:.2f}   with filtering {row['filtered_mean']:6.2f} ± "
                f"{row['filtered_std']:.2f}   ({row['trials']} trials){note}"
            )
    return 0


def cmd_individual(args: argparse.Namespace) -> int:
    """Yu et al.'s individual ε of DP-SGD on digits: JSON and (optionally) the HTML report."""
    from .individual_accounting import individual_study
    from .learning_report import write_individual_report

    study = individual_study(steps=args.steps, exact_sample=args.exact_sample, seed=args.seed)
    _write_json(study, args.json)
    if args.html:
        write_individual_report(study, Path(args.html))
    if args.json not in (None, "-"):
        print(
            f"worst-case ε {study['worst_case_epsilon']:.3f}; median individual ε "
            f"{study['epsilon']['median']:.3f}; r(ε, log loss) "
            f"{study['loss_correlation']['pearson_r_epsilon_log_loss']:.3f}; r(estimated, exact) "
            f"{study['estimated_vs_exact']['pearson_r']:.4f}"
        )
    return 0


def cmd_dpsgd_filter(args: argparse.Namespace) -> int:
    """Plain DP-SGD against DP-SGD with individual Rényi filters at the same (ε, δ)."""
    from .dpsgd_filter import compare_filtered_dpsgd

    result = compare_filtered_dpsgd(
        args.dataset,
        trials=args.trials,
        extra_factor=args.extra_factor,
        clip_factor=args.clip_factor,
        seed=args.seed,
    )
    _write_json(result, args.json)
    if args.json not in (None, "-"):
        print(
            f"{result['dataset']}: (ε, δ) = ({result['epsilon']:.3f}, {result['delta']:g}); "
            f"DP-SGD {result['plain_mean']:.2f} ± {result['plain_std']:.2f} "
            f"({result['plain_steps']} steps); with individual filters "
            f"{result['filtered_mean']:.2f} ± {result['filtered_std']:.2f} "
            f"({result['filtered_steps']} steps); active fraction "
            f"{result['active_fraction_at_step']}"
        )
    return 0


def add_learn_commands(sub: Any) -> None:
    """Register ``learn reproduce`` and ``learn individual`` on the CLI's subparsers."""
    learn = sub.add_parser("learn", help="the papers' learning experiments (private GD, DP-SGD)")
    leaves = learn.add_subparsers(dest="learn_command", required=True)

    rep = leaves.add_parser(
        "reproduce", help="Feldman & Zrnic §5.1: private GD with and without individual filtering"
    )
    rep.add_argument(
        "--dataset",
        default="digits",
        choices=["digits"],
        help="data set (scikit-learn's bundled digits)",
    )
    rep.add_argument(
        "--trials", type=int, default=10, help="independent trials per row (default 10)"
    )
    rep.add_argument(
        "--epsilon",
        type=float,
        action="append",
        choices=list(EPSILONS),
        help="a row's ε (δ = 1e-5); repeatable, default all",
    )
    rep.add_argument(
        "--regime",
        action="append",
        choices=list(REGIMES),
        help="a row's regime; repeatable, default all",
    )
    rep.add_argument(
        "--protocol",
        default="private-checks",
        choices=[*PROTOCOLS, "both"],
        help="paper: Appendix A exactly (B_norm = k·C², exact checks: NOT private); "
        "private-checks: the checks paid from the same (ε, δ); both: one row of each",
    )
    rep.add_argument(
        "--checks", type=int, default=8, help="private accuracy checks (0: ablation, last iterate)"
    )
    rep.add_argument(
        "--check-fraction", type=float, default=0.1, help="share of ρ paid for the checks"
    )
    rep.add_argument("--seed", type=int, default=None, help="reproducible noise (tests only)")
    rep.add_argument("--json", default=None, help="output file ('-' or absent: stdout)")
    rep.set_defaults(func=cmd_reproduce)

    flt = leaves.add_parser(
        "dpsgd-filter",
        help="DP-SGD with individual Rényi filters against plain DP-SGD at the same (ε, δ)",
    )
    flt.add_argument(
        "--dataset",
        default="digits",
        choices=["digits", "synthetic"],
        help="digits (bundled with scikit-learn) or synthetic (60,000 examples; default digits)",
    )
    flt.add_argument("--trials", type=int, default=10, help="independent trials (default 10)")
    flt.add_argument(
        "--extra-factor", type=float, default=2.0, help="filtered steps ÷ plain steps (default 2)"
    )
    flt.add_argument(
        "--clip-factor", type=float, default=1.0, help="C × this (σ unchanged: a too-large clip)"
    )
    flt.add_argument("--seed", type=int, default=None, help="reproducible noise (tests only)")
    flt.add_argument("--json", default=None, help="output file ('-' or absent: stdout)")
    flt.set_defaults(func=cmd_dpsgd_filter)

    ind = leaves.add_parser(
        "individual", help="Yu et al.: individual ε of DP-SGD, its statistics and the report"
    )
    ind.add_argument("--steps", type=int, default=None, help="DP-SGD steps (default 120)")
    ind.add_argument("--exact-sample", type=int, default=300, help="examples with exact ε")
    ind.add_argument("--seed", type=int, default=None, help="reproducible noise (tests only)")
    ind.add_argument("--json", default=None, help="output file ('-' or absent: stdout)")
    ind.add_argument("--html", default=None, help="write the HTML report here")
    ind.set_defaults(func=cmd_individual)
