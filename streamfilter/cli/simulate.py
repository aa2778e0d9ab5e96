"""``streamfilter simulate-local``: one simulated device per user of the event source.

Each user found in ``[source]`` (file or synthetic) becomes a device with its own filter (a row
of a :class:`~streamfilter.client.DeviceFleet`, which runs exactly the code of one
``LocalFilter``). Day by day, in order:

1. the server announces the day's queries (``Daemon.announce``: the query feed and the policy,
   as at the day's close — an adaptive policy sees every earlier release);
2. every device with events that day answers the announced queries through its own filter and
   sends its contributions on the wire (``[local]`` file or Kafka topic) — an exhausted device
   sends nothing;
3. the local-mode server (``streamfilter run``'s daemon, the same store/outbox/sink) reads the
   wire and closes the day.

The devices' state lives in memory, so a simulation starts from a fresh server state.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamfilter.client import Announcement, DeviceConfig, DeviceFleet
from streamfilter.config import Settings
from streamfilter.engine.contract import Reject
from streamfilter.engine.ingest import parse_events
from streamfilter.engine.records import DayAccumulator
from streamfilter.errors import ConfigError
from streamfilter.privacy.noise import RandomBits, SeededRandomBits, SystemRandomBits
from streamfilter.runtime.app import build_daemon, event_source
from streamfilter.runtime.daemon import Daemon
from streamfilter.runtime.io.base import BrokerSource

__all__ = ["SimulationSummary", "device_config", "simulate_local"]


@dataclass
class SimulationSummary:
    devices: int = 0
    days: int = 0
    events: int = 0
    events_rejected: int = 0
    contributions_sent: int = 0
    releases: int = 0
    seconds: float = 0.0
    per_day_seconds: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        # operator-side volume figures of a *simulation*; the real server never sees device ids
        return {
            "devices": self.devices,
            "days": self.days,
            "events": self.events,
            "events_rejected": self.events_rejected,
            "contributions_sent": self.contributions_sent,
            "releases": self.releases,
            "seconds": round(self.seconds, 3),
        }


def device_config(settings: Settings) -> DeviceConfig:
    """The enrolment every device gets: the server's ``[privacy]`` and ``[local]``."""
    params = settings.privacy_params()
    return DeviceConfig.create(
        b_norm=params.b_norm,
        granularity=params.granularity,
        exhaustion=str(params.exhaustion),
        variant=settings.local.variant,
        rho=params.rho,
        sigma_local=settings.local.sigma_local,
        delta=params.delta,
        mechanism=params.mechanism,
        analysts={name: a.share for name, a in settings.analysts.items()},
    )


class _Wire:
    """Where devices send: append to the ``[local]`` file, or produce to its Kafka topic."""

    def __init__(self, settings: Settings) -> None:
        loc = settings.local
        self._fh = None
        self._producer: Any = None
        if loc.kind == "file":
            assert loc.path is not None
            if loc.path.exists() and loc.path.stat().st_size > 0:
                raise ConfigError(
                    f"local.path {loc.path} is not empty; a simulation starts from a fresh wire"
                )
            loc.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(loc.path, "ab")  # noqa: SIM115 - closed in close()
        else:
            from streamfilter.runtime.io.kafka import KafkaSink

            assert loc.topic is not None
            self._producer = KafkaSink(
                loc.topic,
                settings.kafka.client_config(),
                delivery_timeout_s=settings.kafka.delivery_timeout,
            )

    def send(self, lines: list[bytes]) -> None:
        if self._fh is not None:
            self._fh.write(b"".join(line + b"\n" for line in lines))
        else:
            for i, line in enumerate(lines):
                self._producer.publish(str(i), line)

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
        else:
            self._producer.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        else:
            self._producer.close()


def _read_days(settings: Settings, summary: SimulationSummary) -> dict[str, DayAccumulator]:
    """Every event of ``[source]``, validated as the central daemon would, grouped by day."""
    source = event_source(settings, follow=False)
    days: dict[str, DayAccumulator] = {}
    try:
        source.seek({})
        while True:
            batch = source.poll(50_000)
            if not batch and source.at_end():
                break
            for event in parse_events([rec.value for rec in batch]):
                if isinstance(event, Reject):
                    summary.events_rejected += 1
                    continue
                acc = days.get(event.day)
                if acc is None:
                    acc = days[event.day] = DayAccumulator(event.day)
                acc.add(event)
                summary.events += 1
    finally:
        source.close()
    return days


def simulate_local(settings: Settings, *, allow_test_seed: bool = False) -> SimulationSummary:
    """Run the simulation the configuration describes (module docstring)."""
    if settings.mode.kind != "local":
        raise ConfigError("simulate-local needs [mode] kind = 'local' (and a [local] wire)")
    started = time.perf_counter()
    summary = SimulationSummary()
    days = _read_days(settings, summary)
    seed = settings.testing.noise_seed
    # device noise: the OS CSPRNG, or (tests only, with --testing) a seeded generator
    device_bits: RandomBits = SystemRandomBits() if seed is None else SeededRandomBits(seed + 1)
    nonce_bits: RandomBits = SystemRandomBits()
    fleet = DeviceFleet(device_config(settings), device_bits)
    wire = _Wire(settings)  # first: the server's file source opens the wire
    try:
        parts = build_daemon(settings, follow=False, allow_test_seed=allow_test_seed)
    except BaseException:
        wire.close()
        raise
    try:
        daemon = parts.daemon
        assert isinstance(daemon, Daemon)  # local mode: never a cluster worker
        if daemon.engine.last_closed_day is not None:
            raise ConfigError(
                f"state {settings.state.path} already has closed days; the simulated devices "
                "keep their filters in memory, so a simulation needs a fresh state"
            )
        if days:
            day = min(days)
            last = max(days)
            while day <= last:
                t0 = time.perf_counter()
                queries = [Announcement.parse(q) for q in daemon.announce(day)]
                acc = days.pop(day, None)
                if acc is not None and queries:
                    records = acc.finish()
                    ans = fleet.answer(
                        day,
                        queries,
                        records.users,
                        [records.matrix(list(q.coordinates)) for q in queries],
                    )
                    lines = [c.to_json() for c in ans.contributions(day, nonce_bits)]
                    wire.send(lines)
                    summary.contributions_sent += len(lines)
                elif acc is not None:
                    fleet.rows(acc.finish().users)  # enrol the devices; nothing to answer
                wire.flush()
                if isinstance(daemon.source, BrokerSource):
                    daemon.source.mark_end()
                daemon.run(until_end=True, through_day=day)
                summary.days += 1
                summary.per_day_seconds.append(time.perf_counter() - t0)
                day = (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat()
        summary.devices = len(fleet)
        summary.releases = len(daemon.engine.history)
    finally:
        wire.close()
        parts.close()
    summary.seconds = time.perf_counter() - started
    return summary


def write_summary(summary: SimulationSummary, path: Path | None = None) -> str:
    text = json.dumps({"simulation": summary.as_dict()})
    if path is not None:
        path.write_text(text + "\n", encoding="utf-8")
    return text
