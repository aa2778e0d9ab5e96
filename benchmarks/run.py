"""Run the benchmark suite: ``python -m benchmarks.run [--quick] [--only MODULE ...]
[--out-dir DIR]``.

Writes ``benchmarks/results.json`` — a list of ``{name, value, unit, baseline, baseline_value,
ratio, machine, ...}`` (``machine``: CPU model, cores, RAM, Python, OS; ``module_seconds`` and
``module_cpu_seconds``: the whole module's wall time, set-up included, and its processes' CPU) —
and ``benchmarks/results.md``, the table docs/performance.md includes (a full run also rewrites
it between that page's include markers). ``--quick`` (CI smoke, under a minute:
``tests/system/test_bench_quick.py`` holds it to that) uses smaller sizes and fewer runs and writes
``results-quick.json``/``results-quick.md`` instead (not committed); ``--out-dir`` writes them
elsewhere. Each module runs in its own interpreter (a module that fails, e.g. killed for memory,
becomes a failed entry and the suite goes on). Every entry is measured side by side with its
baseline in the same run; each value is the median of the stated number of runs; nothing here
asserts a time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine, skipped

MODULES = [
    "benchmarks.bench_e2e",  # e2e_file_days: the headline (streamfilter run vs DuckDB)
    "benchmarks.bench_memory",  # open_day_memory: peak RSS at 10 vs 1 events per user
    "benchmarks.bench_ingest",
    "benchmarks.bench_engine",  # engine_day_close_* (owned by the engine work)
    "benchmarks.bench_noise",
    "benchmarks.bench_store",
    "benchmarks.bench_kafka",
    "benchmarks.bench_cluster",  # cluster_vs_single, cluster_workers (1, 2, 4) + scale-out model
    "benchmarks.bench_recovery",
    "benchmarks.bench_local",
    "benchmarks.bench_sparse",
    "benchmarks.bench_learn",  # learn_*_step_*: the learning systems' seconds per step
    "benchmarks.bench_dedup",  # dedup_index_vs_sqlite_*: the event-id index vs SQLite
]
HERE = Path(__file__).resolve().parent
#: docs/performance.md includes benchmarks/results.md between these markers (a full run rewrites it)
BEGIN = "<!-- benchmarks/results.md: begin -->"
END = "<!-- benchmarks/results.md: end -->"


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if value == 0 or 0.01 <= abs(value) < 1e6:
            return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _target(e: dict[str, Any]) -> str:
    if not e.get("target"):
        return "—"
    met = e.get("target_met")
    mark = "" if met is None else (" ✅" if met else " ❌ missed")
    return f"{e['target']}{mark}"


def table(entries: list[dict[str, Any]], where: dict[str, Any], quick: bool) -> str:
    rows = [
        "| benchmark | value | baseline | baseline value | ratio | target | median of |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        if e.get("skipped"):
            label = e["skipped"] if e.get("failed") else f"skipped: {e['skipped']}"
            rows.append(f"| `{e['name']}` | {label} | {e['baseline']} | | | | |")
            continue
        ratio = _fmt(e.get("ratio"))
        if e.get("ratio_definition"):
            ratio += f" ({e['ratio_definition']})"
        runs = e.get("runs")
        median_of = "—" if runs is None else f"{runs} run{'' if runs == 1 else 's'}"
        if e.get("size"):
            median_of += f", {e['size']}"
        rows.append(
            f"| `{e['name']}` | {_fmt(e['value'])} {e['unit']} | {e['baseline']} | "
            f"{_fmt(e['baseline_value'])} {e['unit']} | {ratio} | {_target(e)} | {median_of} |"
        )
    lines = "\n".join(rows)
    machine_line = (
        f"Machine: {where['cpu']}, {where['cores']} cores, {where['ram_gb']} GB RAM, "
        f"Python {where['python']}, {where['os']}."
    )
    note = (
        "**Quick mode** (`--quick`, CI smoke): smaller sizes and fewer runs than `make bench`; "
        "not comparable with the full figures.\n\n"
        if quick
        else ""
    )
    details = "\n".join(
        f"- `{e['name']}`: {e['detail']}"
        for e in entries
        if e.get("detail") and not e.get("skipped")
    )
    return f"{note}{lines}\n\n{machine_line}\n\n{details}\n"


#: how much of a failed module's last stderr line its entry keeps
FAILED_REASON_CHARS = 400


def _run_module(name: str, quick: bool) -> list[dict[str, Any]]:
    """One module in its own interpreter: a fresh heap for each benchmark, and a module that
    dies (e.g. killed for memory) becomes a failed entry instead of ending the suite."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "entries.json"
        args = [sys.executable, "-m", "benchmarks.run", "--child", name, str(out)]
        env = dict(os.environ)
        if quick:  # a smoke on 2 cores: one BLAS thread, no oversubscription (learn: 7 s -> 3 s)
            for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
                env.setdefault(var, "1")
        proc = subprocess.run(
            [*args, *(["--quick"] if quick else [])],
            check=False,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        sys.stderr.write(proc.stderr)
        if proc.returncode == 0 and out.exists():
            entries: list[dict[str, Any]] = json.loads(out.read_text())
            return entries
    reason = f"failed: exit status {proc.returncode}" + (
        " (killed: out of memory?)" if proc.returncode == -9 else ""
    )
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1:]
    if last:  # the exception's own line, so a failed entry says why without the whole log
        reason += f": {last[0].strip()[:FAILED_REASON_CHARS]}"
    short = name.rsplit(".", 1)[-1]
    return [{**skipped(short, "", "", reason), "failed": True}]


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's finished children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke, < 1 min)")
    parser.add_argument("--only", nargs="*", help="module names to run, e.g. bench_ingest")
    parser.add_argument("--child", nargs=2, metavar=("MODULE", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=HERE,
        help="where results[-quick].{json,md} are written (default: benchmarks/; docs/performance.md "
        "is rewritten only by a full run into benchmarks/)",
    )
    parser.add_argument(
        "--render",
        action="store_true",
        help="only rewrite results.md (and docs/performance.md) from results.json",
    )
    args = parser.parse_args()
    if args.render:
        suffix = "-quick" if args.quick else ""
        saved = json.loads((args.out_dir / f"results{suffix}.json").read_text())
        text = table(saved, saved[0]["machine"] if saved else machine(), args.quick)
        (args.out_dir / f"results{suffix}.md").write_text(text)
        if not args.quick and args.out_dir.resolve() == HERE:
            include_in_performance_page(text)
        return
    if args.child:  # inside _run_module's subprocess
        module = importlib.import_module(args.child[0])
        Path(args.child[1]).write_text(json.dumps(module.run(quick=args.quick)))
        return
    entries = []
    where = machine()
    started, cpu_started = time.perf_counter(), _children_cpu_s()
    for name in MODULES:
        if args.only and name.rsplit(".", 1)[-1] not in args.only:
            continue
        t0, cpu0 = time.perf_counter(), _children_cpu_s()
        ran = _run_module(name, args.quick)
        # the module's whole wall time, set-up too, and the CPU its processes used (steadier on
        # a shared machine; a broker's or database's own CPU is not in it)
        module_s = round(time.perf_counter() - t0, 1)
        module_cpu_s = round(_children_cpu_s() - cpu0, 1)
        for entry in ran:
            entry["machine"] = where
            entry.setdefault("quick", args.quick)
            entry.setdefault("module", name.rsplit(".", 1)[-1])
            entry["module_seconds"] = module_s
            entry["module_cpu_seconds"] = module_cpu_s
            entries.append(entry)
            print(json.dumps({k: v for k, v in entry.items() if k != "machine"}), flush=True)
        print(f"# {name}: {module_s:.1f} s (CPU {module_cpu_s:.1f} s)", flush=True)
    total_s, total_cpu_s = time.perf_counter() - started, _children_cpu_s() - cpu_started
    print(f"# total: {total_s:.1f} s (CPU {total_cpu_s:.1f} s)", flush=True)
    suffix = "-quick" if args.quick else ""
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"results{suffix}.json"
    if args.only and out.exists():  # a partial run replaces its modules' entries, keeps the rest
        ran_modules = {e["module"] for e in entries}
        kept = [e for e in json.loads(out.read_text()) if e.get("module") not in ran_modules]
        entries = kept + entries
        order = {m.rsplit(".", 1)[-1]: i for i, m in enumerate(MODULES)}
        entries.sort(key=lambda e: order.get(e.get("module", ""), len(order)))
    out.write_text(json.dumps(entries, indent=2) + "\n")
    text = table(entries, where, args.quick)
    (args.out_dir / f"results{suffix}.md").write_text(text)
    if not args.quick and args.out_dir.resolve() == HERE:
        include_in_performance_page(text)


def include_in_performance_page(text: str) -> None:
    """Put the table between docs/performance.md's include markers (the full figures only)."""
    page = HERE.parent / "docs" / "performance.md"
    try:
        current = page.read_text()
    except OSError:
        return
    start, end = current.find(BEGIN), current.find(END)
    if start < 0 or end < start:
        return
    page.write_text(current[: start + len(BEGIN)] + "\n" + text + current[end:])


if __name__ == "__main__":
    main()
