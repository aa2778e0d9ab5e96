"""``DeviceFleet``: many simulated devices, each with its own filter state, in arrays.

For simulation and load tests (``streamfilter simulate-local``): device ``i``'s state is row
``i`` of ``spent_units``/``retired`` and its day is row ``i`` of the record matrices, and every
decision goes through ``client.core.answer_day`` — the code a single :class:`LocalFilter` runs —
so a fleet of N behaves as N independent devices (tested against separate ``LocalFilter``
objects). State lives in memory: a fleet simulates devices, it is not one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from streamfilter.client.core import DeviceConfig, Variant, answer_day
from streamfilter.client.protocol import Announcement, Contribution
from streamfilter.privacy.noise import RandomBits

__all__ = ["DeviceFleet", "FleetAnswers"]


@dataclass(frozen=True)
class FleetAnswers:
    """Per answered query: the sending devices' row indices and their (n_send × d) units."""

    query_ids: list[str]
    devices: list[np.ndarray]
    units: list[np.ndarray]

    def contributions(self, day: str, nonce_bits: RandomBits) -> list[Contribution]:
        """The wire messages, one per sending device and query, each with a fresh 128-bit
        nonce drawn from ``nonce_bits``."""
        out: list[Contribution] = []
        for qid, block in zip(self.query_ids, self.units, strict=True):
            if not len(block):
                continue
            words = nonce_bits.uint64(2 * len(block)).reshape(-1, 2).tolist()
            for row, (hi, lo) in zip(block.tolist(), words, strict=True):
                out.append(Contribution(day, qid, tuple(row), f"{hi:016x}{lo:016x}"))
        return out


class DeviceFleet:
    def __init__(self, config: DeviceConfig, bits: RandomBits | None = None) -> None:
        self.config = config
        self.bits = bits
        self._row: dict[str, int] = {}
        self.spent_units = np.zeros(0, dtype=np.int64)
        self.retired = np.zeros(0, dtype=bool)
        #: each named analyst's spend and retirement per device (docs/design.md §2.13)
        named = config.quotas.named
        self.analyst_spent = {a: np.zeros(0, dtype=np.int64) for a in named}
        self.analyst_retired = {a: np.zeros(0, dtype=bool) for a in named}
        self.last_day: str | None = None

    def __len__(self) -> int:
        return len(self._row)

    def rows(self, device_ids: Sequence[str] | np.ndarray) -> np.ndarray:
        """Row of each device, enrolling devices seen for the first time (zero spent)."""
        row = self._row
        out = np.fromiter((row.setdefault(d, len(row)) for d in device_ids), np.int64)
        grow = len(row) - len(self.spent_units)
        if grow > 0:
            self.spent_units = np.concatenate([self.spent_units, np.zeros(grow, np.int64)])
            self.retired = np.concatenate([self.retired, np.zeros(grow, bool)])
            for a in self.analyst_spent:
                self.analyst_spent[a] = np.concatenate(
                    [self.analyst_spent[a], np.zeros(grow, np.int64)]
                )
                self.analyst_retired[a] = np.concatenate(
                    [self.analyst_retired[a], np.zeros(grow, bool)]
                )
        return out

    def spent(self, device_id: str) -> int:
        row = self._row.get(device_id)
        return 0 if row is None else int(self.spent_units[row])

    def answer(
        self,
        day: str,
        queries: Sequence[Announcement],
        device_ids: Sequence[str] | np.ndarray,
        matrices: Sequence[np.ndarray],
    ) -> FleetAnswers:
        """Devices ``device_ids`` (those with a record on ``day``) answer the day's ``queries``;
        ``matrices[j]`` holds their records' coordinates of ``queries[j]``, one row per device.
        Devices without a record that day neither send nor change."""
        if self.last_day is not None and day <= self.last_day:
            raise ValueError(f"day {day} is not after the last answered day {self.last_day}")
        rows = self.rows(device_ids)
        noise = self.bits if self.config.variant is Variant.LOCAL_NOISE else None
        ans = answer_day(
            self.config,
            queries,
            matrices,
            self.spent_units[rows],
            self.retired[rows],
            noise,
            {a: v[rows] for a, v in self.analyst_spent.items()},
            {a: v[rows] for a, v in self.analyst_retired.items()},
        )
        self.spent_units[rows] = ans.spent_units
        self.retired[rows] = ans.retired
        for a, v in ans.analyst_spent.items():
            self.analyst_spent[a][rows] = v
            self.analyst_retired[a][rows] = ans.analyst_retired[a]
        self.last_day = day
        return FleetAnswers(ans.query_ids, [rows[s] for s in ans.senders], ans.units)
