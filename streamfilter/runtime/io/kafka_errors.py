"""Kafka failures as one clear line: the cause and the config key or ACL to fix.

kafka-python retries a bootstrap connection that fails the TLS handshake or SASL
authentication exactly like an unreachable broker, for ``bootstrap_timeout_ms``, and then says
only ``Unable to bootstrap``. :func:`fail_fast` stops at the first such failure instead: the
cause is read from the client's own "Bootstrap connection to ... failed" log record (a filter
on the ``kafka.net.manager`` logger raises it; ``tests/runtime/io/test_kafka_security.py`` pins the
behaviour on a real secured broker). An unreachable broker is still retried as before.

:func:`explain` turns such a cause, or an authorization error from any request, into
:class:`KafkaAccessError` (exit code 6); docs/kafka.md lists the ACLs of every command.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import Iterator
from typing import Any

from kafka.errors import (
    AuthorizationError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    SaslAuthenticationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    UnsupportedSaslMechanismError,
)

from streamfilter.errors import KafkaAccessError, PublishError

__all__ = ["check_group_access", "explain", "fail_fast", "kafka_access", "sink_topic_gone"]

_MANAGER_LOG = "kafka.net.manager"


class _AuthFailure(Exception):
    """Carries the first TLS/SASL failure out of kafka-python's bootstrap loop."""


def _is_auth_failure(exc: BaseException) -> bool:
    if isinstance(exc, SaslAuthenticationFailedError | UnsupportedSaslMechanismError):
        return True
    if isinstance(exc, ssl.SSLError):
        return True
    text = str(exc)
    return "Handshake failed" in text or "CERTIFICATE_VERIFY_FAILED" in text or "[SSL" in text


#: a broker that refuses SASL credentials answers and closes the connection; kafka-python often
#: sees the close first ("socket disconnected" after ApiVersions). This many in a row during a
#: bootstrap with SASL is taken as refused credentials (an unreachable broker refuses the
#: connection instead).
SASL_DISCONNECTS = 3


class _StopAtAuthFailure(logging.Filter):
    def __init__(self, sasl: bool) -> None:
        super().__init__()
        self.sasl = sasl
        self.disconnects = 0

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if str(record.msg).startswith("Bootstrap connection to") and len(args) > 1:
            cause = args[1]
            if isinstance(cause, BaseException) and _is_auth_failure(cause):
                raise _AuthFailure(cause)
            if self.sasl and "socket disconnected" in str(cause):
                self.disconnects += 1
                if self.disconnects >= SASL_DISCONNECTS:
                    raise _AuthFailure(
                        SaslAuthenticationFailedError(
                            "the broker closed the connection during SASL authentication "
                            f"{self.disconnects} times in a row"
                        )
                    )
            else:
                self.disconnects = 0
        return True


_NOISE = (
    "Handshake failed",
    "[SSL",
    "Authentication",
    "authentication",
    "PEM lib",
    "Authorization",
    "Not authorized",
)


class _QuietAuthNoise(logging.Filter):
    """Drops kafka-python's own lines about the failure :func:`fail_fast` reports in one."""

    def __init__(self, sasl: bool) -> None:
        super().__init__()
        self.sasl = sasl

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("kafka."):
            return True
        text = record.getMessage()
        if any(n in text for n in _NOISE):
            return False
        return not (self.sasl and ("socket disconnected" in text or "not ready" in text))


@contextlib.contextmanager
def fail_fast(client: dict[str, Any]) -> Iterator[None]:
    """Within this block a TLS or SASL failure of a bootstrap connection raises
    :class:`KafkaAccessError` at once instead of being retried, and kafka-python's own log
    lines about it are not shown (the error says it in one line)."""
    sasl = str(client.get("security_protocol", "")).startswith("SASL")
    logger = logging.getLogger(_MANAGER_LOG)
    stop = _StopAtAuthFailure(sasl)
    quiet = _QuietAuthNoise(sasl)
    handlers = list(logging.getLogger().handlers)
    logger.addFilter(stop)
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        yield
    except _AuthFailure as failure:
        raise explain(failure.args[0], client) from None
    finally:
        logger.removeFilter(stop)
        for handler in handlers:
            handler.removeFilter(quiet)


def explain(
    exc: BaseException,
    client: dict[str, Any],
    *,
    topic: str = "",
    role: str = "",
    group: str = "",
) -> KafkaAccessError:
    """The one-line error for ``exc`` (a TLS/SASL failure or an authorization error)."""
    servers = client.get("bootstrap_servers", "")
    at = ",".join(servers) if isinstance(servers, list | tuple) else str(servers)
    mech = client.get("sasl_mechanism")
    user = client.get("sasl_plain_username")
    text = str(exc)
    where = f"kafka topic {topic!r} ({role})" if topic else f"kafka ({text})"
    if isinstance(exc, SaslAuthenticationFailedError):
        return KafkaAccessError(
            f"kafka at {at} refused SASL authentication of user {user!r} with {mech}: check "
            "kafka.sasl_plain_username and kafka.sasl_plain_password (and that the user exists "
            "for this mechanism on the cluster)"
        )
    if isinstance(exc, UnsupportedSaslMechanismError):
        return KafkaAccessError(
            f"kafka at {at} does not enable the SASL mechanism {mech}: set kafka.sasl_mechanism "
            "to one its listener enables"
        )
    if "mismatch" in text or "doesn't match" in text or "not valid for" in text:
        return KafkaAccessError(
            f"kafka at {at}: the broker's TLS certificate is not valid for that host name "
            f"({text.split('(_ssl')[0].strip()}): use in kafka.bootstrap_servers the name the "
            "certificate names"
        )
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return KafkaAccessError(
            f"kafka at {at}: the broker's TLS certificate is not signed by a CA in "
            f"kafka.ssl_cafile ({client.get('ssl_cafile')}): set kafka.ssl_cafile to the CA that "
            "signed it"
        )
    if isinstance(exc, ssl.SSLError) or "[SSL" in text:
        return KafkaAccessError(
            f"kafka: cannot load the client certificate or key (kafka.ssl_certfile "
            f"{client.get('ssl_certfile')}, kafka.ssl_keyfile {client.get('ssl_keyfile')}): "
            f"wrong kafka.ssl_password, or not a PEM file ({type(exc).__name__}: {text})"
        )
    if isinstance(exc, GroupAuthorizationFailedError):
        return KafkaAccessError(
            f"kafka denied access to consumer group {group!r} "
            "(kafka.group_id) to the user: grant READ on Group (docs/kafka.md, ACLs)"
        )
    if isinstance(exc, TransactionalIdAuthorizationFailedError):
        return KafkaAccessError(
            f"kafka denied the releases transactional id to the user ({where}): grant WRITE on "
            f"TransactionalId streamfilter-releases-{topic or '<sink.topic>'} (docs/kafka.md)"
        )
    if isinstance(exc, ClusterAuthorizationFailedError):
        return KafkaAccessError(
            "kafka denied a cluster operation to the user: `topics create` needs CREATE on the "
            "Cluster or on each topic (docs/kafka.md, ACLs)"
        )
    if isinstance(exc, TopicAuthorizationFailedError):
        return KafkaAccessError(
            f"kafka denied {where} to the user: grant the ACLs docs/kafka.md lists for this "
            "command (READ on events and queries, WRITE on releases and rejects, READ on "
            "releases for the stale-state check)"
        )
    return KafkaAccessError(f"{where}: {type(exc).__name__}: {text}")


@contextlib.contextmanager
def kafka_access(
    client: dict[str, Any], *, topic: str = "", role: str = "", group: str = ""
) -> Iterator[None]:
    """Fail fast on TLS/SASL failures and explain authorization errors raised in the block."""
    with fail_fast(client):
        try:
            yield
        except AuthorizationError as exc:
            raise explain(exc, client, topic=topic, role=role, group=group) from None


def check_group_access(client: dict[str, Any], group: str, topic: str) -> None:
    """Fail at start, not at the first day close, when the user may not use ``group`` (the
    consumer group that mirrors the input offsets: kafka.group_id needs READ): one OffsetFetch
    of ``topic``'s partition 0."""
    from kafka import KafkaConsumer, TopicPartition

    with kafka_access(client, group=group):
        consumer = KafkaConsumer(**client, group_id=group, enable_auto_commit=False)
        try:
            consumer.committed(TopicPartition(topic, 0))
        finally:
            consumer.close(autocommit=False)


def sink_topic_gone(client: dict[str, Any], topic: str) -> PublishError | None:
    """The error to fail closed with when the broker says that the releases topic ``topic``
    does not exist (deleted under a running publisher: its description answers
    ``UNKNOWN_TOPIC_OR_PARTITION``); None when it exists, and whenever the broker gives no such
    answer (an outage, a timeout, a refusal: none of them is a deletion)."""
    from kafka import KafkaAdminClient

    try:
        admin = KafkaAdminClient(**{**client, "request_timeout_ms": 10_000})
    except Exception:
        return None
    try:
        described = admin.describe_topics([topic])
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            admin.close()
    if not any(
        d.get("name") == topic and d.get("error_code") == UnknownTopicOrPartitionError.errno
        for d in described
    ):
        return None
    return PublishError(
        f"kafka topic {topic!r} (sink.topic) no longer exists (was it deleted?); nothing more "
        "is published until it is created again (streamfilter topics create), then the "
        "releases it lost are published again from the state, with their stored noise"
    )
