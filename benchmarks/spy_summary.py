"""Summarise a py-spy profile of a benchmark: where the time goes under one function.

Record (py-spy is in the dev extra; sampling, so the profiled code runs unchanged)::

    py-spy record --rate 250 --format raw -o daemon.raw -- \\
        .venv/bin/python -m benchmarks.bench_kafka
    .venv/bin/python -m benchmarks.spy_summary daemon.raw "_daemon ("

prints the share of samples under stacks that contain the marker (here: the daemon runs of
``bench_kafka``, not the topic filling or the bare consumer): by leaf function (self) and by
every frame on the stack (inclusive), line numbers merged.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path


def summarise(raw: Path, marker: str) -> tuple[int, Counter[str], Counter[str]]:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if marker not in stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    return total, own, inclusive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("raw", type=Path, help="py-spy --format raw output")
    parser.add_argument("marker", help="keep stacks containing this text, e.g. '_daemon ('")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    total, own, inclusive = summarise(args.raw, args.marker)
    print(f"{total} samples under {args.marker!r}")
    print("self:")
    for frame, n in own.most_common(args.top):
        print(f"  {100 * n / max(total, 1):5.1f}%  {frame}")
    print("inclusive:")
    for frame, n in inclusive.most_common(args.top * 3):
        print(f"  {100 * n / max(total, 1):5.1f}%  {frame}")


if __name__ == "__main__":
    main()
