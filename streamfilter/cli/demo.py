"""``streamfilter demo``: the main job on the embedded default.

A synthetic sparse-monitoring stream (each user active on a day with a small probability) runs
through the real daemon path — synthetic source, adaptive policy, SQLite state, file sink — and
the releases are printed as a table with their 95% error bars, under the guarantee, beside the
coverage each release carries (docs/design.md §2.11): the noisy number of users who can still
afford a full contribution to ``active``, and their share of the users counted so far.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from streamfilter.cli.guarantee import with_telemetry
from streamfilter.config import load_config
from streamfilter.runtime.app import build_daemon

DEMO_CONFIG = """\
# streamfilter demo: written by `streamfilter demo`
[privacy]
b_norm = 8.0
rho = 0.5
granularity = 0.0009765625
exhaustion = "skip"
mechanism = "discrete_gaussian"

[source]
kind = "synthetic"
[source.synthetic]
users = {users}
days = {days}
start_day = "2026-01-01"
p_active = {p_active}
seed = 7

[queries]
kind = "policy"
policy = "streamfilter.policies:drill_down"

[sink]
kind = "file"
path = "releases.jsonl"

[state]
path = "state.db"

[metrics]
enabled = false           # a one-shot run: nothing to scrape
"""


#: the run's log lines, beside its releases (the terminal shows the table, not the daemon's log)
DEMO_LOG_FILE = "demo.log"


@contextlib.contextmanager
def _log_to(path: Path) -> Iterator[None]:
    """The root logger writes to ``path`` instead of its stream handlers while the block runs,
    in the same format; a handler writing elsewhere (a file) is kept."""
    root = logging.getLogger()
    streams = [
        h
        for h in root.handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]
    to_file = logging.FileHandler(path, encoding="utf-8")
    if streams and streams[0].formatter is not None:
        to_file.setFormatter(streams[0].formatter)
    for h in streams:
        root.removeHandler(h)
    root.addHandler(to_file)
    try:
        yield
    finally:
        root.removeHandler(to_file)
        to_file.close()
        for h in streams:
            root.addHandler(h)


def run_demo(out_dir: Path, users: int, days: int, p_active: float) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = out_dir / "streamfilter.toml"
    cfg.write_text(DEMO_CONFIG.format(users=users, days=days, p_active=p_active))
    settings = load_config(cfg)
    params = settings.privacy_params()
    g = params.guarantee()
    total = with_telemetry(g.rho, settings.telemetry.rho, params.delta)
    started = time.perf_counter()
    with _log_to(out_dir / DEMO_LOG_FILE):
        parts = build_daemon(settings, follow=False)
        try:
            summary = parts.daemon.run(until_end=True)
        finally:
            parts.close()
    elapsed = time.perf_counter() - started

    rows: dict[str, dict[str, dict[str, object]]] = defaultdict(dict)
    for line in (out_dir / "releases.jsonl").read_text().splitlines():
        rel = json.loads(line)
        rows[rel["day"]][rel["query_id"]] = rel
    w = sys.stdout.write
    w(
        f"streamfilter demo — {users:,} synthetic users, {days} days, "
        f"~{p_active:.0%} base daily activity\n"
        f"guarantee: {total['rho_total_max']:.4g}-zCDP per user in total for the whole run (any "
        f"number of queries), ({total['epsilon_total_max']:.3f}, {g.delta:g})-DP = queries "
        f"{g.rho:g} (({g.epsilon:.3f}, {g.delta:g})-DP alone by {g.method}) + telemetry "
        f"{settings.telemetry.rho:g}\n"
        f"noise: {params.mechanism}, σ = {params.sigma_released:.3f} per coordinate, "
        f"95% half-width ±{params.ci95_halfwidth:.2f}; per-user budget B_norm = {params.b_norm:g}\n"
        f"queries: active (sum), plans (histogram free/pro/team), hours (linear, minutes/60), "
        f"focus (adaptive: next day's count of yesterday's top plan)\n\n"
    )
    w(
        f"{'day':<11} {'active':>9} {'population':>16} {'free':>9} {'pro':>9} {'team':>9} "
        f"{'hours':>9} {'covered (active)':>22}  focus\n"
    )

    def cell(rel: dict[str, object] | None, i: int = 0) -> str:
        if rel is None:
            return f"{'-':>9}"
        value = rel["value"]
        assert isinstance(value, list)
        return f"{value[i]:>9.1f}"

    def population(rel: dict[str, object] | None) -> str:
        pop = None if rel is None else rel.get("population")
        if not isinstance(pop, dict):
            return f"{'-':>16}"
        text = f"{pop['value'][0]:.1f} ±{pop['ci95'][0]:.0f}"
        return f"{text:>16}"

    def covered(rel: dict[str, object] | None) -> str:
        cov = None if rel is None else rel.get("coverage")
        if not isinstance(cov, dict):
            return f"{'-':>22}"
        frac = cov["fraction"]
        share = "" if frac is None else f" ({frac:.0%})"
        text = f"{cov['users']:,} ±{cov['ci95']:.0f}{share}"
        return f"{text:>22}"

    for day in sorted(rows):
        r = rows[day]
        focus = next((v for k, v in r.items() if k.startswith("focus-")), None)
        focus_txt = ""
        if focus is not None:
            labels, value = focus["labels"], focus["value"]
            assert isinstance(labels, list) and isinstance(value, list)
            focus_txt = f"{labels[0]} {value[0]:.1f}"
        w(
            f"{day:<11} {cell(r.get('active'))} {population(r.get('active'))} "
            f"{cell(r.get('plans'), 0)} {cell(r.get('plans'), 1)} "
            f"{cell(r.get('plans'), 2)} {cell(r.get('hours'))} {covered(r.get('active'))}  "
            f"{focus_txt}\n"
        )
    s = summary.as_dict()
    w(
        f"\nevery value ± {params.ci95_halfwidth:.2f} (95%); answers cover the active set (users "
        f"whose budget still admits the query)\n"
        f"population: the value over all users counted so far (95% ± of the noise and the "
        f"model's error), if a user "
        f"who has left keeps contributing what they contributed on the day they left; no extra "
        f"ρ: each departing value is paid inside its user's own filter\n"
        f"covered: noisy users who can still afford a full contribution to active (their share "
        f"of the users counted so far), paid from telemetry "
        f"{settings.telemetry.coverage_rho:g} of {settings.telemetry.rho:g}\n"
        f"{s['records_read']:,} events read, {s['rejected']} rejected, {s['days_closed']} days "
        f"closed, {s['releases_published']} releases in {elapsed:.1f}s\n"
        f"output: {out_dir / 'releases.jsonl'} (state {out_dir / 'state.db'}, "
        f"log {out_dir / DEMO_LOG_FILE})\n"
    )
    return 0
