"""One error hierarchy and one exit-code map for every command (docs/design.md §3).

Every error streamfilter raises on purpose derives from :class:`StreamfilterError`, and each class
carries the process exit code a command returns when the error ends it
(``streamfilter.cli.main`` maps ``exc.exit_code``; nothing else chooses an exit code). An
exception outside this hierarchy is a bug and exits 1 with a traceback, so that a supervisor
restarts the process and the operator sees where it came from.

The table of :data:`EXIT_CODES` is the one README.md shows (a test compares them).
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "EXIT_CODES",
    "RESTART_CANNOT_HELP",
    "ConfigError",
    "ExitCode",
    "KafkaAccessError",
    "PublishError",
    "PublisherFencedError",
    "RetentionGapError",
    "StaleStoreError",
    "StoreError",
    "StoreLockedError",
    "StreamfilterError",
    "TelemetryBudgetError",
]


class ExitCode(IntEnum):
    """The process exit codes of every ``streamfilter`` command."""

    OK = 0  # success, also after SIGTERM (the daemon drained)
    UNEXPECTED = 1  # a bug or an error nothing here anticipated (traceback on stderr)
    CONFIG = 2  # configuration, missing file, argument: fix the named key or path
    STATE_IN_USE = 3  # another process owns the state (its lock is held)
    FAIL_CLOSED = 4  # the state or the release sink failed: nothing past the last commit released
    TELEMETRY_BUDGET = 5  # the telemetry budget would be exceeded: nothing was released
    KAFKA_ACCESS = 6  # Kafka refused us: TLS, SASL, or a missing ACL (the message names the fix)
    FENCED = 7  # another instance took over the releases topic: this one stopped publishing


class StreamfilterError(Exception):
    """Root of every error streamfilter raises on purpose; ``exit_code`` ends the command."""

    exit_code: ExitCode = ExitCode.UNEXPECTED
    #: what the error means for the run, appended to its message on stderr
    consequence: str = ""


class ConfigError(StreamfilterError, ValueError):
    """A configuration problem; the message names the key (or the file)."""

    exit_code = ExitCode.CONFIG


class StoreError(StreamfilterError, RuntimeError):
    """The state store cannot be read or written: the daemon fails closed."""

    exit_code = ExitCode.FAIL_CLOSED
    consequence = "failing closed, nothing was released past the last committed day"


class StoreLockedError(StoreError):
    """Another process owns this state."""

    exit_code = ExitCode.STATE_IN_USE
    consequence = ""


class StaleStoreError(StoreError):
    """The state is older than what was already committed from it (a restored stale copy), or
    is not the state its sequence mirror describes: starting from it could publish a second,
    differently-noised release of a (day, query) and forget budget already spent."""


class PublishError(StreamfilterError, RuntimeError):
    """The release sink cannot be checked or written: fail closed, the outbox keeps the releases
    (they are published by the next start; never drawn again)."""

    exit_code = ExitCode.FAIL_CLOSED
    consequence = "failing closed, the unsent releases stay in the state's outbox"


class PublisherFencedError(PublishError):
    """Another streamfilter instance initialised the releases topic's transactional id after
    this one: the broker fenced this one, which cannot publish anything more (docs/kafka.md,
    "Fenced publishing"). Restarting it would fence the other in turn: a supervisor must not."""

    exit_code = ExitCode.FENCED
    consequence = (
        "this instance stopped; its unsent releases stay in its state's outbox — run one "
        "instance per releases topic"
    )


class KafkaAccessError(StreamfilterError, RuntimeError):
    """Kafka cannot be used with these settings: the TLS handshake or SASL authentication
    failed, or an ACL is missing. The message names the cause and the config key or the ACL to
    fix (docs/kafka.md lists the ACLs each command needs); nothing was released."""

    exit_code = ExitCode.KAFKA_ACCESS


class RetentionGapError(StreamfilterError, RuntimeError):
    """Records between the stored input position and a partition's beginning were deleted
    (retention, ``delete_records``) before they were read: starting would skip them silently."""

    exit_code = ExitCode.FAIL_CLOSED
    consequence = (
        "nothing was read or released; to accept the loss set [source] on_retention_gap = "
        '"skip" (the skipped count is logged and exported)'
    )


class TelemetryBudgetError(StreamfilterError, ValueError):
    """A telemetry charge was refused: it would exceed the telemetry budget (nothing written)."""

    exit_code = ExitCode.TELEMETRY_BUDGET


#: exit codes a restart cannot change (a supervisor must not restart on them: the unit's
#: RestartPreventExitStatus); every other failure, an unreachable broker or database included,
#: may pass, and a restart after a pause is the remedy
RESTART_CANNOT_HELP: frozenset[ExitCode] = frozenset(
    {ExitCode.CONFIG, ExitCode.TELEMETRY_BUDGET, ExitCode.FENCED}
)

#: exit code → what it means, as README.md's table shows it
EXIT_CODES: dict[int, str] = {
    ExitCode.OK: "success (also after SIGTERM: the daemon drained and stopped)",
    ExitCode.UNEXPECTED: "unexpected error (a bug): traceback on stderr; the supervisor restarts",
    ExitCode.CONFIG: "configuration error: bad or missing key, file not found, bad argument",
    ExitCode.STATE_IN_USE: "the state is in use by another streamfilter process (lock held)",
    ExitCode.FAIL_CLOSED: "state store or release sink failure (stale, damaged, read-only, disk "
    "full, sink unreadable): failing closed, nothing released past the last committed day",
    ExitCode.TELEMETRY_BUDGET: "the telemetry budget would be exceeded: nothing was released",
    ExitCode.KAFKA_ACCESS: "Kafka refused access (TLS certificate or host name, key password, "
    "SASL credentials or mechanism, missing ACL): the message names the key or ACL to fix",
    ExitCode.FENCED: "another instance took over publishing to the releases topic (Kafka "
    "transactions): this one was fenced and stopped; do not restart it automatically",
}
