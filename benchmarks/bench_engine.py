"""Day close: the vectorised engine next to a per-user Python filter and a numpy lower bound.

One day: ``n`` users with events (one event each: ``active``, ``minutes``, ``sessions`` and a
``plan``), half of them already charged on earlier days (some close to exhausted), 4 queries,
d = 8 in total (sum d=1, histogram d=3, linear d=2, sum d=2), exhaustion ``skip``.

What is timed, each from the same :class:`DayRecords` and the same ledger state:

``value`` — the engine: building the day's records from its decoded columns
(``DayRecords.from_columns``: group by user and coordinate, canonical order — the dominant step,
and part of closing a day), then ``close_day`` (budget lookups, one matrix for all queries, clip → lattice
rounding → exact integer cost → admission → exact integer sums, noise) plus the commit of the
day into the ledger (``BudgetLedger.apply``). Median of ``runs`` runs, each on a fresh copy of the
ledger taken outside the timer.

``baseline_value`` — :func:`baseline_close`: the straightforward implementation, one Python
iteration per user and query over dicts (records as ``{user: {coordinate: value}}``, budgets in
a ``{user: spent}`` dict updated in place). Same filter: the run checks that it charges every
user exactly what the engine charges. Median of ``baseline_runs`` runs (fewer: it is slow).

``lower_bound_value`` — :func:`lower_bound`: the least any implementation does with these
records, in numpy: gather the day's cells, as lattice integers, into the integer contribution
matrix the engine sums — users × 8 (the 4 queries' coordinates side by side; the cell → column
layout is computed outside the timer) — and sum its columns. No budgets, no clipping, no
rounding, no weights. ``lower_bound_ratio`` = value / lower bound (target ≤ 3).

Also reported: ``value_cpu_s``/``baseline_cpu_s``/``ratio_cpu`` (medians of the process CPU
time of the same runs: steadier than wall time on a shared machine; the engine runs on one
thread), ``records_s`` (the part of ``value`` spent in ``DayRecords.from_columns``; the per-user
baseline and the lower bound start from the built records), ``peak_rss_mib`` (the process's peak
resident memory during the engine runs: records, ledger copies and the engine's temporaries) and ``ledger_bytes_per_user``
(the ledger's memory after the day, measured with ``tracemalloc`` on a copy, divided by the
number of known users) and ``engine_peak_alloc_mib`` (``tracemalloc`` peak of what one close +
commit allocates on top of the records and the ledger).
"""

from __future__ import annotations

import copy
import gc
import math
import resource
import statistics
import time
import tracemalloc
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np

from streamfilter.engine.contract import parse_query
from streamfilter.engine.day import close_day
from streamfilter.engine.ledger import BudgetLedger
from streamfilter.engine.params import PrivacyParams
from streamfilter.engine.queries import AnyQuery
from streamfilter.engine.records import DayRecords
from streamfilter.privacy.noise import SeededRandomBits

QUERIES = [
    {
        "query_id": "active",
        "kind": "sum",
        "features": ["active"],
        "clip": 1.0,
        "from_day": "2026-01-01",
    },
    {
        "query_id": "plans",
        "kind": "histogram",
        "feature": "plan",
        "categories": ["free", "pro", "team"],
        "clip": 1.0,
        "from_day": "2026-01-01",
    },
    {
        "query_id": "mix",
        "kind": "linear",
        "weights": {"active": [1, 0], "minutes": [0, 0.01]},
        "clip": 2.0,
        "from_day": "2026-01-01",
    },
    {
        "query_id": "pair",
        "kind": "sum",
        "features": ["active", "sessions"],
        "clip": 3.0,
        "from_day": "2026-01-01",
    },
]
PARAMS = PrivacyParams.create(b_norm=8.0, rho=0.5, granularity=2.0**-10)
DAY = "2026-01-05"
BASELINE = "per-user Python loop over dicts (benchmarks/bench_engine.py:baseline_close)"
LOWER_BOUND = "numpy: gather the cells into the integer (users × 8) matrix, sum it (lower_bound)"


def make_columns(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The day's decoded columns (what ``DayAccumulator`` collects): one event per user."""
    rng = np.random.default_rng(seed)
    users = np.array([f"u-{i}" for i in range(n)], dtype=object)
    plans = np.array(["plan=free", "plan=pro", "plan=team"], dtype=object)[rng.integers(0, 3, n)]
    coords = np.concatenate(
        [
            np.full(n, "active", object),
            np.full(n, "minutes", object),
            np.full(n, "sessions", object),
            plans,
        ]
    )
    values = np.concatenate(
        [
            np.ones(n),
            np.round(rng.gamma(2.0, 6.0, n), 1),
            rng.integers(1, 4, n).astype(float),
            np.ones(n),
        ]
    )
    # the four values of a user come from one event: the same str object, like the accumulator
    return np.tile(users, 4), coords, values


def make_day(n: int, seed: int = 0) -> DayRecords:
    return DayRecords.from_columns(DAY, *make_columns(n, seed))


def ledger_with_history(records: DayRecords, seed: int = 1) -> BudgetLedger:
    """Half the users have already spent part of their budget (some close to exhausted)."""
    rng = np.random.default_rng(seed)
    ledger = BudgetLedger()
    users = records.users[::2]
    spent = rng.integers(0, PARAMS.budget_units, len(users)).astype(np.int64)
    ledger.apply(users, spent, np.zeros(len(users), bool))
    return ledger


def queries() -> list[AnyQuery]:
    return [parse_query(q) for q in QUERIES]


def engine_close(records: DayRecords, ledger: BudgetLedger) -> list[list[float]]:
    """The engine's day close and commit (``Engine.prepare_day`` + ``commit_day`` minus I/O)."""
    out = close_day(records, queries(), ledger, PARAMS, SeededRandomBits(0))
    ledger.apply(out.changed_users, out.spent_units, out.retired)
    return [r.value for r in out.releases]


def baseline_close(records: DayRecords, spent: dict[str, int]) -> list[list[int]]:
    """The straightforward implementation: per-user Python loop over dicts.

    Records become ``{user: {coordinate: value}}``; each query walks every user: the vector
    ``Σ value·weight``, clip to ``C``, round to the lattice, keep ``‖r‖² ≤ floor(C²/γ²)``
    exactly, admit iff ``spent + cost ≤ B`` and add. ``spent`` is updated in place. Returns the
    exact integer sums (lattice units).
    """
    gamma = PARAMS.granularity
    budget = PARAMS.budget_units
    users = records.users.tolist()
    names = records.coord_names.tolist()
    rows: dict[str, dict[str, float]] = {}
    for u, c, v in zip(
        records.user_pos.tolist(), records.coord.tolist(), records.value.tolist(), strict=True
    ):
        rows.setdefault(users[u], {})[names[c]] = v
    totals = []
    for q in queries():
        coords, w = q.coordinates(), q.weights().tolist()
        cap = math.floor(Fraction(q.clip) ** 2 / Fraction(gamma) ** 2)
        radius = min(q.clip / gamma, math.sqrt(cap))
        d = len(w[0])
        total = [0] * d
        for user, rec in rows.items():
            x = [0.0] * d
            for name, row in zip(coords, w, strict=True):
                val = rec.get(name, 0.0)
                if val:
                    for j in range(d):
                        x[j] += val * row[j]
            y = [t / gamma for t in x]
            norm = math.sqrt(sum(t * t for t in y))
            if norm > radius:
                y = [t * (radius / norm) for t in y]
            r = [round(t) for t in y]
            cost = sum(t * t for t in r)
            while cost > cap:  # keep ‖r‖² ≤ cap exactly
                j = max(range(d), key=lambda k: abs(r[k]))
                r[j] -= 1 if r[j] > 0 else -1
                cost = sum(t * t for t in r)
            s = spent.get(user, 0)
            if s + cost <= budget:
                spent[user] = s + cost
                for j in range(d):
                    total[j] += r[j]
        totals.append(total)
    return totals


def lower_bound_inputs(records: DayRecords) -> tuple[np.ndarray, np.ndarray, int]:
    """The layout of the integer contribution matrix (untimed): for every (cell, column) pair —
    a cell goes to each query column of its coordinate — the flat index of its place in the
    column-major (users × 8) matrix, and its value in lattice units."""
    units = np.rint(records.value / PARAMS.granularity).astype(np.int64)
    names = records.coord_names.tolist()
    columns = [c for q in queries() for c in q.coordinates()]  # 8 columns
    n = records.n_users
    flat, vals = [], []
    for j, name in enumerate(columns):
        cells = (
            np.flatnonzero(records.coord == names.index(name))
            if name in names
            else np.zeros(0, np.int64)
        )
        flat.append(j * n + records.user_pos[cells])
        vals.append(units[cells])
    return np.concatenate(flat), np.concatenate(vals), len(columns)


def lower_bound(records: DayRecords, inputs: tuple[np.ndarray, np.ndarray, int]) -> np.ndarray:
    """Gather the cells into the integer (users × 8) contribution matrix and sum its columns:
    numpy and nothing else — no budgets, no clipping, no rounding, no weights."""
    flat, vals, k = inputs
    m = np.zeros(records.n_users * k, np.int64)
    m[flat] = vals
    total: np.ndarray = m.reshape(k, records.n_users).sum(axis=1)
    return total


# -- measurement helpers ------------------------------------------------------------------------


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _median(
    fn: Callable[[], object], runs: int, setup: Callable[[], object] | None = None
) -> float:
    return _medians(fn, runs, setup)[0]


def _medians(
    fn: Callable[[], object], runs: int, setup: Callable[[], object] | None = None
) -> tuple[float, float]:
    """Median wall-clock and median CPU seconds (this process) of ``fn`` over ``runs`` runs.

    The CPU time is what the run itself used: on a machine shared with other work it is the
    steadier of the two (the engine runs on one thread).
    """
    wall, cpu = [], []
    for _ in range(runs):
        if setup is not None:
            setup()
        gc.collect()
        c0 = time.process_time()
        wall.append(_timed(fn))
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident high-water mark (Linux ``clear_refs`` 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_mib() -> float:
    hwm = _status_kib("VmHWM")
    if hwm is None:  # not Linux: the process's lifetime peak
        hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return hwm / 1024


def _close_then_commit(records: DayRecords, ledger: BudgetLedger) -> tuple[float, float]:
    """One engine run, its two halves timed separately."""
    t0 = time.perf_counter()
    out = close_day(records, queries(), ledger, PARAMS, SeededRandomBits(0))
    t1 = time.perf_counter()
    ledger.apply(out.changed_users, out.spent_units, out.retired)
    return t1 - t0, time.perf_counter() - t1


#: the day close's phases, as cProfile names them: (label, module file suffix, function)
_PHASES = [
    ("locate", "engine/ledger.py", "locate"),
    ("state", "engine/ledger.py", "state_at"),
    ("matrix", "engine/records.py", "matrix"),
    ("filter", "privacy/individual_filter.py", "filter_totals"),
    ("queries", "engine/day.py", "_filter_day"),
    ("close", "engine/day.py", "close_day"),
    ("commit", "engine/ledger.py", "apply"),
]


def profile_phases(records: DayRecords, ledger: BudgetLedger) -> dict[str, float]:
    """Where one close + commit spends its time (cProfile cumulative seconds, one run on
    ``ledger``): ledger lookups, building the record matrix, the filter (clip, round and admit:
    one native pass per row where ``privacy/_filter.c`` is built), the rest of the query loop,
    the rest of the close (outcome, changed users) and the ledger commit."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    engine_close(records, ledger)
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    cum = {label: 0.0 for label, _, _ in _PHASES}
    for (path, _, func), (_, _, _, ct, _) in stats.items():
        for label, suffix, name in _PHASES:
            if func == name and path.replace("\\", "/").endswith(suffix):
                cum[label] += ct
    return {
        "ledger_lookup_s": round(cum["locate"] + cum["state"], 4),
        "record_matrix_s": round(cum["matrix"], 4),
        "filter_s": round(cum["filter"], 4),
        "query_loop_rest_s": round(cum["queries"] - cum["filter"] - cum["matrix"], 4),
        "close_rest_s": round(cum["close"] - cum["queries"] - cum["locate"] - cum["state"], 4),
        "ledger_commit_s": round(cum["commit"], 4),
    }


def _allocation_peak(fn: Callable[[], object]) -> int:
    """Peak bytes allocated (``tracemalloc``, numpy arrays included) while ``fn`` runs."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fn()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak


def ledger_bytes(ledger: BudgetLedger) -> int:
    """The ledger's memory, measured: what ``tracemalloc`` sees allocated by a deep copy."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        clone = copy.deepcopy(ledger)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del clone
    return used


def _records(
    n: int, runs: int
) -> tuple[DayRecords, float, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The day's decoded columns, its records and the median time to build them."""
    columns = make_columns(n)
    seconds = _median(lambda: DayRecords.from_columns(DAY, *columns), runs)
    return DayRecords.from_columns(DAY, *columns), seconds, columns


def _baseline(
    records: DayRecords, before: BudgetLedger, runs: int
) -> tuple[float, float, dict[str, int]]:
    """Median time of :func:`baseline_close`, each run on a fresh ``{user: spent}`` dict."""
    spent_before = {u: s for u, s, _ in before.items()}
    spent: dict[str, int] = {}

    def fresh_dict() -> None:
        spent.clear()
        spent.update(spent_before)

    wall, cpu = _medians(lambda: baseline_close(records, spent), runs, fresh_dict)
    return wall, cpu, spent


def _name(n: int) -> str:
    return f"{n // 1_000_000}m" if n >= 1_000_000 else f"{n // 1000}k"


def bench_day_close(n: int, runs: int = 5, baseline_runs: int = 3) -> dict[str, object]:
    records, records_s, columns = _records(n, min(runs, 3))
    before = ledger_with_history(records)
    state: dict[str, BudgetLedger] = {}

    def fresh_ledger() -> None:
        state["ledger"] = copy.deepcopy(before)

    # engine: close + commit, each run on a fresh copy of the ledger
    rss_before = (_status_kib("VmRSS") or 0) / 1024
    peak_reset = _reset_peak_rss()
    value, value_cpu = _medians(
        lambda: engine_close(DayRecords.from_columns(DAY, *columns), state["ledger"]),
        runs,
        fresh_ledger,
    )
    peak_rss = _peak_rss_mib()
    fresh_ledger()
    after = state.pop("ledger")
    close_s, commit_s = _close_then_commit(records, after)
    per_user = ledger_bytes(after) / len(after)
    fresh_ledger()
    engine_alloc = _allocation_peak(lambda: engine_close(records, state.pop("ledger")))
    fresh_ledger()
    phases = profile_phases(records, state.pop("ledger"))

    inputs = lower_bound_inputs(records)
    lower = _median(lambda: lower_bound(records, inputs), runs)

    # baseline last (it builds millions of Python objects); same filter: same charges
    baseline, baseline_cpu, baseline_spent = _baseline(records, before, baseline_runs)
    engine_spent, _ = after.state(records.users)
    if baseline_spent != {u: int(s) for u, s in zip(records.users, engine_spent, strict=True) if s}:
        raise AssertionError("the baseline and the engine charged users differently")
    del baseline_spent

    ratio = baseline / value
    lb_ratio = value / lower
    return {
        "name": f"engine_day_close_{_name(n)}",
        "value": round(value, 4),
        "unit": "s",
        "baseline": BASELINE,
        "baseline_value": round(baseline, 3),
        "ratio": round(ratio, 1),
        "ratio_definition": "baseline / value",
        "target": "ratio ≥ 50, lower_bound_ratio ≤ 3"
        + (", ≤ 64 B/user" if n >= 10_000_000 else ""),
        "target_met": ratio >= 50 and lb_ratio <= 3 and (n < 10_000_000 or per_user <= 64),
        "runs": runs,
        "baseline_runs": baseline_runs,
        "size": f"{n:,} users with events, 4 queries, d=8",
        "value_cpu_s": round(value_cpu, 4),
        "baseline_cpu_s": round(baseline_cpu, 3),
        "ratio_cpu": round(baseline_cpu / value_cpu, 1),
        "lower_bound": LOWER_BOUND,
        "lower_bound_value": round(lower, 4),
        "lower_bound_ratio": round(lb_ratio, 2),
        "close_s": round(close_s, 4),
        "commit_s": round(commit_s, 4),
        "records_s": round(records_s, 3),
        "engine_peak_alloc_mib": round(engine_alloc / 2**20, 1),
        "peak_rss_mib": round(peak_rss, 1),
        "rss_before_engine_mib": round(rss_before, 1),
        "peak_rss_scope": "engine runs" if peak_reset else "process lifetime",
        "ledger_bytes_per_user": round(per_user, 1),
        "known_users_after": len(after),
        "profile_s": phases,
        "detail": (
            f"value: DayRecords.from_columns + close_day + ledger commit, median of {runs} runs; "
            f"baseline: median of {baseline_runs} (from built records); lower bound: median of "
            f"{runs}; from_columns {records_s:.3f} s + one close {close_s:.3f} s + commit "
            f"{commit_s:.3f} s; ledger "
            f"{per_user:.1f} B/user (tracemalloc) for {len(after):,} users; the day close "
            f"allocates at most {engine_alloc / 2**20:,.0f} MiB; peak RSS "
            f"{peak_rss:,.0f} MiB ({'engine runs' if peak_reset else 'process'}); profile "
            f"(cProfile, one run, s): {', '.join(f'{k[:-2]} {v:.3f}' for k, v in phases.items())}"
        ),
    }


def _baseline_runs(n: int) -> int:
    """3 runs of the per-user loop up to 1M users (~15 s each), 1 at 10M (~2-3 min)."""
    return 3 if n <= 1_000_000 else 1


def run(quick: bool = False, runs: int = 5) -> list[dict[str, object]]:
    """Result entries: ``engine_day_close_30k`` (quick, ~3 s) or ``_1m`` and ``_10m`` (full,
    ~1 and ~6 minutes; the 10M run peaks at ~13 GiB resident, mostly the baseline's dicts)."""
    sizes = [30_000] if quick else [1_000_000, 10_000_000]
    return [bench_day_close(n, runs=runs, baseline_runs=_baseline_runs(n)) for n in sizes]


if __name__ == "__main__":
    import json
    import sys

    sizes = [int(a) for a in sys.argv[1:] if a.isdigit()]
    if sizes:
        results = [bench_day_close(n, baseline_runs=_baseline_runs(n)) for n in sizes]
    else:
        results = run(quick="--quick" in sys.argv)
    print(json.dumps(results, indent=2))
