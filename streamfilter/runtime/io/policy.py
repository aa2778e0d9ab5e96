"""Queries chosen by a policy function (``module:function``).

A policy is called with the release history and the next day to close and returns the queries to
register: this is how adaptively chosen queries enter (each may depend on every earlier release,
docs/design.md §1).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence

from streamfilter.engine.contract import Release
from streamfilter.runtime.io.base import Policy, QueryFeed


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
