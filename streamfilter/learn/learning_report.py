"""A self-contained HTML page (inline SVG from :mod:`streamfilter.charts`, no scripts) for the
individual-ε study.

Five figures from :func:`.individual_accounting.individual_study`'s result: the histogram of individual ε
(worst case marked), ε against log training loss, per-class mean ε against per-class accuracy,
estimated against exact ε, and the cost of rounding; plus the privately released statistics.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from streamfilter.charts import column_chart, histogram_chart, scatter_chart

__all__ = ["render_individual_report", "write_individual_report"]


def _figure(chart: Any, title: str, *args: Any, **kwargs: Any) -> str:
    """One chart of :mod:`streamfilter.charts` with its title as the caption."""
    return f"<figure><figcaption>{html.escape(title)}</figcaption>{chart(title, *args, **kwargs)}</figure>"


def render_individual_report(study: dict[str, Any]) -> str:
    """The page as one HTML string."""
    eps = study["epsilon"]
    corr = study["loss_correlation"]
    est = study["estimated_vs_exact"]
    cost = study["rounding_cost"]
    rel = study["released_statistics"]
    classes = study["per_class"]
    figures = [
        _figure(
            histogram_chart,
            f"Individual ε (δ = {study['delta']:g}); red: worst case {study['worst_case_epsilon']:.3g}",
            eps["histogram"]["edges"],
            eps["histogram"]["counts"],
            "individual ε",
            "examples",
            marker=study["worst_case_epsilon"],
        ),
        _figure(
            scatter_chart,
            f"ε against log training loss (Pearson r = {corr['pearson_r_epsilon_log_loss']:.3f})",
            corr["log_loss"],
            corr["epsilon"],
            "log(training loss)",
            "individual ε",
        ),
        _figure(
            scatter_chart,
            f"Per class: mean ε against test accuracy (r = {study['per_class_pearson_r']:.3f})",
            [c["test_accuracy"] for c in classes],
            [c["mean_epsilon"] for c in classes],
            "test accuracy of the class (%)",
            "mean ε of the class",
            labels=[str(c["class"]) for c in classes],
        ),
        _figure(
            scatter_chart,
            f"Estimated against exact ε, {est['examples']} examples (Pearson r = {est['pearson_r']:.4f})",
            est["exact"],
            est["estimated"],
            "exact ε (norms every step)",
            "estimated ε (every K steps, rounded up)",
            diagonal=True,
        ),
        _figure(
            column_chart,
            "Accounting seconds: rounded vs unrounded",
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
figure {{ display: inline-block; margin: 8px; width: 520px; }} figcaption {{ font-size: 13px; }} svg.plot {{ width: 100%; height: auto; }}
svg .tick {{ font-size: 12px; fill: #5b6474; }}
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
