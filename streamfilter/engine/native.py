"""The native helpers the install built (``streamfilter/engine/*.c``, the block filter's
``streamfilter/privacy/_filter.c``; docs/design.md §8.4).

Each is optional: a module here is None when its extension could not be imported, and the
engine then takes its pure-Python path, with the same results and slower. ``missing`` names the
ones not built, so the daemon can say so at start.
"""

from __future__ import annotations

from streamfilter.privacy import individual_filter

__all__ = ["cell_table", "jsonl", "missing", "packed_ids", "pair_set", "user_codes"]

try:  # the column scanner (engine/_jsonl.c): engine/ingest.py
    from streamfilter.engine import _jsonl as jsonl
except ImportError:
    jsonl = None  # type: ignore[assignment]
try:  # id packing (engine/_packed_ids.c): engine/ledger.py, dedup/index.py
    from streamfilter.engine import _packed_ids as packed_ids
except ImportError:
    packed_ids = None  # type: ignore[assignment]
try:  # the open day's user-code table (engine/_user_codes.c): engine/user_codes.py
    from streamfilter.engine import _user_codes as user_codes
except ImportError:
    user_codes = None  # type: ignore[assignment]
try:  # the open day's event-id set (engine/_pair_set.c): dedup/in_memory.py
    from streamfilter.engine import _pair_set as pair_set
except ImportError:
    pair_set = None  # type: ignore[assignment]
try:  # the open day's cells and their exact sums (engine/_cell_table.c): engine/cell_table.py
    from streamfilter.engine import _cell_table as cell_table
except ImportError:
    cell_table = None  # type: ignore[assignment]


def missing() -> list[str]:
    """The source files of the helpers that could not be imported."""
    modules = {
        "engine/_jsonl.c": jsonl,
        "engine/_packed_ids.c": packed_ids,
        "engine/_user_codes.c": user_codes,
        "engine/_pair_set.c": pair_set,
        "engine/_cell_table.c": cell_table,
        "privacy/_filter.c": individual_filter._filter,
    }
    return [source for source, module in modules.items() if module is None]
