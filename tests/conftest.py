"""Shared test configuration.

Components the suite needs (a Kafka broker, PostgreSQL, promtool/Prometheus, Chromium,
systemd-analyze, the native extensions) must be present in CI (``CI=true``): there a missing
component fails the test; locally it skips with the reason. :func:`require` says so where a test
checks; :func:`pytest_runtest_makereport` is the net under every other skip: in CI a skip whose
reason says that something is not installed, built, found or importable is a failure.
"""

import os
import re

import pytest

pytest_plugins = ["tests.kafka_broker", "tests.postgres_server"]

IN_CI = os.environ.get("CI", "").lower() == "true"

#: skip reasons that mean a component is missing (as opposed to a test that does not apply)
COMPONENT_MISSING = re.compile(
    r"not installed|not built|not found|could not import|no module named|no broker", re.I
)


def require(condition: bool, reason: str) -> None:
    """Skip locally / fail in CI when a required external component is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under ``CI=true``, a skip for a missing component is reported as a failure."""
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and COMPONENT_MISSING.search(str(report.longrepr)):
        report.outcome = "failed"
        report.longrepr = f"required in CI (CI=true), but skipped: {report.longrepr}"
