"""The engine (stateful, no I/O) and the ``Monitor`` Python API built on it.

``Engine`` holds the ledger, the query book and the release history, and exposes the day close as
check-then-commit: :meth:`Engine.prepare_day` computes a :class:`DayOutcome` without mutating
anything; :meth:`Engine.commit_day` applies it. The runtime puts a durable store commit between
the two; ``Monitor`` (for notebooks and tests) calls them back to back. Both run this same code.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from streamfilter.engine.active_set import ActiveSetSpec, ActiveSetTracker
from streamfilter.engine.contract import Event, Reject, Release, parse_event, parse_query
from streamfilter.engine.day import DayOutcome, SeededPerRelease, close_day
from streamfilter.engine.ingest import parse_events
from streamfilter.engine.ledger import BudgetLedger
from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.queries import AnyQuery, QueryBook
from streamfilter.engine.records import DayAccumulator
from streamfilter.privacy.accounting import Guarantee
from streamfilter.privacy.noise import RandomBits, SystemRandomBits

__all__ = ["DayInput", "Engine", "InputRecord", "Monitor", "RejectedRecord"]


class InputRecord(Protocol):
    """A validated input record (an event, or a contribution in local mode) of one day."""

    @property
    def day(self) -> str: ...


class DayInput(Protocol):
    """One open day's input buffer: ``add`` returns False for a duplicate record."""

    day: str

    def add(self, record: Any) -> bool: ...


@dataclass(frozen=True)
class RejectedRecord:
    reason: str
    detail: str
    raw: str


class Engine:
    """Ledger + query book + history; one day at a time, in day order."""

    def __init__(self, params: PrivacyParams, bits: RandomBits) -> None:
        self.params = params
        self.bits = bits
        self.ledger = BudgetLedger()
        self.queries = QueryBook()
        self.last_closed_day: str | None = None
        self.history: list[Release] = []
        #: opt-in private active-set estimate (``engine.telemetry``); None = off
        self.active_set: ActiveSetTracker | None = None

    def check_query(self, query: AnyQuery) -> bool:
        """Dry run of :meth:`register_query`: True if new, False if already registered.

        Besides the query book's checks (closed day, duplicate id), the clip must fit this run's
        lattice: ``clip/granularity ≤ 2^31`` keeps every cost and sum inside 64-bit integers.
        """
        try:
            self.params.lattice.max_cost_units(query.clip)
        except ValueError:
            raise Reject(
                "invalid_query", "clip is too large for the configured granularity (clip/γ > 2^31)"
            ) from None
        return self.queries.check(query, self.last_closed_day)

    def register_query(self, query: AnyQuery) -> bool:
        """Register (True), accept an identical re-registration (False), or raise ``Reject``."""
        if self.check_query(query):
            return self.queries.register(query, self.last_closed_day)
        return False

    def check_day(self, day: str) -> None:
        dt.date.fromisoformat(day)
        if self.last_closed_day is not None and day <= self.last_closed_day:
            raise ValueError(f"day {day} is not after the last closed day {self.last_closed_day}")

    def is_closed(self, day: str) -> bool:
        return self.last_closed_day is not None and day <= self.last_closed_day

    # the daemon's input hooks: central mode reads events (local mode: ``engine.local``)
    def parse_record(self, raw: bytes | str) -> InputRecord:
        """Validate one input line; raise ``Reject``."""
        return parse_event(raw)

    def parse_records(self, raws: Sequence[bytes]) -> Sequence[InputRecord | Reject]:
        """``parse_record`` of each line, a ``Reject`` returned in its place (the daemon's batch
        hook). Events go through the batch decoder (``engine.ingest``: same results, ~6× faster);
        an engine with its own ``parse_record`` gets it called per line unless it overrides this.
        """
        if type(self).parse_record is Engine.parse_record:
            return parse_events(raws)
        out: list[InputRecord | Reject] = []
        for raw in raws:
            try:
                out.append(self.parse_record(raw))
            except Reject as rej:
                out.append(rej)
        return out

    def new_day(self, day: str) -> DayInput:
        return DayAccumulator(day)

    def prepare_day(self, acc: DayInput) -> DayOutcome:
        """Compute the day's releases and debits; mutates nothing."""
        assert isinstance(acc, DayAccumulator)
        self.check_day(acc.day)
        return close_day(
            acc.finish(),
            self.queries.for_day(acc.day),
            self.ledger,
            self.params,
            self.bits,
            self.active_set,
        )

    def commit_day(self, outcome: DayOutcome) -> None:
        """Apply a prepared (and, in the runtime, durably stored) day."""
        self.check_day(outcome.day)
        self.ledger.apply(outcome.changed_users, outcome.spent_units, outcome.retired)
        self.last_closed_day = outcome.day
        self.history.extend(outcome.releases)
        if outcome.active_set is not None:
            self.active_set = outcome.active_set


class Monitor:
    """Private continual monitoring in a notebook: the same engine as ``streamfilter run``.

    >>> m = Monitor(b_norm=4.0, rho=0.5, granularity=2**-10, exhaustion="skip", test_seed=None)

    ``test_seed`` makes noise reproducible and is for tests only: releases produced with it are
    not private (the noise can be recomputed). ``active_set`` (opt-in) adds the daily private
    active-set estimate ``_active_set`` (``engine.telemetry``); its ρ adds to the run's.
    """

    def __init__(
        self,
        b_norm: float,
        rho: float | None = None,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        granularity: float = 2.0**-10,
        exhaustion: str = "skip",
        mechanism: str = "discrete_gaussian",
        test_seed: int | None = None,
        active_set: ActiveSetSpec | None = None,
    ) -> None:
        self.params = PrivacyParams.create(
            b_norm=b_norm,
            rho=rho,
            epsilon=epsilon,
            delta=delta,
            granularity=granularity,
            exhaustion=exhaustion,
            mechanism=mechanism,
        )
        bits: RandomBits = SystemRandomBits() if test_seed is None else SeededPerRelease(test_seed)
        self._engine = Engine(self.params, bits)
        if active_set is not None:
            self._engine.active_set = ActiveSetTracker.create(active_set, self.params)
        self.rejects: list[RejectedRecord] = []

    def add_query(self, query: dict[str, Any] | str | bytes) -> AnyQuery:
        """Register a query (same JSON shape as the query feed); raises ``ValueError`` if invalid."""
        parsed = parse_query(query)
        self._engine.register_query(parsed)
        return parsed

    def close_day(
        self, day: str, events: Iterable[dict[str, Any] | str | bytes | Event]
    ) -> list[Release]:
        """Close ``day`` with its events and return its releases (in query registration order).

        Invalid events, and events of another day, are recorded in :attr:`rejects` and skipped.
        """
        self._engine.check_day(day)
        acc = DayAccumulator(day)
        for raw in events:
            try:
                event = raw if isinstance(raw, Event) else parse_event(raw)
                if event.day != day:
                    raise Reject("wrong_day", "event day differs from the day being closed")
            except Reject as rej:
                self.rejects.append(RejectedRecord(rej.reason, rej.detail, _raw_text(raw)))
                continue
            acc.add(event)
        outcome = self._engine.prepare_day(acc)
        self._engine.commit_day(outcome)
        return outcome.releases

    def spent(self, user_id: str) -> float:
        """Budget spent by ``user_id`` in data units (Σ‖q‖² of admitted contributions).

        Sensitive: show it to that user only (paper §4.4; Yu et al. §3.4).
        """
        return float(self._engine.ledger.spent_units(user_id)) * self.params.granularity**2

    def guarantee(self) -> Guarantee:
        return self.params.guarantee()

    @property
    def releases(self) -> list[Release]:
        return list(self._engine.history)

    @property
    def engine(self) -> Engine:
        return self._engine


def _raw_text(raw: object) -> str:
    if isinstance(raw, bytes):
        return raw.decode("utf-8", errors="backslashreplace")
    if isinstance(raw, Event):
        return repr(raw)
    return raw if isinstance(raw, str) else repr(raw)
