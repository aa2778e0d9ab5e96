"""Open the writer of the configured state (``[state] kind``), taking its single-writer lock."""

from __future__ import annotations

from streamfilter.config import StateSection
from streamfilter.runtime.store.base import StateStore
from streamfilter.runtime.store.sqlite import SQLiteStateStore

__all__ = ["open_store"]


def open_store(state: StateSection) -> StateStore:
    """SQLite (the embedded default) or PostgreSQL (imported only when configured)."""
    if state.kind == "postgres":
        from streamfilter.runtime.store.postgres import PostgresStateStore

        assert state.url is not None  # checked by the configuration
        return PostgresStateStore(
            state.url, schema=state.pg_schema, password=state.postgres_password()
        )
    state.path.parent.mkdir(parents=True, exist_ok=True)
    return SQLiteStateStore(state.path, budget_log_max_rows=state.budget_log_max_rows)
