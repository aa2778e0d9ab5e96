"""``streamfilter report``: one self-contained HTML page about a run (inline SVG, no scripts).

What goes on the page, and where it comes from:

* **Releases** — each query's published noisy values over the closed days with their 95% bands,
  read from the configured release sink file (or, for a non-file sink, the releases the state
  store marked as sent). Releases are public by construction: post-processing of noisy output.
* **Closed days** — the list of days the state store committed (read-only; the budgets, in the
  table or the budget log, are never read: per-user budgets are for their owners only, docs/design.md
  §6.11).
* **The guarantee** — from ``PrivacyParams.guarantee()``: ρ-zCDP and ε at δ by each sound
  conversion; data-independent.
* **Budget-exhaustion telemetry** — only noisy values: the opt-in private active-set estimate
  (``_active_set`` releases: noisy cumulative number of users who left the active set) and the
  noisy population statistics that ``streamfilter budget-stats`` recorded in the telemetry ledger,
  with the telemetry budget they spent. When none exists the page says so. Exact counts of
  exhausted users are statistics of users and are never computed.
* **Coverage** — beside each query's values, the private estimate each release carries of the
  users it covers (docs/design.md §2.11): users counted so far who can still afford a full
  contribution, with its 95% band. Days whose coverage fraction is below
  ``[report] low_coverage_fraction`` are shaded on both plots; a series where nobody measurably
  can afford a full contribution is flagged with the users it still answers ("answers users with
  ‖x‖ ≤ …"), never as noise only: a vector that fits the remaining budget is still summed.
* **Population** — when releases carry it (docs/design.md §2.12), each coordinate's population
  estimate is plotted beside its released value, and days are shaded by VALUE coverage
  (released ÷ population) instead of head count: heavy users leave first.
* **Rejects by reason** — exact counts of malformed input from the reject file. They are
  operator data (not differentially private) and the page labels them as such.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamfilter import __version__
from streamfilter.charts import (  # the one chart renderer, shared with the learning report
    PALETTE,
    Series,
    bar_chart,
    column_chart,
    esc,
    fmt,
    line_chart,
)
from streamfilter.cli.guarantee import with_telemetry
from streamfilter.config import Settings
from streamfilter.engine.contract import Coverage, Release
from streamfilter.privacy.quotas import DEFAULT_ANALYST, AnalystQuotas
from streamfilter.runtime.store import SQLiteStateReader, TelemetryCharge
from streamfilter.telemetry.active_set import ACTIVE_SET_QUERY_ID

__all__ = ["ReportData", "load_report_data", "render_report", "write_report"]

MAX_SERIES_PER_PLOT = len(PALETTE)


@dataclass
class ReportData:
    """Everything the page shows; nothing in it is per user."""

    releases: list[Release]
    days: list[str]
    days_source: str
    rejects: Counter[str] = field(default_factory=Counter)
    rejects_source: str | None = None
    releases_source: str = ""
    #: noisy records of ``budget-stats`` calls from the telemetry ledger, oldest first
    budget_stats: list[dict[str, Any]] = field(default_factory=list)
    #: telemetry ρ charged so far (fixed costs of the calls; data-independent)
    telemetry_rho_charged: float = 0.0


# --------------------------------------------------------------------------- loading
def _read_releases_file(path: Path) -> list[Release]:
    seen: set[tuple[str, str]] = set()
    out: list[Release] = []
    with open(path, "rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            rel = Release.from_json(line)
            key = (rel.day, rel.query_id)
            if key not in seen:  # the sink is idempotent per key; tolerate a replayed line
                seen.add(key)
                out.append(rel)
    return out


def _count_rejects(path: Path) -> Counter[str]:
    """Reject counts by reason; only the ``reason`` field is read, never the raw bytes."""
    counts: Counter[str] = Counter()
    with open(path, "rb") as fh:
        for line in fh:
            try:
                reason = json.loads(line).get("reason")
            except (ValueError, AttributeError):
                reason = None
            counts[reason if isinstance(reason, str) else "unreadable reject record"] += 1
    return counts


def load_report_data(settings: Settings) -> ReportData:
    state = settings.state.require_sqlite("report")
    if settings.sink.kind == "file" and settings.sink.path is not None:
        exists = settings.sink.path.exists()
        releases = _read_releases_file(settings.sink.path) if exists else []
        releases_source = str(settings.sink.path)
    elif state.exists():
        with SQLiteStateReader(state) as reader:
            releases = [Release.from_json(p) for p in reader.sent_releases()]
        releases_source = f"{state} (releases acknowledged by the sink)"
    else:
        releases, releases_source = [], "none"
    ledger: list[TelemetryCharge] = []
    if state.exists():
        # the store's reader checks every row it returns; the report never reads budgets
        with SQLiteStateReader(state) as reader:
            days = reader.closed_days()
            ledger = reader.telemetry_ledger()
        days_source = f"state store {state}"
    else:
        days = sorted({r.day for r in releases})
        days_source = "release days (no state store found)"
    days = sorted(set(days) | {r.day for r in releases})
    data = ReportData(releases, days, days_source, releases_source=releases_source)
    data.telemetry_rho_charged = sum(charge.rho for charge in ledger)
    for charge in ledger:
        if charge.kind == "budget_stats":
            data.budget_stats.append(json.loads(charge.record))
    if settings.rejects.kind == "file":
        path = settings.rejects_path()
        if path.exists():
            data.rejects = _count_rejects(path)
        data.rejects_source = str(path)
    return data


def _telemetry_section(data: ReportData, settings: Settings, days: list[str]) -> str:
    """Budget exhaustion, from noisy releases only (never from the ledger of budgets)."""
    active = [r for r in data.releases if r.query_id == ACTIVE_SET_QUERY_ID]
    parts = [
        '<section class="card" id="telemetry"><h3>Budget exhaustion'
        '<span class="tag">noisy only</span></h3>'
    ]
    if active:
        active.sort(key=lambda r: r.day)
        first, last = active[0], active[-1]
        points = {r.day: (float(r.value[0]), float(r.ci95[0])) for r in active}
        series = [Series(first.labels[0], PALETTE[3], points)]
        plot_days = [d for d in days if first.day <= d <= last.day] or [first.day]
        parts.append(
            "<p>Private active-set estimate: the <b>noisy</b> cumulative number of users who have "
            "left the active set (remaining budget below "
            f"<code>telemetry.active_min_remaining = {esc(settings.telemetry.active_min_remaining)}"
            "</code>, or retired), released each day by a binary-tree counter on the separate "
            f"telemetry budget. On {esc(last.day)}: {esc(fmt(last.value[0]))} ± "
            f"{esc(fmt(last.ci95[0]))} (95%).</p>"
            '<div class="legend"><span><i style="background:'
            f'{PALETTE[3]}"></i>departed (cumulative, noisy)</span><span><i style="background:'
            '#999;opacity:.35"></i>95% band</span></div>'
            + line_chart("noisy cumulative departures from the active set", plot_days, series)
        )
    if data.budget_stats:
        rec = data.budget_stats[-1]
        hist = [float(v) for v in rec.get("histogram_noisy", [])]
        per = max(1, len(hist) // 10)
        groups = [sum(hist[i : i + per]) for i in range(0, len(hist), per)]
        labels = [f"{i * per / len(hist):.1f}–{(i + 1) * per / len(hist):.1f}" for i in range(10)]
        quantiles = ", ".join(
            f"{esc(q)}: {'n/a' if v is None else esc(f'{v:.2f}')}"
            for q, v in rec.get("quantiles", {}).items()
        )
        parts.append(
            f"<p>Private budget statistics (<code>streamfilter budget-stats</code>, "
            f"{len(data.budget_stats)} call(s); latest as of {esc(rec.get('last_closed_day'))}): "
            f"≈ {esc(fmt(float(rec['users_noisy'])))} users charged at least once, mean spent "
            f"fraction {esc(fmt(float(rec['mean_spent_fraction'])))}, quantiles of the spent "
            f"fraction {quantiles} — all noisy.</p>"
            + (
                column_chart("noisy users per spent fraction of B", labels, groups)
                if len(groups) == len(labels)
                else ""
            )
        )
    coverage = [r for r in data.releases if r.coverage is not None]
    if coverage:
        parts.append(
            "<p>Coverage: each query's release carries a private estimate of the users it "
            "covers (plotted beside each series above), from unbounded binary-tree counters on "
            "the telemetry budget (<code>telemetry.coverage_rho = "
            f"{esc(fmt(settings.telemetry.coverage_rho))}</code>, charged once for the whole "
            "run).</p>"
        )
    if not active and not data.budget_stats and not coverage:
        parts.append(
            "<p><b>No noisy budget-exhaustion telemetry has been released for this run yet.</b> "
            "Turn on the private active-set estimate (<code>[telemetry] active_set = true</code>) "
            "for a daily noisy count of users who have left the active set, or run "
            "<code>streamfilter budget-stats</code> for noisy statistics of the spent budgets; "
            "both are charged to the separate telemetry budget.</p>"
        )
    parts.append(
        '<p class="note">Exact counts of exhausted or refused users are statistics of users: '
        "releasing them would break the guarantee, so this report never computes them. Answers "
        "are accurate for the <i>active set</i> — the users whose budget still admits the query. "
        f"Telemetry budget charged so far: ρ = {esc(fmt(data.telemetry_rho_charged))} of "
        f"<code>telemetry.rho = {esc(fmt(settings.telemetry.rho))}</code>.</p></section>"
    )
    return "".join(parts)


# --------------------------------------------------------------------------- the page
_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2330;
  margin:0;background:#f3f4f7}
main{max-width:1120px;margin:0 auto;padding:24px 20px 48px}
h1{font-size:26px;margin:0 0 4px} h2{font-size:19px;margin:30px 0 8px}
h3{font-size:16px;margin:0 0 6px}
.sub{color:#5b6474;margin:0 0 18px}
section.card{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:16px 18px;
  margin:14px 0;box-shadow:0 1px 2px rgba(0,0,0,.04)}
.kv{display:grid;grid-template-columns:repeat(4,1fr);gap:10px 18px;margin:10px 0 4px}
.kv div{background:#f6f7fa;border-radius:6px;padding:8px 10px}
.kv b{display:block;font-size:19px} .kv span{color:#5b6474;font-size:13px}
.legend{display:flex;flex-wrap:wrap;gap:14px;margin:4px 0 6px;font-size:13px}
.legend i{display:inline-block;width:14px;height:10px;border-radius:2px;margin-right:5px;
  vertical-align:baseline}
.note{color:#5b6474;font-size:13px;margin:6px 0 0}
.operator{border-left:4px solid #c28f2c}
.tag{display:inline-block;font-size:12px;padding:1px 7px;border-radius:10px;margin-left:8px;
  vertical-align:middle;background:#eef3fb;color:#1f4e8c}
.tag.op{background:#fbf1de;color:#7a5311}
table{border-collapse:collapse;font-size:13px;margin-top:6px}
td,th{padding:3px 10px;border-bottom:1px solid #eceef3;text-align:right}
th:first-child,td:first-child{text-align:left}
svg.plot{width:100%;height:auto;display:block}
svg .tick{font-size:12px;fill:#5b6474}
.flag{margin:6px 0 0;padding:6px 10px;border-radius:6px;font-size:13px}
.flag.partial{background:#fdecea;color:#8a1c12;border-left:4px solid #d62728}
.flag.low{background:#fff4e6;color:#7a4a0c;border-left:4px solid #e8590c}
.tag.partial{background:#fdecea;color:#8a1c12}
td.partial{color:#8a1c12;font-weight:600}
"""


def _low_coverage_days(releases: Sequence[Release], low_fraction: float) -> list[str]:
    """Days whose coverage fraction is below ``low_fraction``, or nobody can afford a full
    contribution (a published fraction only: noisy, post-processing)."""
    out = []
    for rel in releases:
        c = rel.coverage
        if c is not None and (
            c.threshold is None or (c.fraction is not None and c.fraction < low_fraction)
        ):
            out.append(rel.day)
    return out


def _coverage_text(c: Coverage) -> str:
    if c.threshold is None:
        return "nobody can afford a full contribution (clip² > B_norm): coverage 0"
    frac = "" if c.fraction is None else f" = {c.fraction:.0%} of"
    return (
        f"{fmt(c.users)} ± {fmt(c.ci95)} users{frac} the ≈ {fmt(c.counted_users)} counted so "
        f"far can still afford a full contribution (remaining budget ≥ {fmt(c.threshold)})"
    )


def _answered(c: Coverage, b_norm: float) -> str:
    """Which users a release answers in full, from its coverage (public: the threshold is a
    function of the clip and B; the users are noisy)."""
    if c.threshold is None:
        return f"answers users with ‖x‖ ≤ {fmt(math.sqrt(b_norm))}"
    return f"answers users with ‖x‖ ≤ {fmt(math.sqrt(c.threshold))} in full"


def _coverage_block(
    query_id: str,
    releases: list[Release],
    plot_days: list[str],
    low: list[str],
    low_fraction: float,
    b_norm: float = 0.0,
) -> str:
    """The coverage plot beside a series, the low-coverage days and which users are answered.

    A value is never called noise only because few users can afford a *full* contribution: a
    user whose vector fits their remaining budget is still answered (exhaustion ``skip``)."""
    covered = [r for r in releases if r.coverage is not None]
    if not covered:
        return ""
    last = covered[-1].coverage
    assert last is not None
    users = {
        r.day: (float(r.coverage.users), float(r.coverage.ci95)) for r in covered if r.coverage
    }
    counted = {r.day: (float(r.coverage.counted_users), 0.0) for r in covered if r.coverage}
    series = [
        Series("covered users", "#2ca02c", users),
        Series("counted so far", "#9aa1ad", counted),
    ]
    noise_only = [r.day for r in covered if r.coverage is not None and r.coverage.noise_only]
    flag = ""
    if all(r.coverage is not None and r.coverage.threshold is None for r in covered):
        flag = (
            f'<p class="flag partial"><b>Answers users with ‖x‖ ≤ '
            f"{esc(fmt(math.sqrt(b_norm)))}:</b> clip² of {esc(query_id)} exceeds B_norm, so "
            "no user can afford a full contribution; the values sum the users whose vector fits "
            "their remaining budget (at most √B_norm), not everyone's.</p>"
        )
    elif len(noise_only) == len(covered):
        flag = (
            f'<p class="flag partial"><b>Partial answers:</b> on every day of {esc(query_id)} '
            "the users who can afford a full contribution are indistinguishable from 0; the "
            "values sum the users whose vector fits their remaining budget, not everyone's.</p>"
        )
    elif noise_only:
        flag = (
            f'<p class="flag partial"><b>Partial answers on {len(noise_only)} day(s)</b> '
            f"({esc(noise_only[0])} … {esc(noise_only[-1])}): nobody measurably can afford "
            "a full contribution; the values sum the users whose vector still fits.</p>"
        )
    low_note = ""
    if low:
        low_note = (
            f'<p class="flag low">{len(low)} day(s) with coverage below '
            f"{esc(fmt(low_fraction))} of the users counted so far are shaded "
            f"(<code>[report] low_coverage_fraction</code>): a falling value there may be users "
            "running out of budget, not a trend.</p>"
        )
    title = f"{query_id}: coverage (noisy users who can afford a full contribution)"
    return (
        f'<div class="coverage"><div class="legend"><span><i style="background:#2ca02c"></i>'
        'covered users (noisy, 95% band)</span><span><i style="background:#9aa1ad"></i>users '
        "counted so far (noisy)</span></div>"
        f"{line_chart(title, plot_days, series, marked=low, mark_label='low coverage')}"
        f'<p class="note">Coverage on {esc(covered[-1].day)}: {esc(_coverage_text(last))}; '
        f"σ = {esc(fmt(last.sigma))} (telemetry budget).</p>{flag}{low_note}</div>"
    )


def _value_coverage_days(releases: Sequence[Release], low_fraction: float) -> list[str]:
    """Days whose VALUE coverage (released ÷ population, summed over the coordinates) is below
    ``low_fraction`` — post-processing of two noisy values."""
    out = []
    for rel in releases:
        p = rel.population
        if p is not None and sum(p.value) > 0 and sum(rel.value) / sum(p.value) < low_fraction:
            out.append(rel.day)
    return out


def _population_note(releases: Sequence[Release]) -> str:
    last = next((r for r in reversed(releases) if r.population is not None), None)
    if last is None or last.population is None:
        return ""
    p = last.population
    share = sum(last.value) / sum(p.value) if sum(p.value) > 0 else float("nan")
    return (
        f'<p class="note population">Population on {esc(last.day)}: '
        f"{esc(', '.join(fmt(v) for v in p.value[:MAX_SERIES_PER_PLOT]))} ± "
        f"{esc(fmt(p.ci95[0]))} (95%: the noise, σ = {esc(fmt(p.sigma))}, and the model's own "
        f"error, σ ≤ {esc(fmt(p.model_sigma[0]))}) — the value over all users counted so far, "
        f"if {esc(p.model)}; the release is {esc(f'{share:.0%}')} of it. Paid inside each "
        "user's own filter (docs/design.md §2.12).</p>"
    )


def _query_section(
    query_id: str,
    releases: list[Release],
    days: list[str],
    low_fraction: float = 0.5,
    b_norm: float = 0.0,
) -> str:
    last = releases[-1]
    labels = list(last.labels)
    populated = any(r.population is not None for r in releases)
    shown = labels[: MAX_SERIES_PER_PLOT // 2 if populated else MAX_SERIES_PER_PLOT]
    series = []
    for k, label in enumerate(shown):
        points: dict[str, tuple[float, float]] = {}
        pop: dict[str, tuple[float, float]] = {}
        for rel in releases:
            if label in rel.labels:
                j = rel.labels.index(label)
                points[rel.day] = (float(rel.value[j]), float(rel.ci95[j]))
                if rel.population is not None:
                    pop[rel.day] = (rel.population.value[j], rel.population.ci95[j])
        series.append(Series(label, PALETTE[k], points))
        if pop:
            series.append(Series(f"{label} — population", PALETTE[-1 - k], pop))
    first_day, last_day = releases[0].day, releases[-1].day
    plot_days = [d for d in days if first_day <= d <= last_day]
    legend = "".join(
        f'<span><i style="background:{s.color}"></i>{esc(s.label)}</span>' for s in series
    )
    more = ""
    if len(labels) > len(shown):
        more = (
            f'<p class="note">{len(labels) - len(shown)} more coordinates are in the release file '
            "and not plotted.</p>"
        )
    rows = "".join(
        f"<tr><td>{esc(label)}</td><td>{esc(fmt(last.value[j]))}</td>"
        f"<td>± {esc(fmt(last.ci95[j]))}</td></tr>"
        for j, label in enumerate(labels[:MAX_SERIES_PER_PLOT])
    )
    title = f"{query_id}: released values with 95% bands, {first_day} to {last_day}"
    if populated:  # shade by VALUE coverage: heavy users leave first, head counts mislead
        low = _value_coverage_days(releases, low_fraction)
    else:
        low = _low_coverage_days(releases, low_fraction)
    cov = _coverage_block(query_id, releases, plot_days, low, low_fraction, b_norm)
    cov = _population_note(releases) + cov
    if populated and low:
        cov += (
            f'<p class="flag low">{len(low)} day(s) where the release is below '
            f"{esc(fmt(low_fraction))} of the population estimate are shaded: a falling "
            "value there is users running out of budget, not a trend.</p>"
        )
    covered = [r.coverage for r in releases if r.coverage is not None]
    noise_tag = (
        f'<span class="tag partial">{esc(_answered(covered[-1], b_norm))}</span>'
        if covered and all(c.noise_only for c in covered)
        else ""
    )
    return (
        f'<section class="card query" id="q-{esc(query_id)}"><h3>{esc(query_id)}'
        f'<span class="tag">noisy release · public</span>{noise_tag}</h3>'
        f'<div class="legend">{legend}<span><i style="background:#999;opacity:.35"></i>'
        "95% band (± ci95)</span></div>"
        f"{line_chart(title, plot_days, series, marked=low, mark_label='low coverage')}{cov}"
        f"{more}"
        f"<table><tr><th>{esc(last.day)}</th><th>value</th><th>95% half-width</th></tr>"
        f"{rows}</table>"
        f'<p class="note">{len(releases)} releases · σ = {esc(fmt(last.sigma))} per '
        f"coordinate · {esc(last.mechanism)}{_linf_note(last)}</p></section>"
    )


def _linf_note(rel: Release) -> str:
    """Corollary 4.7's statement, as the release carries it."""
    if rel.linf_bound is None or rel.linf_failure_probability is None:
        return ""
    return (
        f' · <span class="linf">every coordinate within ±{esc(fmt(rel.linf_bound))} of the '
        "exact sum over the active set (users whose budget still admits the query), except with "
        f"probability {esc(fmt(rel.linf_failure_probability))} (Corollary 4.7)</span>"
    )


def _coverage_cell(rel: Release) -> str:
    c = rel.coverage
    if c is None:
        return "<td>—</td>"
    cls = ' class="partial"' if c.noise_only else ""
    return f"<td{cls}>{esc(fmt(c.users))} ± {esc(fmt(c.ci95))}</td>"


def _single_release_section(releases: list[Release], days: list[str]) -> str:
    """Queries with one release so far (one-day adaptive queries, or standing queries that just
    started), together: points with 95% error bars, coloured by coordinate label."""
    series: list[Series] = []
    omitted = 0
    for rel in releases:
        for label, value, ci95 in zip(rel.labels, rel.value, rel.ci95, strict=False):
            target = next((s for s in series if s.label == label and rel.day not in s.points), None)
            if target is None:
                if len(series) == MAX_SERIES_PER_PLOT:
                    omitted += 1
                    continue
                target = Series(label, PALETTE[len(series)], {})
                series.append(target)
            target.points[rel.day] = (float(value), float(ci95))
    first, last = releases[0].day, releases[-1].day
    plot_days = [d for d in days if first <= d <= last] or [first]
    legend = "".join(
        f'<span><i style="background:{s.color}"></i>{esc(s.label)}</span>' for s in series
    )
    more = f'<p class="note">{omitted} more coordinates are not plotted.</p>' if omitted else ""
    rows = "".join(
        f"<tr><td>{esc(rel.day)}</td><td>{esc(rel.query_id)}</td><td>{esc(label)}</td>"
        f"<td>{esc(fmt(value))}</td><td>± {esc(fmt(ci95))}</td>{_coverage_cell(rel)}</tr>"
        for rel in releases
        for label, value, ci95 in zip(rel.labels, rel.value, rel.ci95, strict=False)
    )
    partial = [r.query_id for r in releases if r.coverage is not None and r.coverage.noise_only]
    if partial:
        more += (
            f'<p class="flag partial"><b>Partial answers:</b> {esc(", ".join(partial))} — '
            "nobody measurably can afford a full contribution; the values sum the users whose "
            "vector still fits their remaining budget.</p>"
        )
    title = f"{len(releases)} queries with a single release, {first} to {last}"
    return (
        '<section class="card query" id="single-release"><h3>Queries with a single release'
        '<span class="tag">noisy release · public</span></h3>'
        '<p class="note">One-day queries (e.g. chosen adaptively by a policy from earlier '
        "releases) and standing queries that have released once so far; each point is one "
        "query's value with its 95% error bar.</p>"
        f'<div class="legend">{legend}</div>{line_chart(title, plot_days, series, connect=False)}'
        f"{more}<details><summary>{len(releases)} releases</summary><table><tr><th>day</th>"
        f"<th>query</th><th>coordinate</th><th>value</th><th>95% half-width</th>"
        f"<th>coverage (noisy users)</th></tr>{rows}"
        "</table></details></section>"
    )


def _analyst_heading(analyst: str, quotas: AnalystQuotas, granularity: float) -> str:
    """The heading of one analyst's panels: its share and per-user sub-budget (public
    configuration; docs/design.md §2.13)."""
    if analyst in quotas.sub_budget_units:
        units = quotas.sub_budget_units[analyst]
        quota = (
            f"share {fmt(float(quotas.shares[analyst]))} of every user's budget: a sub-budget "
            f"of {fmt(units * granularity**2)} per user"
        )
    else:
        quota = "no longer declared in [analysts]"
    return (
        f'<h3 class="analyst" id="analyst-{esc(analyst)}">Analyst {esc(analyst)}'
        f'<span class="tag">{esc(quota)}</span></h3>'
    )


def render_report(
    settings: Settings, data: ReportData | None = None, *, generated: dt.datetime | None = None
) -> str:
    """The page as a string (``data`` defaults to :func:`load_report_data`)."""
    data = data if data is not None else load_report_data(settings)
    params = settings.privacy_params()
    g = params.guarantee()
    when = (generated or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%d %H:%M UTC")
    by_query: dict[str, list[Release]] = {}
    for rel in sorted(data.releases, key=lambda r: r.day):
        if rel.query_id != ACTIVE_SET_QUERY_ID:  # telemetry: shown in its own section
            by_query.setdefault(rel.query_id, []).append(rel)
    span = f"{data.days[0]} to {data.days[-1]}" if data.days else "no day closed yet"

    eps_rows = "".join(
        f"<tr><td>{esc(method)}</td><td>{esc(fmt(eps))}</td></tr>"
        for method, eps in sorted(g.epsilon_by_method.items())
    )
    composition = ""
    if data.telemetry_rho_charged > 0:
        composition = (
            '<p class="note">Telemetry (below) spends a separate budget: '
            f"ρ<sub>tel</sub> = {esc(fmt(data.telemetry_rho_charged))} charged so far, so each "
            f"user's total is ({esc(fmt(g.rho))} + {esc(fmt(data.telemetry_rho_charged))})-zCDP "
            f"(zCDP composition), at most ρ + telemetry.rho = "
            f"{esc(fmt(g.rho + settings.telemetry.rho))}.</p>"
        )
    total = with_telemetry(g.rho, settings.telemetry.rho, params.delta)
    rho_total, eps_total = total["rho_total_max"], total["epsilon_total_max"]
    guarantee = (
        '<section class="card" id="guarantee"><h3>The guarantee'
        '<span class="tag">data-independent</span></h3>'
        f'<p id="headline">Every user — their whole stream, across all days — is protected by '
        f"<b>{esc(fmt(rho_total))}-zCDP in total</b>, i.e. <b>({esc(fmt(eps_total))}, "
        f"{esc(f'{g.delta:g}')})-DP</b> (CKS conversion), for the entire run, however many "
        "queries are asked and however they were chosen from earlier releases: the queries' "
        f"{esc(fmt(g.rho))}-zCDP (individual privacy filter, Feldman &amp; Zrnic Thm 4.5 / "
        f"Cor 4.7; ({esc(fmt(g.epsilon))}, {esc(f'{g.delta:g}')})-DP alone by "
        f"{esc(g.method)}) plus at most telemetry.rho = {esc(fmt(settings.telemetry.rho))} "
        "(zCDP composition, Bun &amp; Steinke 2016 Lemma 2.3).</p>"
        '<div class="kv">'
        f"<div><b>{esc(fmt(rho_total))}</b><span>ρ in total (zCDP, per user)</span></div>"
        f"<div><b>{esc(fmt(eps_total))}</b><span>ε in total at δ = {esc(f'{g.delta:g}')}</span></div>"
        f"<div><b>{esc(fmt(g.rho))}</b><span>ρ of the queries</span></div>"
        f"<div><b>{esc(fmt(g.sigma))}</b><span>σ per coordinate</span></div>"
        f"<div><b>±{esc(fmt(params.ci95_halfwidth))}</b><span>95% half-width</span></div>"
        f"<div><b>{esc(fmt(g.b_norm))}</b><span>B_norm (budget on Σ‖q‖²)</span></div>"
        f"<div><b>{esc(g.mechanism)}</b><span>mechanism</span></div>"
        f"<div><b>{esc(params.exhaustion)}</b><span>exhaustion policy</span></div>"
        f"<div><b>{esc(repr(params.granularity))}</b><span>lattice step γ</span></div>"
        "</div>"
        f"<table><tr><th>conversion</th><th>ε at δ = {esc(f'{g.delta:g}')}</th></tr>"
        f"{eps_rows}</table>{composition}</section>"
    )

    quotas = settings.analyst_quotas(params)
    owners = {q: rels[-1].analyst or DEFAULT_ANALYST for q, rels in by_query.items()}
    grouped = quotas.active or any(a != DEFAULT_ANALYST for a in owners.values())
    if by_query:
        queries = ""
        for analyst in sorted(set(owners.values())) if grouped else [None]:
            mine = {q: r for q, r in by_query.items() if analyst is None or owners[q] == analyst}
            if analyst is not None:
                queries += _analyst_heading(analyst, quotas, params.granularity)
            queries += "".join(
                _query_section(
                    q, rels, data.days, settings.report.low_coverage_fraction, params.b_norm
                )
                for q, rels in mine.items()
                if len(rels) > 1
            )
            single = [rels[0] for rels in mine.values() if len(rels) == 1]
            if single:
                queries += _single_release_section(sorted(single, key=lambda r: r.day), data.days)
    else:
        queries = '<section class="card"><p>No release has been published yet.</p></section>'

    telemetry = _telemetry_section(data, settings, data.days)

    if data.rejects_source is None:
        rejects = (
            '<section class="card operator" id="rejects"><h3>Rejected input by reason'
            '<span class="tag op">operator data</span></h3><p>The reject sink is not a file; '
            "see the rejects topic or the <code>streamfilter_rejects_total</code> metric.</p>"
            "</section>"
        )
    else:
        counts = sorted(data.rejects.items(), key=lambda kv: (-kv[1], kv[0]))
        chart = (
            bar_chart("rejected records by reason", counts)
            if counts
            else "<p>No input was rejected.</p>"
        )
        rejects = (
            '<section class="card operator" id="rejects"><h3>Rejected input by reason'
            '<span class="tag op">operator data · exact · not private</span></h3>'
            f'{chart}<p class="note">Operator data: exact counts of input records refused before '
            f"any accounting ({sum(data.rejects.values()):,} in "
            f"<code>{esc(data.rejects_source)}</code>). They are not differentially private and "
            "are meant for the people who run the pipeline — do not publish them with the "
            "releases.</p></section>"
        )

    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>streamfilter report — {esc(span)}</title><style>{_CSS}</style></head><body>"
        "<main><h1>streamfilter report</h1>"
        f'<p class="sub">{len(data.days)} closed days ({esc(span)}) · '
        f"{len(data.releases)} releases of {len(by_query)} queries · generated {esc(when)} by "
        f"streamfilter {esc(__version__)}</p>"
        f"{guarantee}<h2>Releases</h2>"
        '<p class="note">Each plot shows one query\'s published noisy values per closed day; the '
        "shaded band is the 95% interval of the noise (value ± ci95). Gaps are days on which the "
        f"query did not run. Releases: <code>{esc(data.releases_source)}</code>; days: "
        f"{esc(data.days_source)}.</p>"
        f"{queries}<h2>Telemetry</h2>{telemetry}<h2>Operations</h2>{rejects}"
        "</main></body></html>\n"
    )


def write_report(settings: Settings, out: str | Path) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(settings), encoding="utf-8")
    return path
