"""A synthetic sparse-monitoring event stream (the embedded default when no events file is set)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator

import numpy as np

from streamfilter.runtime.io.base import Source, SourceRecord


class SyntheticSource(Source):
    """A reproducible sparse-monitoring stream: each user is active on a day with probability
    ``p_active``; an active user sends one or two events with ``active``, ``minutes`` and a
    ``plan``. Offsets are event indices. The data generator is seeded (it is synthetic *data*,
    not noise)."""

    PLANS = ("free", "pro", "team")

    def __init__(
        self, users: int, days: int, start_day: str, p_active: float, seed: int = 0
    ) -> None:
        self.users, self.days, self.p_active, self.seed = users, days, p_active, seed
        self.start = dt.date.fromisoformat(start_day)
        self._partition = "synthetic"
        self._offset = 0
        self._iter: Iterator[tuple[int, bytes]] | None = None
        rng = np.random.default_rng([seed, 0])
        self._plan = rng.choice(3, size=users, p=[0.6, 0.3, 0.1])
        self._engagement = rng.beta(2.0, 5.0, size=users)

    def partitions(self) -> list[str]:
        return [self._partition]

    def seek(self, offsets: dict[str, int]) -> None:
        self._offset = offsets.get(self._partition, 0)
        self._iter = self._generate(self._offset)

    def _day_events(self, k: int) -> list[bytes]:
        rng = np.random.default_rng([self.seed, 1, k])
        p = np.minimum(1.0, self.p_active * 2 * self._engagement)
        active = np.flatnonzero(rng.random(self.users) < p)
        minutes = np.round(rng.gamma(2.0, 6.0, size=len(active)), 1)
        twice = rng.random(len(active)) < 0.2
        day = (self.start + dt.timedelta(days=k)).isoformat()
        out: list[bytes] = []
        for j, u in enumerate(active.tolist()):
            plan = self.PLANS[self._plan[u]]
            out.append(
                json.dumps(
                    {
                        "user_id": f"u-{u}",
                        "day": day,
                        "values": {"active": 1, "minutes": float(minutes[j]), "plan": plan},
                        "event_id": f"e-{k}-{u}",
                    }
                ).encode()
            )
            if twice[j]:
                out.append(
                    json.dumps(
                        {"user_id": f"u-{u}", "day": day, "values": {"minutes": 3.5}}
                    ).encode()
                )
        return out

    def _generate(self, start_offset: int) -> Iterator[tuple[int, bytes]]:
        offset = 0
        for k in range(self.days):
            events = self._day_events(k)
            if offset + len(events) <= start_offset:
                offset += len(events)
                continue
            for ev in events:
                if offset >= start_offset:
                    yield offset, ev
                offset += 1

    def poll(self, max_records: int) -> list[SourceRecord]:
        if self._iter is None:
            self.seek({})
        assert self._iter is not None
        out = []
        for offset, value in self._iter:
            out.append(SourceRecord(self._partition, offset, offset + 1, value))
            self._offset = offset + 1
            if len(out) >= max_records:
                break
        else:
            self._iter = iter(())
        return out

    def at_end(self) -> bool:
        if self._iter is None:
            return False
        # the generator is exhausted once a poll returned fewer records than asked
        try:
            first = next(self._iter)
        except StopIteration:
            return True
        self._iter = _chain_one(first, self._iter)
        return False


def _chain_one(
    first: tuple[int, bytes], rest: Iterator[tuple[int, bytes]]
) -> Iterator[tuple[int, bytes]]:
    yield first
    yield from rest
