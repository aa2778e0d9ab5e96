"""Configuration: one TOML file, validated by pydantic-settings, ``STREAMFILTER_*`` env overrides.

Environment variables override the file, with ``__`` between section and key, e.g.
``STREAMFILTER_PRIVACY__RHO=0.25`` or ``STREAMFILTER_SINK__PATH=/data/releases.jsonl``. Relative
paths in the file are resolved against the file's directory. Errors name the key and the
problem (``ConfigError``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from streamfilter.engine.params import PrivacyParams
from streamfilter.errors import ConfigError

__all__ = ["ConfigError", "Settings", "load_config", "parse_duration"]


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
    b_norm: float = Field(4.0, gt=0, allow_inf_nan=False)
    rho: float | None = Field(None, gt=0, allow_inf_nan=False)
    epsilon: float | None = Field(None, gt=0, allow_inf_nan=False)
    delta: float | None = Field(None, gt=0, lt=1)
    granularity: float = Field(2.0**-10, gt=0, allow_inf_nan=False)
    exhaustion: Literal["skip", "retire", "clip"] = "skip"
    mechanism: Literal["discrete_gaussian", "gaussian"] = "discrete_gaussian"

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
    kind: Literal["file", "kafka", "policy", "none"] = "file"
    path: Path | None = None
    policy: str | None = Field(None, description="'module:function' for kind = 'policy'")

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


class ModeSection(_Section):
    """``central``: the daemon reads raw events and keeps each user's filter. ``local``: each
    device runs its own filter (``streamfilter.client``) and the daemon reads contributions."""

    kind: Literal["central", "local"] = "central"


class LocalSection(_TopicKeys):
    """Local mode: the variant and where the devices' contributions arrive (a file or a topic).

    ``central_noise``: devices send exact admitted vectors, the server adds the ``[privacy]``
    noise once. ``local_noise``: each device adds ``N_Z(0, sigma_local²)`` per coordinate (data
    units) and the server only sums.
    """

    variant: Literal["central_noise", "local_noise"] = "central_noise"
    sigma_local: float | None = Field(None, gt=0, allow_inf_nan=False)
    kind: Literal["file", "kafka"] = "file"
    path: Path | None = None

    @model_validator(mode="after")
    def _needs(self) -> LocalSection:
        if self.variant == "local_noise" and self.sigma_local is None:
            raise ValueError("local.variant = 'local_noise' needs local.sigma_local")
        if self.kind == "kafka" and not self.topic:
            raise ValueError("local.kind = 'kafka' needs local.topic")
        return self


class KafkaSection(_Section):
    """Client settings; security keys are passed through to kafka-python unchanged."""

    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: str = "streamfilter"
    group_id: str = "streamfilter"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: SecretStr | None = None

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
    """``budget_log_max_rows``: each closed day appends its budget changes to a log, folded into
    the per-user table once the log holds more rows than this *and* than the table (larger:
    fewer, larger folds; 0: fold whenever the log outgrows the table)."""

    path: Path = Path("state.db")
    budget_log_max_rows: int = Field(1_000_000, ge=0)


class MetricsSection(_Section):
    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(9464, ge=0, le=65535)
    trusted_operator_metrics: bool = False


class TestingSection(_Section):
    """Reproducible noise for tests only; ``run`` refuses it without ``--testing``."""

    noise_seed: int | None = None


class TelemetrySection(_Section):
    """A separate zCDP budget for statistics about the run itself (docs/odometer.md).

    ``rho`` is the total over the state's life; each ``budget-stats`` call costs ``stats_rho``;
    the opt-in active-set estimate (``active_set = true``) costs ``active_set_rho`` once for
    ``active_set_horizon`` days; a user whose remaining budget falls below
    ``active_min_remaining`` (data units²) counts as having left the active set.
    """

    rho: float = Field(0.05, gt=0, allow_inf_nan=False)
    stats_rho: float = Field(0.01, gt=0, allow_inf_nan=False)
    active_set: bool = False
    active_set_rho: float = Field(0.02, gt=0, allow_inf_nan=False)
    active_set_horizon: int = Field(1024, ge=1, le=1 << 20)
    active_min_remaining: float = Field(1.0, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _within_total(self) -> TelemetrySection:
        for key in ("stats_rho", "active_set_rho"):
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
    queries: QueriesSection = QueriesSection(kind="none")
    sink: SinkSection = SinkSection(kind="stdout")
    rejects: RejectsSection = RejectsSection()
    state: StateSection = StateSection()
    kafka: KafkaSection = KafkaSection()
    metrics: MetricsSection = MetricsSection()
    testing: TestingSection = TestingSection()
    telemetry: TelemetrySection = TelemetrySection()
    limits: LimitsSection = LimitsSection()
    mode: ModeSection = ModeSection()
    local: LocalSection = LocalSection()

    @model_validator(mode="after")
    def _local_mode(self) -> Settings:
        if self.mode.kind == "local":
            if self.local.kind == "file" and self.local.path is None:
                raise ValueError("mode.kind = 'local' needs local.path (or local.kind = 'kafka')")
            if self.telemetry.active_set:
                raise ValueError(
                    "telemetry.active_set needs per-user state; it is not available in local mode"
                )
        return self

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
            if key == "local" and self.mode.kind != "local":
                continue
            if section.kind == "kafka":
                out.append((f"{key}.topic", section))
        return out

    def rejects_path(self) -> Path:
        if self.rejects.path is not None:
            return self.rejects.path
        base = self.sink.path.parent if self.sink.path is not None else self.state.path.parent
        return base / "rejects.jsonl"


def _without_values(message: str) -> str:
    """The Python API's messages quote the offending number (``..., got granularity=0.3``,
    ``b_norm=1e-08 is below ...``); a configuration error names the key and the rule only —
    values are never echoed into logs (docs/design.md §6 item 10)."""
    text = re.sub(r",?\s*got\s+\w+\s*=\s*\S+?(?=[;,]|$)", "", message)
    return re.sub(r"([\w/²]+)\s*=\s*[^\s,;:]+", r"\1", text)


def _resolve_paths(data: dict[str, Any], base: Path) -> None:
    for section in ("source", "queries", "sink", "rejects", "state", "local"):
        sec = data.get(section)
        if isinstance(sec, dict) and isinstance(sec.get("path"), str):
            p = Path(sec["path"])
            if section == "queries" and sec.get("kind") == "policy":
                continue
            sec["path"] = str(p if p.is_absolute() else base / p)


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "config"
        lines.append(f"{key}: {err['msg']}")
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
        raise ConfigError(f"invalid configuration:\n  unknown section(s): {', '.join(unknown)}")
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc)) from None
    settings.privacy_params()  # derived checks (lattice, overflow) name [privacy]
    settings.sigma2_local_units()  # and [local]
    return settings
