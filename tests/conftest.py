"""Shared test configuration.

Components the suite needs (a Kafka broker, PostgreSQL, promtool/Prometheus, Chromium,
systemd-analyze, the native extensions) must be present in CI (``CI=true``): there a missing
component fails the test; locally it skips with the reason. :func:`require` says so where a test
checks; :func:`pytest_runtest_makereport` is the net under every other skip: in CI a skip whose
reason says that something is not installed, built, found or importable is a failure.

``make test`` runs the suite on every core (pytest-xdist, one worker per core). Each worker is a
process of its own with its own session fixtures: its own Kafka brokers and PostgreSQL server, on
free ports, with their files under directories of their own (``tests/support/``). A test marked
``alone`` (one that holds a wall-clock budget) runs while no other worker runs a test.
"""

import fcntl
import os
import re
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.support.kafka_broker", "tests.support.postgres_server"]

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


@pytest.fixture(autouse=True)
def _share_of_the_machine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Under xdist, a readers-writer lock over the workers of one run: every test holds it
    shared, an ``alone`` test exclusively, so it waits for the tests running on the other
    workers and none starts until it ends. The lock file sits in the run's own temporary
    directory (the parent of every worker's), so two runs on one machine do not wait for each
    other. Without xdist it does nothing."""
    if not hasattr(request.config, "workerinput"):
        yield
        return
    alone = request.node.get_closest_marker("alone") is not None
    lock = tmp_path_factory.getbasetemp().parent / "machine.lock"
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield
