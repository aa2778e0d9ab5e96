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

``baseline_value`` — :func:`numpy_close`: what a user would write instead, in numpy, from the
same decoded columns and the same ledger (sorted arrays of user ids and spent units): group the
cells by user and coordinate (``np.unique`` on fixed-width strings + ``np.bincount``), look the users' budgets up
(``np.searchsorted``), then per query the weighted vector, clip, round to the lattice, keep
``‖r‖² ≤ floor(C²/γ²)`` exactly, admit iff ``spent + cost ≤ B`` and sum; commit by merging the
day's users into the sorted ledger. Same filter: the run checks that it charges every user
exactly what the engine charges. No noise (the engine's is a few draws per release).

Engine and baseline runs are paired and alternate which goes first (``runs`` ≥ 5 pairs), each on
a fresh copy of its ledger taken outside the timer; ratio = median over the pairs of (baseline
seconds ÷ engine seconds).

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
BASELINE = "numpy from the same columns and ledger arrays (benchmarks/bench_engine.py:numpy_close)"
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


def numpy_close(
    columns: tuple[np.ndarray, np.ndarray, np.ndarray],
    ledger_users: np.ndarray,
    ledger_spent: np.ndarray,
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The day close as a numpy user would write it; returns the exact integer sums (lattice
    units) and the new ledger (sorted user ids, spent units)."""
    gamma = PARAMS.granularity
    budget = PARAMS.budget_units
    users, coords, values = columns
    # fixed-width strings: numpy sorts them in C (object arrays compare Python objects)
    u, upos = np.unique(users.astype(str), return_inverse=True)
    names, cpos = np.unique(coords.astype(str), return_inverse=True)
    k = len(names)
    x_all = np.bincount(upos * k + cpos, weights=values, minlength=len(u) * k).reshape(len(u), k)
    at = np.searchsorted(ledger_users, u)
    at_ok = np.minimum(at, max(len(ledger_users) - 1, 0))
    known = (at < len(ledger_users)) & (ledger_users[at_ok] == u) if len(ledger_users) else at < 0
    spent = np.where(known, ledger_spent[at_ok] if len(ledger_spent) else 0, 0).astype(np.int64)
    column = {name: j for j, name in enumerate(names.tolist())}
    totals = []
    for q in queries():
        w = q.weights()
        cap = math.floor(Fraction(q.clip) ** 2 / Fraction(gamma) ** 2)
        radius = min(q.clip / gamma, math.sqrt(cap))
        x = np.zeros((len(u), w.shape[1]))
        for name, row in zip(q.coordinates(), w, strict=True):
            if name in column:
                x += x_all[:, column[name], None] * row
        y = x / gamma
        norm = np.sqrt((y * y).sum(axis=1))
        over = norm > radius
        y[over] *= (radius / norm[over])[:, None]
        r = np.rint(y).astype(np.int64)
        cost = (r * r).sum(axis=1)
        for i in np.flatnonzero(cost > cap):  # keep ‖r‖² ≤ cap exactly (rare)
            while cost[i] > cap:
                j = int(np.argmax(np.abs(r[i])))
                r[i, j] -= 1 if r[i, j] > 0 else -1
                cost[i] = int((r[i] * r[i]).sum())
        fits = spent + cost <= budget
        spent += np.where(fits, cost, 0)
        totals.append(r[fits].sum(axis=0))
    merged_users = np.concatenate([ledger_users, u[~known]])
    merged_spent = ledger_spent.copy()
    merged_spent[at[known]] = spent[known]
    merged_spent = np.concatenate([merged_spent, spent[~known]])
    order = np.argsort(merged_users, kind="stable")
    return totals, merged_users[order], merged_spent[order]


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


def _name(n: int) -> str:
    return f"{n // 1_000_000}m" if n >= 1_000_000 else f"{n // 1000}k"


def _paired(
    arms: dict[str, tuple[Callable[[], object], Callable[[], object]]], pairs: int
) -> dict[str, list[tuple[float, float]]]:
    """``pairs`` rounds of every arm (``(setup, fn)``, setup untimed), the order reversed every
    other round; per arm the (wall, CPU) seconds of each round."""
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    names = list(arms)
    for i in range(pairs):
        for name in names if i % 2 == 0 else names[::-1]:
            setup, fn = arms[name]
            setup()
            gc.collect()
            c0 = time.process_time()
            wall = _timed(fn)
            out[name].append((wall, time.process_time() - c0))
    return out


def bench_day_close(n: int, runs: int = 5) -> dict[str, object]:
    records, records_s, columns = _records(n, min(runs, 3))
    before = ledger_with_history(records)
    before_users = np.array([u for u, _, _ in before.items()], dtype=str)
    before_spent = np.array([s for _, s, _ in before.items()], dtype=np.int64)
    order = np.argsort(before_users, kind="stable")
    before_users, before_spent = before_users[order], before_spent[order]
    state: dict[str, BudgetLedger] = {}
    arrays: dict[str, np.ndarray] = {}
    numpy_out: list[tuple[list[np.ndarray], np.ndarray, np.ndarray]] = []

    def fresh_ledger() -> None:
        state["ledger"] = copy.deepcopy(before)

    def fresh_arrays() -> None:
        arrays["users"], arrays["spent"] = before_users.copy(), before_spent.copy()

    def engine_run() -> None:
        engine_close(DayRecords.from_columns(DAY, *columns), state["ledger"])

    def numpy_run() -> None:
        numpy_out[:] = [numpy_close(columns, arrays["users"], arrays["spent"])]

    # engine and numpy, paired and alternated, each on a fresh copy of its ledger
    rss_before = (_status_kib("VmRSS") or 0) / 1024
    peak_reset = _reset_peak_rss()
    timed = _paired(
        {"engine": (fresh_ledger, engine_run), "numpy": (fresh_arrays, numpy_run)}, runs
    )
    peak_rss = _peak_rss_mib()
    ratios = [b[0] / e[0] for e, b in zip(timed["engine"], timed["numpy"], strict=True)]
    ratios_cpu = [b[1] / e[1] for e, b in zip(timed["engine"], timed["numpy"], strict=True)]
    value = statistics.median(w for w, _ in timed["engine"])
    value_cpu = statistics.median(c for _, c in timed["engine"])
    baseline = statistics.median(w for w, _ in timed["numpy"])
    baseline_cpu = statistics.median(c for _, c in timed["numpy"])
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

    # same filter: the numpy close charges every user what the engine charges
    _, np_users, np_spent = numpy_out.pop()
    engine_spent, _ = after.state(np_users.astype(object))
    if not np.array_equal(engine_spent, np_spent):
        raise AssertionError("the numpy baseline and the engine charged users differently")

    ratio = statistics.median(ratios)
    lb_ratio = value / lower
    return {
        "name": f"engine_day_close_{_name(n)}",
        "value": round(value, 4),
        "unit": "s",
        "baseline": BASELINE,
        "baseline_value": round(baseline, 4),
        "ratio": round(ratio, 2),
        "ratio_definition": "median over paired runs of numpy seconds ÷ engine seconds",
        "target": "lower_bound_ratio ≤ 3" + (", ≤ 64 B/user" if n >= 10_000_000 else ""),
        "target_met": lb_ratio <= 3 and (n < 10_000_000 or per_user <= 64),
        "runs": runs,
        "size": f"{n:,} users with events, 4 queries, d=8",
        "value_cpu_s": round(value_cpu, 4),
        "baseline_cpu_s": round(baseline_cpu, 4),
        "ratio_cpu": round(statistics.median(ratios_cpu), 2),
        "lower_bound": LOWER_BOUND,
        "lower_bound_value": round(lower, 4),
        "lower_bound_ratio": round(lb_ratio, 2),
        "close_s": round(close_s, 4),
        "commit_s": round(commit_s, 4),
        "records_s": round(records_s, 3),
        "engine_peak_alloc_mib": round(engine_alloc / 2**20, 1),
        "peak_rss_mib": round(peak_rss, 1),
        "rss_before_engine_mib": round(rss_before, 1),
        "peak_rss_scope": "engine and numpy runs" if peak_reset else "process lifetime",
        "ledger_bytes_per_user": round(per_user, 1),
        "known_users_after": len(after),
        "profile_s": phases,
        "detail": (
            f"value: DayRecords.from_columns + close_day + ledger commit; baseline: the same "
            f"from the same columns in numpy (group, budgets by searchsorted, clip, round, "
            f"admit, sum, merge the ledger); {runs} pairs, order alternated, paired ratios "
            f"{', '.join(f'{r:.2f}' for r in ratios)}; lower bound: median of "
            f"{runs}; from_columns {records_s:.3f} s + one close {close_s:.3f} s + commit "
            f"{commit_s:.3f} s; ledger "
            f"{per_user:.1f} B/user (tracemalloc) for {len(after):,} users; the day close "
            f"allocates at most {engine_alloc / 2**20:,.0f} MiB; peak RSS "
            f"{peak_rss:,.0f} MiB; profile "
            f"(cProfile, one run, s): {', '.join(f'{k[:-2]} {v:.3f}' for k, v in phases.items())}"
        ),
    }


def run(quick: bool = False, runs: int = 5) -> list[dict[str, object]]:
    """Result entries: ``engine_day_close_30k`` (quick) or ``_1m`` and ``_10m`` (full)."""
    sizes = [30_000] if quick else [1_000_000, 10_000_000]
    return [bench_day_close(n, runs=runs) for n in sizes]


if __name__ == "__main__":
    import json
    import sys

    sizes = [int(a) for a in sys.argv[1:] if a.isdigit()]
    results = [bench_day_close(n) for n in sizes] if sizes else run(quick="--quick" in sys.argv)
    print(json.dumps(results, indent=2))
