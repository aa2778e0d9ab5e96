"""The engine: the stateful, I/O-free day step that ``streamfilter run`` and ``Monitor`` share.

``EngineCore`` holds the ledger, the query book and the release history, and exposes the day close
as check-then-commit; each engine names its day input's type (``EngineCore[DayT]``): ``Engine``
(central mode) reads events into a ``DayAccumulator``, ``engine.local.LocalEngine``
contributions into a ``ContributionAccumulator``, and each ``prepare_day`` takes exactly the type
its ``new_day`` makes: :meth:`Engine.prepare_day` computes a :class:`DayOutcome` without mutating
anything; :meth:`Engine.commit_day` applies it. The runtime puts a durable store commit between
the two; ``Monitor`` (for notebooks and tests) calls them back to back. A restarted run hands the
stored state to :meth:`Engine.restore`, the one way state enters an engine.
"""

from __future__ import annotations

import datetime as dt
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from streamfilter.dedup.index import EventIdIndex
from streamfilter.engine.contract import Reject, Release, load_object, parse_event, parse_query
from streamfilter.engine.day import DayOutcome, close_day
from streamfilter.engine.ingest import EventColumns, parse_columns, parse_events
from streamfilter.engine.ledger import BudgetLedger
from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.queries import AnyQuery, QueryBook
from streamfilter.engine.records import DayAccumulator, DaySize
from streamfilter.privacy.noise import RandomBits
from streamfilter.privacy.quotas import DEFAULT_ANALYST, AnalystQuotas, split_budgets
from streamfilter.telemetry.active_set import ActiveSetTracker
from streamfilter.telemetry.coverage import CoverageTracker
from streamfilter.telemetry.population import PopulationTracker


class InputRecord(Protocol):
    """A validated input record (an event, or a contribution in local mode) of one day."""

    @property
    def day(self) -> str: ...


class DayInput(Protocol):
    """One open day's input buffer, as the runtime fills it: ``add`` returns False for a
    duplicate record, ``add_many`` the number of new records of a batch."""

    day: str

    def add(self, record: Any) -> bool: ...

    def add_many(self, records: Sequence[Any]) -> int: ...


#: an engine's day input type: what its ``new_day`` makes and its ``prepare_day`` closes
DayT = TypeVar("DayT", bound=DayInput)


@dataclass(frozen=True)
class RejectedRecord:
    reason: str
    detail: str
    raw: str


class EngineCore(ABC, Generic[DayT]):
    """Ledger + query book + history; one day at a time, in day order. A subclass names its
    records (``parse_record``) and its day input (``new_day``, ``prepare_day``)."""

    def __init__(
        self,
        params: PrivacyParams,
        bits: RandomBits,
        *,
        active_set: ActiveSetTracker | None = None,
        coverage: CoverageTracker | None = None,
        population: PopulationTracker | None = None,
        quotas: AnalystQuotas | None = None,
    ) -> None:
        """``quotas``: the analysts' per-user sub-budgets (None: the default analyst owns the
        whole budget)."""
        self.params = params
        self.bits = bits
        self.quotas = quotas if quotas is not None else AnalystQuotas.single(params.budget_units)
        if self.quotas.budget_units != params.budget_units:
            raise ValueError("the analysts' quotas are for another budget")
        self.ledger = BudgetLedger()
        #: each named analyst's sub-filter spends (users keyed by id), those of analysts no
        #: longer declared included (the default analyst's spend is the rest of the global one)
        self.analyst_ledgers: dict[str, BudgetLedger] = {
            name: BudgetLedger() for name in self.quotas.named
        }
        self.queries = QueryBook()
        self.last_closed_day: str | None = None
        self.history: list[Release] = []
        #: opt-in private active-set estimate (``telemetry.active_set``); None = off
        self.active_set = active_set
        #: coverage with every release (``telemetry.coverage``); None = off
        self.coverage = coverage
        #: population estimate with every release (``telemetry.population``); None = off
        self.population = population

    def restore(
        self,
        *,
        budgets: Sequence[tuple[str, int, bool]],
        queries: Sequence[bytes],
        last_closed_day: str | None,
        releases: Sequence[bytes],
    ) -> None:
        """Resume a run from its stored state (the only way state enters an engine).

        ``budgets``: each user's ``(user_id, spent_units, retired)``; ``queries``: the canonical
        JSON of every registered query, in registration order; ``releases``: every stored release,
        in day order. Must be called on a fresh engine, before any day closes.
        """
        if self.last_closed_day is not None or self.history or len(self.ledger):
            raise ValueError("restore() needs a fresh engine")
        plain, named = split_budgets(budgets)
        for ledger, entries in [(self.ledger, plain)] + [
            (self.analyst_ledgers.setdefault(name, BudgetLedger()), entries)
            for name, entries in named.items()
        ]:
            if entries:
                users, spent, retired = zip(*entries, strict=True)
                ledger.apply(
                    np.array(users, dtype=object),
                    np.array(spent, np.int64),
                    np.array(retired, bool),
                )
        for payload in queries:
            self.queries.register(parse_query(payload), None)
        self.last_closed_day = last_closed_day
        self._check_owners()
        self.history = [Release.from_json(p) for p in releases]

    def _check_owners(self) -> None:
        """Every query that still stands belongs to a declared analyst (``ValueError``)."""
        for query in self.queries:
            if query.until_day is not None and self.is_closed(query.until_day.isoformat()):
                continue
            try:
                self.quotas.owner(query.analyst)
            except ValueError as exc:
                raise ValueError(
                    f"registered query {query.query_id!r} still stands but {exc}; declare the "
                    "analyst again (a sub-budget's spend is kept) or end the query"
                ) from None

    def analyst_spent_units(self, user_id: str) -> dict[str, int]:
        """``user_id``'s spend per analyst, lattice units (sensitive: their eyes only): each
        stored analyst's, and the default analyst's, the rest of the global spend."""
        named = {name: ledger.spent_units(user_id) for name, ledger in self.analyst_ledgers.items()}
        default = self.ledger.spent_units(user_id) - sum(named.values())
        return dict(sorted({**named, DEFAULT_ANALYST: default}.items()))

    def next_open_day(self) -> dt.date:
        """The first day that has not closed (``date.min`` before any day closed: every day is
        open then)."""
        if self.last_closed_day is None:
            return dt.date.min
        return dt.date.fromisoformat(self.last_closed_day) + dt.timedelta(days=1)

    def parse_query(self, raw: bytes | str | dict[str, Any]) -> AnyQuery:
        """Validate one query as this run sees it; raise ``Reject``.

        ``"from_day": "next"`` starts a query at the first day that has not closed (instead of
        a date that may already be closed, which is refused as ``closed_day``): it is stored with
        that date. Announcing the same ``"next"`` query again later (a policy's standing query, a
        re-read feed) returns the registered one rather than a conflicting duplicate.
        """
        obj = load_object(raw, "query")
        if obj.get("from_day") != "next":
            return parse_query(obj)
        query = parse_query({**obj, "from_day": self.next_open_day().isoformat()})
        existing = self.queries.get(query.query_id)
        if existing is not None:
            as_existing = query.model_copy(update={"from_day": existing.from_day})
            if as_existing.canonical_json() == existing.canonical_json():
                return existing
        return query

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
        try:
            self.quotas.owner(query.analyst)
        except ValueError as exc:
            raise Reject("invalid_query", str(exc)) from None
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

    # the daemon's input hooks
    @abstractmethod
    def parse_record(self, raw: bytes | str) -> InputRecord:
        """Validate one input line; raise ``Reject``."""

    def parse_records(self, raws: Sequence[bytes]) -> Sequence[InputRecord | Reject]:
        """``parse_record`` of each line, a ``Reject`` returned in its place (the daemon's batch
        hook)."""
        out: list[InputRecord | Reject] = []
        for raw in raws:
            try:
                out.append(self.parse_record(raw))
            except Reject as rej:
                out.append(rej)
        return out

    def parse_columns(self, raws: Sequence[bytes]) -> EventColumns | None:
        """The lines as columns, for an engine that reads events (``Engine``); else None."""
        return None

    @abstractmethod
    def new_day(self, day: str) -> DayT:
        """An open day's empty input."""

    @abstractmethod
    def prepare_day(self, acc: DayT) -> DayOutcome:
        """Compute the day's releases and debits from its input; mutates no state."""

    def commit_day(self, outcome: DayOutcome) -> None:
        """Apply a prepared (and, in the runtime, durably stored) day."""
        self.check_day(outcome.day)
        self.ledger.apply(outcome.changed_users, outcome.spent_units, outcome.retired)
        for change in outcome.analyst_changes:
            ledger = self.analyst_ledgers.setdefault(change.analyst, BudgetLedger())
            ledger.apply(change.users, change.spent_units, change.retired)
        self.last_closed_day = outcome.day
        self.history.extend(outcome.releases)
        if outcome.active_set is not None:
            self.active_set = outcome.active_set
        if outcome.coverage is not None:
            self.coverage = outcome.coverage
        if outcome.population is not None:
            self.population = outcome.population


class Engine(EngineCore[DayAccumulator]):
    """The central engine: events in (``parse_event``), each day's in a ``DayAccumulator``,
    closed by the individual filter and the noise (``engine.day.close_day``)."""

    def __init__(
        self,
        params: PrivacyParams,
        bits: RandomBits,
        *,
        active_set: ActiveSetTracker | None = None,
        coverage: CoverageTracker | None = None,
        population: PopulationTracker | None = None,
        event_id_index: Callable[[str], EventIdIndex] | None = None,
        quotas: AnalystQuotas | None = None,
    ) -> None:
        """``event_id_index(day)``: a new day's repeated-event index (the runtime's spills to
        disk); None keeps every day's pairs in memory. ``quotas``: as ``EngineCore``."""
        super().__init__(
            params,
            bits,
            active_set=active_set,
            coverage=coverage,
            population=population,
            quotas=quotas,
        )
        self.event_id_index = event_id_index
        # the size of the days before the next one, which its tables are allocated for at once
        # (``DayAccumulator.reserve``): the last day prepared and the newest day opened
        self._closed_size = DaySize(0, 0)
        self._newest: weakref.ref[DayAccumulator] | None = None

    def parse_record(self, raw: bytes | str) -> InputRecord:
        """Validate one input line; raise ``Reject`` (``wrong_type``: a value of another type than
        the registered queries read)."""
        return parse_event(raw, self.queries.kinds)

    def parse_records(self, raws: Sequence[bytes]) -> Sequence[InputRecord | Reject]:
        """``parse_record`` of each line through the batch decoder (``engine.ingest``: the same
        results, faster)."""
        return parse_events(raws, self.queries.kinds)

    def parse_columns(self, raws: Sequence[bytes]) -> EventColumns | None:
        """The lines as columns when every one is a valid event with the first one's features
        (``engine.ingest.parse_columns``: the same events ``parse_records`` would return); else
        None."""
        return parse_columns(raws, self.queries.kinds)

    def new_day(self, day: str) -> DayAccumulator:
        """An open day's event buffer, with this engine's repeated-event index."""
        index = None if self.event_id_index is None else self.event_id_index(day)
        acc = DayAccumulator(day, index)
        acc.reserve(self._expected_size())
        self._newest = weakref.ref(acc)
        return acc

    def _expected_size(self) -> DaySize:
        """A new day's size hint: the larger of the last day prepared and the newest day opened
        (still growing when the next day's first event arrives)."""
        newest = None if self._newest is None else self._newest()
        if newest is None or newest.finished:
            return self._closed_size
        size, closed = newest.size(), self._closed_size
        return DaySize(max(size.users, closed.users), max(size.cells, closed.cells))

    def prepare_day(self, acc: DayAccumulator) -> DayOutcome:
        """Compute the day's releases and debits; mutates no state (it notes the day's size, the
        next day's size hint: ``_expected_size``)."""
        self.check_day(acc.day)
        if not acc.finished:
            self._closed_size = acc.size()
        return close_day(
            acc.finish(),
            self.queries.for_day(acc.day),
            self.ledger,
            self.params,
            self.bits,
            self.active_set,
            self.coverage,
            self.population,
            self.quotas,
            self.analyst_ledgers,
        )
