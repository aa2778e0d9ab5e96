"""The public data contract: events, queries and releases (docs/design.md §3).

Events are validated by ``parse_event``, the reference: it defines every accept and every reject
(a *reason*, never a quoted value). The daemon's hot path validates whole batches with
``engine.ingest`` (the native scanner, ``engine/_jsonl.c``, on the plain form; every other line
goes to ``parse_event``), which returns exactly what ``parse_event`` returns or raises.
Queries are rare and validated with pydantic (``parse_query``).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from streamfilter.privacy.quotas import ANALYST_NAME_PATTERN

__all__ = [
    "MAX_ABS_VALUE",
    "MAX_EVENT_BYTES",
    "REJECT_REASON_MEANING",
    "Coverage",
    "Event",
    "FeatureKinds",
    "Population",
    "Query",
    "Reject",
    "RejectReason",
    "Release",
    "coordinate_kinds",
    "parse_event",
    "parse_query",
]

MAX_EVENT_BYTES = 65_536
MAX_ID_CHARS = 256
MAX_FEATURES_PER_EVENT = 256
MAX_FEATURE_CHARS = 128
MAX_STRING_VALUE_CHARS = 256
#: numbers beyond this magnitude are rejected as overflowing (sums of many stay finite in float64)
MAX_ABS_VALUE = 1e12
MAX_QUERY_DIM = 4096
_DAY_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
#: control characters (Unicode category Cc: C0, DEL and C1), refused in a user id
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")
_EVENT_KEYS = frozenset({"user_id", "day", "values", "event_id"})


class RejectReason(StrEnum):
    """Every reason a record can be refused for: the one closed list (reject records, the
    ``streamfilter_rejects_total{reason}`` label, and docs/design.md §3.4's table come from it).
    A value is a stable short code; :data:`REJECT_REASON_MEANING` says what each means."""

    # events (a line of a file or one Kafka message)
    MALFORMED_JSON = "malformed_json"
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_FIELD = "unknown_field"
    MISSING_FIELD = "missing_field"
    INVALID_USER_ID = "invalid_user_id"
    INVALID_DAY = "invalid_day"
    INVALID_VALUES = "invalid_values"
    INVALID_NUMBER = "invalid_number"
    WRONG_TYPE = "wrong_type"
    INVALID_EVENT_ID = "invalid_event_id"
    OVERSIZED = "oversized"
    UNDECODABLE_BATCH = "undecodable_batch"
    LATE = "late"
    FUTURE = "future"
    WRONG_DAY = "wrong_day"
    WRONG_PARTITION = "wrong_partition"
    # queries
    UNKNOWN_QUERY_KIND = "unknown_query_kind"
    INVALID_QUERY = "invalid_query"
    DUPLICATE_QUERY_ID = "duplicate_query_id"
    CLOSED_DAY = "closed_day"
    QUERY_TOO_LARGE = "query_too_large"
    TOO_MANY_QUERIES = "too_many_queries"
    # local mode: contributions sent by devices
    INVALID_QUERY_ID = "invalid_query_id"
    INVALID_NONCE = "invalid_nonce"
    INVALID_UNITS = "invalid_units"
    UNKNOWN_QUERY = "unknown_query"
    INACTIVE_QUERY = "inactive_query"
    INVALID_DIMENSION = "invalid_dimension"
    OVER_CLIP = "over_clip"
    IMPLAUSIBLE_NORM = "implausible_norm"


#: what each reject reason means, as docs/design.md §3.4's table shows it (a test keeps them in step)
REJECT_REASON_MEANING: dict[RejectReason, str] = {
    RejectReason.MALFORMED_JSON: "not valid UTF-8 JSON",
    RejectReason.NOT_AN_OBJECT: "valid JSON, but not an object",
    RejectReason.UNKNOWN_FIELD: "a field the contract does not define",
    RejectReason.MISSING_FIELD: "a required field is absent",
    RejectReason.INVALID_USER_ID: "user_id is not a string of 1 to 256 characters without control "
    "characters",
    RejectReason.INVALID_DAY: "day is not an ISO date (YYYY-MM-DD)",
    RejectReason.INVALID_VALUES: "values is not an object of feature → number or string, or too large",
    RejectReason.INVALID_NUMBER: "a value is NaN, infinite or beyond ±1e12",
    RejectReason.WRONG_TYPE: "a value's type is not the one the registered queries read: a "
    "string where a query sums the feature, or a number where a query counts its categories",
    RejectReason.INVALID_EVENT_ID: "event_id is not a string of 1 to 256 characters",
    RejectReason.OVERSIZED: "the record exceeds its size limit ([limits] max_event_bytes, "
    "max_query_bytes)",
    RejectReason.UNDECODABLE_BATCH: "Kafka: the client cannot decode the record's batch (corrupt, "
    "or compressed with a codec it lacks); the raw bytes are not available",
    RejectReason.LATE: "the event's day is already closed",
    RejectReason.FUTURE: "the event's day is after today (UTC) plus [window] future_slack",
    RejectReason.WRONG_DAY: "Python API: an event of another day passed to close_day",
    RejectReason.WRONG_PARTITION: "cluster mode: the event's user_id does not map to the Kafka "
    "partition it was read from (murmur2 of user_id over the day's pinned partition count)",
    RejectReason.UNKNOWN_QUERY_KIND: "kind is not sum, histogram or linear",
    RejectReason.INVALID_QUERY: "a query field is missing, malformed or out of range",
    RejectReason.DUPLICATE_QUERY_ID: "query_id already registered with another definition",
    RejectReason.CLOSED_DAY: "the query starts on a day that is already closed",
    RejectReason.QUERY_TOO_LARGE: "the query's dimension × [limits] expected_users needs more "
    "memory than [limits] max_query_memory_bytes",
    RejectReason.TOO_MANY_QUERIES: "[limits] max_live_queries queries still run",
    RejectReason.INVALID_QUERY_ID: "local mode: the contribution names no valid query id",
    RejectReason.INVALID_NONCE: "local mode: the contribution's nonce is malformed",
    RejectReason.INVALID_UNITS: "local mode: the contribution's integer vector is malformed",
    RejectReason.UNKNOWN_QUERY: "local mode: the contribution is for a query never announced",
    RejectReason.INACTIVE_QUERY: "local mode: the query does not run on the contribution's day",
    RejectReason.INVALID_DIMENSION: "local mode: the vector's length differs from the query's",
    RejectReason.OVER_CLIP: "local mode (central noise): the vector's norm exceeds the clip",
    RejectReason.IMPLAUSIBLE_NORM: "local mode (local noise): the noisy vector's norm is implausible",
}


class Reject(ValueError):
    """A record refused before it reaches the accounting. ``reason`` is one of
    :class:`RejectReason` (anything else raises ``ValueError`` here, so no code path can emit a
    reason the list lacks); ``detail`` names the field and the problem but never quotes the
    offending value."""

    def __init__(self, reason: RejectReason | str, detail: str) -> None:
        self.reason = RejectReason(reason)
        super().__init__(f"{self.reason}: {detail}")
        self.detail = detail


class Event(NamedTuple):
    """A validated event. ``values`` maps feature → finite float or category string.

    Constructing one directly validates nothing: use ``parse_event`` (or ``engine.ingest`` for
    a batch). A named tuple: the native scanner makes one per line at C speed
    (``engine/_jsonl.c``, ``scan_events``).
    """

    user_id: str
    day: str
    values: dict[str, float | str]
    event_id: str | None = None


#: feature → True when the registered queries read it as a category (a coordinate ``f=v``), False
#: when they read it as a number (a coordinate ``f``); features no query reads are absent (any
#: type is accepted). ``engine.queries.QueryBook.kinds`` keeps it as queries register.
FeatureKinds = Mapping[str, bool]


def coordinate_kinds(query: SumQuery | HistogramQuery | LinearQuery) -> dict[str, bool]:
    """Each feature ``query`` reads, and whether it reads it as a category (True) or a number."""
    out: dict[str, bool] = {}
    for coordinate in query.coordinates():
        name, sep, _ = coordinate.partition("=")
        out[name] = bool(sep) or out.get(name, False)
    return out


#: days outside this range are refused (the daemon computes the next day of every closed day)
MIN_DAY, MAX_DAY = "1970-01-01", "9998-12-31"


def _parse_day(value: Any, field: str) -> str:
    if not isinstance(value, str) or not _DAY_RE.fullmatch(value):
        raise Reject("invalid_day", f"{field} must be an ISO date YYYY-MM-DD")
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        raise Reject("invalid_day", f"{field} is not a valid calendar date") from None
    if not MIN_DAY <= value <= MAX_DAY:
        raise Reject("invalid_day", f"{field} must be between {MIN_DAY} and {MAX_DAY}")
    return value


def _is_utf8(text: str) -> bool:
    """False for strings with lone surrogates (valid JSON escapes, not encodable text)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_id(value: Any, field: str, reason: str) -> str:
    if not isinstance(value, str):
        raise Reject(reason, f"{field} must be a string")
    if not value or len(value) > MAX_ID_CHARS:
        raise Reject(reason, f"{field} must have 1 to {MAX_ID_CHARS} characters")
    if not _is_utf8(value):
        raise Reject(reason, f"{field} must be valid Unicode text (no lone surrogates)")
    return value


def load_object(raw: bytes | str | dict[str, Any], what: str, max_bytes: int | None = None) -> Any:
    """One JSON record of the contract → its object, or ``Reject`` (``oversized``,
    ``malformed_json``, ``invalid_number`` for NaN/Infinity, ``not_an_object``)."""
    if isinstance(raw, dict):
        obj: Any = raw
    else:
        if max_bytes is not None and len(raw) > max_bytes:
            raise Reject("oversized", f"{what} exceeds {max_bytes} bytes")
        try:
            obj = json.loads(raw, parse_constant=_refuse_constant)
        except Reject:
            raise
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise Reject("malformed_json", "not valid UTF-8 JSON") from None
    if not isinstance(obj, dict):
        article = "an" if what[0] in "aeiou" else "a"
        raise Reject("not_an_object", f"{article} {what} must be a JSON object")
    return obj


def parse_event(raw: bytes | str | dict[str, Any], kinds: FeatureKinds | None = None) -> Event:
    """Validate one event (a JSON line, or an already-decoded dict); raise ``Reject``.

    ``kinds`` (``FeatureKinds`` of the registered queries): a value whose type is not its
    feature's is refused as ``wrong_type`` — a string where a query sums the feature would add
    nothing, and a number where a query counts categories would match none, both silently."""
    obj = load_object(raw, "event", MAX_EVENT_BYTES)
    extra = obj.keys() - _EVENT_KEYS
    if extra:
        raise Reject("unknown_field", "unknown field(s): " + ", ".join(sorted(map(str, extra))[:5]))
    for key in ("user_id", "day", "values"):
        if key not in obj:
            raise Reject("missing_field", f"missing required field {key}")
    user_id = _check_id(obj["user_id"], "user_id", "invalid_user_id")
    if _CONTROL_RE.search(user_id):
        raise Reject("invalid_user_id", "user_id must not contain control characters")
    day = _parse_day(obj["day"], "day")
    event_id = obj.get("event_id")
    if event_id is not None:
        event_id = _check_id(event_id, "event_id", "invalid_event_id")
    values = obj["values"]
    if not isinstance(values, dict):
        raise Reject("invalid_values", "values must be an object")
    if len(values) > MAX_FEATURES_PER_EVENT:
        raise Reject("invalid_values", f"values has more than {MAX_FEATURES_PER_EVENT} features")
    clean: dict[str, float | str] = {}
    for name, v in values.items():
        if not isinstance(name, str) or not _is_utf8(name):
            raise Reject("invalid_values", "feature names must be valid Unicode strings")
        if not name or len(name) > MAX_FEATURE_CHARS or "=" in name:
            raise Reject(
                "invalid_values",
                f"feature names must have 1 to {MAX_FEATURE_CHARS} characters and no '='",
            )
        if isinstance(v, bool) or v is None:
            raise Reject("invalid_values", f"values.{name} must be a number or a string")
        if isinstance(v, int | float):
            fv = float(v) if abs(v) <= MAX_ABS_VALUE else math.inf
            if not math.isfinite(fv):
                raise Reject(
                    "invalid_number", f"values.{name} must be finite, |x| ≤ {MAX_ABS_VALUE:g}"
                )
            clean[name] = fv
        elif isinstance(v, str):
            if len(v) > MAX_STRING_VALUE_CHARS or not _is_utf8(v):
                raise Reject(
                    "invalid_values",
                    f"values.{name} must be valid text of at most {MAX_STRING_VALUE_CHARS} chars",
                )
            clean[name] = v
        else:
            raise Reject("invalid_values", f"values.{name} must be a number or a string")
    if kinds:
        check_kinds(clean, kinds)
    return Event(user_id=user_id, day=day, values=clean, event_id=event_id)


def check_kinds(values: Mapping[str, float | str], kinds: FeatureKinds) -> None:
    """Raise ``Reject("wrong_type")`` for the first value whose type is not its feature's."""
    for name, v in values.items():
        categorical = kinds.get(name)
        if categorical is not None and categorical is not isinstance(v, str):
            raise Reject(
                "wrong_type",
                f"values.{name} must be a {'string' if categorical else 'number'}: a registered "
                f"query reads it as a {'category' if categorical else 'number'}",
            )


def _refuse_constant(name: str) -> Any:
    raise Reject("invalid_number", "NaN and Infinity are not valid JSON numbers")


# --------------------------------------------------------------------------- pydantic schema

FiniteFloat = Annotated[float, Field(allow_inf_nan=False, ge=-MAX_ABS_VALUE, le=MAX_ABS_VALUE)]
FeatureName = Annotated[str, Field(min_length=1, max_length=MAX_FEATURE_CHARS, pattern=r"^[^=]+$")]


class _QueryBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    query_id: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:\-]+$")]
    clip: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    from_day: dt.date
    until_day: dt.date | None = None
    #: whose sub-budget the query draws on (docs/design.md §2.13); None: the default analyst
    analyst: Annotated[str, Field(pattern=ANALYST_NAME_PATTERN)] | None = None

    @model_validator(mode="after")
    def _check_days(self) -> _QueryBase:
        if self.until_day is not None and self.until_day < self.from_day:
            raise ValueError("until_day must not be before from_day")
        return self

    def applies_to(self, day: str) -> bool:
        d = dt.date.fromisoformat(day)
        return self.from_day <= d and (self.until_day is None or d <= self.until_day)

    # coordinates (record columns) read by the query and the (k × d) weight matrix
    def coordinates(self) -> list[str]:
        raise NotImplementedError

    def weights(self) -> np.ndarray:
        raise NotImplementedError

    def labels(self) -> list[str]:
        raise NotImplementedError

    def canonical_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", exclude_none=True), sort_keys=True)


class SumQuery(_QueryBase):
    kind: Literal["sum"]
    features: Annotated[list[FeatureName], Field(min_length=1, max_length=MAX_QUERY_DIM)]

    @model_validator(mode="after")
    def _unique(self) -> SumQuery:
        if len(set(self.features)) != len(self.features):
            raise ValueError("features must be unique")
        return self

    def coordinates(self) -> list[str]:
        return list(self.features)

    def weights(self) -> np.ndarray:
        return np.eye(len(self.features))

    def labels(self) -> list[str]:
        return list(self.features)


class HistogramQuery(_QueryBase):
    kind: Literal["histogram"]
    feature: FeatureName
    categories: Annotated[
        list[Annotated[str, Field(max_length=256)]], Field(min_length=1, max_length=MAX_QUERY_DIM)
    ]

    @model_validator(mode="after")
    def _unique(self) -> HistogramQuery:
        if len(set(self.categories)) != len(self.categories):
            raise ValueError("categories must be unique")
        return self

    def coordinates(self) -> list[str]:
        return [f"{self.feature}={c}" for c in self.categories]

    def weights(self) -> np.ndarray:
        return np.eye(len(self.categories))

    def labels(self) -> list[str]:
        return list(self.categories)


class LinearQuery(_QueryBase):
    """``weights`` maps a coordinate (a numeric feature ``f`` or a category ``f=v``) to a row of d
    weights; the user's vector is ``Σ_coord record[coord]·weights[coord]``."""

    kind: Literal["linear"]
    weights_: Annotated[
        dict[
            Annotated[str, Field(min_length=1, max_length=400)],
            Annotated[list[FiniteFloat], Field(min_length=1, max_length=MAX_QUERY_DIM)],
        ],
        Field(alias="weights", min_length=1, max_length=MAX_QUERY_DIM),
    ]
    output_labels: list[Annotated[str, Field(max_length=128)]] | None = Field(
        default=None, alias="labels"
    )
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _same_dim(self) -> LinearQuery:
        dims = {len(v) for v in self.weights_.values()}
        if len(dims) != 1:
            raise ValueError("every weights row must have the same length d")
        if self.output_labels is not None and len(self.output_labels) != dims.pop():
            raise ValueError("labels must have length d")
        return self

    def coordinates(self) -> list[str]:
        # sorted: the stored (canonical) form and the announced one give the same matrix and
        # hence the same float sums, before and after a restart and on devices
        return sorted(self.weights_)

    def weights(self) -> np.ndarray:
        return np.array([self.weights_[c] for c in self.coordinates()], dtype=np.float64)

    def labels(self) -> list[str]:
        d = len(next(iter(self.weights_.values())))
        return list(self.output_labels) if self.output_labels else [f"{i}" for i in range(d)]

    def canonical_json(self) -> str:
        return json.dumps(
            self.model_dump(mode="json", exclude_none=True, by_alias=True), sort_keys=True
        )


Query = Annotated[SumQuery | HistogramQuery | LinearQuery, Field(discriminator="kind")]
_QUERY_ADAPTER: TypeAdapter[SumQuery | HistogramQuery | LinearQuery] = TypeAdapter(Query)


def parse_query(raw: bytes | str | dict[str, Any]) -> SumQuery | HistogramQuery | LinearQuery:
    """Validate one query; raise ``Reject`` with reason ``unknown_query_kind`` or ``invalid_query``."""
    obj = load_object(raw, "query")
    if obj.get("kind") not in ("sum", "histogram", "linear"):
        raise Reject("unknown_query_kind", "kind must be one of sum, histogram, linear")
    try:
        return _QUERY_ADAPTER.validate_python(obj)
    except ValidationError as exc:
        fields = sorted({".".join(str(p) for p in e["loc"][1:]) or "query" for e in exc.errors()})
        msgs = sorted({e["msg"] for e in exc.errors()})
        raise Reject("invalid_query", f"invalid {', '.join(fields)}: {'; '.join(msgs)}") from None


# --------------------------------------------------------------------------- releases


@dataclass(frozen=True)
class Coverage:
    """How many users a release covers (docs/design.md §2.11), a private estimate.

    ``users``: noisy number of users counted so far (admitted at least once, or retired) who,
    at the close of the day, can still afford one *full* contribution to the query (remaining
    budget ≥ ``threshold`` ≥ clip², exact lattice units; a lower bound on who could be answered
    in full all day). ``sigma``/``ci95``: its noise (standard deviation, 95% half-width).
    ``counted_users``: noisy number of users counted so far; ``fraction`` = ``users /
    counted_users`` clamped to [0, 1], ``None`` while ``counted_users`` is within its own noise
    of 0. ``threshold`` (data units²) is ``None`` when nobody can afford a full contribution
    (clip² > B_norm): then ``users`` is exactly 0 with no noise — a noise-only series.
    """

    users: int
    sigma: float
    ci95: float
    fraction: float | None
    counted_users: int
    threshold: float | None

    def to_json_dict(self) -> dict[str, object]:
        return {
            "users": self.users,
            "sigma": self.sigma,
            "ci95": self.ci95,
            "fraction": self.fraction,
            "counted_users": self.counted_users,
            "threshold": self.threshold,
        }

    @property
    def noise_only(self) -> bool:
        """Nobody is admissible, or the estimate is within its 95% half-width of 0."""
        return self.threshold is None or self.users <= self.ci95


@dataclass(frozen=True)
class Population:
    """The query's value over ALL users counted so far, a private estimate (docs/design.md
    §2.12): the release plus the noisy total of what the users who left it contributed on the
    day they left. ``value`` per coordinate (data units); ``sigma``: the standard deviation of
    its noise (exact); ``model_sigma`` per coordinate: a private upper estimate of the standard
    deviation of the model's error (departed users counted at their departure value, not
    today's); ``ci95`` per coordinate covers both; ``model``: the one assumption it rests on."""

    value: list[float]
    sigma: float
    model_sigma: list[float]
    ci95: list[float]
    model: str

    def to_json_dict(self) -> dict[str, object]:
        return {
            "value": self.value,
            "sigma": self.sigma,
            "model_sigma": self.model_sigma,
            "ci95": self.ci95,
            "model": self.model,
        }


@dataclass(frozen=True)
class Release:
    """One noisy answer for one (day, query). ``value``/``ci95`` are in data units, length d."""

    day: str
    query_id: str
    labels: list[str]
    value: list[float]
    sigma: float
    ci95: list[float]
    mechanism: str
    granularity: float
    #: Corollary 4.7 (Feldman & Zrnic): ‖value − exact sum over the active set‖∞ ≤ linf_bound
    #: except with probability linf_failure_probability (None: not stated, e.g. _active_set)
    linf_bound: float | None = None
    linf_failure_probability: float | None = None
    #: private estimate of the users this value covers (None: not tracked, e.g. local mode)
    coverage: Coverage | None = None
    #: private estimate of the value over all users counted so far (None: not tracked)
    population: Population | None = None
    #: the analyst whose query this answers (None: the query named none)
    analyst: str | None = None

    def to_json(self) -> str:
        """The exact bytes that leave the process (key order fixed by the contract)."""
        obj: dict[str, object] = {
            "day": self.day,
            "query_id": self.query_id,
            "labels": self.labels,
            "value": self.value,
            "sigma": self.sigma,
            "ci95": self.ci95,
            "mechanism": self.mechanism,
            "granularity": self.granularity,
        }
        if self.linf_bound is not None:
            obj["linf_bound"] = self.linf_bound
            obj["linf_failure_probability"] = self.linf_failure_probability
        if self.coverage is not None:
            obj["coverage"] = self.coverage.to_json_dict()
        if self.population is not None:
            obj["population"] = self.population.to_json_dict()
        if self.analyst is not None:
            obj["analyst"] = self.analyst
        return json.dumps(obj, allow_nan=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> Release:
        obj = json.loads(text)
        if obj.get("coverage") is not None:
            obj["coverage"] = Coverage(**obj["coverage"])
        if obj.get("population") is not None:
            obj["population"] = Population(**obj["population"])
        return cls(**obj)
