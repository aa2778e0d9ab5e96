"""The one switch between the native extensions and the pure-Python paths (docs/design.md §8.4).

Every module that has a native twin gets it here (``load``), never by importing it itself, so
that one environment variable decides for the whole package, as ``PSYCOPG_IMPL`` does for
psycopg:

``STREAMFILTER_IMPL=python``  no extension is used: every path is the pure-Python one (the
                              same results, slower; tests compare the two this way).
``STREAMFILTER_IMPL=native``  every extension is used; one that is not built is an error at
                              import that names it.
unset (or empty)              each extension that is built is used, the others take their
                              Python path, and the daemon warns at start (``missing``).

The C sources share ``hashtable.h`` here (the hash tables' index, growth and key mixer).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["ENV", "EXTENSIONS", "NativeNotBuiltError", "impl", "load", "missing"]

ENV = "STREAMFILTER_IMPL"
#: each extension's module (below ``streamfilter``) and its source file
EXTENSIONS = {
    "engine._jsonl": "engine/_jsonl.c",
    "engine._packed_ids": "engine/_packed_ids.c",
    "engine._user_codes": "engine/_user_codes.c",
    "engine._pair_set": "engine/_pair_set.c",
    "engine._cell_table": "engine/_cell_table.c",
    "privacy._filter": "privacy/_filter.c",
}


class NativeNotBuiltError(ImportError):
    """``STREAMFILTER_IMPL=native`` and an extension is not built."""


def impl() -> str | None:
    """``native``, ``python``, or None (unset: each extension that is built)."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "native", "python"):
        return value or None
    raise ValueError(f"{ENV} must be 'native' or 'python' (or unset), not {value!r}")


def load(name: str) -> ModuleType | None:
    """The extension ``streamfilter.<name>``, or None where the Python path is to run."""
    if name not in EXTENSIONS:
        raise KeyError(f"no native extension {name}")
    choice = impl()
    if choice == "python":
        return None
    try:
        return importlib.import_module(f"streamfilter.{name}")
    except ImportError as exc:
        if choice == "native":
            raise NativeNotBuiltError(
                f"{ENV}=native but streamfilter/{EXTENSIONS[name]} is not built ({exc}); build "
                f"the extensions (pip install -e . with a C compiler) or set {ENV}=python"
            ) from exc
        return None


def missing() -> list[str]:
    """The source files of the extensions not in use (all of them under ``python``)."""
    return [source for name, source in EXTENSIONS.items() if load(name) is None]
