"""``LocalFilter``: one device's individual privacy filter with durable on-device state.

The device learns the queries from announcements (the query JSON the server registered), builds
its own user's daily record from that user's events (the central record rule, docs/design.md §2), and
answers each day through ``client.core.answer_day`` — the same clip, lattice, integer cost and
exhaustion policy as the central engine. It persists before it sends:

1. compute the day's contributions (noise drawn, for ``local_noise``),
2. write the new state — spent budget, last answered day, and the contributions as an outbox —
   to a temporary file, fsync it, ``os.replace`` it over the state file, fsync the directory,
3. hand the contributions to the transport; :meth:`LocalFilter.mark_sent` empties the outbox.

A kill at any point leaves either the old state (nothing was sent; the day is answered again from
the same events) or the new one (the outbox is resent with the same bytes and nonces, and the
server drops duplicates) — never fresh noise for the same contribution, never a debit lost.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from streamfilter.client.core import DeviceConfig, Variant, answer_day
from streamfilter.client.protocol import Announcement, AnnouncementError, Contribution
from streamfilter.privacy.accounting import Mechanism
from streamfilter.privacy.noise import RandomBits, SystemRandomBits
from streamfilter.privacy.odometer import UserLoss, user_loss
from streamfilter.privacy.quotas import DEFAULT_ANALYST

__all__ = ["LocalFilter", "day_record"]

STATE_FORMAT = 1


def day_record(events: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The user's record for one day: numeric features summed, a category ``v`` of feature ``f``
    counts 1 at ``f=v``; a repeated ``event_id`` counts once. A coordinate's value is the exact
    sum of its values rounded once (``math.fsum``; an exact zero is +0.0), as in the central
    engine (``engine.exact_sums``, docs/design.md §2.2), so both build the same floats."""
    seen: set[str] = set()
    cells: dict[str, list[float]] = {}
    for event in events:
        event_id = event.get("event_id")
        if event_id is not None:
            if event_id in seen:
                continue
            seen.add(event_id)
        values = event.get("values", {})
        if not isinstance(values, Mapping):
            raise ValueError("event values must be an object")
        for name, v in values.items():
            if isinstance(v, str):
                cells.setdefault(f"{name}={v}", []).append(1.0)
            elif isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v):
                cells.setdefault(name, []).append(float(v))
            else:
                raise ValueError("event values must be finite numbers or strings")
    out: dict[str, float] = {}
    for coord, vals in cells.items():
        out[coord] = math.fsum(vals) + 0.0
    return out


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class LocalFilter:
    """One user's filter on their own device (Feldman & Zrnic Remark 4.6).

    >>> f = LocalFilter(path, DeviceConfig.create(b_norm=4.0, rho=0.5))   # doctest: +SKIP
    >>> f.announce(query_json); f.answer_day("2026-01-01", my_events)      # doctest: +SKIP
    """

    def __init__(
        self, state_path: str | Path, config: DeviceConfig, bits: RandomBits | None = None
    ):
        self.path = Path(state_path)
        self.config = config
        self.bits = bits if bits is not None else SystemRandomBits()
        self.spent_units = 0
        self.retired = False
        #: each named analyst's spend and retirement on this device (docs/design.md §2.13);
        #: the default analyst's spend is the rest of ``spent_units``
        self.analyst_spent: dict[str, int] = {}
        self.analyst_retired: dict[str, bool] = {}
        self.last_day: str | None = None
        self._queries: dict[str, Announcement] = {}
        self._outbox: list[Contribution] = []
        if self.path.exists():
            self._load()

    # ------------------------------------------------------------------ state
    def _load(self) -> None:
        try:
            state = json.loads(self.path.read_bytes())
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"device state {self.path} is unreadable: {type(exc).__name__}"
            ) from None
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"device state {self.path} has an unknown format")
        if state.get("config") != self.config.fingerprint():
            raise ValueError(
                "the device's privacy configuration differs from the one its state was made with"
            )
        self.spent_units = int(state["spent_units"])
        self.retired = bool(state["retired"])
        # a state from before analysts has none: all its spend is the default analyst's
        analysts = state.get("analysts", {})
        self.analyst_spent = {a: int(v["spent_units"]) for a, v in analysts.items()}
        self.analyst_retired = {a: bool(v["retired"]) for a, v in analysts.items()}
        self.last_day = state["last_day"]
        for canonical in state["queries"]:
            a = Announcement.parse(canonical)
            self._queries[a.query_id] = a
        self._outbox = [Contribution.from_json(c) for c in state["outbox"]]
        if (
            not 0 <= self.spent_units <= self.config.budget_units
            or not 0 <= sum(self.analyst_spent.values()) <= self.spent_units
        ):
            raise ValueError(f"device state {self.path} is corrupt (spent outside the budget)")

    def _save(
        self,
        spent_units: int,
        retired: bool,
        last_day: str | None,
        queries: dict[str, Announcement],
        outbox: list[Contribution],
        analysts: tuple[dict[str, int], dict[str, bool]] | None = None,
    ) -> None:
        analyst_spent, analyst_retired = analysts or (self.analyst_spent, self.analyst_retired)
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "config": self.config.fingerprint(),
            "spent_units": spent_units,
            "retired": retired,
            "last_day": last_day,
            "queries": [a.canonical for a in queries.values()],
            "outbox": [c.to_json().decode() for c in outbox],
        }
        if analyst_spent:
            state["analysts"] = {
                a: {"spent_units": units, "retired": analyst_retired.get(a, False)}
                for a, units in sorted(analyst_spent.items())
            }
        _write_atomically(self.path, json.dumps(state, separators=(",", ":")).encode())
        # only after the state is durable does memory (and hence the transport) move on
        self.spent_units, self.retired, self.last_day = spent_units, retired, last_day
        self.analyst_spent, self.analyst_retired = dict(analyst_spent), dict(analyst_retired)
        self._queries, self._outbox = queries, outbox

    # ------------------------------------------------------------------ protocol
    def announce(self, raw: str | bytes | dict[str, Any]) -> bool:
        """Learn a query. True if new; False for an identical re-announcement. Raises
        ``AnnouncementError`` for a malformed one, a changed definition under a known id, or a
        query starting on a day this device has already answered."""
        a = Announcement.parse(raw)
        known = self._queries.get(a.query_id)
        if known is not None:
            if known.canonical != a.canonical:
                raise AnnouncementError("query_id is already known with another definition")
            return False
        if self.last_day is not None and a.from_day <= self.last_day:
            raise AnnouncementError("from_day is a day this device has already answered")
        try:
            self.config.quotas.owner(a.analyst)
        except ValueError as exc:
            raise AnnouncementError(f"{exc} of this device's enrolment") from None
        self._save(
            self.spent_units,
            self.retired,
            self.last_day,
            {**self._queries, a.query_id: a},
            self._outbox,
        )
        return True

    def answer_day(self, day: str, events: Iterable[Mapping[str, Any]]) -> list[Contribution]:
        """Answer the announced queries of ``day`` from this user's events of that day.

        Returns the new contributions (also kept in the durable outbox until :meth:`mark_sent`).
        A refused, retired or exhausted filter returns nothing for that query.
        """
        if self.last_day is not None and day <= self.last_day:
            raise ValueError(f"day {day} is not after the last answered day {self.last_day}")
        record = day_record(events)
        todays = [a for a in self._queries.values() if a.applies_to(day)]
        matrices = [
            np.array([[record.get(c, 0.0) for c in a.coordinates]], dtype=np.float64)
            for a in todays
        ]
        answers = answer_day(
            self.config,
            todays,
            matrices,
            np.array([self.spent_units], dtype=np.int64),
            np.array([self.retired]),
            self.bits if self.config.variant is Variant.LOCAL_NOISE else None,
            {a: np.array([v], np.int64) for a, v in self.analyst_spent.items()},
            {a: np.array([v]) for a, v in self.analyst_retired.items()},
        )
        new = [
            Contribution(day, qid, tuple(int(u) for u in units[0]), secrets.token_hex(16))
            for qid, senders, units in zip(
                answers.query_ids, answers.senders, answers.units, strict=True
            )
            if len(senders)
        ]
        self._save(
            int(answers.spent_units[0]),
            bool(answers.retired[0]),
            day,
            self._queries,
            self._outbox + new,
            (
                {a: int(v[0]) for a, v in answers.analyst_spent.items()},
                {a: bool(v[0]) for a, v in answers.analyst_retired.items()},
            ),
        )
        return new

    def pending(self) -> list[Contribution]:
        """Contributions persisted but not yet acknowledged by the transport (resend as is)."""
        return list(self._outbox)

    def mark_sent(self, nonces: Iterable[str]) -> None:
        done = set(nonces)
        keep = [c for c in self._outbox if c.nonce not in done]
        if len(keep) != len(self._outbox):
            self._save(self.spent_units, self.retired, self.last_day, self._queries, keep)

    # ------------------------------------------------------------------ the user's own view
    @property
    def remaining(self) -> float:
        """Budget left, data units² (``(B − spent)·γ²``)."""
        return (self.config.budget_units - self.spent_units) * self.config.granularity**2

    def spent_by_analyst(self) -> dict[str, int]:
        """This user's spend on each analyst's sub-budget, lattice units (their eyes only):
        the named analysts' and the default analyst's, the rest."""
        quotas = self.config.quotas
        named = {a: self.analyst_spent.get(a, 0) for a in quotas.named}
        return {**named, DEFAULT_ANALYST: self.spent_units - sum(self.analyst_spent.values())}

    def odometer(self) -> UserLoss:
        """This user's realized loss so far: spent budget, ρ and ε at the configured δ
        (``privacy.odometer.user_loss``). For this user's eyes only; never sent."""
        mechanism: Mechanism = (
            "gaussian" if self.config.mechanism == "gaussian" else "discrete_gaussian"
        )
        return user_loss(
            self.spent_units,
            self.config.granularity,
            self.config.noise_variance_units,
            self.config.delta,
            mechanism,
        )
