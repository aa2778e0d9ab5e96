"""``ingest_json``: JSON event lines → the validated columnar day batch, on one core.

Input: ``n`` event lines of one day as producers write them (``json.dumps``): ``n/4`` users, each
event ``{"active": 1, "minutes": <float>, "plan": <category>}`` with an ``event_id`` (80%) or
``{"minutes": 3.5}`` alone (20%), and 0.1% malformed lines (rejected with their reason).

* streamfilter: the daemon's path (``runtime/daemon.py``, ``_ingest_batch``) on batches of
  50,000 lines (its poll size): a batch of one schema decoded straight into columns
  (``engine.ingest.parse_columns``: the native scanner) and added with
  ``DayAccumulator.add_columns``; any other batch — this stream's, which mixes two schemas and
  holds malformed lines — validated at once (``parse_events``: the scanner over runs of one
  schema, ``parse_event`` for every line it does not take), its rejects set aside and its valid
  events added as columns (``add_many``), repeated ``event_id``s dropped.
* baseline: what a user would write instead, msgspec per line — ``msgspec.json.Decoder`` of a
  struct carrying the contract's limits as constraints (C, typed decoding; the fastest Python
  JSON validator we know), the calendar day checked once per distinct day string — then the
  same batch accumulation (``add_many`` of the batch's valid structs: they have the same
  attributes), so both build the same columns.
* also measured (detail): the per-event path ``Monitor`` takes (``parse_events``, then
  ``DayAccumulator.add`` of each event) and the first one (``parse_event`` per line + ``add``).

events/s = lines / median wall-clock seconds; ratio = streamfilter ÷ baseline.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import statistics
from collections.abc import Callable
from typing import Annotated

import msgspec
import numpy as np

from benchmarks.common import entry, median_seconds, seconds
from streamfilter.engine.contract import (
    MAX_ABS_VALUE,
    MAX_FEATURE_CHARS,
    MAX_FEATURES_PER_EVENT,
    MAX_ID_CHARS,
    MAX_STRING_VALUE_CHARS,
    Reject,
    parse_event,
)
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


_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_FEATURE_CHARS)]
_Number = Annotated[float, msgspec.Meta(ge=-MAX_ABS_VALUE, le=MAX_ABS_VALUE)]
_Text = Annotated[str, msgspec.Meta(max_length=MAX_STRING_VALUE_CHARS)]


class MsgspecEvent(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """The event as a msgspec user would declare it: the contract's limits as constraints."""

    user_id: _Id
    day: str
    values: Annotated[dict[_Name, _Number | _Text], msgspec.Meta(max_length=MAX_FEATURES_PER_EVENT)]
    event_id: _Id | None = None


def msgspec_baseline(lines: list[bytes]) -> DayAccumulator:
    acc = DayAccumulator(DAY)
    decode = msgspec.json.Decoder(MsgspecEvent).decode
    days: dict[str, bool] = {}
    for a in range(0, len(lines), BATCH):
        events = []
        for line in lines[a : a + BATCH]:
            try:
                event = decode(line)
            except msgspec.DecodeError:
                continue
            ok = days.get(event.day)
            if ok is None:
                ok = days[event.day] = _valid_day(event.day)
            if ok:
                events.append(event)
        acc.add_many(events)  # type: ignore[arg-type]  # same attributes as Event
    return acc


def _valid_day(day: str) -> bool:
    try:
        return dt.date.fromisoformat(day).isoformat() == day
    except ValueError:
        return False


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


def paired_seconds(
    ours: Callable[[], object], baseline: Callable[[], object], pairs: int
) -> tuple[float, float, float]:
    """``pairs`` runs of each, in pairs whose order alternates (a drift of the machine falls on
    both): the median seconds of each and the median of the pairs' ratios baseline ÷ ours."""
    ours(), baseline()  # warm-up
    mine: list[float] = []
    theirs: list[float] = []
    for i in range(pairs):
        for fn, out in ((ours, mine), (baseline, theirs))[:: 1 if i % 2 == 0 else -1]:
            out.append(seconds(fn))
    ratios = [t / m for m, t in zip(mine, theirs, strict=True)]
    return statistics.median(mine), statistics.median(theirs), statistics.median(ratios)


def run(quick: bool = False) -> list[dict[str, object]]:
    n = 15_000 if quick else 300_000
    n_detail = 8_000 if quick else 100_000
    pairs = 5
    lines = make_lines(n)
    detail_lines = lines[:n_detail]
    reference = streamfilter_path(detail_lines).finish()
    for other in (msgspec_baseline, per_event_path, previous_path):
        assert _same_records(reference, other(detail_lines).finish()), "the same day records"
    ours, theirs, ratio = paired_seconds(
        lambda: streamfilter_path(lines), lambda: msgspec_baseline(lines), pairs
    )
    value, base = n / ours, n / theirs
    per_event = n_detail / median_seconds(lambda: per_event_path(detail_lines), 3)
    prev = n_detail / median_seconds(lambda: previous_path(detail_lines), 3)
    return [
        entry(
            "ingest_json",
            value=round(value),
            unit="events/s",
            baseline="msgspec per line into a struct with the contract's limits + the same add_many",
            baseline_value=round(base),
            ratio=round(ratio, 2),
            ratio_definition="median over the pairs of baseline seconds ÷ streamfilter seconds",
            target=f"≥ {TARGET:,} events/s",
            target_met=value >= TARGET,
            runs=pairs,
            size=f"{n:,} lines",
            detail=(
                f"JSON lines → validated events → DayAccumulator columns, one core, {n:,} lines "
                f"({n // 4:,} users, two schemas, 0.1% malformed) in the daemon's batches of "
                f"{BATCH:,}, {pairs} order-alternated pairs with the baseline; the per-event "
                f"path (parse_events + add per event, Monitor's): {per_event:,.0f} events/s; "
                f"the reference alone (parse_event + add): {prev:,.0f} events/s"
            ),
        )
    ]


if __name__ == "__main__":
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
