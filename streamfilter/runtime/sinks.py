"""Release and reject sinks: small interface, file / stdout implementations (Kafka elsewhere).

Guarantee expected by the outbox relay: when :meth:`Sink.flush` returns, every record passed to
:meth:`Sink.publish` before it is durable (file: fsync'd; Kafka: acknowledged). Records are
published with a key (``day/query_id`` for releases); a sink may drop a record whose key it
already holds with identical bytes (the file sink does, so a restart after a crash between
"published" and "marked sent" leaves exactly one line per release).

A sink that can read back what it already holds reports the latest day it holds a release of
(:meth:`Sink.last_published_day`): the daemon refuses to start from a state whose last closed day
is earlier (a restored stale copy of the state; DESIGN.md §5).
"""

from __future__ import annotations

import abc
import json
import os
import sys
from pathlib import Path
from typing import IO

__all__ = ["FileSink", "Sink", "StdoutSink", "reject_payload"]


class Sink(abc.ABC):
    @abc.abstractmethod
    def publish(self, key: str, payload: bytes) -> None: ...

    @abc.abstractmethod
    def flush(self) -> None:
        """Return once everything published so far is durable / acknowledged."""

    def last_published_day(self) -> str | None:
        """The latest day this sink already holds a release of, if it can tell (else ``None``)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class FileSink(Sink):
    """Append JSON lines to a file; ``flush`` fsyncs. Idempotent per key for release files:
    on open, keys already present (``day/query_id`` of existing lines) are remembered."""

    def __init__(self, path: Path, dedupe_releases: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._keys: set[str] = set()
        if dedupe_releases and self.path.exists():
            with open(self.path, "rb") as fh:
                for line in fh:
                    try:
                        obj = json.loads(line)
                        self._keys.add(f"{obj['day']}/{obj['query_id']}")
                    except (ValueError, KeyError, TypeError):
                        continue
        self._dedupe = dedupe_releases
        self._held_through = max((k.split("/", 1)[0] for k in self._keys), default=None)
        self._fh: IO[bytes] = open(self.path, "ab")  # noqa: SIM115 - owned by the sink

    def publish(self, key: str, payload: bytes) -> None:
        if self._dedupe:
            if key in self._keys:
                return
            self._keys.add(key)
        self._fh.write(payload + b"\n")

    def flush(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def last_published_day(self) -> str | None:
        """The latest ``day`` among the release lines the file held when it was opened."""
        return self._held_through

    def close(self) -> None:
        if not self._fh.closed:
            self.flush()
            self._fh.close()


class StdoutSink(Sink):
    def __init__(self, stream: IO[bytes] | None = None) -> None:
        self._out = stream if stream is not None else sys.stdout.buffer

    def publish(self, key: str, payload: bytes) -> None:
        self._out.write(payload + b"\n")

    def flush(self) -> None:
        self._out.flush()


def reject_payload(reason: str, detail: str, raw: bytes, source: str) -> bytes:
    """One reject record: the reason, a value-free detail, and the raw bytes (as text when they
    are UTF-8, else ``raw_b64``)."""
    record: dict[str, str] = {"reason": reason, "detail": detail, "source": source}
    try:
        record["raw"] = raw.decode("utf-8")
    except UnicodeDecodeError:
        import base64

        record["raw_b64"] = base64.b64encode(raw).decode("ascii")
    return json.dumps(record, ensure_ascii=False).encode("utf-8")
