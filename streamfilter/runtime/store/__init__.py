"""The state store: the durable source of truth (docs/design.md §5).

``base`` holds the interface, its records and the start-up check against the sink; ``sqlite`` the
embedded writer; ``schema`` the SQLite schema and row format; ``reader`` the lock-free read-only
view; ``mirror`` the sequence mirror outside the store. This module only re-exports.
"""

from streamfilter.errors import StaleStoreError, StoreError, StoreLockedError, TelemetryBudgetError
from streamfilter.runtime.store.base import (
    DayCommit,
    Position,
    StateStore,
    StoredState,
    TelemetryBalance,
    TelemetryCharge,
    check_sink_not_ahead,
)
from streamfilter.runtime.store.reader import SQLiteStateReader
from streamfilter.runtime.store.sqlite import BUDGET_LOG_MAX_ROWS, SQLiteStateStore

__all__ = [
    "BUDGET_LOG_MAX_ROWS",
    "DayCommit",
    "Position",
    "SQLiteStateReader",
    "SQLiteStateStore",
    "StaleStoreError",
    "StateStore",
    "StoreError",
    "StoreLockedError",
    "StoredState",
    "TelemetryBalance",
    "TelemetryBudgetError",
    "TelemetryCharge",
    "check_sink_not_ahead",
]
