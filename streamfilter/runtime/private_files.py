"""Files that hold budgets or raw input (the state and its WAL, the sequence mirror, the reject
file) are the operator's alone: created ``0600`` whatever the umask, and a file is never created
through a symlink."""

from __future__ import annotations

import os
from pathlib import Path

#: owner read/write only
PRIVATE_FILE_MODE = 0o600


def open_private(path: Path, flags: int) -> int:
    """``os.open(path, flags)``, creating ``path`` when it does not exist: exclusively
    (``O_EXCL``: never through a symlink, dangling or not) and with :data:`PRIVATE_FILE_MODE`
    exactly (the umask can only take bits away; ``fchmod`` sets the rest). An existing file is
    opened as it is, with the mode its owner gave it."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    except FileExistsError:
        return os.open(path, flags & ~os.O_CREAT)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def create_private(path: Path) -> None:
    """Make sure ``path`` exists, created private when it did not (for files another library
    then opens by name: SQLite gives its ``-wal`` and ``-shm`` the database file's mode)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)
