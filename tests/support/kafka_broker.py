"""Pytest plugin: a real single-node Apache Kafka 4.x broker (KRaft) for the tests.

Enable it with ``pytest_plugins = ["tests.support.kafka_broker"]`` in ``tests/conftest.py`` (or run
pytest with ``-p tests.support.kafka_broker``). The broker comes from ``deploy/kafka/kafka-up.sh``
(Maven Central jars, see ``deploy/kafka/README.md``).

Fixtures
--------
``kafka_bootstrap`` (session) -> ``"host:port"``
    If ``KAFKA_BOOTSTRAP`` is set, that broker is used as is (never started or stopped here).
    Otherwise one broker is started on free ports for the whole session and stopped (and its
    files removed, unless a test failed) at the end.
``kafka_private_broker`` (function) -> :class:`KafkaBroker`
    A dedicated broker owned by one test, always started here (even with ``KAFKA_BOOTSTRAP``).
    Use it for outage tests: stopping it does not disturb the tests sharing ``kafka_bootstrap``.

When the broker cannot be provided (no ``java``; neither cached jars nor ``mvn``; Maven
Central unreachable) the tests are skipped with the reason -- except when ``CI=true``, where
they fail: Kafka tests must never be skipped silently in CI. A broker that has its
prerequisites but does not start is always an error.

Helpers for tests
-----------------
``create_topic(bootstrap, name, partitions=1)``   create a topic and wait until it has leaders
``unique_topic(prefix)``                          a fresh topic name
``read_topic(bootstrap, topic)``                  every record currently in a topic
``wait_for_broker(bootstrap)``                    block until the broker answers metadata
``broker_control(bootstrap)``                     stop / start / restart a broker started here

Outage tests::

    def test_survives_outage(kafka_private_broker):
        broker = kafka_private_broker            # or broker_control(kafka_bootstrap)
        ...
        broker.stop(keep_data=True)              # SIGTERM (SIGKILL after a bound); data kept
        ...                                      # clients now see the broker as down
        broker.start(keep_data=True)             # same port, data dir, cluster id, topics
        # or broker.restart() == stop(keep_data=True) + start(keep_data=True)

``broker_control(kafka_bootstrap)`` works for the session broker too (it raises
``LookupError`` when ``KAFKA_BOOTSTRAP`` points to an external broker); remember that every
later test shares that broker, so always start it again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_DEPLOY_DIR = REPO_ROOT / "deploy" / "kafka"
KAFKA_UP = KAFKA_DEPLOY_DIR / "kafka-up.sh"
KAFKA_DOWN = KAFKA_DEPLOY_DIR / "kafka-down.sh"
HOST = "127.0.0.1"

EXIT_UNAVAILABLE = 3  # kafka-up.sh: java / mvn / jars missing (see deploy/kafka/common.sh)
START_TIMEOUT_S = 90  # broker readiness bound inside kafka-up.sh
PROVISION_TIMEOUT_S = 900  # extra allowance for a cold Maven download
STOP_TIMEOUT_S = 30  # SIGTERM -> SIGKILL bound inside kafka-down.sh

log = logging.getLogger(__name__)

#: SCRAM users a sasl_ssl broker is formatted with (deploy/kafka/kafka-up.sh)
SASL_PASSWORDS = {"admin": "admin-secret", "app": "app-secret"}


class KafkaUnavailable(RuntimeError):
    """A prerequisite of the test broker (java, mvn or the cached jars) is missing."""


class KafkaBrokerError(RuntimeError):
    """kafka-up.sh / kafka-down.sh failed although the prerequisites are there."""


def pytest_configure(config: pytest.Config) -> None:
    # kafka-python 3.0.x loads its protocol schemas with importlib.resources.read_text(), which
    # is deprecated on Python 3.11+; with filterwarnings=error that breaks `import kafka`.
    # Later filterwarnings lines take precedence, so this only relaxes these warnings.
    # (read_text itself calls the deprecated open_text, attributed to importlib.resources.)
    for line in (
        "ignore:read_text is deprecated:DeprecationWarning:kafka\\.",
        "ignore:open_text is deprecated:DeprecationWarning:importlib\\.resources",
    ):
        config.addinivalue_line("filterwarnings", line)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def skip_or_fail(reason: str) -> None:
    """Skip the test locally; fail it in CI, where Kafka tests must always run."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: Kafka tests may not be skipped)", pytrace=False)
    pytest.skip(reason)


# ------------------------------------------------------------------------------------------
# Broker processes


@dataclass
class KafkaBroker:
    """A broker managed by ``deploy/kafka/kafka-up.sh`` / ``kafka-down.sh`` on one port.

    All state lives in ``deploy/kafka/.run/<port>/`` (data dir, pid file, kafka.log), so
    ``stop(keep_data=True)`` followed by ``start(keep_data=True)`` restarts the same cluster.
    """

    port: int
    controller_port: int
    host: str = HOST
    security: str = "plaintext"  # or "sasl_ssl" (KAFKA_SECURITY of kafka-up.sh)

    @property
    def bootstrap(self) -> str:
        host = "localhost" if self.security == "sasl_ssl" else self.host
        return f"{host}:{self.port}"

    @property
    def tls_dir(self) -> Path:
        """sasl_ssl: ca.crt, client.crt, client.key (+ client.key.password), made by kafka-up.sh."""
        return self.run_dir / "tls"

    def client(self, user: str = "admin", mechanism: str = "SCRAM-SHA-512") -> dict[str, Any]:
        """kafka-python settings for ``user`` (sasl_ssl: admin is a super user; app has the
        rights ACLs give it). Empty for a plaintext broker."""
        if self.security != "sasl_ssl":
            return {}
        return {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": mechanism,
            "sasl_plain_username": user,
            "sasl_plain_password": SASL_PASSWORDS[user],
            "ssl_cafile": str(self.tls_dir / "ca.crt"),
        }

    @property
    def run_dir(self) -> Path:
        return KAFKA_DEPLOY_DIR / ".run" / str(self.port)

    @property
    def log_file(self) -> Path:
        return self.run_dir / "kafka.log"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KAFKA_PORT"] = str(self.port)
        env["KAFKA_CONTROLLER_PORT"] = str(self.controller_port)
        env.setdefault("KAFKA_START_TIMEOUT", str(START_TIMEOUT_S))
        env.setdefault("KAFKA_STOP_TIMEOUT", str(STOP_TIMEOUT_S))
        env.pop("KAFKA_KEEP_DATA", None)  # only the explicit keep_data arguments count
        env["KAFKA_SECURITY"] = self.security
        return env

    def _run(self, script: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(
                ["bash", str(script), *args],
                env=self._env(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise KafkaBrokerError(
                f"{script.name} {' '.join(args)} did not finish within {timeout:.0f}s "
                f"(broker log: {self.log_file})"
            ) from exc

    def start(self, *, keep_data: bool = False) -> str:
        """Start the broker (no-op if it runs) and wait until it serves metadata.

        ``keep_data=True`` reuses the data left by ``stop(keep_data=True)``; otherwise the
        storage is formatted afresh. Returns the bootstrap address.
        """
        args = ["--keep-data"] if keep_data else []
        proc = self._run(KAFKA_UP, args, timeout=START_TIMEOUT_S + PROVISION_TIMEOUT_S)
        if proc.returncode == EXIT_UNAVAILABLE:
            raise KafkaUnavailable(_last_lines(proc.stderr) or "kafka-up.sh: unavailable")
        if proc.returncode != 0:
            raise KafkaBrokerError(
                f"kafka-up.sh failed (exit {proc.returncode}) for port {self.port}:\n"
                f"{_last_lines(proc.stderr, 60)}"
            )
        address = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        if address != self.bootstrap:
            raise KafkaBrokerError(f"kafka-up.sh printed {address!r}, expected {self.bootstrap}")
        return address

    def stop(self, *, keep_data: bool = False, purge: bool = False) -> None:
        """Stop the broker: SIGTERM, then SIGKILL after a bound.

        ``keep_data=True`` keeps the data dir for a later ``start(keep_data=True)``;
        otherwise it is deleted. ``purge=True`` also deletes kafka.log and the run dir.
        """
        args = ["--keep-data"] if keep_data else (["--purge"] if purge else [])
        proc = self._run(KAFKA_DOWN, args, timeout=STOP_TIMEOUT_S + 30)
        if proc.returncode != 0:
            raise KafkaBrokerError(
                f"kafka-down.sh failed (exit {proc.returncode}) for port {self.port}:\n"
                f"{_last_lines(proc.stderr, 40)}"
            )

    def restart(self) -> str:
        """Stop and start again with the same data (cluster id, topics, offsets)."""
        self.stop(keep_data=True)
        return self.start(keep_data=True)

    def is_running(self) -> bool:
        """True if the broker process recorded in the pid file is alive."""
        try:
            pid = int((self.run_dir / "kafka.pid").read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return False
        with contextlib.suppress(OSError):  # a zombie counts as stopped
            stat = Path(f"/proc/{pid}/stat").read_text()
            return stat.rsplit(")", 1)[1].split()[0] != "Z"
        return True


def _last_lines(text: str, n: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


# Brokers started by this module, by bootstrap address (for broker_control).
_MANAGED: dict[str, KafkaBroker] = {}


def broker_control(bootstrap: str) -> KafkaBroker:
    """The :class:`KafkaBroker` behind ``bootstrap``, to stop / start / restart it.

    Only brokers started by these fixtures can be controlled; an external ``KAFKA_BOOTSTRAP``
    raises ``LookupError`` (use the ``kafka_private_broker`` fixture for outage tests).
    """
    try:
        return _MANAGED[bootstrap]
    except KeyError:
        raise LookupError(
            f"{bootstrap} was not started by tests/support/kafka_broker.py (external KAFKA_BOOTSTRAP?); "
            "use the kafka_private_broker fixture for tests that stop the broker"
        ) from None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_port_pair() -> tuple[int, int]:
    """Two consecutive free ports (client, controller) below the ephemeral range.

    Staying out of the ephemeral range means an outgoing connection cannot grab the port
    while a test has the broker stopped.
    """
    lo, _ = _ephemeral_range()
    rng = random.Random()
    upper = max(lo - 2, 20000)
    for _ in range(200):
        port = rng.randrange(15000, upper)
        if _bindable(port) and _bindable(port + 1):
            return port, port + 1
    for _ in range(50):  # fall back to what the OS hands out
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port < 65535 and _bindable(port + 1):
            return port, port + 1
    raise KafkaBrokerError("could not find two consecutive free TCP ports on 127.0.0.1")


def start_broker(security: str = "plaintext") -> KafkaBroker:
    """Start a new broker on free ports (skip/fail if unavailable) and register it."""
    if shutil.which("bash") is None:
        skip_or_fail("bash is not available to run deploy/kafka/kafka-up.sh")
    last_error: KafkaBrokerError | None = None
    for _ in range(3):  # retry if another process took the ports in the meantime
        port, controller_port = free_port_pair()
        broker = KafkaBroker(port, controller_port, security=security)
        unavailable = ""
        try:
            broker.start()
        except KafkaUnavailable as exc:
            unavailable = str(exc)
        except KafkaBrokerError as exc:
            if "in use" not in str(exc):
                raise
            last_error = exc
            continue
        if unavailable:  # outside the except block: no chained traceback in the report
            broker.stop(purge=True)
            skip_or_fail(f"Kafka test broker unavailable: {unavailable}")
        _MANAGED[broker.bootstrap] = broker
        return broker
    assert last_error is not None
    raise last_error


def release_broker(broker: KafkaBroker, *, keep_logs: bool) -> None:
    """Stop a broker from :func:`start_broker`; keep its kafka.log if ``keep_logs``."""
    _MANAGED.pop(broker.bootstrap, None)
    broker.stop(purge=not keep_logs)
    if keep_logs:
        log.warning("Kafka broker log kept for inspection: %s", broker.log_file)


# ------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    """Bootstrap address ``host:port`` of a running broker (see the module docstring)."""
    external = os.environ.get("KAFKA_BOOTSTRAP", "").strip()
    if external:
        try:
            wait_for_broker(external, timeout=30)
        except Exception as exc:
            pytest.fail(f"KAFKA_BOOTSTRAP={external} does not answer: {exc}", pytrace=False)
        yield external
        return
    broker = start_broker()
    try:
        yield broker.bootstrap
    finally:
        release_broker(broker, keep_logs=request.session.testsfailed > 0)


@pytest.fixture(scope="session")
def kafka_secured(request: pytest.FixtureRequest) -> Iterator[KafkaBroker]:
    """One secured broker for the session: SASL_SSL on ``localhost:<port>`` with a CA made by
    kafka-up.sh, SCRAM-SHA-512/256 and PLAIN users ``admin`` (super user) and ``app`` (rights
    only from ACLs), ACLs enforced. ``broker.client(user)`` gives the client settings.
    ``KAFKA_SECURED_PORT`` names one already started with ``KAFKA_SECURITY=sasl_ssl
    deploy/kafka/kafka-up.sh`` (used as is, never stopped here)."""
    port = os.environ.get("KAFKA_SECURED_PORT", "").strip()
    if port:
        yield KafkaBroker(int(port), int(port) + 1, security="sasl_ssl")
        return
    broker = start_broker(security="sasl_ssl")
    try:
        yield broker
    finally:
        release_broker(broker, keep_logs=request.session.testsfailed > 0)


@pytest.fixture
def kafka_private_broker(request: pytest.FixtureRequest) -> Iterator[KafkaBroker]:
    """A broker of this test's own, which the test may stop and restart."""
    broker = start_broker()
    try:
        yield broker
    finally:
        release_broker(broker, keep_logs=request.session.testsfailed > 0)


# ------------------------------------------------------------------------------------------
# Client helpers (kafka-python)


def admin_client(bootstrap: str, **config: Any):
    """A kafka-python admin client (``config``: security settings, e.g. ``broker.client()``)."""
    return _admin(bootstrap, **config)


def _admin(bootstrap: str, **config: Any):
    from kafka import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=bootstrap, client_id="streamfilter-tests", **config)


def wait_for_broker(bootstrap: str, timeout: float = 60.0) -> dict[str, Any]:
    """Block until ``bootstrap`` answers a metadata request; returns ``describe_cluster()``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin = _admin(bootstrap, request_timeout_ms=5000, bootstrap_timeout_ms=3000)
            try:
                cluster = admin.describe_cluster()
            finally:
                admin.close()
            if cluster.get("brokers"):
                return cluster
            err: Exception = RuntimeError("no broker registered yet")
        except Exception as exc:
            err = exc
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{bootstrap} did not answer metadata within {timeout}s: {err}")
        time.sleep(0.5)


def unique_topic(prefix: str = "test") -> str:
    """A topic name no other test uses (the broker may be shared by the whole session)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    *,
    replication_factor: int = 1,
    configs: dict[str, str] | None = None,
    timeout: float = 30.0,
    client: dict[str, Any] | None = None,
) -> str:
    """Create ``name`` and wait until every partition has a leader; returns ``name``."""
    admin = _admin(bootstrap, request_timeout_ms=int(timeout * 1000), **(client or {}))
    try:
        admin.create_topics(
            {
                name: {
                    "num_partitions": partitions,
                    "replication_factor": replication_factor,
                    "configs": dict(configs or {}),
                }
            },
            timeout_ms=int(timeout * 1000),
        )
        admin.wait_for_topics([name], timeout_ms=int(timeout * 1000))
    finally:
        admin.close()
    return name


def read_topic(
    bootstrap: str,
    topic: str,
    timeout: float = 30.0,
    *,
    isolation_level: str = "read_committed",
    client: dict[str, Any] | None = None,
) -> list[Any]:
    """Every record in ``topic`` up to its current end offsets, ordered by (partition, offset).

    Uses a group-less consumer (no offsets are committed) that reads committed records only, as
    release readers do (``isolation_level="read_uncommitted"`` also returns aborted ones);
    ``client``: extra kafka-python settings (security). Returns kafka-python
    ``ConsumerRecord``s; raises ``TimeoutError`` if the end is not reached in time.
    """
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id="streamfilter-tests-reader",
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=int(min(timeout, 30) * 1000) + 1000,
        isolation_level=isolation_level,
        **(client or {}),
    )
    try:
        deadline = time.monotonic() + timeout
        partitions = consumer.partitions_for_topic(topic)
        while not partitions and time.monotonic() < deadline:
            time.sleep(0.2)
            partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise TimeoutError(f"topic {topic!r} has no partitions visible on {bootstrap}")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        end = consumer.end_offsets(tps)
        consumer.seek_to_beginning(*tps)
        records: list[Any] = []
        while any(consumer.position(tp) < end[tp] for tp in tps):
            if time.monotonic() >= deadline:
                got = {tp.partition: consumer.position(tp) for tp in tps}
                want = {tp.partition: end[tp] for tp in tps}
                raise TimeoutError(f"reading {topic!r}: positions {got}, end offsets {want}")
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close(autocommit=False)
