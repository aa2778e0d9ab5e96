"""Wiring: build the engine, store, source, feed and sinks that a configuration names."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from streamfilter.config import Settings, config_fingerprint
from streamfilter.dedup.index import EventIdIndex
from streamfilter.dedup.spill import SpillingEventIds
from streamfilter.engine.day import SeededPerRelease
from streamfilter.engine.engine import Engine, EngineCore
from streamfilter.engine.ingest import SCANNER
from streamfilter.engine.local import LocalEngine
from streamfilter.engine.params import PrivacyParams
from streamfilter.errors import ConfigError, ExitCode, StreamfilterError
from streamfilter.privacy.noise import RandomBits, SystemRandomBits
from streamfilter.runtime.daemon import Daemon, InputLimits
from streamfilter.runtime.io.base import NoQueryFeed, QueryFeed, Sink, Source
from streamfilter.runtime.io.files import FileQueryFeed, FileSink, FileSource, StdoutSink
from streamfilter.runtime.io.policy import PolicyFeed
from streamfilter.runtime.io.synthetic import SyntheticSource
from streamfilter.runtime.store import StateStore
from streamfilter.runtime.store.open import open_store
from streamfilter.runtime.telemetry import load_active_set, load_coverage
from streamfilter.telemetry.active_set import ActiveSetTracker
from streamfilter.telemetry.coverage import CoverageTracker
from streamfilter.telemetry.population import PopulationSpec, PopulationTracker

log = logging.getLogger("streamfilter.app")

if TYPE_CHECKING:
    from streamfilter.runtime.cluster_worker import ClusterWorker
    from streamfilter.runtime.io.kafka import TopicSpec
    from streamfilter.runtime.observe.http import MetricsEndpoint

__all__ = [
    "Components",
    "build_daemon",
    "check_query_source",
    "check_topics",
    "config_fingerprint",
    "event_source",
    "input_limits",
    "kafka_errors_explained",
    "startup_summary",
    "topic_specs",
]


@dataclass
class Components:
    daemon: Daemon | ClusterWorker
    store: StateStore
    source: Source
    sink: Sink
    reject_sink: Sink
    metrics: MetricsEndpoint | None = None  # [metrics] enabled: observer + HTTP server

    def close(self) -> None:
        if self.metrics is not None:  # stop serving first: /readyz must not outlive the store
            with contextlib.suppress(Exception):
                self.metrics.stop()
        for closer in (
            self.source.close,
            self.daemon.feed.close,
            self.sink.close,
            self.reject_sink.close,
            self.store.close,
        ):
            with contextlib.suppress(Exception):  # close everything we can
                closer()


def _contributions_source(settings: Settings, follow: bool) -> Source:
    """Local mode: the devices' contributions (``[local]``) are the daemon's input."""
    loc = settings.local
    if loc.kind == "file":
        assert loc.path is not None
        return FileSource(loc.path, follow=follow)
    from streamfilter.runtime.io.kafka import KafkaSource
    from streamfilter.runtime.io.kafka_errors import check_group_access, kafka_access

    assert loc.topic is not None
    k = settings.kafka
    check_group_access(k.client_config(), k.group_id, loc.topic)
    with kafka_access(k.client_config(), topic=loc.topic, role="local.topic", group=k.group_id):
        return KafkaSource(loc.topic, k.client_config(), k.group_id)


def _event_id_index(settings: Settings) -> Callable[[str], EventIdIndex]:
    """Each open day's repeated-event index: spilling to ``[spill] dir`` past
    ``event_ids_in_memory`` pairs, so a day's memory does not grow with its events."""
    spill = settings.spill

    def new_index(day: str) -> EventIdIndex:
        return SpillingEventIds(spill.event_ids_in_memory, spill.dir, label=day)

    return new_index


def _engine(
    settings: Settings,
    params: PrivacyParams,
    bits: RandomBits,
    active_set: ActiveSetTracker | None,
    coverage: CoverageTracker | None,
    population: PopulationTracker | None = None,
) -> EngineCore[Any]:
    if settings.mode.kind == "local":  # no per-user state on the server: no active-set estimate
        return LocalEngine(
            params,
            bits,
            settings.local.variant,
            settings.sigma2_local_units(),
            settings.analyst_quotas(params),
        )
    return Engine(
        params,
        bits,
        active_set=active_set,
        coverage=coverage,
        population=population,
        event_id_index=_event_id_index(settings),
        quotas=settings.analyst_quotas(params),
    )


def _population(
    settings: Settings, params: PrivacyParams, stored: bytes | None
) -> PopulationTracker | None:
    """The population counters the engine runs (``[telemetry] population``; no ρ is charged:
    docs/design.md §2.12), resumed from the state when it holds them."""
    if not settings.telemetry.population:
        return None
    if stored is not None:
        return PopulationTracker.from_json(stored)
    try:
        spec = PopulationSpec(settings.telemetry.population_epoch_days)
        return PopulationTracker.create(spec, params)
    except ValueError as exc:
        raise ConfigError(f"telemetry.population: {exc}") from None


def _source(settings: Settings, follow: bool) -> Source:
    if settings.mode.kind == "local":
        return _contributions_source(settings, follow)
    return event_source(settings, follow)


def event_source(settings: Settings, follow: bool = False) -> Source:
    """The ``[source]`` of raw events (central mode's input; local mode's simulated devices)."""
    s = settings.source
    if s.kind == "file":
        assert s.path is not None
        return FileSource(s.path, follow=follow)
    if s.kind == "synthetic":
        g = s.synthetic
        return SyntheticSource(g.users, g.days, g.start_day, g.p_active, g.seed)
    from streamfilter.runtime.io.kafka import KafkaSource
    from streamfilter.runtime.io.kafka_errors import check_group_access, kafka_access

    assert s.topic is not None
    k = settings.kafka
    check_group_access(k.client_config(), k.group_id, s.topic)
    with kafka_access(k.client_config(), topic=s.topic, role="source.topic", group=k.group_id):
        return KafkaSource(s.topic, k.client_config(), k.group_id)


def check_query_source(settings: Settings) -> None:
    """Refuse a run whose queries could silently never arrive (exit 2, before the state opens):
    no ``[queries]`` section (running without queries is ``kind = "none"``, a decision), or a
    query file that does not exist — like a missing events file. Days closed without their
    queries can never be answered later (a query starting on a closed day is refused)."""
    q = settings.queries
    if q is None:
        raise ConfigError(
            'queries: no [queries] section; name the query source ([queries] kind = "file" '
            'with path, "kafka" with topic, or "policy"), or write [queries] kind = "none" to '
            "run without queries (days then close with no releases)"
        )
    if q.kind == "file" and (q.path is None or not q.path.is_file()):
        raise ConfigError(
            f"queries.path: query file not found: {q.path} (create it, fix the path, or set "
            '[queries] kind = "none" to run without queries)'
        )


def _feed(settings: Settings) -> QueryFeed:
    q = settings.queries
    assert q is not None  # check_query_source ran first
    if q.kind == "file":
        assert q.path is not None
        return FileQueryFeed(q.path)
    if q.kind == "policy":
        assert q.policy is not None
        try:
            return PolicyFeed(q.policy)
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"queries.policy: cannot load {q.policy}: {exc}") from None
    if q.kind == "none":
        return NoQueryFeed()
    from streamfilter.runtime.io.kafka import KafkaQueryFeed
    from streamfilter.runtime.io.kafka_errors import kafka_access

    assert q.topic is not None
    client = settings.kafka.client_config()
    with kafka_access(client, topic=q.topic, role="queries.topic"):
        return KafkaQueryFeed(q.topic, client)


def _sink(settings: Settings, kind: str, path: Path, topic: str | None, dedupe: bool) -> Sink:
    if kind == "file":
        # the reject file (no dedupe) quotes raw input: private, like the state
        return FileSink(path, dedupe_releases=dedupe, private=not dedupe)
    if kind == "stdout":
        return StdoutSink()
    from streamfilter.runtime.io.kafka import KafkaSink, release_transactional_id
    from streamfilter.runtime.io.kafka_errors import kafka_access

    assert topic is not None
    # the releases sink (dedupe) publishes in transactions under the topic's own id; rejects not
    txn_id = release_transactional_id(topic) if dedupe else None
    client = settings.kafka.client_config()
    role = "sink.topic" if dedupe else "rejects.topic"
    with kafka_access(client, topic=topic, role=role):
        return KafkaSink(
            topic,
            client,
            delivery_timeout_s=settings.kafka.delivery_timeout,
            transactional_id=txn_id,
        )


def topic_specs(settings: Settings) -> list[TopicSpec]:
    topics = [(key, sec) for key, sec in settings.kafka_topics() if sec.topic is not None]
    if not topics:  # no Kafka in this run: kafka-python is not imported at all
        return []
    from streamfilter.runtime.io.kafka import TopicSpec

    return [
        TopicSpec(key, str(sec.topic), sec.partitions, sec.replication_factor)
        for key, sec in topics
    ]


def kafka_errors_explained(settings: Settings) -> contextlib.AbstractContextManager[None]:
    """Around a command's work: Kafka TLS/SASL failures and authorization errors become one
    clear line (``KafkaAccessError``); nothing when the configuration does not use Kafka."""
    if not topic_specs(settings):
        return contextlib.nullcontext()
    from streamfilter.runtime.io.kafka_errors import kafka_access

    k = settings.kafka
    return kafka_access(k.client_config(), group=k.group_id)


T = TypeVar("T")

#: waits between start-up attempts at an unreachable broker or database (s); the last repeats
STARTUP_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class StoppedWhileStarting(StreamfilterError):
    """A stop (SIGTERM) arrived while start-up waited for a broker or database: a clean exit."""

    exit_code = ExitCode.OK


class _QuietClient(logging.Filter):
    """Drops the client libraries' own lines while an attempt runs: each failed attempt is
    one WARNING of ours, not a screenful of kafka-python's ERRORs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith("kafka")


def until_reachable(
    what: str,
    attempt: Callable[[], T],
    transient: tuple[type[BaseException], ...],
    endpoint: MetricsEndpoint | None = None,
    stop: threading.Event | None = None,
) -> T:
    """``attempt()`` until it returns: a ``transient`` failure (the service did not answer) is
    not a configuration error — it is logged as one WARNING per attempt, ``/readyz`` says what
    start-up waits for, and the attempt is repeated after the next of :data:`STARTUP_RETRY_S`,
    for as long as it takes (a supervisor's restart could do no better), or until ``stop`` is
    set (SIGTERM: :class:`StoppedWhileStarting`, exit 0). Any other error ends start-up as
    before."""
    quiet = _QuietClient()
    handlers = list(logging.getLogger().handlers)
    try:
        for n in itertools.count(1):
            if endpoint is not None:
                endpoint.waiting = f"connecting to {what} (attempt {n})"
            started = time.monotonic()
            for handler in handlers:
                handler.addFilter(quiet)
            try:
                return attempt()
            except transient as exc:
                pause = STARTUP_RETRY_S[min(n, len(STARTUP_RETRY_S)) - 1]
                text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                name = type(exc).__name__
                cause = text if text.startswith(name) else f"{name}: {text}"
                log.warning(
                    "%s did not answer (attempt %d, %.0f s: %s); retrying in %.0f s — a "
                    "network or server state, not the configuration",
                    what,
                    n,
                    time.monotonic() - started,
                    cause,
                    pause,
                )
                if endpoint is not None:
                    endpoint.waiting = f"{what} did not answer (attempt {n}); retrying"
            finally:
                for handler in handlers:
                    handler.removeFilter(quiet)
            if (stop or threading.Event()).wait(pause):
                raise StoppedWhileStarting(
                    f"stopped while waiting for {what}: nothing was read or released"
                )
        raise AssertionError("unreachable")  # pragma: no cover - count() never ends
    finally:
        if endpoint is not None:
            endpoint.waiting = None


def _kafka_unreachable() -> tuple[type[BaseException], ...]:
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError

    return (KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError)


def check_topics(
    settings: Settings, endpoint: MetricsEndpoint | None = None, stop: threading.Event | None = None
) -> None:
    """Refuse to start when a configured topic is missing, naming it and its key; wait (with
    ``until_reachable``) while the broker does not answer."""
    specs = topic_specs(settings)
    if not specs:
        return
    from streamfilter.runtime.io.kafka import missing_topics

    client = settings.kafka.client_config()
    try:
        missing = until_reachable(
            f"kafka at {settings.kafka.bootstrap_servers}",
            lambda: missing_topics(client, specs),
            _kafka_unreachable(),
            endpoint,
            stop,
        )
    except StreamfilterError:  # TLS, SASL, ACL: the cause and the key or ACL to fix
        raise
    except Exception as exc:  # any other client failure: report the broker
        raise ConfigError(
            f"kafka at {settings.kafka.bootstrap_servers} answered with an error: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if missing:
        names = ", ".join(f"{s.name!r} ({s.role})" for s in missing)
        raise ConfigError(
            f"missing kafka topic(s): {names}; create them with "
            "`streamfilter topics create --config PATH`"
        )


def build_daemon(
    settings: Settings,
    *,
    follow: bool = True,
    allow_test_seed: bool = False,
    stop: threading.Event | None = None,
) -> Components:
    """The daemon and its parts; ``stop`` (set on SIGTERM) ends a wait for an unreachable
    broker or database (:func:`until_reachable`)."""
    params = settings.privacy_params()
    check_query_source(settings)
    seed = settings.testing.noise_seed
    if seed is not None and not allow_test_seed:
        raise ConfigError(
            "testing.noise_seed makes the noise reproducible and the releases NOT private; "
            "`run` refuses it unless --testing is given"
        )
    bits: RandomBits = SeededPerRelease(seed) if seed is not None else SystemRandomBits()
    if settings.cluster.enabled:
        if not follow:
            raise ConfigError(
                "cluster.enabled: cluster workers follow the input; --until-end is not "
                "available in cluster mode (stop the workers with SIGTERM)"
            )
        return _build_worker(settings, params, bits)
    # serving /readyz from the start: it says what start-up waits for
    metrics = _serve_metrics(settings, params)
    try:
        store = _open_store(settings, metrics, stop)
    except BaseException:
        if metrics is not None:
            metrics.stop()
        raise
    try:
        fingerprint = config_fingerprint(params, settings)
        state = store.load()  # the one load at start-up: every row checked against its CRC
        stored = state.config_fingerprint
        if stored is None:
            store.set_config_fingerprint(fingerprint)
        elif stored != fingerprint:
            raise ConfigError(
                f"[privacy] (or [mode]/[local]) differs from the configuration this state was "
                "created with "
                f"(state {settings.state.describe()}); granularity, b_norm, rho/epsilon, mechanism and "
                "exhaustion cannot change during a run — start a new state instead"
            )
        active_set = load_active_set(
            settings, params, store, state.active_set_state
        )  # opt-in; charges telemetry once
        coverage = load_coverage(  # on by default; charges telemetry once
            settings, params, store, state.coverage_state, state.budgets
        )
        check_topics(settings, metrics, stop)
        source = _source(settings, follow)
        feed = _feed(settings)
        sink = _sink(
            settings, settings.sink.kind, settings.sink.path or Path(), settings.sink.topic, True
        )
        reject_sink = _sink(
            settings, settings.rejects.kind, settings.rejects_path(), settings.rejects.topic, False
        )
    except BaseException as exc:
        store.close()
        if metrics is not None:
            metrics.stop()
        if isinstance(exc, LookupError):  # a topic vanished between the check and the assignment
            raise ConfigError(str(exc)) from None
        raise
    w = settings.window
    daemon = Daemon(
        _engine(
            settings,
            params,
            bits,
            active_set,
            coverage,
            _population(settings, params, state.population_state),
        ),
        store,
        source,
        feed,
        sink,
        reject_sink,
        allowed_lateness_s=w.allowed_lateness,
        idle_timeout_s=w.idle_timeout,
        poll_interval_s=w.poll_interval,
        future_slack_s=w.future_slack,
        on_retention_gap=settings.source.on_retention_gap,
        limits=input_limits(settings),
        observer=metrics.observer if metrics is not None else None,
        state=state,
        min_affordable_days=settings.queries.min_affordable_days if settings.queries else 7,
    )
    parts = Components(daemon, store, source, sink, reject_sink, metrics)
    if metrics is not None:
        last = daemon.engine.last_closed_day
        metrics.observer.restore(
            last,
            [r for r in daemon.engine.history if r.day == last],
            store.size_bytes(),
        )
    return parts


def _open_store(
    settings: Settings, endpoint: MetricsEndpoint | None, stop: threading.Event | None
) -> StateStore:
    """The configured state; a database that does not answer is waited for."""
    if settings.state.kind != "postgres":
        return open_store(settings.state)
    from streamfilter.runtime.store.postgres import StoreUnreachableError

    return until_reachable(
        f"the state database ({settings.state.describe()})",
        lambda: open_store(settings.state),
        (StoreUnreachableError,),
        endpoint,
        stop,
    )


def input_limits(settings: Settings) -> InputLimits:
    """``[limits]`` and ``[rejects] max_raw_bytes`` as the daemon's input limits."""
    lim = settings.limits
    return InputLimits(
        max_event_bytes=lim.max_event_bytes,
        max_query_bytes=lim.max_query_bytes,
        max_query_memory_bytes=lim.max_query_memory_bytes,
        expected_users=lim.expected_users,
        max_live_queries=lim.max_live_queries,
        max_reject_raw_bytes=settings.rejects.max_raw_bytes,
    )


def _serve_metrics(settings: Settings, params: PrivacyParams) -> MetricsEndpoint | None:
    """The ``[metrics]`` endpoint, serving (None when disabled). A port that cannot be bound
    is a configuration error when ``[metrics] enabled`` was set explicitly; with the default it
    is a warning and the run goes on without the endpoint."""
    m = settings.metrics
    if not m.enabled:
        return None
    from streamfilter.runtime.observe.http import metrics_endpoint  # prometheus_client: only now

    endpoint = metrics_endpoint(settings, params)
    try:
        endpoint.start()
    except OSError as exc:
        if "enabled" in m.model_fields_set:  # asked for explicitly: refuse to run without
            raise ConfigError(f"metrics.port: cannot listen on {m.host}:{m.port}: {exc}") from None
        log.warning(
            "metrics: cannot listen on %s:%d (%s); running without /metrics, /healthz and "
            "/readyz — set [metrics] port, or enabled = false to opt out",
            m.host,
            m.port,
            exc.strerror or exc,
        )
        return None
    return endpoint


def _build_worker(settings: Settings, params: PrivacyParams, bits: RandomBits) -> Components:
    """Cluster mode (docs/design.md §7): a worker over the group's partitions and the shared
    ledger; the release sink is built only if this worker becomes the releaser."""
    if settings.telemetry.population:
        raise ConfigError(
            "telemetry.population is not available in cluster mode yet (the partial days "
            "carry no departed sums); run a single process or set population = false"
        )
    from streamfilter.runtime.cluster_worker import ClusterWorker, worker_name
    from streamfilter.runtime.io.kafka import KafkaGroupSource
    from streamfilter.runtime.io.kafka_errors import check_group_access, kafka_access
    from streamfilter.runtime.store.cluster import ClusterLedger

    st = settings.state
    assert st.url is not None  # checked by the configuration
    ledger = ClusterLedger(st.url, schema=st.pg_schema, password=st.postgres_password())
    parts: list[object] = [ledger]
    try:
        fingerprint = config_fingerprint(params, settings)
        ledger.set_config_fingerprint(fingerprint)  # the first worker's stays
        if ledger.load_fingerprint() != fingerprint:
            raise ConfigError(
                f"[privacy] differs from the configuration the cluster's ledger was created with "
                f"(state {st.describe()}); start a new ledger instead"
            )
        # coverage with every release, on by default: the first worker charges it once and
        # stores the tracker in the ledger; the releaser steps it with every released day
        coverage = load_coverage(settings, params, ledger, ledger.coverage_state())
        check_topics(settings)
        s, k, c = settings.source, settings.kafka, settings.cluster
        assert s.topic is not None
        check_group_access(k.client_config(), k.group_id, s.topic)
        with kafka_access(k.client_config(), topic=s.topic, role="source.topic", group=k.group_id):
            source = KafkaGroupSource(
                s.topic,
                k.client_config(),
                k.group_id,
                member_name=worker_name(),
                session_timeout_s=c.session_timeout,
                heartbeat_interval_s=c.heartbeat_interval,
                max_poll_interval_s=c.max_poll_interval,
                assignment_settle_s=c.assignment_settle,
            )
        parts.append(source)
        feed = _feed(settings)
        parts.append(feed)
        reject_sink = _sink(
            settings, settings.rejects.kind, settings.rejects_path(), settings.rejects.topic, False
        )
    except BaseException:
        for part in reversed(parts):
            with contextlib.suppress(Exception):
                part.close()  # type: ignore[attr-defined]
        raise

    def release_sink() -> Sink:
        return _sink(
            settings, settings.sink.kind, settings.sink.path or Path(), settings.sink.topic, True
        )

    metrics = None
    if settings.metrics.enabled:  # several workers on one host need one [metrics] port each
        from streamfilter.runtime.observe.http import metrics_endpoint

        metrics = metrics_endpoint(settings, params)
        try:
            metrics.start()
        except OSError as exc:
            for part in reversed(parts):
                with contextlib.suppress(Exception):
                    part.close()  # type: ignore[attr-defined]
            raise ConfigError(
                f"metrics.port: cannot listen on {settings.metrics.host}:{settings.metrics.port}: "
                f"{exc.strerror or exc} (give each worker on a host its own port, or set "
                "[metrics] enabled = false)"
            ) from None
    w = settings.window
    daemon = ClusterWorker(
        Engine(params, bits, coverage=coverage, event_id_index=_event_id_index(settings)),
        ledger,
        source,
        feed,
        release_sink,
        reject_sink,
        lease_s=settings.cluster.releaser_lease,
        allowed_lateness_s=w.allowed_lateness,
        idle_timeout_s=w.idle_timeout,
        poll_interval_s=w.poll_interval,
        future_slack_s=w.future_slack,
        limits=input_limits(settings),
        observer=metrics.observer if metrics is not None else None,
    )
    return _WorkerComponents(daemon, ledger, source, daemon.sink, reject_sink, metrics)


class _WorkerComponents(Components):
    def close(self) -> None:
        self.sink = self.daemon.sink  # the release sink, if this worker became the releaser
        super().close()


def startup_summary(settings: Settings, parts: Components) -> str:
    """One line for the start-up log: where input, queries and output are, the privacy level and
    the state — never a secret (Kafka credentials are not named) nor a data-dependent count."""
    params = settings.privacy_params()
    q = settings.queries

    def where(kind: str, path: Path | None, topic: str | None) -> str:
        if kind == "kafka":
            return f"kafka topic {topic}"
        return f"{kind} {path}" if path is not None else kind

    s = settings.source
    src = where(s.kind, s.path, s.topic)
    if settings.mode.kind == "local":
        loc = settings.local
        src = (
            f"local-mode contributions ({loc.variant}) from {where(loc.kind, loc.path, loc.topic)}"
        )
    queries = (
        "none" if q is None else where(q.kind, q.path if q.kind != "policy" else None, q.topic)
    )
    if q is not None and q.kind == "policy":
        queries = f"policy {q.policy}"
    metrics = parts.metrics.server.url + "/metrics" if parts.metrics is not None else "off"
    return (
        f"starting: source {src}; queries {queries}; "
        f"releases {where(settings.sink.kind, settings.sink.path, settings.sink.topic)}; "
        f"state {settings.state.describe()} (last closed day "
        f"{parts.daemon.engine.last_closed_day or 'none'}); privacy {params.rho_stated:g}-zCDP per user "
        f"(+ telemetry {settings.telemetry.rho:g}), {params.mechanism} σ = "
        f"{params.sigma_released:.4g}, B_norm = {params.b_norm:g}, exhaustion "
        f"{params.exhaustion}; metrics {metrics}; event scanner {SCANNER}"
    )
