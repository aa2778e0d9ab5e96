"""Wiring: build the engine, store, source, feed and sinks that a configuration names."""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass

from streamfilter.config import ConfigError, Settings
from streamfilter.engine.day import SeededPerRelease
from streamfilter.engine.monitor import Engine
from streamfilter.engine.params import PrivacyParams
from streamfilter.privacy.noise import RandomBits, SystemRandomBits
from streamfilter.runtime.daemon import Daemon
from streamfilter.runtime.feeds import FileQueryFeed, NoQueryFeed, PolicyFeed, QueryFeed
from streamfilter.runtime.sinks import FileSink, Sink, StdoutSink
from streamfilter.runtime.sources import FileSource, Source, SyntheticSource
from streamfilter.runtime.store import SQLiteStateStore, StateStore, StoreError

__all__ = ["Components", "build_daemon", "config_fingerprint"]


def config_fingerprint(params: PrivacyParams) -> str:
    """What must never change during a run: the lattice, the budget, the noise, the policy."""
    desc = {
        "granularity": params.granularity,
        "budget_units": params.budget_units,
        "sigma2_units": params.sigma2_units,
        "sigma": params.sigma,
        "exhaustion": str(params.exhaustion),
        "mechanism": params.mechanism,
    }
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Components:
    daemon: Daemon
    store: StateStore
    source: Source
    sink: Sink
    reject_sink: Sink

    def close(self) -> None:
        for closer in (
            self.source.close,
            self.sink.close,
            self.reject_sink.close,
            self.store.close,
        ):
            with contextlib.suppress(Exception):  # close everything we can
                closer()


def _source(settings: Settings, follow: bool) -> Source:
    s = settings.source
    if s.kind == "file":
        assert s.path is not None
        return FileSource(s.path, follow=follow)
    if s.kind == "synthetic":
        g = s.synthetic
        return SyntheticSource(g.users, g.days, g.start_day, g.p_active, g.seed)
    raise ConfigError("source.kind = 'kafka' is not available in this build")


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
    raise ConfigError("queries.kind = 'kafka' is not available in this build")


def _sink(kind: str, path: object, dedupe: bool) -> Sink:
    if kind == "file":
        from pathlib import Path

        assert isinstance(path, Path)
        return FileSink(path, dedupe_releases=dedupe)
    if kind == "stdout":
        return StdoutSink()
    raise ConfigError(f"sink kind '{kind}' is not available in this build")


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
    store = SQLiteStateStore(settings.state.path)
    try:
        fingerprint = config_fingerprint(params)
        stored = store.load().config_fingerprint
        if stored is None:
            store.set_config_fingerprint(fingerprint)
        elif stored != fingerprint:
            raise ConfigError(
                f"[privacy] differs from the configuration this state was created with "
                f"(state {settings.state.path}); granularity, b_norm, rho/epsilon, mechanism and "
                "exhaustion cannot change during a run — start a new state instead"
            )
        source = _source(settings, follow)
        feed = _feed(settings)
        sink = _sink(settings.sink.kind, settings.sink.path, dedupe=True)
        reject_sink = _sink(settings.rejects.kind, settings.rejects_path(), dedupe=False)
    except (ConfigError, StoreError, OSError):
        store.close()
        raise
    w = settings.window
    daemon = Daemon(
        Engine(params, bits),
        store,
        source,
        feed,
        sink,
        reject_sink,
        allowed_lateness_s=w.allowed_lateness,
        idle_timeout_s=w.idle_timeout,
        poll_interval_s=w.poll_interval,
    )
    return Components(daemon, store, source, sink, reject_sink)
