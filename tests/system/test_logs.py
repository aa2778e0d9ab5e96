"""Logs (docs/design.md §6 item 10): with DEBUG logging on everything, neither the logs nor the
metrics scrape of a whole run contain a user id, an event value or a pre-noise sum."""

import json
import logging

from streamfilter.config import load_config
from streamfilter.runtime.app import build_daemon
from tests.runtime.observe.test_prometheus import SECRET_USERS
from tests.support.http import get


def test_logs_never_contain_user_ids_values_or_pre_noise_sums(tmp_path, caplog):
    """The daemon, the wiring and the metrics server with DEBUG logging on everything."""
    # values exactly on the lattice (γ = 2^-10) so the pre-noise sum has one exact spelling
    minutes = [4096.5, 2048.25]
    exact_sum = sum(minutes)  # 6144.75
    events = [
        {"user_id": SECRET_USERS[0], "day": "2026-01-01", "values": {"minutes": minutes[0]}},
        {"user_id": SECRET_USERS[1], "day": "2026-01-01", "values": {"minutes": minutes[1]}},
        {"user_id": SECRET_USERS[2], "day": "2026-01-02", "values": {"minutes": "NaN?"}},
        {"user_id": SECRET_USERS[2], "day": "2026-01-02", "values": {"minutes": 1e300}},
    ]
    lines = [json.dumps(e) for e in events] + [f'{{"user_id": "{SECRET_USERS[2]}", broken']
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    query = {
        "query_id": "minutes",
        "kind": "linear",
        "weights": {"minutes": [1.0]},
        "clip": 8192.0,
        "from_day": "2026-01-01",
    }
    (tmp_path / "queries.jsonl").write_text(json.dumps(query) + "\n")
    cfg = tmp_path / "sf.toml"
    cfg.write_text(
        '[privacy]\nb_norm = 1e8\nrho = 0.5\n[source]\nkind = "file"\npath = "events.jsonl"\n'
        '[queries]\nkind = "file"\npath = "queries.jsonl"\n[sink]\nkind = "file"\n'
        'path = "releases.jsonl"\n[state]\npath = "state.db"\n'
        "[metrics]\nenabled = true\nport = 0\ntrusted_operator_metrics = true\n"
    )
    caplog.set_level(logging.DEBUG)
    parts = build_daemon(load_config(cfg), follow=False)
    try:
        get(parts.metrics.server.url + "/metrics")
        parts.daemon.run(until_end=True)
        scrape = get(parts.metrics.server.url + "/metrics")[1]
    finally:
        parts.close()
    assert any(r.name.startswith("streamfilter") for r in caplog.records)  # logging was on
    released = [json.loads(x) for x in (tmp_path / "releases.jsonl").read_text().splitlines()]
    assert released[0]["value"] != [exact_sum]  # noise was added
    lattice_units = int(exact_sum * 1024)
    forbidden = [*SECRET_USERS, "SECRET", "4096.5", "2048.25", "6144.75", str(lattice_units)]
    forbidden += ["1e+300", "NaN?"]
    for text in (caplog.text, scrape):
        for needle in forbidden:
            assert needle not in text, needle
