"""Example adaptive query policies (``[queries] kind = "policy"``).

A policy is ``f(history, next_day) -> iterable of query dicts``: it sees every release published
so far (noisy, so using them is post-processing) and returns queries to register before
``next_day`` closes. It must be deterministic in its inputs so that a restarted daemon registers
the same queries again (re-registering an identical query is a no-op).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamfilter.engine.contract import Release

__all__ = ["drill_down", "standing_monitoring"]


def standing_monitoring(history: Sequence[Release], next_day: str) -> list[dict[str, Any]]:
    """Standing queries from the first day: daily actives, plan mix, hours of use (clipped)."""
    if history:
        return []
    return [
        {
            "query_id": "active",
            "kind": "sum",
            "features": ["active"],
            "clip": 1.0,
            "from_day": next_day,
        },
        {
            "query_id": "plans",
            "kind": "histogram",
            "feature": "plan",
            "categories": ["free", "pro", "team"],
            "clip": 1.0,
            "from_day": next_day,
        },
        {
            "query_id": "hours",
            "kind": "linear",
            "weights": {"minutes": [1 / 60]},
            "labels": ["hours"],
            "clip": 1.0,
            "from_day": next_day,
        },
    ]


def drill_down(history: Sequence[Release], next_day: str) -> list[dict[str, Any]]:
    """Standing monitoring, plus an adaptive one-day ``focus`` query on the plan with the largest
    noisy count in the latest ``plans`` release: its daily count measured on its own (the whole
    clip spent on one coordinate). The choice depends on published releases only."""
    queries = standing_monitoring(history, next_day)
    plans = [r for r in history if r.query_id == "plans"]
    if plans:
        last = plans[-1]
        top = last.labels[max(range(len(last.value)), key=last.value.__getitem__)]
        queries.append(
            {
                "query_id": f"focus-{next_day}",
                "kind": "linear",
                "weights": {f"plan={top}": [1.0]},
                "labels": [f"plan={top}"],
                "clip": 1.0,
                "from_day": next_day,
                "until_day": next_day,
            }
        )
    return queries
