"""Throughput of the exact discrete Gaussian sampler against the scalar CKS baseline.

Both sample N_Z(0, s2) exactly with s2 = 4_194_304 (sigma/gamma = 2048) from the OS CSPRNG
(``SystemRandomBits``, the production source; drawing its bits is included in the time):
* ``discrete_gaussian``: CKS Algorithm 3, vectorised with numpy;
* ``discrete_gaussian_reference``: the same algorithms written one sample at a time with Python
  integers (its random words are buffered, 256 per system call, so it is not dominated by
  system-call overhead).
Each value is the median of >= 5 timed runs (after one warm-up); ratio = vectorised ÷ reference;
target: >= 2M samples/s (what a day close of many queries needs). Nothing here asserts a time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from fractions import Fraction

from benchmarks.common import entry
from streamfilter.privacy.noise import (
    SystemRandomBits,
    discrete_gaussian,
    discrete_gaussian_reference,
)

SIGMA2_UNITS = 4_194_304
TARGET = 2_000_000


def _rate(fn: Callable[[int], object], n: int) -> float:
    """Samples per second of one ``fn(n)``."""
    start = time.perf_counter()
    fn(n)
    return n / (time.perf_counter() - start)


def run(quick: bool = False) -> list[dict[str, object]]:
    bits = SystemRandomBits()
    repeats = 5 if quick else 7
    n_vec = 200_000 if quick else 2_000_000
    n_ref = 2_000 if quick else 20_000
    arms = {
        "vec": (lambda n: discrete_gaussian(bits, SIGMA2_UNITS, n), n_vec),
        "ref": (lambda n: discrete_gaussian_reference(bits, Fraction(SIGMA2_UNITS), n), n_ref),
    }
    for fn, _ in arms.values():
        fn(1000)  # warm-up
    rates: dict[str, list[float]] = {"vec": [], "ref": []}
    for i in range(repeats):  # paired, the order alternating
        for name in ("vec", "ref") if i % 2 == 0 else ("ref", "vec"):
            fn, n = arms[name]
            rates[name].append(_rate(fn, n))
    vec, ref = statistics.median(rates["vec"]), statistics.median(rates["ref"])
    ratios = [a / b for a, b in zip(rates["vec"], rates["ref"], strict=True)]
    return [
        entry(
            "noise_discrete_gaussian",
            value=round(vec),
            unit="samples/s",
            baseline="CKS exact scalar sampler (discrete_gaussian_reference)",
            baseline_value=round(ref),
            ratio=round(statistics.median(ratios), 1),
            ratio_definition="median over paired runs of value ÷ baseline (samples/s)",
            target=f"≥ {TARGET:,} samples/s",
            target_met=vec >= TARGET,
            runs=repeats,
            size=f"{n_vec:,} samples (baseline: {n_ref:,})",
            detail=(
                f"exact N_Z(0, s²), s² = {SIGMA2_UNITS} (σ/γ = 2048), bits from the OS CSPRNG "
                "(drawing them is timed); one core"
            ),
        )
    ]


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
