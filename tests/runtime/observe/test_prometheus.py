"""The Prometheus observer (docs/design.md §6 items 9-10): the metrics the daemon exports, no user
id in any label, exact counts only on the operator's opt-in, and readiness.

Values are read back with ``registry.get_sample_value`` from a fresh registry per test.
"""

import datetime as dt
import json

import pytest
from prometheus_client import CollectorRegistry

from streamfilter.engine.engine import Engine
from streamfilter.engine.params import PrivacyParams
from streamfilter.privacy.noise import SeededRandomBits
from streamfilter.privacy.quotas import AnalystQuotas
from streamfilter.runtime.daemon import Daemon
from streamfilter.runtime.io.base import QueryFeed
from streamfilter.runtime.observe.http import MetricsServer
from streamfilter.runtime.observe.prometheus import (
    EXACT_METRICS,
    REJECT_REASONS,
    PrometheusObserver,
)
from streamfilter.runtime.store import SQLiteStateStore, StoreError
from streamfilter.testing import FakeClock, MemorySink, MemorySource
from tests.support.http import get

PARAMS = PrivacyParams.create(b_norm=2.0, rho=0.5, granularity=2.0**-8)
ACTIVE = {"query_id": "active", "kind": "sum", "features": ["active"], "clip": 1.0}
PLANS = {
    "query_id": "plans",
    "kind": "histogram",
    "feature": "plan",
    "categories": ["free", "pro"],
    "clip": 1.0,
}
# user ids and values nobody would print by accident: any trace of them is a leak
SECRET_USERS = ["uid-SECRET-4711-alice", "uid-SECRET-0815-bob", "uid-SECRET-2342-carol"]


class ListFeed(QueryFeed):
    def __init__(self, queries):
        self.pending = [json.dumps(q).encode() for q in queries]

    def poll(self):
        out, self.pending = [("test", q) for q in self.pending], []
        return out


def utc(day):
    d = dt.date.fromisoformat(day)
    return dt.datetime(d.year, d.month, d.day, tzinfo=dt.UTC).timestamp()


def ev(user, day, **values):
    return json.dumps({"user_id": user, "day": day, "values": values}).encode()


def stream():
    """Three days on two partitions, plus three malformed records."""
    p0 = [
        ev(SECRET_USERS[0], "2026-01-01", active=1, plan="pro"),
        ev(SECRET_USERS[1], "2026-01-01", active=1, plan="free"),
        b"{not json",
        ev(SECRET_USERS[0], "2026-01-02", active=1),
        ev(SECRET_USERS[2], "2026-01-03", active=1, plan="pro"),
    ]
    p1 = [
        ev(SECRET_USERS[2], "2026-01-01", active=1),
        json.dumps({"user_id": SECRET_USERS[1], "day": "2026-13-01", "values": {}}).encode(),
        json.dumps({"user_id": SECRET_USERS[1], "day": "2026-01-02", "bogus": 1}).encode(),
        ev(SECRET_USERS[1], "2026-01-03", active=1),
    ]
    return {"p0": p0, "p1": p1}


def run_daemon(tmp_path, observer, *, store=None, wall="2026-01-05", engine=None, queries=None):
    clock = FakeClock(wall=utc(wall))
    store = store or SQLiteStateStore(tmp_path / "state.db")
    queries = queries or [{**q, "from_day": "2026-01-01"} for q in (ACTIVE, PLANS)]
    daemon = Daemon(
        engine or Engine(PARAMS, SeededRandomBits(7)),
        store,
        MemorySource(stream()),
        ListFeed(queries),
        MemorySink(),
        MemorySink(),
        poll_interval_s=0,
        wall_clock=clock.time,
        monotonic=clock.monotonic,
        observer=observer,
    )
    try:
        daemon.run(until_end=True)
    finally:
        store.close()
    return daemon


def label_values(registry):
    for metric in registry.collect():
        for sample in metric.samples:
            yield sample.name, sample.labels


# ---------------------------------------------------------------------------- values


def test_operational_metrics_read_back(tmp_path):
    reg = CollectorRegistry()
    obs = PrometheusObserver(
        reg, PARAMS, allowed_lateness_s=7200, wall_clock=lambda: utc("2026-01-05")
    )
    daemon = run_daemon(tmp_path, obs)
    get = reg.get_sample_value

    assert get("streamfilter_records_consumed_total", {"partition": "p0"}) >= 1
    consumed = sum(
        get("streamfilter_records_consumed_total", {"partition": p}) or 0 for p in ("p0", "p1")
    )
    assert consumed == daemon.summary.records_read == 9
    assert get("streamfilter_rejects_total", {"reason": "malformed_json"}) == 1
    assert get("streamfilter_rejects_total", {"reason": "invalid_day"}) == 1
    assert get("streamfilter_rejects_total", {"reason": "unknown_field"}) == 1
    assert get("streamfilter_rejects_total", {"reason": "late"}) == 0  # pre-created at 0
    assert get("streamfilter_day_closes_total") == 3
    assert get("streamfilter_releases_published_total") == 6  # 3 days × 2 queries
    assert get("streamfilter_day_close_seconds_count") == 3
    assert get("streamfilter_day_close_seconds_sum") > 0
    assert get("streamfilter_state_store_commit_seconds_count") == 3
    assert get("streamfilter_state_store_size_bytes") > 0
    assert get("streamfilter_last_closed_day_timestamp_seconds") == utc("2026-01-03")
    # releases of 2026-01-03 acknowledged at 2026-01-05 00:00: one day after the day ended
    assert get("streamfilter_release_lag_seconds") == 86400
    assert get("streamfilter_allowed_lateness_seconds") == 7200
    assert get("streamfilter_failing_closed") == 0
    assert get("streamfilter_ready") == 0  # run() returned: stopped
    assert obs.readiness() == (False, "stopped")


def test_privacy_configuration_gauges_come_from_the_guarantee():
    params = PrivacyParams.create(b_norm=4.0, epsilon=1.0, delta=1e-5)
    reg = CollectorRegistry()
    PrometheusObserver(reg, params)
    g = params.guarantee()
    get = reg.get_sample_value
    assert get("streamfilter_privacy_rho") == g.rho
    assert get("streamfilter_privacy_sigma") == g.sigma
    assert get("streamfilter_privacy_norm_budget") == g.b_norm == 4.0
    assert get("streamfilter_privacy_delta") == g.delta == 1e-5
    assert get("streamfilter_privacy_epsilon") == g.epsilon
    for method, eps in g.epsilon_by_method.items():
        assert get("streamfilter_privacy_epsilon_by_conversion", {"conversion": method}) == eps
    assert get("streamfilter_privacy_granularity") == params.granularity
    assert get("streamfilter_privacy_ci95_halfwidth") == params.ci95_halfwidth
    assert get("streamfilter_privacy_telemetry_rho") is None  # only when told
    reg2 = CollectorRegistry()
    PrometheusObserver(reg2, params, telemetry_rho=0.05)
    assert reg2.get_sample_value("streamfilter_privacy_telemetry_rho") == 0.05
    info = {
        "mechanism": "discrete_gaussian",
        "exhaustion": "skip",
        "epsilon_method": g.method,
        "rho_calibration": params.rho_method,
    }
    assert get("streamfilter_privacy_info", info) == 1
    (build,) = [lab for name, lab in label_values(reg) if name == "streamfilter_build_info"]
    assert build["version"] and build["python"]


def test_published_releases_are_exported_with_their_bands(tmp_path):
    reg = CollectorRegistry()
    obs = PrometheusObserver(reg, PARAMS)
    run_daemon(tmp_path, obs)
    last = [r for r in _releases(tmp_path) if r["day"] == "2026-01-03"]
    assert {r["query_id"] for r in last} == {"active", "plans"}
    for rel in last:
        for label, value, ci in zip(rel["labels"], rel["value"], rel["ci95"], strict=True):
            key = {"query_id": rel["query_id"], "coordinate": label}
            assert reg.get_sample_value("streamfilter_release_value", key) == value
            assert reg.get_sample_value("streamfilter_release_ci95", key) == ci


def _releases(tmp_path):
    db = SQLiteStateStore(tmp_path / "state.db")
    try:
        return [json.loads(p) for p in db.load().releases]
    finally:
        db.close()


def test_the_privacy_gauges_are_computed_at_the_first_scrape_once(monkeypatch):
    """The (ε, δ) statement (scipy's root finder, ~0.5 s) is not computed at start-up, only
    when the gauges are first scraped, and then kept; the values are the guarantee's."""
    from prometheus_client import generate_latest

    params = PrivacyParams.create(b_norm=4.0, rho=0.5)
    calls = []
    real = PrivacyParams.guarantee
    monkeypatch.setattr(PrivacyParams, "guarantee", lambda self: calls.append(1) or real(self))
    observer = PrometheusObserver(CollectorRegistry(), params)
    assert calls == []
    first = generate_latest(observer.registry).decode()
    second = generate_latest(observer.registry).decode()
    assert calls == [1]
    g = real(params)
    for text in (first, second):
        assert f"streamfilter_privacy_epsilon {g.epsilon!r}" in text
        assert f"streamfilter_privacy_rho {g.rho!r}" in text


# ---------------------------------------------------------------------------- no leaks


def test_no_label_value_is_a_user_id_even_with_exact_metrics(tmp_path):
    reg = CollectorRegistry()
    obs = PrometheusObserver(reg, PARAMS, trusted_operator_metrics=True)
    run_daemon(tmp_path, obs)
    obs.rejected("uid-SECRET-4711-alice")  # a reason that is not a code is counted as "other"
    labels = [v for _, lab in label_values(reg) for v in lab.values()]
    assert labels
    for value in labels:
        assert not any(u in value for u in SECRET_USERS), value
    assert reg.get_sample_value("streamfilter_rejects_total", {"reason": "other"}) == 1
    keys = {k for _, lab in label_values(reg) for k in lab}
    assert keys <= {
        "partition",
        "reason",
        "query_id",
        "coordinate",
        "conversion",
        "version",
        "python",
        "mechanism",
        "exhaustion",
        "epsilon_method",
        "rho_calibration",
        "le",
    }
    reasons = {lab["reason"] for _, lab in label_values(reg) if "reason" in lab}
    assert reasons <= REJECT_REASONS | {"other"}


def test_exact_counts_are_absent_unless_the_operator_opts_in(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    reg = CollectorRegistry()
    run_daemon(tmp_path / "a", PrometheusObserver(reg, PARAMS))
    names = {name for name, _ in label_values(reg)}
    assert not [n for n in names if "exact" in n]
    for name in EXACT_METRICS:
        assert reg.get_sample_value(name) is None

    trusted = CollectorRegistry()
    run_daemon(tmp_path / "b", PrometheusObserver(trusted, PARAMS, trusted_operator_metrics=True))
    get = trusted.get_sample_value
    # 2026-01-03 (B = 2, every nonzero contribution costs 1): users[2] (spent 1 on day 1) is
    # admitted to "active"; users[1] spent 2 on day 1 (active + plan) and is refused.
    assert get("streamfilter_day_users_with_records_exact") == 2
    assert get("streamfilter_query_admitted_users_exact", {"query_id": "active"}) == 1
    assert get("streamfilter_query_refused_users_exact", {"query_id": "active"}) == 1
    # users[2] then has nothing left for its "plans" coordinate pro; users[1] has no plan
    assert get("streamfilter_query_admitted_users_exact", {"query_id": "plans"}) == 0
    assert get("streamfilter_query_refused_users_exact", {"query_id": "plans"}) == 1


# ---------------------------------------------------------------------------- readiness


def test_readyz_reports_a_stalled_outbox_and_an_unreachable_input():
    """A publish blocked inside the client (a broker outage) raises nothing: a committed release
    waiting longer than OUTBOX_STALL_S makes /readyz 503 by itself; so does an input whose
    broker cannot be asked. Both clear when the condition does; the gauge follows at scrape."""
    from streamfilter.runtime.observe.prometheus import OUTBOX_STALL_S

    now = [1000.0]
    reg = CollectorRegistry()
    obs = PrometheusObserver(reg, PARAMS, wall_clock=lambda: now[0])
    obs.started()
    obs.outbox(3)
    assert obs.readiness() == (True, "ready")
    now[0] += OUTBOX_STALL_S + 1
    ready, why = obs.readiness()
    assert not ready and why.startswith("3 committed releases not acknowledged by the sink")
    assert reg.get_sample_value("streamfilter_ready") == 0.0
    obs.outbox(0)
    assert obs.readiness() == (True, "ready")
    assert reg.get_sample_value("streamfilter_ready") == 1.0
    obs.source_unavailable("KafkaTimeoutError")
    assert obs.readiness() == (False, "the input is unavailable (KafkaTimeoutError); days wait")
    obs.source_available()
    assert obs.readiness() == (True, "ready")


class BrokenStore(SQLiteStateStore):
    def commit_day(self, commit):
        raise StoreError("state store broken-for-test failed to commit: disk I/O error")


def test_failing_closed_sets_the_gauge_and_readyz_answers_503(tmp_path):
    reg = CollectorRegistry()
    obs = PrometheusObserver(reg, PARAMS)
    server = MetricsServer(reg, "127.0.0.1", 0, obs.readiness)
    server.start()
    try:
        with pytest.raises(StoreError):
            run_daemon(tmp_path, obs, store=BrokenStore(tmp_path / "state.db"))
        assert reg.get_sample_value("streamfilter_failing_closed") == 1
        assert reg.get_sample_value("streamfilter_ready") == 0
        assert reg.get_sample_value("streamfilter_releases_published_total") == 0
        status, body, _ = get(server.url + "/readyz")
        assert status == 503 and "failing closed" in body
    finally:
        server.stop()


def test_coverage_and_population_are_gauges_of_the_noisy_releases():
    from streamfilter.engine.contract import Coverage, Population, Release
    from streamfilter.engine.day import ExactDayStats

    reg = CollectorRegistry()
    obs = PrometheusObserver(reg, PARAMS, telemetry_rho=0.05)
    rel = Release(
        "2026-01-01",
        "active",
        ["active"],
        [12.5],
        2.0,
        [3.9],
        "discrete_gaussian",
        1.0,
        coverage=Coverage(41, 5.0, 9.8, 0.8, 50, 1.0),
        population=Population([20.25], 6.0, [3.0], [11.75], "m"),
    )
    obs.day_closed("2026-01-01", 0.1, [rel], ExactDayStats(3))
    obs.published(1)
    key = {"query_id": "active", "coordinate": "active"}
    assert reg.get_sample_value("streamfilter_release_population", key) == 20.25
    assert reg.get_sample_value("streamfilter_release_population_ci95", key) == 11.75
    q = {"query_id": "active"}
    assert reg.get_sample_value("streamfilter_release_coverage_users", q) == 41
    assert reg.get_sample_value("streamfilter_release_coverage_ci95", q) == 9.8
    # the headline total is a gauge too: ρ + telemetry ρ, as `streamfilter guarantee` says
    assert reg.get_sample_value("streamfilter_privacy_guarantee_rho") == pytest.approx(
        PARAMS.guarantee().rho + 0.05
    )


def test_exact_operational_counts_are_labelled_operator_data_in_help_and_design():
    """Records read and rejects by reason are exact, data-dependent counts: exported by default
    as trusted-operator data, and both the HELP text and docs/design.md §6.9 say so."""
    from pathlib import Path

    reg = CollectorRegistry()
    PrometheusObserver(reg, PARAMS)
    helps = {m.name: m.documentation for m in reg.collect()}
    design = (Path(__file__).parents[3] / "docs" / "design.md").read_text()
    section = design[design.index("### 6.9") : design.index("### 6.10")]
    for name in ("streamfilter_records_consumed", "streamfilter_rejects"):
        assert helps[name].startswith("OPERATOR DATA (exact, not differentially private"), name
        assert f"{name}_total" in section
    assert "trusted-operator data" in section


def test_per_analyst_metrics_carry_the_configuration_and_public_release_counts(tmp_path):
    """Each analyst's share and sub-budget (configuration) and how many of its releases were
    published: nothing about any user; the exact per-query counts stay opt-in."""
    quotas = AnalystQuotas.from_shares({"growth": 0.25}, PARAMS.budget_units)
    reg = CollectorRegistry()
    obs = PrometheusObserver(reg, PARAMS, wall_clock=lambda: utc("2026-01-05"), quotas=quotas)
    queries = [{**ACTIVE, "from_day": "2026-01-01", "analyst": "growth"}]
    queries.append({**PLANS, "from_day": "2026-01-01"})
    run_daemon(
        tmp_path, obs, engine=Engine(PARAMS, SeededRandomBits(7), quotas=quotas), queries=queries
    )
    get = reg.get_sample_value
    assert get("streamfilter_analyst_share", {"analyst": "growth"}) == 0.25
    assert get("streamfilter_analyst_share", {"analyst": "default"}) == 0.75
    assert get("streamfilter_analyst_sub_budget", {"analyst": "growth"}) == 0.5  # 2.0 · 0.25
    assert get("streamfilter_analyst_releases_total", {"analyst": "growth"}) == 3
    assert get("streamfilter_analyst_releases_total", {"analyst": "default"}) == 3
    text = "".join(f"{name}{labels}" for name, labels in label_values(reg))
    assert not any(user in text for user in SECRET_USERS)
    assert not any(name in text for name in EXACT_METRICS)
