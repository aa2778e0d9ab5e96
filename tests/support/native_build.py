"""The native extensions in tests (docs/design.md §8.4): a marker that skips a test where an
extension is not built, and the check that CI built it (a missing build is a failure there)."""

from __future__ import annotations

import os
from types import ModuleType

import pytest


def needs(module: ModuleType | None, source: str) -> pytest.MarkDecorator:
    """Skip the test where ``module`` (built from ``source``) could not be imported (in CI the
    skip is a failure: tests/conftest.py)."""
    return pytest.mark.skipif(module is None, reason=f"{source} is not built (pip install -e .)")


def check_built_in_ci(module: ModuleType | None, source: str) -> None:
    """``module`` is built: skipped where it is not, except in CI, where that fails."""
    if module is None and os.environ.get("CI", "").lower() != "true":
        pytest.skip(f"{source} is not built here (pip install -e .)")
    assert module is not None, f"{source} is not built"
