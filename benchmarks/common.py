"""Helpers shared by the benchmark modules: timing, medians, the machine, the entry format.

Every entry is a dict with the keys ``run.py`` writes (``name, value, unit, baseline,
baseline_value, ratio``) plus what the table needs to be read correctly: ``ratio_definition``,
``target`` / ``target_met`` (None when the entry has no target), ``runs`` (how many timed runs the
median is over) and ``size``. Nothing here asserts a time.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_seconds(fn: Callable[[], object], runs: int, warmup: bool = True) -> float:
    """Median wall-clock seconds of ``fn()`` over ``runs`` runs (after one untimed warm-up)."""
    if warmup:
        fn()
    return statistics.median(seconds(fn) for _ in range(runs))


def machine() -> dict[str, Any]:
    """CPU model, cores, RAM, Python and OS of this machine (one dict, in every entry)."""
    cpu = platform.processor() or platform.machine()
    ram_gb = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gb = round(int(line.split()[1]) / 1024**2, 1)
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gb": ram_gb,
        "python": platform.python_version(),
        "os": platform.platform(),
    }


def entry(
    name: str,
    *,
    value: float | None,
    unit: str,
    baseline: str,
    baseline_value: float | None,
    ratio: float | None,
    ratio_definition: str,
    runs: int | str,
    size: str,
    target: str | None = None,
    target_met: bool | None = None,
    detail: str = "",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_value": baseline_value,
        "ratio": ratio,
        "ratio_definition": ratio_definition,
        "target": target,
        "target_met": target_met,
        "runs": runs,
        "size": size,
        "detail": detail,
        **extra,
    }


def skipped(name: str, unit: str, baseline: str, reason: str) -> dict[str, Any]:
    """An entry that could not be measured here (e.g. no Kafka broker in ``--quick``)."""
    return entry(
        name,
        value=None,
        unit=unit,
        baseline=baseline,
        baseline_value=None,
        ratio=None,
        ratio_definition="",
        runs=0,
        size="",
        detail=f"skipped: {reason}",
        skipped=reason,
    )


def upkeep_left(state: Path) -> tuple[int, float]:
    """``(entries, seconds)``: the budget-log entries a ``--until-end`` run left for the next
    run's upkeep (docs/design.md §5.1), and the time folding them takes, measured here so that
    the deferred work is reported next to the run that caused it."""
    from streamfilter.runtime.store import SQLiteStateStore

    store = SQLiteStateStore(state)
    try:
        entries = store.excess_log_entries()
        t0 = time.perf_counter()
        left = store.compact(entries)
        elapsed = time.perf_counter() - t0
        assert left == 0, left
        return entries, elapsed
    finally:
        store.close()
