"""Wiring: build the engine, store, source, feed and sinks that a configuration names."""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from streamfilter.config import Settings
from streamfilter.engine.day import SeededPerRelease
from streamfilter.engine.local import LocalEngine
from streamfilter.engine.monitor import Engine
from streamfilter.engine.params import PrivacyParams
from streamfilter.errors import ConfigError, StreamfilterError
from streamfilter.privacy.noise import RandomBits, SystemRandomBits
from streamfilter.runtime.active_set import load_active_set
from streamfilter.runtime.daemon import Daemon, InputLimits
from streamfilter.runtime.io.base import NoQueryFeed, QueryFeed, Sink, Source
from streamfilter.runtime.io.files import FileQueryFeed, FileSink, FileSource, StdoutSink
from streamfilter.runtime.io.policy import PolicyFeed
from streamfilter.runtime.io.synthetic import SyntheticSource
from streamfilter.runtime.store import SQLiteStateStore, StateStore

if TYPE_CHECKING:
    from streamfilter.runtime.io.kafka import TopicSpec
    from streamfilter.runtime.observe.http import MetricsEndpoint

__all__ = [
    "Components",
    "build_daemon",
    "check_topics",
    "config_fingerprint",
    "event_source",
    "topic_specs",
]


def config_fingerprint(params: PrivacyParams, settings: Settings | None = None) -> str:
    """What must never change during a run: the lattice, the budget, the noise, the policy (and,
    in local mode, the variant and the devices' noise)."""
    desc: dict[str, object] = {
        "granularity": params.granularity,
        "budget_units": params.budget_units,
        "sigma2_units": params.sigma2_units,
        "sigma": params.sigma,
        "exhaustion": str(params.exhaustion),
        "mechanism": params.mechanism,
    }
    if settings is not None and settings.mode.kind == "local":
        desc["mode"] = {
            "variant": settings.local.variant,
            "sigma2_local_units": settings.sigma2_local_units(),
        }
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Components:
    daemon: Daemon
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

    assert loc.topic is not None
    k = settings.kafka
    return KafkaSource(loc.topic, k.client_config(), k.group_id)


def _engine(settings: Settings, params: PrivacyParams, bits: RandomBits) -> Engine:
    if settings.mode.kind == "local":
        return LocalEngine(params, bits, settings.local.variant, settings.sigma2_local_units())
    return Engine(params, bits)


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

    assert s.topic is not None
    k = settings.kafka
    return KafkaSource(s.topic, k.client_config(), k.group_id)


def _feed(settings: Settings) -> QueryFeed:
    q = settings.queries
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

    assert q.topic is not None
    return KafkaQueryFeed(q.topic, settings.kafka.client_config())


def _sink(settings: Settings, kind: str, path: Path, topic: str | None, dedupe: bool) -> Sink:
    if kind == "file":
        return FileSink(path, dedupe_releases=dedupe)
    if kind == "stdout":
        return StdoutSink()
    from streamfilter.runtime.io.kafka import KafkaSink

    assert topic is not None
    return KafkaSink(topic, settings.kafka.client_config())


def topic_specs(settings: Settings) -> list[TopicSpec]:
    from streamfilter.runtime.io.kafka import TopicSpec

    return [
        TopicSpec(key, sec.topic, sec.partitions, sec.replication_factor)
        for key, sec in settings.kafka_topics()
        if sec.topic is not None
    ]


def check_topics(settings: Settings) -> None:
    """Refuse to start when a configured topic is missing, naming it and its key."""
    specs = topic_specs(settings)
    if not specs:
        return
    from streamfilter.runtime.io.kafka import missing_topics

    try:
        missing = missing_topics(settings.kafka.client_config(), specs)
    except Exception as exc:  # any client failure: report the broker
        raise ConfigError(
            f"cannot reach kafka at {settings.kafka.bootstrap_servers}: {type(exc).__name__}: {exc}"
        ) from None
    if missing:
        names = ", ".join(f"{s.name!r} ({s.role})" for s in missing)
        raise ConfigError(
            f"missing kafka topic(s): {names}; create them with "
            "`streamfilter topics create --config PATH`"
        )


def build_daemon(
    settings: Settings, *, follow: bool = True, allow_test_seed: bool = False
) -> Components:
    params = settings.privacy_params()
    seed = settings.testing.noise_seed
    if seed is not None and not allow_test_seed:
        raise ConfigError(
            "testing.noise_seed makes the noise reproducible and the releases NOT private; "
            "`run` refuses it unless --testing is given"
        )
    bits: RandomBits = SeededPerRelease(seed) if seed is not None else SystemRandomBits()
    settings.state.path.parent.mkdir(parents=True, exist_ok=True)
    store = SQLiteStateStore(
        settings.state.path, budget_log_max_rows=settings.state.budget_log_max_rows
    )
    try:
        fingerprint = config_fingerprint(params, settings)
        stored = store.load().config_fingerprint
        if stored is None:
            store.set_config_fingerprint(fingerprint)
        elif stored != fingerprint:
            raise ConfigError(
                f"[privacy] (or [mode]/[local]) differs from the configuration this state was "
                "created with "
                f"(state {settings.state.path}); granularity, b_norm, rho/epsilon, mechanism and "
                "exhaustion cannot change during a run — start a new state instead"
            )
        active_set = load_active_set(settings, params, store)  # opt-in; charges telemetry once
        check_topics(settings)
        source = _source(settings, follow)
        feed = _feed(settings)
        sink = _sink(
            settings, settings.sink.kind, settings.sink.path or Path(), settings.sink.topic, True
        )
        reject_sink = _sink(
            settings, settings.rejects.kind, settings.rejects_path(), settings.rejects.topic, False
        )
    except (StreamfilterError, OSError):
        store.close()
        raise
    except LookupError as exc:  # a topic vanished between the check and the assignment
        store.close()
        raise ConfigError(str(exc)) from None
    metrics = None
    if settings.metrics.enabled:  # prometheus_client is imported only when metrics are on
        from streamfilter.runtime.observe.http import metrics_endpoint

        metrics = metrics_endpoint(settings, params)
    w, lim = settings.window, settings.limits
    daemon = Daemon(
        _engine(settings, params, bits),
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
        limits=InputLimits(
            max_event_bytes=lim.max_event_bytes,
            max_query_bytes=lim.max_query_bytes,
            max_query_memory_bytes=lim.max_query_memory_bytes,
            expected_users=lim.expected_users,
            max_live_queries=lim.max_live_queries,
            max_reject_raw_bytes=settings.rejects.max_raw_bytes,
        ),
        observer=metrics.observer if metrics is not None else None,
    )
    daemon.engine.active_set = active_set
    parts = Components(daemon, store, source, sink, reject_sink, metrics)
    if metrics is not None:
        metrics.observer.restore(daemon.engine.last_closed_day)
        try:
            metrics.start()
        except OSError as exc:
            parts.close()
            m = settings.metrics
            raise ConfigError(f"metrics.port: cannot listen on {m.host}:{m.port}: {exc}") from None
    return parts
