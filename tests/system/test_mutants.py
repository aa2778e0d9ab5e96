"""The mutation check stays applicable (``make mutants`` runs it; this is its fast guard in
``make test``): every mutant's original text occurs exactly once in its file, the patch changes
it, and every test named to kill it exists."""

import re
from pathlib import Path

import pytest

from tests.support.mutants import MUTANTS, ROOT


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutant_applies_and_names_existing_tests(mutant):
    text = (ROOT / mutant.path).read_text()
    assert text.count(mutant.original) == 1, mutant.name
    assert mutant.replacement != mutant.original
    assert mutant.tests
    for node in mutant.tests:
        path, _, name = node.partition("::")
        source = (ROOT / path).read_text()
        if name:
            assert re.search(rf"^def {re.escape(name)}\(", source, re.M), node


def test_the_privacy_core_is_covered():
    touched = {Path(m.path).name for m in MUTANTS}
    assert {
        "individual_filter.py",
        "_filter.c",
        "lattice.py",
        "accounting.py",
        "continual.py",
        "odometer.py",
    } <= touched
