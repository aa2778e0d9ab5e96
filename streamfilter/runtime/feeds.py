"""Query feeds: where queries come from (a file, a policy function; Kafka elsewhere).

A feed yields raw query records; the daemon validates and registers them durably. A *policy*
(``module:function``) is called with the release history and the next day to close and returns
the queries to register — this is how adaptively chosen queries enter (each may depend on every
earlier release, DESIGN.md §1).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from streamfilter.engine.contract import Release

__all__ = ["FileQueryFeed", "NoQueryFeed", "PolicyFeed", "QueryFeed", "load_policy"]

Policy = Callable[[Sequence[Release], str], Iterable[dict[str, Any]]]


class QueryFeed:
    def poll(self) -> list[tuple[str, bytes]]:
        """New raw query records as (source label, bytes)."""
        return []

    def poll_all(self) -> list[tuple[str, bytes]]:
        """Everything published to the feed so far (called right before a day closes, so that
        every query registered before the close applies). Default: one ``poll``."""
        return self.poll()

    def on_day(self, history: Sequence[Release], next_day: str) -> list[tuple[str, bytes]]:
        """Called before ``next_day`` closes, with every release so far."""
        return []

    def positions(self) -> dict[str, int]:
        """Durable read positions (partition label → next offset), stored with each day."""
        return {}

    def seek(self, offsets: dict[str, int]) -> None:
        """Resume at stored positions (labels this feed does not own are ignored)."""

    def close(self) -> None:
        pass


class NoQueryFeed(QueryFeed):
    pass


class FileQueryFeed(QueryFeed):
    """Query JSON lines from a file, read from a stored byte offset; new lines are picked up."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0

    @property
    def _label(self) -> str:
        return f"queries:{self.path.name}"

    def seek(self, offsets: dict[str, int]) -> None:
        self._offset = offsets.get(self._label, 0)

    def positions(self) -> dict[str, int]:
        return {self._label: self._offset}

    def poll(self) -> list[tuple[str, bytes]]:
        if not self.path.exists():
            return []
        out = []
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            for line in fh:
                if not line.endswith(b"\n") and line.strip():
                    break  # partial line
                start = self._offset
                self._offset += len(line)
                if line.strip():
                    out.append((f"{self.path.name}:{start}", line.rstrip(b"\r\n")))
        return out


def load_policy(spec: str) -> Policy:
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise ValueError("a policy is 'module:function'")
    module = importlib.import_module(module_name)
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"policy {spec} is not a callable")
    return func


class PolicyFeed(QueryFeed):
    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._policy = load_policy(spec)

    def on_day(self, history: Sequence[Release], next_day: str) -> list[tuple[str, bytes]]:
        out = []
        for q in self._policy(list(history), next_day):
            out.append((f"policy:{self.spec}", json.dumps(q).encode()))
        return out
