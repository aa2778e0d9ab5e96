"""The sequence mirror ``<state>.seq``: the store's monotonic sequence kept outside the store.

Every committed day increments the store's sequence ``seq``; after each commit it is mirrored in
``<path>.seq`` (JSON: the state's random ``state_id``, ``seq``, ``last_closed_day``; written to a
temporary file, fsync'd, renamed, directory fsync'd). A mirror *ahead* of the store means the state
is an older copy than what was already committed (and possibly published); a mirror *behind* is
the harmless trace of a crash between the commit and the mirror write (docs/design.md §5).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from streamfilter.errors import StoreError
from streamfilter.runtime.private_files import open_private


@dataclass(frozen=True)
class SequenceMirror:
    """The contents of ``<state>.seq``: which state, how many days it committed, the last one."""

    state_id: str
    seq: int
    last_closed_day: str | None


def read_mirror(path: Path) -> SequenceMirror | None:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot read the sequence mirror {path}: {exc.strerror}") from exc
    try:
        obj = json.loads(text)
        mirror = SequenceMirror(obj["state_id"], obj["seq"], obj["last_closed_day"])
        valid = (
            isinstance(mirror.state_id, str)
            and type(mirror.seq) is int
            and mirror.seq >= 0
            and (mirror.last_closed_day is None or isinstance(mirror.last_closed_day, str))
        )
    except (ValueError, KeyError, TypeError):
        valid = False
    if not valid:
        raise StoreError(
            f"the sequence mirror {path} is unreadable, so whether the state is the newest "
            "copy cannot be checked; refusing to start — if the state is the newest copy, delete "
            f"{path} and start again"
        )
    return mirror


def write_mirror(path: Path, mirror: SequenceMirror) -> None:
    """Atomically replace ``path``: temporary file (created ``0600``, never through a symlink),
    fsync, rename, fsync the directory."""
    data = json.dumps(
        {"state_id": mirror.state_id, "seq": mirror.seq, "last_closed_day": mirror.last_closed_day},
        sort_keys=True,
    ).encode()
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a crash's leftover (or a planted link): created afresh below
    fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        view = memoryview(data + b"\n")
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
