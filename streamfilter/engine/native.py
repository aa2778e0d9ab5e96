"""The engine's native helpers (``streamfilter/engine/*.c``; docs/design.md §8.4), as
``streamfilter._native`` chooses them (``STREAMFILTER_IMPL``).

Each is None where the Python path runs (not built, or ``STREAMFILTER_IMPL=python``): the engine
then takes its pure-Python path, with the same results and slower.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamfilter._native import load

__all__ = ["cell_table", "jsonl", "packed_ids", "pair_set", "user_codes"]

if TYPE_CHECKING:  # the stubs (engine/_*.pyi) type them; at run time each may be None
    from streamfilter.engine import _cell_table as cell_table
    from streamfilter.engine import _jsonl as jsonl
    from streamfilter.engine import _packed_ids as packed_ids
    from streamfilter.engine import _pair_set as pair_set
    from streamfilter.engine import _user_codes as user_codes
else:
    jsonl = load("engine._jsonl")  # the column scanner: engine/ingest.py, engine/lines.py
    packed_ids = load("engine._packed_ids")  # id packing: engine/ledger.py, dedup/index.py
    user_codes = load("engine._user_codes")  # the open day's user-code table: engine/user_codes.py
    pair_set = load("engine._pair_set")  # the open day's event-id set: dedup/in_memory.py
    cell_table = load("engine._cell_table")  # the open day's cells and sums: engine/cell_table.py
