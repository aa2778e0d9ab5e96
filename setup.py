"""The native extensions (docs/design.md §8.4): plain C against the CPython API, no library, built
by ``pip install`` with the machine's C compiler. Each is optional: without a compiler the install
goes on, the pure-Python paths run and the daemon warns at start (``streamfilter._native``; CI
fails). Declared here, as setuptools' stable interface, rather than in pyproject.toml, where
``[tool.setuptools] ext-modules`` is still experimental (a warning at every install).

``STREAMFILTER_CFLAGS`` adds compiler and linker flags (``make sanitize``: ASan + UBSan).
"""

from __future__ import annotations

import os
import shlex

from setuptools import Extension, setup

EXTRA = shlex.split(os.environ.get("STREAMFILTER_CFLAGS", ""))
#: the shared hash table (open addressing, growth, the key mixer) every table includes
HEADERS = ["streamfilter/_native/hashtable.h"]


def extension(name: str, *flags: str) -> Extension:
    """``streamfilter.<name>`` from ``streamfilter/<name>.c``."""
    return Extension(
        f"streamfilter.{name.replace('/', '.')}",
        sources=[f"streamfilter/{name}.c"],
        include_dirs=["streamfilter/_native"],
        depends=HEADERS,
        extra_compile_args=["-Wall", "-Wextra", *flags, *EXTRA],
        extra_link_args=EXTRA,
        optional=True,
    )


setup(
    ext_modules=[
        extension("engine/_jsonl", "-O2"),  # the column scanner (engine/ingest.py)
        extension("engine/_packed_ids", "-O2"),  # id packing: ledger keys, the event-id index
        extension("engine/_user_codes", "-O2"),  # the open day's user-code table
        extension("engine/_pair_set", "-O2"),  # the open day's event-id set
        extension("engine/_cell_table", "-O2"),  # the open day's cells and their exact sums
        # the block filter: -ffp-contract=off keeps its float arithmetic the Python path's
        extension("privacy/_filter", "-O3", "-ffp-contract=off", "-fno-math-errno"),
    ]
)
