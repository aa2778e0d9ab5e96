"""Which native helpers the install built (``streamfilter/engine/*.c``, docs/design.md §8.4).

Each is optional: without it the engine takes its pure-Python path, with the same results and
slower. ``missing`` names the ones not built, so the daemon can say so at start.
"""

from __future__ import annotations

__all__ = ["missing"]


def missing() -> list[str]:
    """The source files of the helpers that could not be imported."""
    from streamfilter.engine import event_ids, ingest, records

    modules = {
        "engine/_jsonl.c": ingest._jsonl,
        "engine/_packed_ids.c": event_ids._packed_ids,
        "engine/_user_codes.c": records._user_codes,
    }
    return [source for source, module in modules.items() if module is None]
