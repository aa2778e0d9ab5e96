"""A short fuzz of the native scanner against the reference, for ``make sanitize`` (the
extensions built with ASan + UBSan): the agreement property of ``tests/engine/test_ingest.py``
(``parse_events`` and ``parse_columns`` on mixed batches, both sources' batch forms, each set of
feature kinds) on ``FUZZ_EXAMPLES`` batches (default 1000), plus batches of arbitrary bytes.
Not collected by pytest; run ``python tests/system/fuzz_scanner.py`` from the repository root.
(Coverage-guided fuzzing with atheris: ``tests/system/fuzz_atheris.py``, where atheris installs.)
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # after PYTHONPATH: make sanitize

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamfilter.engine import ingest
from tests.engine.test_ingest import (
    KINDS,
    check_agrees,
    near_plain_lines,
    plain_events,
    raw_lines,
)

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "1000"))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    st.lists(st.one_of(raw_lines(), near_plain_lines(), st.binary(max_size=200)), max_size=12),
    st.integers(0, 100),
    st.sampled_from(KINDS),
    st.integers(0, 2**32),
)
def fuzz(odd, n_plain, kinds, seed):
    rnd = random.Random(seed)
    lines = list(odd) + plain_events(rnd, n_plain)
    rnd.shuffle(lines)
    check_agrees(lines, kinds, label=False)


if __name__ == "__main__":
    assert ingest.SCANNER == "native", "the fuzz is of the native scanner: build it first"
    fuzz()
    print(f"fuzz_scanner: {EXAMPLES} batches, the scanner agreed with parse_event on every line")
