"""``ingest_json``: JSON event lines → the validated columnar day batch, on one core.

Input: ``n`` event lines of one day as producers write them (``json.dumps``): ``n/4`` users, each
event ``{"active": 1, "minutes": <float>, "plan": <category>}`` with an ``event_id`` (80%) or
``{"minutes": 3.5}`` alone (20%), and 0.1% malformed lines (rejected with their reason).

* streamfilter: the daemon's path (``runtime/daemon.py``, ``_ingest_batch``) on batches of
  50,000 lines (its poll size): a batch of one schema decoded straight into columns
  (``engine.ingest.parse_columns``: the native scanner, else msgspec) and added with
  ``DayAccumulator.add_columns``; any other batch — this stream's, which mixes two schemas and
  holds malformed lines — validated at once (``parse_events``: msgspec into the ``Event``
  struct, the contract's checks, ``parse_event`` for every line it cannot accept), its rejects
  set aside and its valid events added as columns (``add_many``), repeated ``event_id``s
  dropped.
* baseline: ``EventModel.model_validate_json`` per line — the contract's pydantic model (its
  JSON parsing and validation are compiled Rust, pydantic-core) — then the same batch
  accumulation (``add_many`` of the batch's valid models: they have the same attributes), so
  both build the same columns.
* also measured (detail): the per-event path ``Monitor`` takes (``parse_events``, then
  ``DayAccumulator.add`` of each event) and the first one (``parse_event`` per line + ``add``).

events/s = lines / median wall-clock seconds; ratio = streamfilter ÷ baseline.
"""

from __future__ import annotations

import json
import random

import numpy as np
from pydantic import ValidationError

from benchmarks.common import entry, median_seconds
from streamfilter.engine.contract import EventModel, Reject, parse_event
from streamfilter.engine.ingest import parse_columns, parse_events
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


#: lines per batch, as the daemon polls them (``Daemon.batch_size``)
BATCH = 50_000


def streamfilter_path(lines: list[bytes]) -> DayAccumulator:
    acc = DayAccumulator(DAY)
    for a in range(0, len(lines), BATCH):
        batch = lines[a : a + BATCH]
        columns = parse_columns(batch)
        if columns is not None:
            acc.add_columns(columns)
        else:
            acc.add_many([e for e in parse_events(batch) if not isinstance(e, Reject)])
    return acc


def per_event_path(lines: list[bytes]) -> DayAccumulator:
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
    for a in range(0, len(lines), BATCH):
        models = []
        for line in lines[a : a + BATCH]:
            try:
                models.append(validate(line))
            except ValidationError:
                continue
        acc.add_many(models)  # type: ignore[arg-type]  # same attributes as Event
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
    reference = streamfilter_path(base_lines).finish()
    for other in (pydantic_baseline, per_event_path, previous_path):
        assert _same_records(reference, other(base_lines).finish()), "the same day records"
    value = n / median_seconds(lambda: streamfilter_path(lines), runs)
    base = n_base / median_seconds(lambda: pydantic_baseline(base_lines), runs)
    per_event = n_base / median_seconds(lambda: per_event_path(base_lines), runs)
    prev = n_base / median_seconds(lambda: previous_path(base_lines), runs)
    return [
        entry(
            "ingest_json",
            value=round(value),
            unit="events/s",
            baseline="per-event pydantic EventModel.model_validate_json + the same add_many",
            baseline_value=round(base),
            ratio=round(value / base, 2),
            ratio_definition="value ÷ baseline",
            target=f"≥ {TARGET:,} events/s",
            target_met=value >= TARGET,
            runs=runs,
            size=f"{n:,} lines (baseline: {n_base:,})",
            detail=(
                f"JSON lines → validated events → DayAccumulator columns, one core, {n:,} lines "
                f"({n // 4:,} users, two schemas, 0.1% malformed) in the daemon's batches of "
                f"{BATCH:,}; the per-event path (parse_events + add per event, Monitor's): "
                f"{per_event:,.0f} events/s; the first path (parse_event + add): {prev:,.0f} "
                "events/s"
            ),
        )
    ]


if __name__ == "__main__":
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
