"""A :class:`~streamfilter.engine.monitor.Monitor` that saves itself in a state store and resumes.

``PersistentMonitor.open(path, b_norm=..., rho=...)`` keeps the notebook's run in the same SQLite
state store as ``streamfilter run`` (``runtime.store``): each new query is stored when registered,
each day is committed (budgets, releases) in one transaction *before* it is applied in memory, so
a kernel restart loses nothing that was returned. Opening an existing store restores the ledger,
the queries and the releases through ``Engine.restore`` — the daemon's one entry point — and
refuses privacy settings that differ from the ones the store was created with. The releases are
marked sent as they are returned, so ``streamfilter report`` on the same state shows them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamfilter.config import config_fingerprint
from streamfilter.engine.day import DayOutcome
from streamfilter.engine.monitor import Monitor
from streamfilter.engine.queries import AnyQuery
from streamfilter.errors import ConfigError
from streamfilter.runtime.store import DayCommit, SQLiteStateStore
from streamfilter.telemetry.coverage import CoverageTracker

__all__ = ["PersistentMonitor"]


class PersistentMonitor(Monitor):
    """``Monitor`` + a state store. Use :meth:`open`; call :meth:`close` (or use ``with``)."""

    store: SQLiteStateStore

    @classmethod
    def open(cls, path: str | Path, b_norm: float, **kwargs: Any) -> PersistentMonitor:
        """Open (or create) the store at ``path`` with these privacy settings and resume from it."""
        monitor = cls(b_norm, **kwargs)
        store = SQLiteStateStore(Path(path))
        try:
            state = store.load()
            fingerprint = config_fingerprint(monitor.params)
            if state.config_fingerprint is None:
                store.set_config_fingerprint(fingerprint)
            elif state.config_fingerprint != fingerprint:
                raise ConfigError(
                    f"the privacy settings differ from those the state {path} was created with "
                    "(granularity, b_norm, rho/epsilon, mechanism and exhaustion cannot change)"
                )
            monitor.engine.restore(
                budgets=state.budgets,
                queries=state.queries,
                last_closed_day=state.last_closed_day,
                releases=state.releases,
            )
            coverage = monitor.engine.coverage
            if coverage is not None and state.coverage_state is not None:
                stored = CoverageTracker.from_json(state.coverage_state)
                if stored.description() != coverage.description():
                    raise ConfigError(
                        f"the coverage settings differ from those the state {path} was created "
                        "with; they cannot change during a run"
                    )
                monitor.engine.coverage = stored
        except BaseException:
            store.close()
            raise
        monitor.store = store
        return monitor

    def _registered(self, query: AnyQuery) -> None:
        self.store.add_query(query.canonical_json().encode())

    def _commit(self, outcome: DayOutcome) -> None:
        budget_keys, budget_spent, budget_retired = outcome.budget_rows()
        self.store.commit_day(
            DayCommit(
                day=outcome.day,
                releases=[(r.query_id, r.to_json().encode()) for r in outcome.releases],
                changed_users=budget_keys,
                spent_units=budget_spent,
                retired=budget_retired,
                positions={},
                active_set_state=outcome.active_set_state,
                coverage_state=outcome.coverage_state,
            )
        )
        super()._commit(outcome)
        self.store.mark_sent([(outcome.day, r.query_id) for r in outcome.releases])

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> PersistentMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
