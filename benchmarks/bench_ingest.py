"""``ingest_json``: JSON event lines → the validated columnar day batch, on one core.

Input: ``n`` event lines of one day as producers write them (``json.dumps``): ``n/4`` users, each
event ``{"active": 1, "minutes": <float>, "plan": <category>}`` with an ``event_id`` (80%) or
``{"minutes": 3.5}`` alone (20%), and 0.1% malformed lines (rejected with their reason).

* streamfilter: ``engine.ingest.parse_events`` on the whole list (msgspec decoding into the
  ``Event`` struct, the contract's checks, ``parse_event`` for every line it cannot accept), then
  ``DayAccumulator.add`` of each event — the columns (user, coordinate, value) the day close
  reads, with repeated ``event_id``s dropped.
* baseline: ``EventModel.model_validate_json`` per line — the contract's pydantic model (its
  JSON parsing and validation are compiled Rust, pydantic-core) — then the same
  ``DayAccumulator.add`` of each model (it has the same attributes), so both build the same
  columns.
* also measured (detail): the previous hot path, ``parse_event`` per line + ``DayAccumulator.add``.

events/s = lines / median wall-clock seconds; ratio = streamfilter ÷ baseline.
"""

from __future__ import annotations

import json
import random

import numpy as np
from pydantic import ValidationError

from benchmarks.common import entry, median_seconds
from streamfilter.engine.contract import EventModel, Reject, parse_event
from streamfilter.engine.ingest import parse_events
from streamfilter.engine.records import DayAccumulator, DayRecords

DAY = "2026-01-05"
TARGET = 300_000


def make_lines(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    users = max(1, n // 4)
    plans = ("free", "pro", "team")
    lines = []
    for i in range(n):
        user = f"u-{rng.randrange(users)}"
        if rng.random() < 0.001:
            lines.append(b'{"user_id": "' + user.encode() + b'", "day": "2026-01-05", "values": {')
        elif rng.random() < 0.2:
            lines.append(
                json.dumps({"user_id": user, "day": DAY, "values": {"minutes": 3.5}}).encode()
            )
        else:
            values = {
                "active": 1,
                "minutes": round(rng.gammavariate(2.0, 6.0), 1),
                "plan": rng.choice(plans),
            }
            obj = {"user_id": user, "day": DAY, "values": values, "event_id": f"e-{i}"}
            lines.append(json.dumps(obj).encode())
    return lines


def streamfilter_path(lines: list[bytes]) -> DayAccumulator:
    acc = DayAccumulator(DAY)
    add = acc.add
    for item in parse_events(lines):
        if not isinstance(item, Reject):
            add(item)
    return acc


def previous_path(lines: list[bytes]) -> DayAccumulator:
    acc = DayAccumulator(DAY)
    for line in lines:
        try:
            event = parse_event(line)
        except Reject:
            continue
        acc.add(event)
    return acc


def pydantic_baseline(lines: list[bytes]) -> DayAccumulator:
    acc = DayAccumulator(DAY)
    validate = EventModel.model_validate_json
    for line in lines:
        try:
            model = validate(line)
        except ValidationError:
            continue
        acc.add(model)  # type: ignore[arg-type]  # same attributes as Event
    return acc


def _same_records(a: DayRecords, b: DayRecords) -> bool:
    """The same users, cells and sums (the accumulators' internals are free to differ)."""
    return (
        a.day == b.day
        and a.users.tolist() == b.users.tolist()
        and a.coord_names.tolist() == b.coord_names.tolist()
        and np.array_equal(a.user_pos, b.user_pos)
        and np.array_equal(a.coord, b.coord)
        and np.array_equal(a.value, b.value)
    )


def run(quick: bool = False) -> list[dict[str, object]]:
    n = 15_000 if quick else 1_000_000
    n_base = 8_000 if quick else 200_000
    runs = 3 if quick else 5
    lines = make_lines(n)
    base_lines = lines[:n_base]
    assert _same_records(
        streamfilter_path(base_lines).finish(), pydantic_baseline(base_lines).finish()
    ), "both paths must build the same day records"
    value = n / median_seconds(lambda: streamfilter_path(lines), runs)
    base = n_base / median_seconds(lambda: pydantic_baseline(base_lines), runs)
    prev = n_base / median_seconds(lambda: previous_path(base_lines), runs)
    return [
        entry(
            "ingest_json",
            value=round(value),
            unit="events/s",
            baseline="per-event pydantic EventModel.model_validate_json + the same add",
            baseline_value=round(base),
            ratio=round(value / base, 2),
            ratio_definition="value ÷ baseline",
            target=f"≥ {TARGET:,} events/s",
            target_met=value >= TARGET,
            runs=runs,
            size=f"{n:,} lines (baseline: {n_base:,})",
            detail=(
                f"JSON lines → validated Events → DayAccumulator columns, one core, {n:,} lines "
                f"({n // 4:,} users, 0.1% malformed); previous path (parse_event + add): "
                f"{prev:,.0f} events/s, so the batch decoder is {value / prev:.1f}× it"
            ),
        )
    ]


if __name__ == "__main__":
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
