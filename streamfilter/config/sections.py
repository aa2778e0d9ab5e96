"""The configuration's sections: one pydantic model per TOML table (``[privacy]``, ``[source]``,
...), each refusing unknown keys, and the duration syntax they share (``parse_duration``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictBool,
    field_validator,
    model_validator,
)

from streamfilter.errors import ConfigError
from streamfilter.privacy.accounting import Mechanism

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


class AnalystSection(_Section):
    """``[analysts.<name>]``: an analyst's quota, ``share`` of every user's budget (a TOML
    number in (0, 1]; the shares sum to at most 1; docs/design.md §2.13). Queries name their
    analyst (``"analyst": "<name>"``); those that name none belong to the analyst ``default``,
    whose share is the rest unless ``[analysts.default]`` sets it."""

    model_config = ConfigDict(extra="forbid", strict=True)
    share: float = Field(gt=0, le=1, allow_inf_nan=False)


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


def url_has_password(url: str) -> bool:
    """Whether a ``postgresql://`` URL carries a password: in its user-info (``user:pw@``, even
    an empty one) or as a ``password`` parameter of its query string (libpq reads both)."""
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        return True
    return any(k.strip().lower() == "password" for k, _ in parse_qsl(parts.query, True))


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
            if url_has_password(self.url):
                raise ValueError(
                    "state.url must not contain a password (neither user:password@ nor "
                    "?password=): use state.password_env or state.password_file"
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
    renewed at every turn of its loop); a releaser silent for longer is replaced.
    ``assignment_settle``: a worker reads nothing of a new assignment until it has held this
    long (another rebalance starts the wait again), so workers that start together read each
    record once, not once per rebalance (0: read at once)."""

    #: strict: a TOML boolean only (a switch this consequential is never coerced from text)
    enabled: StrictBool = False
    session_timeout: Seconds = 10.0
    heartbeat_interval: Seconds = 3.0
    max_poll_interval: Seconds = 300.0
    releaser_lease: Seconds = Field(30.0, gt=0)
    assignment_settle: Seconds = Field(5.0, ge=0)

    @field_validator(
        "session_timeout",
        "heartbeat_interval",
        "max_poll_interval",
        "releaser_lease",
        "assignment_settle",
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
    doubling (docs/design.md §2.11). ``population`` (on by default in central single-process
    mode with the discrete Gaussian and ``skip``) makes every release carry its population
    estimate; it costs no ρ — each departing vector is paid
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
    #: None: on where it applies (central single-process, discrete Gaussian, skip), else off
    population: bool | None = None
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
