"""Configuration: one TOML file, validated by pydantic-settings, ``STREAMFILTER_*`` env overrides.

Environment variables override the file, with ``__`` between section and key, e.g.
``STREAMFILTER_PRIVACY__RHO=0.25`` or ``STREAMFILTER_SINK__PATH=/data/releases.jsonl``. Relative
paths in the file are resolved against the file's directory. Errors name the key and the
problem (``ConfigError``).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from streamfilter.engine.params import PrivacyParams
from streamfilter.errors import ConfigError
from streamfilter.privacy.accounting import Mechanism, calibrate_rho, sigma_for_rho

__all__ = [
    "ConfigError",
    "Settings",
    "config_fingerprint",
    "load_config",
    "parse_duration",
    "plausibility_warnings",
]

log = logging.getLogger("streamfilter.config")


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
MAX_DURATION_S = 366 * 86400.0
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: str | float | int) -> float:
    """``"2h"``, ``"10m"``, ``"30s"``, ``"250ms"`` or a number of seconds → seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        raise ValueError("a duration is a string like '2h', '10m', '30s' or a number of seconds")
    if not 0 <= seconds <= MAX_DURATION_S:
        raise ValueError(
            f"a duration must be between 0 and {MAX_DURATION_S:.0f} seconds (366 days)"
        )
    return seconds


Seconds = Annotated[float, Field(ge=0)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PrivacySection(_Section):
    """The privacy-critical settings: ``b_norm`` and the level (``rho``, or ``epsilon`` with
    ``delta``) are required, never defaulted; numbers must be TOML numbers (a quoted ``"0.5"`` is
    refused in the file; environment overrides are text by nature and parsed). ``population``
    (optional) declares the number of users, for the plausibility warnings of
    :func:`plausibility_warnings` (δ above 1/n, an error bar wider than a tenth of n)."""

    b_norm: float = Field(gt=0, allow_inf_nan=False)
    rho: float | None = Field(None, gt=0, allow_inf_nan=False)
    epsilon: float | None = Field(None, gt=0, allow_inf_nan=False)
    delta: float | None = Field(None, gt=0, lt=1)
    granularity: float = Field(2.0**-10, gt=0, allow_inf_nan=False)
    exhaustion: Literal["skip", "retire", "clip"] = "skip"
    mechanism: Mechanism = "discrete_gaussian"
    population: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _rho_or_epsilon(self) -> PrivacySection:
        if self.rho is not None and self.epsilon is not None:
            raise ValueError("give either rho or epsilon (with delta), not both")
        if self.rho is None and (self.epsilon is None or self.delta is None):
            raise ValueError("give rho, or epsilon and delta")
        return self


class WindowSection(_Section):
    """``future_slack``: an event whose day begins more than this after now (UTC) is rejected as
    ``future`` (a clock ahead of ours, a typo such as 2099): it must not hold days open or pin
    the resume position, and ``--until-end`` never closes a day later than today."""

    allowed_lateness: Seconds = 7200.0
    idle_timeout: Seconds = 600.0
    poll_interval: Seconds = 0.5
    future_slack: Seconds = 86400.0

    @field_validator(
        "allowed_lateness", "idle_timeout", "poll_interval", "future_slack", mode="before"
    )
    @classmethod
    def _duration(cls, v: Any) -> float:
        return parse_duration(v)


class SyntheticSection(_Section):
    users: int = Field(100_000, ge=1, le=50_000_000)
    days: int = Field(60, ge=1, le=10_000)
    start_day: str = "2026-01-01"
    p_active: float = Field(0.1, gt=0, le=1)
    seed: int = 0


class _TopicKeys(_Section):
    topic: str | None = None
    partitions: int = Field(1, ge=1, le=10_000)
    replication_factor: int = Field(1, ge=1, le=32)


class SourceSection(_TopicKeys):
    """``on_retention_gap``: what to do when a partition's records after the stored position
    were deleted before they were read: ``fail`` (exit 4, naming the partition and the number
    of records) or ``skip`` (start at the partition's beginning; logged and counted)."""

    kind: Literal["file", "synthetic", "kafka"] = "file"
    path: Path | None = None
    on_retention_gap: Literal["fail", "skip"] = "fail"
    synthetic: SyntheticSection = SyntheticSection()

    @model_validator(mode="after")
    def _needs(self) -> SourceSection:
        if self.kind == "file" and self.path is None:
            raise ValueError("source.kind = 'file' needs source.path")
        if self.kind == "kafka" and not self.topic:
            raise ValueError("source.kind = 'kafka' needs source.topic")
        return self


class QueriesSection(_TopicKeys):
    """``min_affordable_days``: a query that a user contributing a full-norm vector every day can
    afford on fewer days than this is warned about at registration (engine.affordability)."""

    kind: Literal["file", "kafka", "policy", "none"] = "file"
    path: Path | None = None
    policy: str | None = Field(None, description="'module:function' for kind = 'policy'")
    min_affordable_days: int = Field(7, ge=0, le=100_000)

    @model_validator(mode="after")
    def _needs(self) -> QueriesSection:
        if self.kind == "file" and self.path is None:
            raise ValueError("queries.kind = 'file' needs queries.path")
        if self.kind == "kafka" and not self.topic:
            raise ValueError("queries.kind = 'kafka' needs queries.topic")
        if self.kind == "policy":
            spec = self.policy or (str(self.path) if self.path else None)
            if not spec or ":" not in spec:
                raise ValueError("queries.kind = 'policy' needs queries.policy = 'module:function'")
            self.policy = spec
        return self


class SinkSection(_TopicKeys):
    kind: Literal["file", "stdout", "kafka"] = "file"
    path: Path | None = None

    @model_validator(mode="after")
    def _needs(self) -> SinkSection:
        if self.kind == "file" and self.path is None:
            raise ValueError("sink.kind = 'file' needs sink.path")
        if self.kind == "kafka" and not self.topic:
            raise ValueError("sink.kind = 'kafka' needs sink.topic")
        return self


class RejectsSection(_TopicKeys):
    """``max_raw_bytes``: a reject record quotes at most this many bytes of the refused record,
    with its original length and SHA-256 when cut (a reject stays within the sink's limits)."""

    kind: Literal["file", "stdout", "kafka"] = "file"
    path: Path | None = None  # default: rejects.jsonl beside the releases
    max_raw_bytes: int = Field(4096, ge=0, le=131_072)

    @model_validator(mode="after")
    def _needs(self) -> RejectsSection:
        if self.kind == "kafka" and not self.topic:
            raise ValueError("rejects.kind = 'kafka' needs rejects.topic")
        return self


class LimitsSection(_Section):
    """What one input record may make the daemon hold; over a limit the record is rejected with
    a reason before anything is allocated for it (docs/design.md §3.4).

    ``max_event_bytes``: an event's size (``oversized``; at most the contract's 64 KiB).
    ``max_query_bytes``: a query's JSON size (``oversized``). ``max_query_memory_bytes``: a
    query's per-day matrices, estimated as ``expected_users × (coordinates + d) × 8`` bytes plus
    its weights (``query_too_large``). ``max_live_queries``: queries that still run
    (``too_many_queries``).
    """

    max_event_bytes: int = Field(65_536, ge=64, le=65_536)
    max_query_bytes: int = Field(1 << 20, ge=256, le=64 << 20)
    max_query_memory_bytes: int = Field(2 << 30, ge=1 << 20)
    expected_users: int = Field(100_000, ge=1, le=1_000_000_000)
    max_live_queries: int = Field(1000, ge=1, le=1_000_000)


class SpillSection(_Section):
    """The open day's repeated-event index (docs/design.md §2.2): past ``event_ids_in_memory``
    (user, event id) pairs it writes them, sorted, to files in a private directory (0700, files
    0600 with no name: nothing survives the process) under ``dir`` — the system's temporary
    directory when not set; a set ``dir`` must exist. Put it on a disk, not a RAM-backed
    ``tmpfs``."""

    dir: Path | None = None
    event_ids_in_memory: int = Field(1 << 20, ge=1, le=1 << 31)  # runtime.event_ids default

    @model_validator(mode="after")
    def _dir_exists(self) -> SpillSection:
        if self.dir is not None and not self.dir.is_dir():
            raise ValueError(f"spill.dir: no such directory: {self.dir}")
        return self


class ModeSection(_Section):
    """``central``: the daemon reads raw events and keeps each user's filter. ``local``: each
    device runs its own filter (``streamfilter.client``) and the daemon reads contributions."""

    kind: Literal["central", "local"] = "central"


#: ``[local] path`` when not given: this file beside ``[state] path``
LOCAL_DEFAULT_FILE = "contributions.jsonl"


class LocalSection(_TopicKeys):
    """Local mode: the variant and where the devices' contributions arrive (a file or a topic).

    ``central_noise``: devices send exact admitted vectors, the server adds the ``[privacy]``
    noise once. ``local_noise``: each device adds ``N_Z(0, sigma_local²)`` per coordinate (data
    units) and the server only sums. ``path`` (``kind = "file"``) defaults to
    ``contributions.jsonl`` beside ``[state] path``.
    """

    variant: Literal["central_noise", "local_noise"] = "central_noise"
    sigma_local: float | None = Field(None, gt=0, allow_inf_nan=False)
    #: or calibrate sigma_local from a per-device target against the server: device_rho, or
    #: device_epsilon with device_delta (``Settings._local_mode``)
    device_rho: float | None = Field(None, gt=0, allow_inf_nan=False)
    device_epsilon: float | None = Field(None, gt=0, allow_inf_nan=False)
    device_delta: float | None = Field(None, gt=0, lt=1)
    kind: Literal["file", "kafka"] = "file"
    path: Path | None = None

    @model_validator(mode="after")
    def _needs(self) -> LocalSection:
        targets = [self.sigma_local, self.device_rho, self.device_epsilon]
        if sum(t is not None for t in targets) > 1:
            raise ValueError("give one of local.sigma_local, device_rho, device_epsilon")
        if (self.device_epsilon is None) != (self.device_delta is None):
            raise ValueError("local.device_epsilon and local.device_delta go together")
        if self.variant == "local_noise" and all(t is None for t in targets):
            raise ValueError(
                "local.variant = 'local_noise' needs local.sigma_local (or a per-device target: "
                "device_rho, or device_epsilon with device_delta)"
            )
        if self.kind == "kafka" and not self.topic:
            raise ValueError("local.kind = 'kafka' needs local.topic")
        return self


#: kafka-python refuses a delivery timeout below the request timeout plus the linger that
#: ``KafkaSink`` sets (30 s + 5 ms)
DELIVERY_TIMEOUT_MIN_S = 31.0


class KafkaSection(_Section):
    """Client settings; security keys are passed through to kafka-python unchanged.

    ``sasl_mechanism``: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (username + password). OAUTHBEARER
    and GSSAPI are not supported (they need a token provider or a Kerberos setup that these
    settings do not describe). A SASL protocol needs a mechanism and a username and password;
    the ``ssl_*`` files must exist (docs/kafka.md, "Security settings").

    ``delivery_timeout``: how long a publication (releases, rejects) may wait for the broker's
    acknowledgement before it fails and is retried from the store (docs/kafka.md, the `[kafka]` table);
    more than the client's 30 s request timeout, as kafka-python requires."""

    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: str = "streamfilter"
    group_id: str = "streamfilter"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: SecretStr | None = None
    delivery_timeout: float = Field(300.0, ge=DELIVERY_TIMEOUT_MIN_S)

    @field_validator("delivery_timeout", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        return parse_duration(v)

    @model_validator(mode="after")
    def _security_complete(self) -> KafkaSection:
        if self.security_protocol.startswith("SASL_"):
            for key in ("sasl_mechanism", "sasl_plain_username", "sasl_plain_password"):
                if getattr(self, key) is None:
                    raise ValueError(
                        f"kafka.security_protocol = {self.security_protocol!r} needs kafka.{key}"
                    )
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, key)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"kafka.{key}: no such file: {path}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("kafka.ssl_certfile and kafka.ssl_keyfile go together")
        return self

    def client_config(self) -> dict[str, Any]:
        """kafka-python keyword arguments (secrets unmasked only here)."""
        cfg: dict[str, Any] = {
            "bootstrap_servers": [s.strip() for s in self.bootstrap_servers.split(",")],
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
        }
        for key in (
            "sasl_mechanism",
            "sasl_plain_username",
            "ssl_cafile",
            "ssl_certfile",
            "ssl_keyfile",
        ):
            value = getattr(self, key)
            if value is not None:
                cfg[key] = value
        for key in ("sasl_plain_password", "ssl_password"):
            secret = getattr(self, key)
            if secret is not None:
                cfg[key] = secret.get_secret_value()
        return cfg


class StateSection(_Section):
    """Where the state lives: ``kind = "sqlite"`` (the default: ``path``) or ``"postgres"``
    (``url`` without a password, ``pg_schema``, and the password from ``password_env`` or
    ``password_file``; runtime/store/postgres.py).

    ``budget_log_max_rows`` (SQLite): each closed day appends its budget changes to a log; the
    entries by which the log exceeds this *and* the per-user table are folded into the table,
    oldest first, between input batches (larger: a longer log, fewer folds; 0: the log never
    stays larger than the table for long)."""

    kind: Literal["sqlite", "postgres"] = "sqlite"
    path: Path = Path("state.db")
    budget_log_max_rows: int = Field(1_000_000, ge=0)
    url: str | None = Field(None, description="postgresql://user@host:port/database (no password)")
    pg_schema: str = Field("streamfilter", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    password_env: str | None = None
    password_file: Path | None = None

    @model_validator(mode="after")
    def _postgres(self) -> StateSection:
        if self.kind == "postgres":
            if not self.url:
                raise ValueError("state.kind = 'postgres' needs state.url")
            if not self.url.startswith(("postgresql://", "postgres://")):
                raise ValueError("state.url must be a postgresql:// URL")
            if re.match(r"^postgres(ql)?://[^/@]*:[^/@]*@", self.url):
                raise ValueError(
                    "state.url must not contain a password: use state.password_env or "
                    "state.password_file"
                )
        return self

    def describe(self) -> str:
        """The state's name in messages (never the password)."""
        return f"postgres schema {self.pg_schema}" if self.kind == "postgres" else str(self.path)

    def require_sqlite(self, command: str) -> Path:
        """The SQLite path, for commands that read the state file directly."""
        if self.kind != "sqlite":
            raise ConfigError(
                f"{command} reads a SQLite state; with state.kind = '{self.kind}' it is not "
                "available yet (query the database with a read-only role instead)"
            )
        return self.path

    def postgres_password(self) -> str | None:
        """The password for ``kind = "postgres"``, from the environment or a file (never logged)."""
        if self.password_env is not None:
            value = os.environ.get(self.password_env)
            if value is None:
                raise ConfigError(
                    f"state.password_env: the environment variable {self.password_env} is not set"
                )
            return value
        if self.password_file is not None:
            try:
                return self.password_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"state.password_file: cannot read {self.password_file}: {exc.strerror}"
                ) from None
        return None


class ClusterSection(_Section):
    """Cluster mode (docs/design.md §7): ``enabled = true`` makes every ``streamfilter run``
    with this configuration one worker of a cluster. It needs ``[source] kind = "kafka"`` (the
    consumer group ``[kafka] group_id`` assigns the partitions), ``[state] kind = "postgres"``
    (the shared ledger) and central mode. ``session_timeout`` and ``heartbeat_interval`` are the
    group's (a worker silent for ``session_timeout`` loses its partitions);
    ``max_poll_interval`` bounds the time between two polls (a worker stuck longer leaves the
    group). ``releaser_lease``: how long the releaser's lease lasts without renewal (it is
    renewed at every turn of its loop); a releaser silent for longer is replaced."""

    #: strict: a TOML boolean only (a switch this consequential is never coerced from text)
    enabled: StrictBool = False
    session_timeout: Seconds = 10.0
    heartbeat_interval: Seconds = 3.0
    max_poll_interval: Seconds = 300.0
    releaser_lease: Seconds = Field(30.0, gt=0)

    @field_validator(
        "session_timeout",
        "heartbeat_interval",
        "max_poll_interval",
        "releaser_lease",
        mode="before",
    )
    @classmethod
    def _duration(cls, v: Any) -> float:
        return parse_duration(v)

    @model_validator(mode="after")
    def _heartbeat_below_session(self) -> ClusterSection:
        if self.heartbeat_interval >= self.session_timeout:
            raise ValueError("cluster.heartbeat_interval must be below cluster.session_timeout")
        return self


class MetricsSection(_Section):
    """``/metrics``, ``/healthz`` and ``/readyz`` are served by default (``enabled = false`` opts
    out). When the port is taken and ``enabled`` was not set explicitly, ``run`` warns and goes on
    without them; an explicit ``enabled = true`` makes it a configuration error (exit 2)."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(9464, ge=0, le=65535)
    trusted_operator_metrics: bool = False


class TestingSection(_Section):
    """Reproducible noise for tests only; ``run`` refuses it without ``--testing``."""

    noise_seed: int | None = None


class ReportSection(_Section):
    """``streamfilter report``: days whose coverage fraction (the share of the users counted so
    far who can still afford a full contribution, docs/design.md §2.11) is below
    ``low_coverage_fraction`` are marked on each series."""

    low_coverage_fraction: float = Field(0.5, ge=0, le=1, allow_inf_nan=False)


class TelemetrySection(_Section):
    """A separate zCDP budget for statistics about the run itself (docs/odometer.md).

    ``rho`` is the total over the state's life (default: ``rho_fraction`` — 10% — of the query
    budget ``[privacy] rho``, so the headline total is at most 1.1× the configured level); each
    ``budget-stats`` call costs ``stats_rho`` (default a fifth of ``rho``); the opt-in active-set
    estimate (``active_set = true``) costs ``active_set_rho`` (default two fifths of ``rho``) once
    for ``active_set_horizon`` days; a user whose remaining budget falls below
    ``active_min_remaining`` (data units²) counts as having left the active set. Coverage with
    every release (``coverage``, on by default in central mode, not available in local mode)
    costs ``coverage_rho`` (default two fifths of ``rho``) once for the whole, unbounded run; it
    tracks ``coverage_levels`` thresholds ``b_norm/2^k`` with epochs of ``coverage_epoch_days``,
    doubling (docs/design.md §2.11). ``population`` (opt-in, central single-process mode) makes
    every release carry its population estimate; it costs no ρ — each departing vector is paid
    inside its user's own filter — and its counters start with epochs of
    ``population_epoch_days`` (docs/design.md §2.12). Defaults are resolved by
    :func:`load_config` (:func:`_resolve_telemetry`).
    """

    rho_fraction: float = Field(0.1, gt=0, le=1, allow_inf_nan=False)
    rho: float = Field(0.05, gt=0, allow_inf_nan=False)
    stats_rho: float = Field(0.01, gt=0, allow_inf_nan=False)
    active_set: bool = False
    active_set_rho: float = Field(0.02, gt=0, allow_inf_nan=False)
    active_set_horizon: int = Field(1024, ge=1, le=1 << 20)
    active_min_remaining: float = Field(1.0, gt=0, allow_inf_nan=False)
    #: None: on in central mode, off in local mode (resolved by ``Settings``)
    coverage: bool | None = None
    coverage_rho: float = Field(0.02, gt=0, allow_inf_nan=False)
    coverage_levels: int = Field(8, ge=1, le=16)
    coverage_epoch_days: int = Field(128, ge=1, le=1 << 20)
    population: bool = False
    population_epoch_days: int = Field(32, ge=1, le=1 << 20)

    @field_validator("coverage_epoch_days", "population_epoch_days")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"must be a power of two, got {value}")
        return value

    @model_validator(mode="after")
    def _within_total(self) -> TelemetrySection:
        for key in ("stats_rho", "active_set_rho", "coverage_rho"):
            if getattr(self, key) > self.rho:
                raise ValueError(f"telemetry.{key} must be <= telemetry.rho")
        return self


class Settings(BaseSettings):
    """The whole configuration (docs/design.md §3 "Config")."""

    model_config = SettingsConfigDict(
        env_prefix="STREAMFILTER_", env_nested_delimiter="__", extra="forbid"
    )

    privacy: PrivacySection
    window: WindowSection = WindowSection()
    source: SourceSection = SourceSection(kind="synthetic")
    #: None: no [queries] section. ``run`` refuses that (a run without queries closes days that
    #: can never be answered later): running without queries needs an explicit kind = "none"
    queries: QueriesSection | None = None
    sink: SinkSection = SinkSection(kind="stdout")
    rejects: RejectsSection = RejectsSection()
    state: StateSection = StateSection()
    kafka: KafkaSection = KafkaSection()
    metrics: MetricsSection = MetricsSection()
    testing: TestingSection = TestingSection()
    telemetry: TelemetrySection = TelemetrySection()
    report: ReportSection = ReportSection()
    limits: LimitsSection = LimitsSection()
    spill: SpillSection = SpillSection()
    mode: ModeSection = ModeSection()
    local: LocalSection = LocalSection()
    cluster: ClusterSection = ClusterSection()

    @model_validator(mode="after")
    def _cluster_mode(self) -> Settings:
        if not self.cluster.enabled:
            return self
        needs = {
            "source.kind = 'kafka'": self.source.kind == "kafka",
            "state.kind = 'postgres'": self.state.kind == "postgres",
            "mode.kind = 'central'": self.mode.kind == "central",
            "telemetry.active_set = false": not self.telemetry.active_set,
        }
        missing = [k for k, ok in needs.items() if not ok]
        if missing:
            raise ValueError(f"cluster.enabled = true needs {', '.join(missing)}")
        return self

    @model_validator(mode="after")
    def _local_mode(self) -> Settings:
        if self.mode.kind == "local":
            self._calibrate_sigma_local()
            if self.local.kind == "file" and self.local.path is None:
                # the devices' wire defaults beside the state (like rejects beside the releases)
                self.local.path = self.state.path.parent / LOCAL_DEFAULT_FILE
            if self.telemetry.active_set:
                raise ValueError(
                    "telemetry.active_set needs per-user state; it is not available in local mode"
                )
            if self.telemetry.coverage:
                raise ValueError(
                    "telemetry.coverage needs per-user state; it is not available in local mode "
                    "(docs/local-mode.md)"
                )
            if self.telemetry.population:
                raise ValueError(
                    "telemetry.population needs per-user state; it is not available in local mode"
                )
            self.telemetry.coverage = False
        elif self.telemetry.coverage is None:
            self.telemetry.coverage = True
        return self

    def _calibrate_sigma_local(self) -> None:
        """``sigma_local`` from a per-device target: each device's messages are
        ``B/(2·s_l²)``-zCDP against the server (Theorem 4.5 with the device's own noise), so
        ``σ_local = sqrt(B_norm/(2ρ_device))`` (Corollary 4.7's form); from (ε, δ) the largest ρ
        the CKS conversion allows (``calibrate_rho``). The lattice rounds ``s_l²`` up, so the
        device's actual ρ is at most the target."""
        loc = self.local
        rho = loc.device_rho
        if loc.device_epsilon is not None and loc.device_delta is not None:
            rho, _ = calibrate_rho(loc.device_epsilon, loc.device_delta, "discrete_gaussian")
        if rho is not None and loc.sigma_local is None:
            loc.sigma_local = sigma_for_rho(self.privacy.b_norm, rho)

    def sigma2_local_units(self) -> int | None:
        """``ceil(sigma_local²/γ²)`` for ``local_noise`` (None otherwise)."""
        if self.mode.kind != "local" or self.local.variant != "local_noise":
            return None
        assert self.local.sigma_local is not None
        try:
            return self.privacy_params().lattice.sigma2_units(self.local.sigma_local)
        except ValueError as exc:
            raise ConfigError(f"local.sigma_local: {exc}") from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # environment overrides the file (the file arrives as init kwargs)
        return (env_settings, init_settings)

    def privacy_params(self) -> PrivacyParams:
        p = self.privacy
        try:
            return PrivacyParams.create(
                b_norm=p.b_norm,
                rho=p.rho,
                epsilon=p.epsilon,
                delta=p.delta,
                granularity=p.granularity,
                exhaustion=p.exhaustion,
                mechanism=p.mechanism,
            )
        except (ValueError, ArithmeticError) as exc:
            raise ConfigError(f"[privacy]: {_without_values(str(exc))}") from None

    def kafka_topics(self) -> list[tuple[str, _TopicKeys]]:
        """(config key, section) of every section that names a Kafka topic."""
        out: list[tuple[str, _TopicKeys]] = []
        for key in ("source", "queries", "sink", "rejects", "local"):
            section = getattr(self, key)
            if (key == "local" and self.mode.kind != "local") or section is None:
                continue
            if section.kind == "kafka":
                out.append((f"{key}.topic", section))
        return out

    def rejects_path(self) -> Path:
        if self.rejects.path is not None:
            return self.rejects.path
        base = self.sink.path.parent if self.sink.path is not None else self.state.path.parent
        return base / "rejects.jsonl"


#: shares of the telemetry budget its uses get when not configured (the rest stays unspent)
TELEMETRY_STATS_FIFTHS = 1  # stats_rho = rho / 5
TELEMETRY_ACTIVE_SET_FIFTHS = 2  # active_set_rho = 2 rho / 5
TELEMETRY_COVERAGE_FIFTHS = 2  # coverage_rho = 2 rho / 5


def _resolve_telemetry(settings: Settings, params: PrivacyParams) -> None:
    """Fill the telemetry amounts the configuration left out: ``rho`` = ``rho_fraction`` × the
    query ρ, then ``stats_rho`` and ``active_set_rho`` as shares of it. The guarantee is
    ``ρ + telemetry.rho`` for whatever value this gives (the telemetry ledger refuses every charge
    beyond it), so plain float arithmetic is sound here."""
    t = settings.telemetry
    given = t.model_fields_set
    values = t.model_dump()
    rho = t.rho if "rho" in given else t.rho_fraction * params.rho
    values["rho"] = rho
    if "stats_rho" not in given:
        values["stats_rho"] = rho * TELEMETRY_STATS_FIFTHS / 5
    if "active_set_rho" not in given:
        values["active_set_rho"] = rho * TELEMETRY_ACTIVE_SET_FIFTHS / 5
    if "coverage_rho" not in given:
        values["coverage_rho"] = rho * TELEMETRY_COVERAGE_FIFTHS / 5
    try:
        settings.telemetry = TelemetrySection(**values)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, ("telemetry",))) from None


def plausibility_warnings(settings: Settings, params: PrivacyParams) -> list[str]:
    """Settings that are valid but almost certainly not meant (logged as warnings at load):
    noise so large the answers are useless (σ ≥ ``IMPLAUSIBLE_SIGMA`` data units, or a 95%
    half-width above a tenth of the declared population), and δ above 1/n for a declared
    population n (such a δ allows releasing a random user's data outright)."""
    out = []
    n = settings.privacy.population
    half = params.ci95_halfwidth
    if params.sigma_released >= IMPLAUSIBLE_SIGMA or (n is not None and half > n / 10):
        scale = f"the declared population {n:,}" if n is not None else "most populations"
        out.append(
            f"[privacy]: σ = {params.sigma_released:.4g} per coordinate (95% ± {half:.4g}) is "
            f"too large for answers about {scale} to be useful; check b_norm (σ = "
            "sqrt(b_norm / (2ρ)))"
        )
    if n is not None and settings.privacy.delta is not None and settings.privacy.delta > 1 / n:
        out.append(
            f"[privacy]: delta is above 1/population (1/{n:,}); a δ that large permits "
            "publishing some user's data outright — choose δ well below 1/n"
        )
    return out


#: noise per coordinate (data units) above which the answers are taken as useless
IMPLAUSIBLE_SIGMA = 1000.0


def _check_types(data: dict[str, Any]) -> None:
    """The privacy section is strictly typed in the file: a number given as text (``rho =
    "0.5"``) or a boolean is refused, naming the key (pydantic would coerce them)."""
    sec = data.get("privacy")
    if not isinstance(sec, dict):
        return
    numeric = ("b_norm", "rho", "epsilon", "delta", "granularity", "population")
    for key in numeric:
        value = sec.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(
                f"invalid configuration:\n  privacy.{key}: must be a number, not "
                f'{type(value).__name__} (write {key} = 0.5, not {key} = "0.5")'
            )


def _suggest(word: str, choices: list[str]) -> str:
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _fields_at(loc: tuple[str | int, ...]) -> list[str]:
    """The keys the model accepts at ``loc`` (for "did you mean")."""
    model: Any = Settings
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
        args = [a for a in getattr(model, "__args__", ()) if hasattr(a, "model_fields")]
        if args:
            model = args[0]
    return list(getattr(model, "model_fields", {}))


def _without_values(message: str) -> str:
    """The Python API's messages quote the offending number (``..., got granularity=0.3``,
    ``b_norm=1e-08 is below ...``); a configuration error names the key and the rule only —
    values are never echoed into logs (docs/design.md §6 item 10)."""
    text = re.sub(r",?\s*got\s+\w+\s*=\s*\S+?(?=[;,]|$)", "", message)
    return re.sub(r"([\w/²]+)\s*=\s*[^\s,;:]+", r"\1", text)


def _resolve_paths(data: dict[str, Any], base: Path) -> None:
    for section in ("source", "queries", "sink", "rejects", "state", "local", "spill"):
        sec = data.get(section)
        key = "dir" if section == "spill" else "path"
        if isinstance(sec, dict) and isinstance(sec.get(key), str):
            p = Path(sec[key])
            if section == "queries" and sec.get("kind") == "policy":
                continue
            sec[key] = str(p if p.is_absolute() else base / p)


def _format_errors(exc: ValidationError, prefix: tuple[str, ...] = ()) -> str:
    lines = []
    for err in exc.errors():
        loc = (*prefix, *err["loc"])
        key = ".".join(str(p) for p in loc) or "config"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key" + _suggest(str(loc[-1]), _fields_at(loc[:-1]))
        elif err["type"] == "missing" and loc[:1] == ("privacy",):
            msg = "required: the privacy settings are never defaulted"
        lines.append(f"{key}: {msg}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_config(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Read and validate a TOML config (``None``: defaults + env only)."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path} is not UTF-8 text") from None
        except RecursionError:
            raise ConfigError(f"config file {path} is nested too deeply") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        _resolve_paths(data, path.resolve().parent)
    for key, value in overrides.items():
        data.setdefault(key, {}).update(value)
    unknown = sorted(k for k in data if k not in Settings.model_fields)
    if unknown:
        # refuse, e.g., pydantic-settings loader options such as `_env_prefix` used as keys
        hints = "".join(_suggest(k, list(Settings.model_fields)) for k in unknown)
        raise ConfigError(
            f"invalid configuration:\n  unknown section(s): {', '.join(unknown)}{hints}"
        )
    _check_types(data)
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc)) from None
    params = settings.privacy_params()  # derived checks (lattice, overflow) name [privacy]
    settings.sigma2_local_units()  # and [local]
    _resolve_telemetry(settings, params)
    for warning in plausibility_warnings(settings, params):
        log.warning("%s", warning)
    return settings


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
