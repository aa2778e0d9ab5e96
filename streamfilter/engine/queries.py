"""The query book: registered queries in registration order (docs/design.md §3, §5).

Queries for day ``t`` are those registered before ``t`` closes whose ``[from_day, until_day]``
covers ``t``; within a day they are evaluated in registration order (Algorithm 3's rounds).
"""

from __future__ import annotations

from collections.abc import Iterator

from streamfilter.engine.contract import (
    HistogramQuery,
    LinearQuery,
    Reject,
    SumQuery,
    coordinate_kinds,
)

__all__ = ["AnyQuery", "QueryBook"]

AnyQuery = SumQuery | HistogramQuery | LinearQuery
#: the id of the opt-in active-set release (``engine.telemetry``); never a registered query's
RESERVED_QUERY_ID = "_active_set"
#: the per-release noise key of the coverage estimates (telemetry.coverage)
COVERAGE_NOISE_ID = "_coverage"


class QueryBook:
    def __init__(self) -> None:
        self._queries: dict[str, AnyQuery] = {}
        #: the type each feature must have (``contract.FeatureKinds``), kept as queries register
        self.kinds: dict[str, bool] = {}

    def __iter__(self) -> Iterator[AnyQuery]:
        return iter(self._queries.values())

    def __len__(self) -> int:
        return len(self._queries)

    def __contains__(self, query_id: object) -> bool:
        return query_id in self._queries

    def get(self, query_id: str) -> AnyQuery | None:
        return self._queries.get(query_id)

    def check(self, query: AnyQuery, last_closed_day: str | None) -> bool:
        """Dry run of :meth:`register`: True if new, False if an identical query is registered.

        Raises ``Reject('closed_day')`` when the query starts on or before the last closed day,
        ``Reject('duplicate_query_id')`` when a different query already uses the id, and
        ``Reject('invalid_query')`` when it reads a feature as a number that a registered query
        reads as a category, or the reverse (docs/design.md §3.1: a feature has one type).
        """
        if query.query_id in (RESERVED_QUERY_ID, COVERAGE_NOISE_ID):
            raise Reject(
                "invalid_query", f"query_id {query.query_id} is reserved for the telemetry"
            )
        existing = self._queries.get(query.query_id)
        if existing is not None:
            if existing.canonical_json() == query.canonical_json():
                return False
            raise Reject(
                "duplicate_query_id", "query_id is already registered with another definition"
            )
        for name, categorical in coordinate_kinds(query).items():
            if self.kinds.get(name, categorical) is not categorical:
                theirs = "category" if self.kinds[name] else "number"
                raise Reject(
                    "invalid_query",
                    f"feature {name} is read as a {theirs} by a registered query; a feature has "
                    "one type",
                )
        if last_closed_day is not None and query.from_day.isoformat() <= last_closed_day:
            raise Reject(
                "closed_day",
                'from_day is a day that is already closed (use "from_day": "next" to start at '
                "the first open day)",
            )
        return True

    def register(self, query: AnyQuery, last_closed_day: str | None) -> bool:
        is_new = self.check(query, last_closed_day)
        if is_new:
            self._queries[query.query_id] = query
            for name, categorical in coordinate_kinds(query).items():
                self.kinds.setdefault(name, categorical)
        return is_new

    def for_day(self, day: str) -> list[AnyQuery]:
        return [q for q in self._queries.values() if q.applies_to(day)]
