"""``streamfilter check``: validate a configuration, its paths and its query file before a run.

Prints, per query of the query file, the cost of one full contribution (``clip²``), how many such
days a fresh user can afford (``floor(B_norm/clip²)``), the warnings ``run`` would log at
registration (``engine.affordability``), and which queries read a common coordinate. Exit 0 when
everything would run; 2 (configuration error) when a path is missing or a query line would be
rejected. Reads no state. With a file source it reads the first ``SCAN_EVENTS`` events locally
(the operator's own input; nothing is published) only to warn about configured coordinates that
never appear in them — a misspelled feature or a category in the wrong case would otherwise be
released as pure noise — with the closest coordinate seen as a suggestion, and about values of
another type than the queries read (a string where a query sums the feature, a number where it
counts categories: ``run`` rejects those events as ``wrong_type``). ``--events FILE`` reads
that file instead (e.g. a sample of a Kafka topic).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from streamfilter.config import Settings, load_config
from streamfilter.engine.affordability import (
    DEFAULT_MIN_DAYS,
    affordability_warning,
    analyst_costs,
    overlaps,
    query_cost,
)
from streamfilter.engine.contract import FeatureKinds, Reject, parse_event
from streamfilter.engine.engine import Engine
from streamfilter.engine.queries import AnyQuery
from streamfilter.errors import ConfigError
from streamfilter.privacy.noise import SystemRandomBits
from streamfilter.runtime.app import check_query_source, input_limits
from streamfilter.runtime.query_admission import admit_query

__all__ = ["SCAN_EVENTS", "check", "cmd_check"]

#: events of a file source that ``check`` reads to find coordinates no event has
SCAN_EVENTS = 200_000


@dataclass
class _Seen:
    """What the first events of a file hold: their coordinates (numeric features ``f``,
    categories ``f=v``), the valid events read, and per ``(feature, is a string)`` the events
    whose value has the other type than ``kinds`` says."""

    coordinates: set[str] = field(default_factory=set)
    events: int = 0
    mistyped: Counter[tuple[str, bool]] = field(default_factory=Counter)


def _events_seen(path: Path, kinds: FeatureKinds, limit: int = SCAN_EVENTS) -> _Seen | None:
    """``_Seen`` of the first ``limit`` valid events of a file, or None when it cannot be
    read. The events are parsed without ``kinds`` (as the contract alone accepts them), so that
    the values ``run`` would reject as ``wrong_type`` are counted here."""
    seen = _Seen()
    try:
        with open(path, "rb") as fh:
            for n, line in enumerate(fh):
                if n >= limit:
                    break
                try:
                    event = parse_event(line)
                except Reject:
                    continue
                seen.events += 1
                for name, value in event.values.items():
                    is_text = isinstance(value, str)
                    seen.coordinates.add(f"{name}={value}" if is_text else name)
                    if kinds.get(name, is_text) is not is_text:
                        seen.mistyped[name, is_text] += 1
    except OSError:
        return None
    return seen


def _paths(settings: Settings) -> list[str]:
    problems = []
    try:
        check_query_source(settings)
    except ConfigError as exc:
        problems.append(str(exc))
    src = settings.source
    central_file = settings.mode.kind == "central" and src.kind == "file"
    if central_file and src.path is not None and not src.path.is_file():
        problems.append(f"source.path: events file not found: {src.path}")
    for key, path in (
        ("state.path", settings.state.path),
        ("sink.path", settings.sink.path if settings.sink.kind == "file" else None),
    ):
        if path is None:
            continue
        parent = Path(path).parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent  # run creates missing directories under a writable one
        if not os.access(parent, os.W_OK):
            problems.append(f"{key}: directory {parent} is not writable")
    return problems


def check(settings: Settings, events: Path | None = None) -> dict[str, object]:
    """The check's findings as a dict (``problems`` empty = the configuration would run).
    ``events``: the events file to read instead of a file source's."""
    params = settings.privacy_params()
    problems = _paths(settings)
    q = settings.queries
    min_days = q.min_affordable_days if q is not None else DEFAULT_MIN_DAYS
    quotas = settings.analyst_quotas(params)
    engine = Engine(params, SystemRandomBits(), quotas=quotas)
    limits = input_limits(settings)
    queries: list[AnyQuery] = []
    if q is not None and q.kind == "file" and q.path is not None and q.path.is_file():
        with open(q.path, "rb") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:  # the rule `run` registers by: what it refuses, check reports
                    query = admit_query(engine, limits, line.rstrip(b"\r\n"))
                    if query is None:  # the same query twice: registered once
                        continue
                    engine.register_query(query)
                    queries.append(query)
                except Reject as rej:
                    problems.append(f"{q.path.name}:{n}: {rej.reason}: {rej.detail}")
    rows, warnings = [], []
    loc = settings.local
    wire = loc.path if settings.mode.kind == "local" and loc.kind == "file" else None
    if wire is not None and not wire.is_file():  # devices (or simulate-local) write it
        warnings.append(f"local.path: contributions file {loc.path} does not exist yet")
    for query in queries:
        cost = query_cost(query, params, quotas)
        rows.append({**cost.as_dict(), "kind": query.kind, "coordinates": query.coordinates()})
        warning = affordability_warning(cost, params, min_days)
        if warning is not None:
            warnings.append(warning)
    src = settings.source
    path, where = events, "--events"
    if path is None and settings.mode.kind == "central" and src.kind == "file":
        path, where = src.path, "source.path"
    if events is not None and not events.is_file():
        problems.append(f"--events: events file not found: {events}")
    seen = _events_seen(path, engine.queries.kinds) if queries and path and path.is_file() else None
    for query in queries if seen and seen.coordinates else ():
        assert seen is not None
        coordinates = seen.coordinates
        lower = {c.lower(): c for c in coordinates}
        for coord in query.coordinates():
            if coord in coordinates:
                continue
            near = lower.get(coord.lower()) or next(
                iter(difflib.get_close_matches(coord, sorted(coordinates), n=1)), None
            )
            hint = f" (did you mean {near!r}?)" if near else ""
            warnings.append(
                f"query {query.query_id}: {coord!r} appears in none of the first "
                f"{SCAN_EVENTS:,} events of {where}{hint}; its answer would be noise only"
            )
    for (name, is_text), count in sorted(seen.mistyped.items()) if seen else ():
        assert seen is not None
        read_as = "a category" if engine.queries.kinds[name] else "a number"
        warnings.append(
            f"feature {name!r}: {count} of {seen.events} events of {where} hold a "
            f"{'string' if is_text else 'number'} where a query reads {read_as}; run rejects "
            "them as wrong_type"
        )
    shared = [{"queries": [a, b], "coordinates": c} for a, b, c in overlaps(queries)]
    note = None
    if q is None or q.kind != "file":
        kind = "none" if q is None else q.kind
        note = f"queries come from {kind}: they are checked when registered (run logs warnings)"
    g = params.guarantee()
    analysts = (
        [a.as_dict() for a in analyst_costs(queries, params, quotas)] if quotas.active else []
    )
    return {
        "problems": problems,
        "warnings": warnings,
        "queries": rows,
        "analysts": analysts,
        "overlaps": shared,
        "note": note,
        "b_norm": params.b_norm,
        "rho": g.rho,
        "sigma": params.sigma_released,
        "min_affordable_days": min_days,
    }


def _text(out: dict[str, object]) -> str:
    lines = [
        f"streamfilter check — b_norm = {out['b_norm']:g}, ρ = {out['rho']:.6g}, "
        f"σ = {out['sigma']:.6g} per coordinate"
    ]
    rows = out["queries"]
    assert isinstance(rows, list)
    if rows:
        lines.append(f"  {'query':<20} {'kind':<10} {'clip':>8} {'clip² (cost)':>13} {'days':>7}")
        for r in rows:
            lines.append(
                f"  {r['query_id']:<20} {r['kind']:<10} {r['clip']:>8g} "
                f"{r['cost_full_contribution']:>13g} {r['full_days_affordable']:>7}"
            )
        analysts = out["analysts"]
        of = "its analyst's sub-budget / clip²" if analysts else "B_norm / clip²"
        lines.append(f"  (days: full-norm contributions a fresh user can afford, {of})")
    analysts = out["analysts"]
    assert isinstance(analysts, list)
    if analysts:
        lines.append(
            f"  {'analyst':<20} {'share':>8} {'sub-budget':>11} {'queries':>8} "
            f"{'cost/day':>10} {'days':>7}"
        )
        for a in analysts:
            lines.append(
                f"  {a['analyst']:<20} {a['share']:>8.4g} {a['sub_budget']:>11g} "
                f"{len(a['queries']):>8} {a['cost_full_contribution']:>10g} "
                f"{a['full_days_affordable']:>7}"
            )
        lines.append(
            "  (per analyst: its queries' full costs a day, and the days its sub-budget"
            " floor(share·B) affords them all)"
        )
    for key, label in (("overlaps", "overlap"), ("warnings", "WARNING"), ("problems", "ERROR")):
        items = out[key]
        assert isinstance(items, list)
        for item in items:
            if key == "overlaps":
                a, b = item["queries"]
                item = f"{a} and {b} read {', '.join(item['coordinates'])} (a user pays both)"
            lines.append(f"  {label}: {item}")
    if out["note"]:
        lines.append(f"  note: {out['note']}")
    problems = out["problems"]
    assert isinstance(problems, list)
    lines.append("  OK: the configuration would run" if not problems else "  NOT OK")
    return "\n".join(lines)


def cmd_check(args: argparse.Namespace) -> int:
    out = check(load_config(args.config), args.events)
    print(json.dumps(out, indent=2) if args.json else _text(out))
    problems = out["problems"]
    assert isinstance(problems, list)
    if problems:
        raise ConfigError(f"check found {len(problems)} problem(s): {problems[0]}")
    return 0
