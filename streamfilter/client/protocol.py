"""Local-mode wire formats: query announcements in, contributions out (stdlib + numpy only).

An *announcement* is the query JSON of the public contract (``sum``, ``histogram``, ``linear``;
docs/design.md §3) as the server registered it. The device reads only what it needs to answer: the
coordinates of its record the query reads, the (k × d) weight matrix, the clip and the days.

A *contribution* is one admitted, lattice-rounded vector for one (day, query), in integer lattice
units, with a random 128-bit nonce that lets the server drop a resent duplicate. It carries no
user or device identifier:

    {"day": "2026-01-05", "query_id": "plans", "units": [0, 1024, 0], "nonce": "9f…(32 hex)"}
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamfilter.privacy.quotas import ANALYST_NAME_PATTERN

__all__ = [
    "MAX_QUERY_DIM",
    "NONCE_HEX_CHARS",
    "QUERY_ID_RE",
    "Announcement",
    "AnnouncementError",
    "Contribution",
]

QUERY_ID_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
NONCE_HEX_CHARS = 32
MAX_QUERY_DIM = 4096
_DAY_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class AnnouncementError(ValueError):
    """An announcement the device refuses (it then answers nothing for that query)."""


def _day(value: Any, name: str) -> str:
    if not isinstance(value, str) or not _DAY_RE.match(value):
        raise AnnouncementError(f"{name} must be an ISO date YYYY-MM-DD")
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        raise AnnouncementError(f"{name} is not a valid calendar date") from None
    return value


def _names(value: Any, name: str) -> list[str]:
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= MAX_QUERY_DIM
        or not all(isinstance(v, str) and v for v in value)
        or len(set(value)) != len(value)
    ):
        raise AnnouncementError(f"{name} must be a non-empty list of distinct strings")
    return list(value)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Announcement:
    """A query as the device sees it. ``canonical`` identifies it (re-announcements must match)."""

    query_id: str
    clip: float
    from_day: str
    until_day: str | None
    coordinates: tuple[str, ...]
    weights: tuple[tuple[float, ...], ...]  # k rows (one per coordinate) of d weights
    canonical: str
    #: the analyst whose sub-budget the query draws on (None: the default analyst)
    analyst: str | None = None

    @property
    def dim(self) -> int:
        return len(self.weights[0])

    def weight_matrix(self) -> np.ndarray:
        """(k × d) float64, the same matrix the server's query uses (``Query.weights()``)."""
        return np.array(self.weights, dtype=np.float64)

    def applies_to(self, day: str) -> bool:
        return self.from_day <= day and (self.until_day is None or day <= self.until_day)

    @classmethod
    def parse(cls, raw: str | bytes | dict[str, Any]) -> Announcement:
        try:
            obj = json.loads(raw) if isinstance(raw, str | bytes) else raw
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise AnnouncementError("an announcement must be valid UTF-8 JSON") from None
        if not isinstance(obj, dict):
            raise AnnouncementError("an announcement must be a JSON object")
        query_id = obj.get("query_id")
        if not isinstance(query_id, str) or not QUERY_ID_RE.match(query_id):
            raise AnnouncementError("query_id must match [A-Za-z0-9_.:-]{1,128}")
        raw_clip: Any = obj.get("clip")
        clip = float(raw_clip) if _finite(raw_clip) else math.nan
        if not clip > 0:
            raise AnnouncementError("clip must be a positive finite number")
        from_day = _day(obj.get("from_day"), "from_day")
        until_day = obj.get("until_day")
        if until_day is not None:
            until_day = _day(until_day, "until_day")
            if until_day < from_day:
                raise AnnouncementError("until_day must not be before from_day")
        analyst = obj.get("analyst")
        if analyst is not None and (
            not isinstance(analyst, str) or not re.match(ANALYST_NAME_PATTERN, analyst)
        ):
            raise AnnouncementError("analyst must match [A-Za-z0-9_-]{1,64}")
        kind = obj.get("kind")
        coords: list[str]
        rows: list[tuple[float, ...]]
        if kind == "sum":
            coords = _names(obj.get("features"), "features")
            rows = [tuple(float(i == j) for j in range(len(coords))) for i in range(len(coords))]
        elif kind == "histogram":
            feature = obj.get("feature")
            if not isinstance(feature, str) or not feature:
                raise AnnouncementError("feature must be a non-empty string")
            cats = _names(obj.get("categories"), "categories")
            coords = [f"{feature}={c}" for c in cats]
            rows = [tuple(float(i == j) for j in range(len(cats))) for i in range(len(cats))]
        elif kind == "linear":
            weights = obj.get("weights")
            if not isinstance(weights, dict) or not 1 <= len(weights) <= MAX_QUERY_DIM:
                raise AnnouncementError("weights must map coordinates to rows of d numbers")
            coords = sorted(weights)  # the server's order (``LinearQuery.coordinates``)
            rows = []
            for row in (weights[c] for c in coords):
                if (
                    not isinstance(row, list)
                    or not 1 <= len(row) <= MAX_QUERY_DIM
                    or not all(_finite(w) for w in row)
                ):
                    raise AnnouncementError("every weights row must be a list of finite numbers")
                rows.append(tuple(float(w) for w in row))
            if len({len(r) for r in rows}) != 1:
                raise AnnouncementError("every weights row must have the same length d")
        else:
            raise AnnouncementError("kind must be one of sum, histogram, linear")
        return cls(
            query_id=query_id,
            clip=clip,
            from_day=from_day,
            until_day=until_day,
            coordinates=tuple(coords),
            weights=tuple(rows),
            canonical=json.dumps(obj, sort_keys=True, separators=(",", ":")),
            analyst=analyst,
        )


@dataclass(frozen=True)
class Contribution:
    """One admitted vector for one (day, query), integer lattice units (see module docstring)."""

    day: str
    query_id: str
    units: tuple[int, ...]
    nonce: str

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "day": self.day,
                "query_id": self.query_id,
                "units": list(self.units),
                "nonce": self.nonce,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: str | bytes) -> Contribution:
        """Trusting reader for the device's own outbox (the server validates with its own)."""
        obj = json.loads(raw)
        return cls(obj["day"], obj["query_id"], tuple(int(u) for u in obj["units"]), obj["nonce"])
