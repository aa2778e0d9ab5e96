"""Writes events.jsonl and queries.jsonl for tests/system/test_golden_releases.py (run once; the outputs
are committed). Deterministic: Python's ``random`` with a fixed seed, no dependency."""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
rng = random.Random(20261124)
lines = []
for d in range(1, 7):
    day = f"2026-03-{d:02d}"
    for u in range(400):
        if rng.random() < 0.35:
            continue
        for k in range(rng.choice([1, 1, 2, 3])):
            values = {"active": 1, "minutes": round(rng.expovariate(1 / 20), 2)}
            if rng.random() < 0.6:
                values["plan"] = rng.choice(["free", "pro", "team", "FREE"])
            event = {"user_id": f"u-{u}", "day": day, "values": values, "event_id": f"e{u}-{d}-{k}"}
            lines.append(json.dumps(event, sort_keys=True))
    lines.append(json.dumps({"user_id": "", "day": day, "values": {}}))  # a reject
    lines.append(f'{{"user_id": "u-1", "day": "{day}", "values": {{"x": NaN}}}}')  # a reject
(HERE / "events.jsonl").write_text("\n".join(lines) + "\n")
queries = [
    {
        "query_id": "active",
        "kind": "sum",
        "features": ["active"],
        "clip": 1.0,
        "from_day": "2026-03-01",
    },
    {
        "query_id": "minutes",
        "kind": "sum",
        "features": ["minutes"],
        "clip": 30.0,
        "from_day": "2026-03-01",
    },
    {
        "query_id": "plans",
        "kind": "histogram",
        "feature": "plan",
        "categories": ["free", "pro", "team"],
        "clip": 1.0,
        "from_day": "2026-03-02",
        "until_day": "2026-03-05",
    },
    {
        "query_id": "mix",
        "kind": "linear",
        "weights": {"active": [1, 0], "minutes": [0, 0.05]},
        "clip": 2.0,
        "from_day": "2026-03-03",
    },
]
(HERE / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
