"""Run the benchmark suite: ``python -m benchmarks.run [--quick]``.

Writes ``benchmarks/results.json`` (a list of ``{name, value, unit, baseline, baseline_value,
ratio, machine}``) and ``benchmarks/results.md`` (the table the README includes). Every entry is
measured side by side with its baseline in the same run; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
from pathlib import Path

MODULES = [
    "benchmarks.bench_engine",
    "benchmarks.bench_noise",
    "benchmarks.bench_sparse",
    "benchmarks.bench_kafka",
    "benchmarks.bench_local",
]
HERE = Path(__file__).resolve().parent


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke, < 1 min)")
    parser.add_argument("--only", nargs="*", help="module names to run")
    args = parser.parse_args()
    entries = []
    where = machine()
    for name in MODULES:
        if args.only and name.rsplit(".", 1)[-1] not in args.only:
            continue
        module = importlib.import_module(name)
        for entry in module.run(quick=args.quick):
            entry["machine"] = where
            entries.append(entry)
            print(json.dumps(entry))
    suffix = "-quick" if args.quick else ""
    (HERE / f"results{suffix}.json").write_text(json.dumps(entries, indent=2) + "\n")
    rows = ["| benchmark | value | baseline | baseline value | ratio |", "|---|---|---|---|---|"]
    for e in entries:
        rows.append(
            f"| `{e['name']}` | {e['value']} {e['unit']} | {e['baseline']} | "
            f"{e['baseline_value']} {e['unit']} | {e['ratio']}× |"
        )
    (HERE / f"results{suffix}.md").write_text("\n".join(rows) + f"\n\nMachine: {where}\n")


if __name__ == "__main__":
    main()
