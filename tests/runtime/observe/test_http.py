"""The metrics server (``runtime/observe/http.py``): /metrics, /healthz and /readyz over real
sockets on 127.0.0.1, and its life inside ``build_daemon`` (served, not served, a busy port)."""

import json
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from streamfilter.config import load_config
from streamfilter.errors import ConfigError
from streamfilter.runtime.app import build_daemon
from streamfilter.runtime.observe.http import MetricsServer
from streamfilter.runtime.observe.prometheus import PrometheusObserver
from streamfilter.runtime.store import SQLiteStateStore
from tests.runtime.observe.test_prometheus import ACTIVE, PARAMS, stream, utc
from tests.support.http import get


def test_health_and_readiness_endpoints_over_http():
    reg = CollectorRegistry()
    obs = PrometheusObserver(reg, PARAMS)
    server = MetricsServer(reg, "127.0.0.1", 0, obs.readiness)
    server.start()
    try:
        base = server.url
        assert server.port > 0
        assert get(base + "/healthz")[:2] == (200, "ok\n")
        status, body, _ = get(base + "/readyz")
        assert (status, body) == (503, "starting\n")
        obs.started()
        assert get(base + "/readyz")[:2] == (200, "ready\n")
        status, body, ctype = get(base + "/metrics")
        assert status == 200 and ctype.startswith("text/plain")
        assert "streamfilter_privacy_rho 0.5" in body
        assert "streamfilter_ready 1.0" in body
        assert get(base + "/nope")[0] == 404
        obs.failing_closed("disk full")
        status, body, _ = get(base + "/readyz")
        assert status == 503 and body.startswith("failing closed")
        assert get(base + "/healthz")[0] == 200  # alive: the supervisor sees it exit instead
    finally:
        server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(base + "/healthz", timeout=2)


# ---------------------------------------------------------------------------- wiring


def _config(tmp_path, port, enabled="true"):
    (tmp_path / "events.jsonl").write_text(
        b"\n".join([*stream()["p0"], *stream()["p1"]]).decode() + "\n"
    )
    (tmp_path / "queries.jsonl").write_text(json.dumps({**ACTIVE, "from_day": "2026-01-01"}))
    cfg = tmp_path / "sf.toml"
    cfg.write_text(
        '[privacy]\nb_norm = 2.0\nrho = 0.5\n[source]\nkind = "file"\npath = "events.jsonl"\n'
        '[queries]\nkind = "file"\npath = "queries.jsonl"\n[sink]\nkind = "file"\n'
        f'path = "releases.jsonl"\n[state]\npath = "state.db"\n'
        f'[metrics]\nenabled = {enabled}\nhost = "127.0.0.1"\nport = {port}\n'
    )
    return load_config(cfg)


def test_build_daemon_serves_metrics_and_close_stops_the_server(tmp_path):
    parts = build_daemon(_config(tmp_path, 0), follow=False)
    try:
        assert parts.metrics is not None
        url = parts.metrics.server.url
        assert get(url + "/readyz")[0] == 503  # built, not started
        parts.daemon.on_day_closed = lambda day, rel: ready.append(get(url + "/readyz")[0])
        ready: list[int] = []
        parts.daemon.run(until_end=True)
        assert ready and set(ready) == {200}
        body = get(url + "/metrics")[1]
        assert "streamfilter_day_closes_total 3.0" in body
        assert 'streamfilter_rejects_total{reason="malformed_json"} 1.0' in body
    finally:
        parts.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/healthz", timeout=2)
    # a restart resumes the last closed day gauge from the store
    parts = build_daemon(_config(tmp_path, 0), follow=False)
    try:
        reg = parts.metrics.registry
        assert reg.get_sample_value("streamfilter_last_closed_day_timestamp_seconds") == utc(
            "2026-01-03"
        )
    finally:
        parts.close()


def test_metrics_disabled_builds_no_endpoint(tmp_path):
    parts = build_daemon(_config(tmp_path, 0, enabled="false"), follow=False)
    try:
        assert parts.metrics is None
        assert type(parts.daemon.observer).__name__ == "DaemonObserver"
    finally:
        parts.close()


def test_a_busy_metrics_port_is_a_configuration_error_and_releases_the_state(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=r"metrics\.port"):
            build_daemon(_config(tmp_path, port), follow=False)
    SQLiteStateStore(tmp_path / "state.db").close()  # the lock was released
