"""Whether a query record is admitted: the one rule ``run`` registers by and ``check`` reports
by (so the two refuse the same queries). Every refusal is a ``Reject`` with its reason code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from streamfilter.engine.contract import Reject, RejectReason

if TYPE_CHECKING:
    from streamfilter.engine.engine import EngineCore


class InputLimits(Protocol):
    """The ``[limits]`` a query is admitted within (``runtime.daemon.InputLimits``)."""

    @property
    def max_query_bytes(self) -> int: ...
    @property
    def max_query_memory_bytes(self) -> int: ...
    @property
    def expected_users(self) -> int: ...
    @property
    def max_live_queries(self) -> int: ...


def admit_query(engine: EngineCore[Any], limits: InputLimits, raw: bytes) -> Any:
    """The query ``raw`` defines if it is new and within ``[limits]``; None if it is registered
    already; raises ``Reject`` (oversized, invalid, closed day, duplicate id, over a limit)."""
    if len(raw) > limits.max_query_bytes:
        raise Reject(
            RejectReason.OVERSIZED,
            f"a query exceeds [limits] max_query_bytes ({limits.max_query_bytes})",
        )
    query = engine.parse_query(raw)
    if not engine.check_query(query):
        return None
    _check_query_limits(engine, limits, query)
    return query


def _check_query_limits(engine: EngineCore[Any], limits: InputLimits, query: Any) -> None:
    """Refuse a new query whose per-day matrices would exceed ``max_query_memory_bytes`` at
    ``expected_users``, or one more than ``max_live_queries`` that still run."""
    k, d = len(query.coordinates()), len(query.labels())
    need = 8 * (limits.expected_users * (k + d) + k * d)
    if need > limits.max_query_memory_bytes:
        raise Reject(
            RejectReason.QUERY_TOO_LARGE,
            f"{k} coordinates × {d} outputs at {limits.expected_users} expected users need "
            f"about {need >> 20} MiB, over [limits] max_query_memory_bytes",
        )
    last = engine.last_closed_day
    live = sum(
        1
        for q in engine.queries
        if q.until_day is None or last is None or q.until_day.isoformat() > last
    )
    if live >= limits.max_live_queries:
        raise Reject(
            RejectReason.TOO_MANY_QUERIES,
            f"[limits] max_live_queries ({limits.max_live_queries}) queries still run",
        )


def query_id_of(raw: bytes) -> str:
    """The ``query_id`` a refused record names, for its warning ("?" when it names none)."""
    import json

    try:
        value = json.loads(raw).get("query_id")
    except (ValueError, AttributeError, RecursionError):
        return "?"
    return value if isinstance(value, str) and value.isprintable() and len(value) <= 200 else "?"
