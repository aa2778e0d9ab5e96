"""A self-contained HTML page (inline SVG, no scripts) for the individual-ε study.

Five figures from :func:`.individual_accounting.individual_study`'s result: the histogram of individual ε
(worst case marked), ε against log training loss, per-class mean ε against per-class accuracy,
estimated against exact ε, and the cost of rounding; plus the privately released statistics.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["render_individual_report", "write_individual_report"]

BLUE = "#1f77b4"
RED = "#d62728"
W, H, PAD = 520, 320, 48


class _Frame:
    """Maps data coordinates to an SVG plot area with axes, ticks and labels."""

    def __init__(self, xr: tuple[float, float], yr: tuple[float, float], xlabel: str, ylabel: str):
        self.x0, self.x1 = xr if xr[1] > xr[0] else (xr[0], xr[0] + 1.0)
        self.y0, self.y1 = yr if yr[1] > yr[0] else (yr[0], yr[0] + 1.0)
        self.xlabel, self.ylabel = xlabel, ylabel

    def x(self, v: float) -> float:
        return PAD + (v - self.x0) / (self.x1 - self.x0) * (W - 2 * PAD)

    def y(self, v: float) -> float:
        return H - PAD - (v - self.y0) / (self.y1 - self.y0) * (H - 2 * PAD)

    def axes(self) -> str:
        parts = [
            f'<rect x="{PAD}" y="{PAD}" width="{W - 2 * PAD}" height="{H - 2 * PAD}" fill="#fbfbfd" stroke="#999"/>'
        ]
        for i in range(5):
            xv = self.x0 + (self.x1 - self.x0) * i / 4
            yv = self.y0 + (self.y1 - self.y0) * i / 4
            parts.append(
                f'<text x="{self.x(xv):.1f}" y="{H - PAD + 16}" font-size="11" text-anchor="middle">{xv:.3g}</text>'
            )
            parts.append(
                f'<text x="{PAD - 6}" y="{self.y(yv) + 4:.1f}" font-size="11" text-anchor="end">{yv:.3g}</text>'
            )
        parts.append(
            f'<text x="{W / 2}" y="{H - 8}" font-size="12" text-anchor="middle">{html.escape(self.xlabel)}</text>'
        )
        parts.append(
            f'<text x="14" y="{H / 2}" font-size="12" text-anchor="middle" transform="rotate(-90 14 {H / 2})">{html.escape(self.ylabel)}</text>'
        )
        return "".join(parts)


def _range(values: Sequence[float], pad: float = 0.05) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    span = (hi - lo) or 1.0
    return lo - pad * span, hi + pad * span


def _svg(title: str, body: str) -> str:
    return (
        f"<figure><figcaption>{html.escape(title)}</figcaption>"
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}">'
        f"{body}</svg></figure>"
    )


def _scatter(
    title: str,
    xs: Sequence[float],
    ys: Sequence[float],
    xlabel: str,
    ylabel: str,
    diagonal: bool = False,
    labels: Sequence[str] | None = None,
) -> str:
    xr, yr = _range(xs), _range(ys)
    if diagonal:
        xr = yr = (min(xr[0], yr[0]), max(xr[1], yr[1]))
    f = _Frame(xr, yr, xlabel, ylabel)
    dots = "".join(
        f'<circle cx="{f.x(a):.1f}" cy="{f.y(b):.1f}" r="{4 if labels else 2.2}" fill="{BLUE}" fill-opacity="0.6"/>'
        for a, b in zip(xs, ys, strict=True)
        if math.isfinite(a) and math.isfinite(b)
    )
    extra = ""
    if diagonal:
        extra = f'<line x1="{f.x(xr[0]):.1f}" y1="{f.y(xr[0]):.1f}" x2="{f.x(xr[1]):.1f}" y2="{f.y(xr[1]):.1f}" stroke="{RED}" stroke-width="2"/>'
    if labels:
        extra += "".join(
            f'<text x="{f.x(a) + 6:.1f}" y="{f.y(b) - 6:.1f}" font-size="11">{html.escape(t)}</text>'
            for a, b, t in zip(xs, ys, labels, strict=True)
        )
    return _svg(title, f.axes() + f'<g class="series">{dots}</g>' + extra)


def _histogram(title: str, edges: Sequence[float], counts: Sequence[int], marker: float) -> str:
    f = _Frame((edges[0], edges[-1]), (0.0, max(counts) * 1.08 or 1.0), "individual ε", "examples")
    bars = "".join(
        f'<rect x="{f.x(a):.1f}" y="{f.y(c):.1f}" width="{max(f.x(b) - f.x(a) - 1, 1):.1f}" height="{f.y(0) - f.y(c):.1f}" fill="{BLUE}"/>'
        for a, b, c in zip(edges[:-1], edges[1:], counts, strict=True)
    )
    line = f'<line x1="{f.x(marker):.1f}" y1="{PAD}" x2="{f.x(marker):.1f}" y2="{H - PAD}" stroke="{RED}" stroke-width="2"/>'
    return _svg(title, f.axes() + f'<g class="series">{bars}</g>' + line)


def _cost_bars(title: str, labels: Sequence[str], values: Sequence[float]) -> str:
    logs = [math.log10(max(v, 1e-6)) for v in values]
    lo = min(0.0, math.floor(min(logs)))
    f = _Frame((0.0, float(len(values))), (lo, max(logs) + 0.5), "", "log10(seconds)")
    bars = "".join(
        f'<rect x="{f.x(i + 0.2):.1f}" y="{f.y(v):.1f}" width="{f.x(0.6) - f.x(0):.1f}" height="{f.y(lo) - f.y(v):.1f}" fill="{BLUE if i == 0 else RED}"/>'
        f'<text x="{f.x(i + 0.5):.1f}" y="{PAD + 14}" font-size="11" text-anchor="middle">{html.escape(t)}</text>'
        for i, (t, v) in enumerate(zip(labels, logs, strict=True))
    )
    return _svg(title, f.axes() + f'<g class="series">{bars}</g>')


def render_individual_report(study: dict[str, Any]) -> str:
    """The page as one HTML string."""
    eps = study["epsilon"]
    corr = study["loss_correlation"]
    est = study["estimated_vs_exact"]
    cost = study["rounding_cost"]
    rel = study["released_statistics"]
    classes = study["per_class"]
    figures = [
        _histogram(
            f"Individual ε (δ = {study['delta']:g}); red: worst case {study['worst_case_epsilon']:.3g}",
            eps["histogram"]["edges"],
            eps["histogram"]["counts"],
            study["worst_case_epsilon"],
        ),
        _scatter(
            f"ε against log training loss (Pearson r = {corr['pearson_r_epsilon_log_loss']:.3f})",
            corr["log_loss"],
            corr["epsilon"],
            "log(training loss)",
            "individual ε",
        ),
        _scatter(
            f"Per class: mean ε against test accuracy (r = {study['per_class_pearson_r']:.3f})",
            [c["test_accuracy"] for c in classes],
            [c["mean_epsilon"] for c in classes],
            "test accuracy of the class (%)",
            "mean ε of the class",
            labels=[str(c["class"]) for c in classes],
        ),
        _scatter(
            f"Estimated against exact ε, {est['examples']} examples (Pearson r = {est['pearson_r']:.4f})",
            est["exact"],
            est["estimated"],
            "exact ε (norms every step)",
            "estimated ε (every K steps, rounded up)",
            diagonal=True,
        ),
        _cost_bars(
            "Accounting seconds: rounded (blue) vs unrounded (red)",
            [
                f"rounded: {cost['rdp_evaluations_rounded']:,} evals",
                f"unrounded: {cost['rdp_evaluations_unrounded']:,} evals",
            ],
            [cost["seconds_rounded"], cost["seconds_unrounded"]],
        ),
    ]
    quant_rows = "".join(
        f"<tr><td>{html.escape(p)}-quantile</td><td>{rel['nonprivate_quantiles'][p]:.3f}</td><td>{v:.3f}</td></tr>"
        for p, v in rel["quantiles"].items()
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Individual privacy of DP-SGD — {html.escape(study["dataset"])}</title>
<style>
body {{ background: #f3f4f7; font-family: sans-serif; margin: 24px; color: #222; }}
.card {{ background: #ffffff; padding: 16px 20px; margin-bottom: 16px; border-radius: 6px; }}
figure {{ display: inline-block; margin: 8px; }} figcaption {{ font-size: 13px; margin-bottom: 4px; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 3px 8px; }}
</style></head><body>
<div class="card"><h1>Individual privacy accounting for DP-SGD (Yu et al.), {html.escape(study["dataset"])}</h1>
<p>{html.escape(study["model"])}, n = {study["n_train"]}, test accuracy {study["test_accuracy"]:.2f}%,
worst-case ε = {study["worst_case_epsilon"]:.3f} at δ = {study["delta"]:g}.
Individual ε: min {eps["min"]:.3f}, median {eps["median"]:.3f}, max {eps["max"]:.3f};
{100 * eps["fraction_at_worst_case"]:.1f}% of examples at the worst case.
These per-example values are shown because the data are a public benchmark; a deployment shows
each ε to its owner only.</p></div>
<div class="card">{"".join(figures)}</div>
<div class="card"><h2>Estimated against exact ε</h2>
<p>Pearson r = {est["pearson_r"]:.4f}; mean |error| = {est["mean_abs_error"]:.4f}; worst |error| = {est["max_abs_error"]:.4f};
estimate ≥ exact for {100 * est["fraction_estimate_at_least_exact"]:.1f}% of the {est["examples"]} examples.</p>
<h2>Cost of rounding</h2>
<table><tr><th></th><th>RDP evaluations</th><th>seconds</th></tr>
<tr><td>rounded up to C/100</td><td>{cost["rdp_evaluations_rounded"]:,}</td><td>{cost["seconds_rounded"]:.3f}</td></tr>
<tr><td>unrounded (same norms)</td><td>{cost["rdp_evaluations_unrounded"]:,}</td><td>{cost["seconds_unrounded"]:.3f}</td></tr>
<tr><td>exact (every step, sample)</td><td>{cost["rdp_evaluations_exact_every_step"]:,}</td><td>{cost["seconds_exact_every_step"]:.3f}</td></tr></table>
<h2>Privately released statistics</h2>
<p>Budget ({rel["budget_epsilon"]:g}, {rel["budget_delta"]:g})-DP (ρ = {rel["rho"]:.4g}-zCDP): Gaussian noise on the clipped sum and on a 40-bin histogram.</p>
<table><tr><th>statistic</th><th>non-private</th><th>released</th></tr>
<tr><td>mean</td><td>{rel["nonprivate_mean"]:.3f}</td><td>{rel["mean"]:.3f}</td></tr>{quant_rows}</table></div>
</body></html>
"""


def write_individual_report(study: dict[str, Any], path: Path) -> Path:
    path = Path(path)
    path.write_text(render_individual_report(study), encoding="utf-8")
    return path
