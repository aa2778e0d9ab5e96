"""Shared test configuration.

Components the suite needs (a Kafka broker, promtool/Prometheus, Chromium) must be present in CI
(``CI=true``): there a missing component fails the test; locally it skips with the reason.
"""

import os

import pytest

pytest_plugins = ["tests.support.kafka_broker", "tests.support.postgres_server"]

IN_CI = os.environ.get("CI", "").lower() == "true"


def require(condition: bool, reason: str) -> None:
    """Skip locally / fail in CI when a required external component is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)
