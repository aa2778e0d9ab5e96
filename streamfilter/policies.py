"""Example adaptive query policies (``[queries] kind = "policy"``).

A policy is ``f(history, next_day) -> iterable of query dicts``: it sees every release published
so far (noisy, so using them is post-processing) and returns queries to register before
``next_day`` closes. It must be deterministic in its inputs so that a restarted daemon registers
the same queries again (re-registering an identical query is a no-op). A configuration names
one by its path, e.g. ``policy = "streamfilter.policies:drill_down"``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from streamfilter.engine.contract import Release
from streamfilter.telemetry.active_set import ACTIVE_SET_QUERY_ID

__all__ = [
    "ActiveFraction",
    "active_fraction",
    "drill_down",
    "standing_monitoring",
    "stop_when_inactive",
]

log = logging.getLogger("streamfilter.policies")


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


# -- stopping (Feldman & Zrnic §5: stop once few users remain active) ---------------------------


class ActiveFraction(NamedTuple):
    """The noisy active fraction and its 95% interval, each in [0, 1]."""

    estimate: float
    low: float
    high: float


def active_fraction(release: Release, population: int) -> ActiveFraction:
    """Active fraction ``1 − departed/population`` from one ``_active_set`` release.

    ``population`` is a *public* number of users (e.g. the enrolled user base the operator
    publishes anyway); the departures are the release's noisy cumulative count, so the result is
    post-processing of published values only. Clamped to [0, 1]; the interval uses the
    release's ``ci95``.
    """
    if release.query_id != ACTIVE_SET_QUERY_ID:
        raise ValueError(f"not an {ACTIVE_SET_QUERY_ID} release: {release.query_id!r}")
    if population < 1:
        raise ValueError(f"population must be >= 1, got population={population!r}")
    departed, half = release.value[0], release.ci95[0]

    def clamp(x: float) -> float:
        return min(1.0, max(0.0, x))

    return ActiveFraction(
        estimate=clamp(1.0 - departed / population),
        low=clamp(1.0 - (departed + half) / population),
        high=clamp(1.0 - (departed - half) / population),
    )


Policy = Callable[[Sequence[Release], str], list[dict[str, Any]]]


def stop_when_inactive(
    templates: Iterable[dict[str, Any]],
    *,
    population: int,
    min_active_fraction: float,
    confident: bool = True,
) -> Policy:
    """A policy running ``templates`` as standing queries until the active set is too small.

    Each day, every template (a query dict; ``from_day``/``until_day`` bound the days it runs)
    is registered as the one-day query ``"<query_id>:<day>"`` for the day about to close — so
    that it *can* stop: a registered standing query cannot be withdrawn. The policy stops for
    good (registers nothing more, logs one warning on ``streamfilter.policies``) once any
    published ``_active_set`` release shows an active fraction below ``min_active_fraction`` —
    with ``confident`` (default) only when even the upper end of its 95% interval is below, so
    noise alone rarely stops it early. Needs ``[telemetry] active_set = true`` (otherwise it
    never stops). Uses published releases only, so it is post-processing and deterministic in
    ``(history, next_day)`` as a policy must be.

    Example (a module of your own, then ``[queries] kind = "policy"``,
    ``policy = "mypolicies:policy"``)::

        policy = stop_when_inactive(
            [{"query_id": "active", "kind": "sum", "features": ["active"], "clip": 1.0,
              "from_day": "2026-01-01"}],
            population=100_000, min_active_fraction=0.5)
    """
    fixed = [dict(t) for t in templates]
    if not 0.0 < min_active_fraction <= 1.0:
        raise ValueError(f"min_active_fraction must be in (0, 1], got {min_active_fraction!r}")
    if population < 1:
        raise ValueError(f"population must be >= 1, got population={population!r}")

    def below(release: Release) -> bool:
        f = active_fraction(release, population)
        return (f.high if confident else f.estimate) < min_active_fraction

    def policy(history: Sequence[Release], next_day: str) -> list[dict[str, Any]]:
        estimates = [r for r in history if r.query_id == ACTIVE_SET_QUERY_ID]
        stops = [r for r in estimates if below(r)]
        if stops:
            if stops[0] is estimates[-1]:  # the first release below the threshold: warn once
                log.warning(
                    "stopping %d standing queries from %s: active fraction %.3f < %.3f (%s)",
                    len(fixed),
                    next_day,
                    active_fraction(stops[0], population).estimate,
                    min_active_fraction,
                    stops[0].day,
                )
            return []
        out = []
        for t in fixed:
            if t["from_day"] > next_day or t.get("until_day", next_day) < next_day:
                continue
            out.append(
                {**t, "query_id": f"{t['query_id']}:{next_day}", "from_day": next_day}
                | {"until_day": next_day}
            )
        return out

    return policy
