"""Command line: ``streamfilter run | guarantee | simulate-local | demo`` and more.

Exit codes: each error class carries its own (``streamfilter.errors.EXIT_CODES`` is the map); an
error outside that hierarchy is a bug and exits 1 with its traceback.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from streamfilter import __version__
from streamfilter.cli.budget import add_budget_commands
from streamfilter.cli.check import cmd_check
from streamfilter.cli.guarantee import cmd_guarantee
from streamfilter.cli.run import cmd_run
from streamfilter.cli.topics import cmd_topics
from streamfilter.config import load_config
from streamfilter.errors import ExitCode, StreamfilterError
from streamfilter.learn.commands import add_learn_commands


def _err(msg: str) -> None:
    print(f"streamfilter: {msg}", file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> int:
    from streamfilter.cli.report import write_report

    path = write_report(load_config(args.config), args.out)
    print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_simulate_local(args: argparse.Namespace) -> int:
    from streamfilter.cli.simulate import simulate_local, write_summary
    from streamfilter.runtime.app import kafka_errors_explained

    settings = load_config(args.config)
    with kafka_errors_explained(settings):  # Kafka TLS/SASL/ACL failures: one line, exit 6
        summary = simulate_local(settings, allow_test_seed=args.testing)
    print(write_summary(summary), file=sys.stderr)
    return 0


def cmd_migrate_state(args: argparse.Namespace) -> int:
    """Convert a SQLite state to this version's row checksums (the writer's open does it, in one
    transaction; ``runtime/store/sqlite.py``)."""
    from streamfilter.errors import StoreError
    from streamfilter.runtime.store import SQLiteStateStore

    if not args.state.is_file():
        raise StoreError(f"no state store at {args.state}")
    SQLiteStateStore(args.state).close()
    print(f"state store {args.state}: row checksums in this version's format")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from streamfilter.cli.demo import run_demo

    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="streamfilter-demo-"))
    return run_demo(out_dir, users=args.users, days=args.days, p_active=args.p_active)


def _testing_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--testing",
        action="store_true",
        help="allow [testing] noise_seed (releases are NOT private)",
    )


#: help for the options several commands share (every option has help text: tests/test_cli_help)
SHARED_HELP = {
    "config": "TOML configuration file",
    "json": "print JSON instead of text",
}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _add_logging_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``-v``, ``--log-level`` and ``--log-format``, accepted before and after the subcommand
    (on a subcommand they default to SUPPRESS, so they never overwrite a value given before it)."""
    kw: dict[str, object] = {} if top else {"default": argparse.SUPPRESS}
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        help="more log output (-v: DEBUG); the default level is INFO",
        **({"default": 0} if top else kw),
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        help="log level (default INFO: start-up, each day close, shutdown)",
        **({"default": None} if top else kw),
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="text (default) or json: one JSON object per log line",
        **({"default": "text"} if top else kw),
    )


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += [child, *_subparsers(child)]
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message."""

    def format(self, record: logging.LogRecord) -> str:
        obj = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            obj["exception"] = self.formatException(record.exc_info)
        return json.dumps(obj)


def setup_logging(args: argparse.Namespace) -> None:
    level = args.log_level or ("DEBUG" if args.verbose else "INFO")
    handler = logging.StreamHandler(sys.stderr)
    if args.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # the client library's INFO chatter (kafka-python logs every connection and IO loop) is not
    # the daemon's story: it logs at WARNING unless a level was asked for explicitly
    explicit = bool(args.log_level) or bool(args.verbose)
    logging.getLogger("kafka").setLevel(level if explicit else logging.WARNING)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamfilter", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"streamfilter {__version__}")
    _add_logging_options(parser, top=True)
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

    chk = sub.add_parser(
        "check",
        help="validate a configuration, its paths and query file; per query: cost, days affordable",
    )
    chk.add_argument("--config", required=True)
    chk.add_argument("--json", action="store_true")
    chk.add_argument(
        "--events",
        type=Path,
        help="events file to check against the queries (default: a file source's)",
    )
    chk.set_defaults(func=cmd_check)

    add_budget_commands(sub)  # budget, budget-stats (cli/budget.py)
    add_learn_commands(sub)  # learn reproduce | individual (learn/commands.py)

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

    mig = sub.add_parser(
        "migrate-state", help="convert a SQLite state written by an older version (in place)"
    )
    mig.add_argument("state", type=Path, help="the state file ([state] path)")
    mig.set_defaults(func=cmd_migrate_state)

    demo = sub.add_parser("demo", help="synthetic sparse-monitoring stream on the embedded default")
    demo.add_argument("--users", type=int, default=100_000, help="synthetic users (100,000)")
    demo.add_argument("--days", type=int, default=60, help="days to run (60)")
    demo.add_argument(
        "--p-active", type=float, default=0.1, help="base probability a user is active a day (0.1)"
    )
    demo.add_argument(
        "--out", help="directory for config, state and releases (default: a temp dir)"
    )
    demo.set_defaults(func=cmd_demo)
    for child in _subparsers(parser):
        _add_logging_options(child, top=False)
        for action in child._actions:
            if action.help is None and action.dest in SHARED_HELP:
                action.help = SHARED_HELP[action.dest]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args)
    try:
        return int(args.func(args))
    except StreamfilterError as exc:
        _err(f"{exc}; {exc.consequence}" if exc.consequence else str(exc))
        return int(exc.exit_code)
    except FileNotFoundError as exc:
        _err(f"file not found: {exc.filename}")
        return int(ExitCode.CONFIG)


if __name__ == "__main__":
    sys.exit(main())
