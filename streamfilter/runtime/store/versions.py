"""Schema versions of a state store: one generic mechanism for SQLite and PostgreSQL.

A state records the version of its schema in ``meta`` (key ``schema_version``; a state without
the key is version 1, the schema before versions were recorded). A store lists its migration
steps in order: ``steps[i]`` turns version ``i + 1`` into ``i + 2``, so the version this code
writes is ``len(steps) + 1``. Opening a state runs the missing steps and records the new version
in one transaction (a step that fails leaves the state as it was), and refuses a state whose
version is newer than this code's: it may hold rows this code would misread or overwrite.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from streamfilter.errors import StoreError

__all__ = [
    "SCHEMA_VERSION_KEY",
    "SchemaTooNewError",
    "current_version",
    "parse_version",
    "pending_steps",
]

#: the ``meta`` key holding a state's schema version
SCHEMA_VERSION_KEY = "schema_version"

Step = TypeVar("Step")


class SchemaTooNewError(StoreError):
    """The state was written by a newer streamfilter (a schema version this code does not know)."""


def current_version(steps: Sequence[object]) -> int:
    """The schema version this code writes: one more than its number of migration steps."""
    return len(steps) + 1


def pending_steps(found: int, steps: Sequence[Step], where: str) -> Sequence[Step]:
    """The steps that bring a state of version ``found`` to :func:`current_version`, in order;
    :class:`SchemaTooNewError` (one line) for a version newer than that or not a version."""
    current = current_version(steps)
    if found > current or found < 1:
        raise SchemaTooNewError(
            f"state store {where} has schema version {found}, but this streamfilter knows "
            f"versions 1 to {current}: run a streamfilter at least as new as the one that wrote "
            "it; refusing to start"
        )
    return steps[found - 1 :]


def parse_version(value: str | None, where: str) -> int:
    """The version recorded in ``meta`` (``None``: version 1); unreadable is refused."""
    if value is None:
        return 1
    try:
        return int(value)
    except ValueError:
        raise SchemaTooNewError(
            f"state store {where} records schema version {value[:40]!r}, which this "
            "streamfilter cannot read; refusing to start"
        ) from None
