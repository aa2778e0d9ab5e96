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
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from streamfilter.engine.params import PrivacyParams
from streamfilter.errors import ConfigError
from streamfilter.privacy.accounting import calibrate_rho, sigma_for_rho
from streamfilter.privacy.quotas import ANALYST_NAME_PATTERN, AnalystQuotas
from streamfilter.privacy.rounding import float_down

from .sections import (
    LOCAL_DEFAULT_FILE,
    AnalystSection,
    ClusterSection,
    KafkaSection,
    LimitsSection,
    LocalSection,
    MetricsSection,
    ModeSection,
    PrivacySection,
    QueriesSection,
    RejectsSection,
    ReportSection,
    SinkSection,
    SourceSection,
    SpillSection,
    StateSection,
    TelemetrySection,
    TestingSection,
    WindowSection,
    _TopicKeys,
    parse_duration,
)

__all__ = [
    "ConfigError",
    "Settings",
    "SpillSection",
    "StateSection",
    "config_fingerprint",
    "load_config",
    "parse_duration",
    "plausibility_warnings",
]

log = logging.getLogger("streamfilter.config")


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
    #: ``[analysts.<name>] share``: per-analyst quotas (docs/design.md §2.13); empty: none
    analysts: dict[Annotated[str, Field(pattern=ANALYST_NAME_PATTERN)], AnalystSection] = {}

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

    @model_validator(mode="after")
    def _population_where_it_applies(self) -> Settings:
        """``[telemetry] population`` unset: on in central single-process mode with the
        discrete Gaussian and the ``skip`` policy and no analysts, off elsewhere; ``true`` where it cannot run
        is refused (docs/design.md §2.12)."""
        cannot = [
            name
            for name, applies in (
                ("cluster.enabled = true", self.cluster.enabled),
                ("privacy.mechanism = 'gaussian'", self.privacy.mechanism != "discrete_gaussian"),
            )
            if applies
        ]
        if self.telemetry.population is None:
            # analysts' quotas are not built into the departure rule (refused when set: load_config)
            default = not cannot and self.privacy.exhaustion == "skip" and not self.analysts
            self.telemetry.population = default and self.mode.kind == "central"
        elif self.telemetry.population and cannot:
            raise ValueError(f"telemetry.population is not available with {', '.join(cannot)}")
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

    def analyst_quotas(self, params: PrivacyParams | None = None) -> AnalystQuotas:
        """The analysts' per-user sub-budgets (``privacy.quotas``); ``ConfigError`` if the
        shares oversubscribe the budget."""
        budget_units = (params or self.privacy_params()).budget_units
        shares = {name: section.share for name, section in self.analysts.items()}
        try:
            return AnalystQuotas.from_shares(shares, budget_units)
        except ValueError as exc:
            raise ConfigError(f"[analysts]: {exc}") from None

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
    beyond it), so plain float arithmetic is sound for ``rho``; the shares are rounded down so
    that as many charges as they promise fit in it."""
    t = settings.telemetry
    given = t.model_fields_set
    values = t.model_dump()
    rho = t.rho if "rho" in given else t.rho_fraction * params.rho
    values["rho"] = rho
    # each share rounded down: k shares of rho/k then fit in rho exactly (rho * 1 / 5 in float
    # arithmetic can exceed a fifth by an ulp, and the fifth budget-stats call was refused)
    if "stats_rho" not in given:
        values["stats_rho"] = float_down(Fraction(rho) * TELEMETRY_STATS_FIFTHS / 5)
    if "active_set_rho" not in given:
        values["active_set_rho"] = float_down(Fraction(rho) * TELEMETRY_ACTIVE_SET_FIFTHS / 5)
    if "coverage_rho" not in given:
        values["coverage_rho"] = float_down(Fraction(rho) * TELEMETRY_COVERAGE_FIFTHS / 5)
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


#: the prefix of configuration overrides in the environment (``STREAMFILTER_SECTION__KEY``)
ENV_PREFIX = "STREAMFILTER_"


def _check_environment(environ: dict[str, str] | os._Environ[str]) -> None:
    """Refuse an override the settings would silently ignore, like an unknown key in the file:
    every ``STREAMFILTER_<SECTION>__<KEY>`` must name a section and one of its keys. (Variables
    without ``__`` are not overrides: ``STREAMFILTER_PG_PASSWORD`` is a password source.)"""
    sections = list(Settings.model_fields)
    lines = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or "__" not in upper:
            continue
        section, _, rest = upper[len(ENV_PREFIX) :].lower().partition("__")
        key = rest.split("__", 1)[0]
        if section not in sections:
            match = difflib.get_close_matches(section, sections, n=1, cutoff=0.6)
            hint = (
                f" (did you mean {ENV_PREFIX}{match[0].upper()}__{rest.upper()}?)" if match else ""
            )
            lines.append(f"{name}: unknown section {section!r}{hint}")
            continue
        keys = _fields_at((section,))
        if key not in keys:
            match = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
            hint = (
                f" (did you mean {ENV_PREFIX}{section.upper()}__{match[0].upper()}?)"
                if match
                else ""
            )
            lines.append(f"{name}: unknown key {section}.{key}{hint}")
    if lines:
        raise ConfigError("invalid environment override:\n  " + "\n  ".join(lines))


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
    _check_environment(os.environ)
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc)) from None
    params = settings.privacy_params()  # derived checks (lattice, overflow) name [privacy]
    settings.sigma2_local_units()  # and [local]
    _check_analysts(settings, params)
    _resolve_telemetry(settings, params)
    for warning in plausibility_warnings(settings, params):
        log.warning("%s", warning)
    return settings


def _check_analysts(settings: Settings, params: PrivacyParams) -> None:
    """Quotas that oversubscribe the budget, and the modes that do not run analysts yet, are
    refused with one line each."""
    if not settings.analysts:
        return
    if settings.cluster.enabled:
        raise ConfigError(
            "[analysts]: analysts are not supported in cluster mode yet; remove [analysts] or "
            "run a single process"
        )
    if settings.telemetry.population:
        raise ConfigError(
            "[analysts]: the population estimate does not support analysts yet; set "
            "[telemetry] population = false"
        )
    if settings.state.kind != "sqlite":
        raise ConfigError(
            "[analysts]: analysts need a SQLite state for now (the PostgreSQL store does not "
            "yet mark a state holding analysts' entries against older versions)"
        )
    settings.analyst_quotas(params)


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
