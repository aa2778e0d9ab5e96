"""Inline SVG charts for the self-contained HTML pages (no scripts, no dependencies).

One renderer for every page: ``streamfilter report`` (:mod:`streamfilter.cli.report`: values
over days with 95% bands, bars, columns) and the learning study's page
(:mod:`streamfilter.learn.report`: scatter plots, a histogram, columns). Pure string building:
no I/O, no imports from the rest of the package (the lowest layer, tests/system/test_architecture.py).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "PALETTE",
    "Series",
    "bar_chart",
    "column_chart",
    "esc",
    "fmt",
    "histogram_chart",
    "line_chart",
    "nice_ticks",
    "scatter_chart",
]

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1e6 or abs(x) < 1e-3:
        return f"{x:.3g}"
    return f"{round(x, 6):,.6g}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi - lo < 1e-12:
        lo, hi = lo - 1.0, hi + 1.0
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = mag
    for mult in (1.0, 2.0, 2.5, 5.0, 10.0):
        step = mult * mag
        if step >= raw:
            break
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t < hi + step * 0.999:
        ticks.append(round(t, 12))
        t += step
    return ticks


@dataclass
class Series:
    label: str
    color: str
    points: dict[str, tuple[float, float]]  # day -> (value, ci95 half-width)


def _runs(days: Sequence[str], present: set[str]) -> list[list[int]]:
    """Contiguous index runs of days that have a value (gaps split lines and bands)."""
    runs: list[list[int]] = []
    current: list[int] = []
    for i, day in enumerate(days):
        if day in present:
            current.append(i)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def _tick_indices(n: int, most: int = 9) -> list[int]:
    """Indices of the day labels on the x axis: evenly spaced, the last day always labelled."""
    if n <= 0:
        return []
    every = max(1, math.ceil(n / most))
    picked = list(range(0, n, every))
    if picked[-1] != n - 1:
        if (n - 1) - picked[-1] < every * 0.6 and len(picked) > 1:
            picked[-1] = n - 1  # too close to the previous label: move it to the last day
        else:
            picked.append(n - 1)
    return picked


def line_chart(
    title: str,
    days: Sequence[str],
    series: Sequence[Series],
    *,
    connect: bool = True,
    marked: Sequence[str] = (),
    mark_label: str = "",
) -> str:
    """Values over days with their 95% bands; ``connect=False`` draws points with error bars
    (one-day queries: nothing links one query's day to another's). Days in ``marked`` are
    shaded (class ``low-coverage``, titled ``mark_label``)."""
    width, height = 1080, 300
    left, right, top, bottom = 76, 16, 14, 46
    pw, ph = width - left - right, height - top - bottom
    lows = [v - c for s in series for v, c in s.points.values()]
    highs = [v + c for s in series for v, c in s.points.values()]
    # every value axis includes zero: a panel starting at 300 reads a small change as a big one
    ticks = nice_ticks(min([0.0, *lows]), max([1e-9, *highs]))
    y0, y1 = ticks[0], ticks[-1]
    n = len(days)

    def x(i: int) -> float:
        return left + (pw * i / (n - 1) if n > 1 else pw / 2)

    def y(v: float) -> float:
        return top + ph * (1 - (v - y0) / (y1 - y0))

    out = [
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{esc(title)}">',
        f"<title>{esc(title)}</title>",
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fbfbfd" stroke="#d0d4dc"/>',
    ]
    for t in ticks:
        yy = y(t)
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e4e7ee"/>'
            f'<text x="{left - 8}" y="{yy + 4:.1f}" text-anchor="end" class="tick">'
            f"{esc(fmt(t))}</text>"
        )
    step = pw / (n - 1) if n > 1 else pw
    for i, d in enumerate(days):
        if d in marked:
            x0, x1 = max(left, x(i) - step / 2), min(left + pw, x(i) + step / 2)
            out.append(
                f'<rect class="low-coverage" x="{x0:.1f}" y="{top}" width="{x1 - x0:.1f}" '
                f'height="{ph}" fill="#e8590c" fill-opacity="0.14">'
                f"<title>{esc(d)}: {esc(mark_label)}</title></rect>"
            )
    if y0 < 0 < y1:
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y(0):.1f}" y2="{y(0):.1f}" '
            'stroke="#9aa1ad" stroke-dasharray="4 3"/>'
        )
    for i in _tick_indices(n):
        xx = x(i)
        anchor = "end" if i == n - 1 and n > 1 else "middle"  # keep the last date inside
        out.append(
            f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top + ph}" y2="{top + ph + 5}" '
            'stroke="#9aa1ad"/>'
            f'<text x="{xx:.1f}" y="{top + ph + 20}" text-anchor="{anchor}" class="tick">'
            f"{esc(days[i])}</text>"
        )
    for s in series:
        for run in _runs(days, set(s.points)):
            pts = [(i, *s.points[days[i]]) for i in run]
            if not connect:
                out.extend(
                    f'<line class="band" x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{y(v - c):.1f}" '
                    f'y2="{y(v + c):.1f}" stroke="{s.color}" stroke-opacity="0.45" '
                    'stroke-width="5"/>'
                    for i, v, c in pts
                )
            elif len(pts) > 1:
                upper = " ".join(f"{x(i):.1f},{y(v + c):.1f}" for i, v, c in pts)
                lower = " ".join(f"{x(i):.1f},{y(v - c):.1f}" for i, v, c in reversed(pts))
                out.append(
                    f'<polygon class="band" points="{upper} {lower}" fill="{s.color}" '
                    'fill-opacity="0.16" stroke="none"/>'
                )
                line = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v, _ in pts)
                out.append(
                    f'<polyline class="series" points="{line}" fill="none" '
                    f'stroke="{s.color}" stroke-width="2"/>'
                )
            else:
                i, v, c = pts[0]
                out.append(
                    f'<line class="band" x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{y(v - c):.1f}" '
                    f'y2="{y(v + c):.1f}" stroke="{s.color}" stroke-opacity="0.5" '
                    'stroke-width="6"/>'
                )
            if n <= 90:
                out.extend(
                    f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="2.6" fill="{s.color}">'
                    f"<title>{esc(days[i])} {esc(s.label)}: {esc(fmt(v))} ± {esc(fmt(c))}"
                    "</title></circle>"
                    for i, v, c in pts
                )
    out.append("</svg>")
    return "".join(out)


def bar_chart(title: str, counts: Sequence[tuple[str, int]]) -> str:
    width, row, left, right = 1080, 26, 190, 90
    height = row * len(counts) + 16
    top = max((c for _, c in counts), default=1) or 1
    out = [
        f'<svg class="plot bars" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{esc(title)}">',
        f"<title>{esc(title)}</title>",
    ]
    for k, (reason, count) in enumerate(counts):
        yy = 8 + k * row
        w = (width - left - right) * count / top
        out.append(
            f'<text x="{left - 10}" y="{yy + 16}" text-anchor="end" class="tick">'
            f"{esc(reason)}</text>"
            f'<rect x="{left}" y="{yy + 3}" width="{max(w, 1):.1f}" height="{row - 8}" '
            'fill="#8a6d3b" fill-opacity="0.75"/>'
            f'<text x="{left + w + 8:.1f}" y="{yy + 16}" class="tick">{count:,}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def column_chart(title: str, labels: Sequence[str], values: Sequence[float]) -> str:
    """Vertical bars (noisy counts; a negative noisy count is drawn as an empty bar)."""
    width, height, left, bottom, top = 1080, 220, 76, 40, 14
    pw, ph = width - left - 16, height - top - bottom
    ticks = nice_ticks(0.0, max([*values, 1.0]))
    hi = ticks[-1]
    slot = pw / max(len(values), 1)
    out = [
        f'<svg class="plot columns" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} '
        f'{height}" width="{width}" height="{height}" role="img" aria-label="{esc(title)}">',
        f"<title>{esc(title)}</title>",
    ]
    for t in ticks:
        yy = top + ph * (1 - t / hi)
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e4e7ee"/>'
            f'<text x="{left - 8}" y="{yy + 4:.1f}" text-anchor="end" class="tick">'
            f"{esc(fmt(t))}</text>"
        )
    for k, (label, value) in enumerate(zip(labels, values, strict=True)):
        h = ph * max(value, 0.0) / hi
        xx = left + k * slot
        out.append(
            f'<rect x="{xx + slot * 0.12:.1f}" y="{top + ph - h:.1f}" width="{slot * 0.76:.1f}" '
            f'height="{h:.1f}" fill="#6b5ca5" fill-opacity="0.8"><title>{esc(label)}: '
            f"{esc(fmt(value))}</title></rect>"
            f'<text x="{xx + slot / 2:.1f}" y="{top + ph + 18}" text-anchor="middle" '
            f'class="tick">{esc(label)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _frame(
    title: str,
    xr: tuple[float, float],
    yr: tuple[float, float],
    xlabel: str,
    ylabel: str,
    size: tuple[int, int] = (520, 340),
) -> tuple[list[str], Callable[[float], float], Callable[[float], float]]:
    """An x–y plot area with tick labels and axis titles: (opening SVG parts, x map, y map)."""
    width, height = size
    left, right, top, bottom = 64, 14, 12, 50
    pw, ph = width - left - right, height - top - bottom
    xt, yt = nice_ticks(*xr), nice_ticks(*yr)
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def x(v: float) -> float:
        return left + pw * (v - x0) / (x1 - x0)

    def y(v: float) -> float:
        return top + ph * (1 - (v - y0) / (y1 - y0))

    out = [
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{esc(title)}">',
        f"<title>{esc(title)}</title>",
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fbfbfd" stroke="#d0d4dc"/>',
    ]
    for t in yt:
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#e4e7ee"/>'
            f'<text x="{left - 8}" y="{y(t) + 4:.1f}" text-anchor="end" class="tick">'
            f"{esc(fmt(t))}</text>"
        )
    for t in xt:
        out.append(
            f'<text x="{x(t):.1f}" y="{top + ph + 18}" text-anchor="middle" class="tick">'
            f"{esc(fmt(t))}</text>"
        )
    out.append(
        f'<text x="{left + pw / 2:.1f}" y="{height - 8}" text-anchor="middle" class="tick">'
        f"{esc(xlabel)}</text>"
        f'<text x="14" y="{top + ph / 2:.1f}" text-anchor="middle" class="tick" '
        f'transform="rotate(-90 14 {top + ph / 2:.1f})">{esc(ylabel)}</text>'
    )
    return out, x, y


def _extent(values: Sequence[float]) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
    return (min(finite), max(finite)) if finite else (0.0, 1.0)


def scatter_chart(
    title: str,
    xs: Sequence[float],
    ys: Sequence[float],
    xlabel: str,
    ylabel: str,
    *,
    diagonal: bool = False,
    labels: Sequence[str] | None = None,
) -> str:
    """Points (``PALETTE[0]``); ``diagonal`` adds the line y = x (``PALETTE[1]``) on equal
    axes; ``labels`` names each point."""
    xr, yr = _extent(xs), _extent(ys)
    if diagonal:
        xr = yr = (min(xr[0], yr[0]), max(xr[1], yr[1]))
    out, x, y = _frame(title, xr, yr, xlabel, ylabel)
    r = 4.0 if labels else 2.2
    dots = "".join(
        f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="{r}" fill="{PALETTE[0]}" fill-opacity="0.6"/>'
        for a, b in zip(xs, ys, strict=True)
        if math.isfinite(a) and math.isfinite(b)
    )
    out.append(f'<g class="series">{dots}</g>')
    if diagonal:
        lo, hi = xr
        out.append(
            f'<line x1="{x(lo):.1f}" y1="{y(lo):.1f}" x2="{x(hi):.1f}" y2="{y(hi):.1f}" '
            f'stroke="{PALETTE[1]}" stroke-width="2"/>'
        )
    if labels:
        out.extend(
            f'<text x="{x(a) + 6:.1f}" y="{y(b) - 6:.1f}" class="tick">{esc(t)}</text>'
            for a, b, t in zip(xs, ys, labels, strict=True)
        )
    out.append("</svg>")
    return "".join(out)


def histogram_chart(
    title: str,
    edges: Sequence[float],
    counts: Sequence[float],
    xlabel: str,
    ylabel: str,
    *,
    marker: float | None = None,
) -> str:
    """Bars over ``edges`` (``PALETTE[0]``); ``marker`` draws a vertical line (``PALETTE[1]``)."""
    out, x, y = _frame(title, (edges[0], edges[-1]), (0.0, max([*counts, 1.0])), xlabel, ylabel)
    bars = "".join(
        f'<rect x="{x(a):.1f}" y="{y(c):.1f}" width="{max(x(b) - x(a) - 1, 1):.1f}" '
        f'height="{y(0) - y(c):.1f}" fill="{PALETTE[0]}"/>'
        for a, b, c in zip(edges[:-1], edges[1:], counts, strict=True)
    )
    out.append(f'<g class="series">{bars}</g>')
    if marker is not None:
        top, bottom = y(max([*counts, 1.0])), y(0)
        out.append(
            f'<line x1="{x(marker):.1f}" y1="{top:.1f}" x2="{x(marker):.1f}" y2="{bottom:.1f}" '
            f'stroke="{PALETTE[1]}" stroke-width="2"/>'
        )
    out.append("</svg>")
    return "".join(out)
