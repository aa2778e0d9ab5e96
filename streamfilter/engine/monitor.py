"""``Monitor``: the Python API for notebooks and tests, built on :class:`Engine` (no I/O)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from streamfilter.engine.affordability import affordability_warning, query_cost
from streamfilter.engine.contract import Event, Reject, Release, parse_event
from streamfilter.engine.day import DayOutcome, SeededPerRelease
from streamfilter.engine.engine import Engine, RejectedRecord
from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.queries import AnyQuery
from streamfilter.engine.records import DayAccumulator
from streamfilter.privacy.accounting import Guarantee, guarantee
from streamfilter.privacy.noise import RandomBits, SystemRandomBits
from streamfilter.privacy.quotas import AnalystQuotas
from streamfilter.privacy.rounding import float_up
from streamfilter.telemetry.active_set import ActiveSetSpec, ActiveSetTracker
from streamfilter.telemetry.coverage import CoverageSpec, CoverageTracker
from streamfilter.telemetry.population import PopulationSpec, PopulationTracker

__all__ = ["Monitor"]

log = logging.getLogger("streamfilter.monitor")


class Monitor:
    """Private continual monitoring in a notebook: the same engine as ``streamfilter run``.

    >>> m = Monitor(b_norm=4.0, rho=0.5, granularity=2**-10, exhaustion="skip", test_seed=None)

    ``test_seed`` makes noise reproducible and is for tests only: releases produced with it are
    not private (the noise can be recomputed). ``active_set`` (opt-in) adds the daily private
    active-set estimate ``_active_set`` (``telemetry.active_set``); its ρ adds to the run's.
    ``coverage`` (opt-in here; on by default in ``streamfilter run``) makes every query's release
    carry its coverage estimate (``telemetry.coverage``, docs/design.md §2.11); its ρ adds too.
    ``population`` (opt-in) makes every query's release carry its population estimate
    (``telemetry.population``, docs/design.md §2.12), paid inside each user's own filter.
    ``analysts`` maps analyst names to their shares of every user's budget (docs/design.md
    §2.13); queries name their analyst, those that name none belong to ``default``.
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
        coverage: CoverageSpec | None = None,
        population: PopulationSpec | None = None,
        analysts: Mapping[str, float] | None = None,
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
        self._test_seed = test_seed
        bits: RandomBits = SystemRandomBits() if test_seed is None else SeededPerRelease(test_seed)
        quotas = AnalystQuotas.from_shares(analysts or {}, self.params.budget_units)
        self._engine = Engine(self.params, bits, quotas=quotas)
        #: the ρ each opt-in estimate charges, as the daemon charges its telemetry ledger
        self._charged = {
            name: spec.rho
            for name, spec in (("coverage", coverage), ("active set", active_set))
            if spec is not None
        }
        if active_set is not None:
            self._engine.active_set = ActiveSetTracker.create(active_set, self.params)
        if coverage is not None:
            self._engine.coverage = CoverageTracker.create(coverage, self.params, quotas)
        if population is not None:
            self._engine.population = PopulationTracker.create(population, self.params)
        self.rejects: list[RejectedRecord] = []

    def add_query(self, query: dict[str, Any] | str | bytes) -> AnyQuery:
        """Register a query (same JSON shape as the query feed); raises ``ValueError`` if invalid."""
        parsed = self._engine.parse_query(query)
        if self._engine.check_query(parsed):
            self._registered(parsed)
        if self._engine.register_query(parsed):
            cost = query_cost(parsed, self.params, self._engine.quotas)
            warning = affordability_warning(cost, self.params)
            if warning is not None:
                log.warning("%s", warning)
        return parsed

    def close_day(
        self, day: str | dt.date, events: Iterable[dict[str, Any] | str | bytes | Event]
    ) -> list[Release]:
        """Close ``day`` (an ISO date string or a ``datetime.date``) with its events and return
        its releases (in query registration order).

        Days skipped since the last closed day are closed first, without events, as the daemon
        closes them (releases leave on a data-independent schedule); their releases are in
        :attr:`releases`. Invalid events, and events of another day, are recorded in
        :attr:`rejects` and skipped.
        """
        if isinstance(day, dt.date):
            day = day.isoformat()
        self._engine.check_day(day)
        last = self._engine.last_closed_day
        if last is not None:
            gap = dt.date.fromisoformat(last) + dt.timedelta(days=1)
            while gap.isoformat() < day:
                self._commit(self._engine.prepare_day(DayAccumulator(gap.isoformat())))
                gap += dt.timedelta(days=1)
        acc = DayAccumulator(day)
        for raw in events:
            try:
                event = (
                    raw if isinstance(raw, Event) else parse_event(raw, self._engine.queries.kinds)
                )
                if event.day != day:
                    raise Reject("wrong_day", "event day differs from the day being closed")
            except Reject as rej:
                self.rejects.append(RejectedRecord(rej.reason, rej.detail, _raw_text(raw)))
                continue
            acc.add(event)
        outcome = self._engine.prepare_day(acc)
        self._commit(outcome)
        return outcome.releases

    def _commit(self, outcome: DayOutcome) -> None:
        """Apply a prepared day (``runtime.notebook.PersistentMonitor`` stores it first)."""
        self._engine.commit_day(outcome)

    def _registered(self, query: AnyQuery) -> None:
        """A new query was registered (``PersistentMonitor`` stores it)."""

    def __repr__(self) -> str:
        """The settings and the schedule — never a data-dependent count (no number of users)."""
        p = self.params
        g = self.guarantee()
        parts = " + ".join(f"{k} {v:g}" for k, v in self.rho_parts().items())
        queries = ", ".join(q.query_id for q in self._engine.queries) or "none"
        seeded = ", test_seed set: NOT private" if self._test_seed is not None else ""
        return (
            f"<Monitor {g.rho:g}-zCDP per user in total ({parts}; ({g.epsilon:.4g}, "
            f"{g.delta:g})-DP), "
            f"b_norm={p.b_norm:g}, {p.mechanism} σ={p.sigma_released:.4g} (95% ±"
            f"{p.ci95_halfwidth:.4g}), exhaustion={p.exhaustion}, queries: {queries}; last "
            f"closed day {self._engine.last_closed_day or 'none'}{seeded}>"
        )

    def spent(self, user_id: str) -> float:
        """Budget spent by ``user_id`` in data units (Σ‖q‖² of admitted contributions).

        Sensitive: show it to that user only (paper §4.4; Yu et al. §3.4).
        """
        return float(self._engine.ledger.spent_units(user_id)) * self.params.granularity**2

    def spent_by_analyst(self, user_id: str) -> dict[str, float]:
        """``user_id``'s spend on each analyst's sub-budget, data units (sensitive, as
        :meth:`spent`)."""
        return {
            name: float(units) * self.params.granularity**2
            for name, units in self._engine.analyst_spent_units(user_id).items()
        }

    def rho_parts(self) -> dict[str, float]:
        """Each part of the total ρ: the queries, and what each opt-in estimate is charged (its
        configured ρ, an upper bound on its effective ρ, as ``streamfilter run`` charges it; the
        population estimate is paid inside each user's filter: it adds nothing)."""
        return {"queries": self.params.guarantee().rho, **self._charged}

    def guarantee(self) -> Guarantee:
        """The whole run's guarantee: the queries' ρ plus coverage's and the active set's
        (zCDP composes additively, Bun & Steinke 2016 Lemma 2.3; the sum rounded up)."""
        p = self.params
        total = float_up(sum((Fraction(v) for v in self.rho_parts().values()), Fraction(0)))
        return guarantee(p.b_norm, total, p.sigma_released, p.mechanism, p.delta)

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
