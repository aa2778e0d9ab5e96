"""Deduplication of repeated events: a day's exact index of ``(user code, event id)`` pairs
(docs/design.md §2.2).

``index`` is the interface (:class:`~streamfilter.dedup.index.EventIdIndex`) and the pairs'
packing; ``in_memory`` the in-memory tier (pure, the engine's: ``Monitor`` and every day's recent
pairs); ``spill`` the tier that spills to disk past a bound — an adapter, imported only by the
runtime (``tests/system/test_architecture.py`` holds each module to its layer).
"""
