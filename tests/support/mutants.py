"""Mutation check of the privacy core: every mutant must be killed by the tests named for it.

``python -m tests.support.mutants`` (``make mutants``; CI runs it from ``.ci/run``). For each mutant: copy
``streamfilter/`` and ``tests/`` to a temporary directory, apply one textual patch (the original
text must occur exactly once), rebuild the one C extension when the patch is to C, and run the
mutant's tests there in a subprocess with ``pytest -x`` (``--jobs`` at once, default one per
core; the same tests also run on an unmutated copy, which must pass). A mutant whose tests all pass
*survives*; the run lists each mutant with the test that killed it and exits 1 if any survived
(or if a patch no longer applies, so that the list cannot silently go stale).

The ``python`` mutants of code that has a native twin (``privacy/_filter.c``) remove that
extension from the copy, so that the patched Python path is the one that runs; the ``c`` mutants
patch the twin and rebuild it with the flags of ``pyproject.toml``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTEST = ("-o", "addopts=")  # the ini's "-ra" would list passes too


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    original: str
    replacement: str
    tests: tuple[str, ...]  # pytest node ids, run in this order with -x
    drop_native: bool = False  # run the Python twin: remove privacy/_filter*.so from the copy


STATISTICAL = "tests/system/test_accuracy_statement.py::test_each_release_draws_the_calibrated_noise_and_states_the_bound_it_holds"
COVERAGE = "tests/telemetry/test_coverage.py::test_coverage_estimates_are_unbiased_with_the_oracle_variance_and_hold_95_percent"
EPOCHS = "tests/telemetry/test_coverage.py::test_the_epoch_counter_is_unbiased_with_the_oracle_variance_across_epochs"
ACTIVE = "tests/system/test_telemetry.py::test_the_estimate_draws_the_oracle_variance"
NATIVE_EDGE = "tests/privacy/test_filter.py::test_the_rounding_fallback_paths_agree"
NATIVE_TIES = "tests/privacy/test_filter.py::test_rounding_at_the_edges_of_the_coordinate_range"
THM49 = "tests/privacy/test_accounting.py::test_thm49_rho_is_the_paper_closed_form"
GDP = "tests/privacy/test_accounting.py::test_gdp_epsilon_against_dp_accounting"
ODOMETER = "tests/privacy/test_accuracy_odometer.py::test_discretised_odometer_examples"
BUDGET = "tests/cli/test_budget.py::test_the_odometer_rounds_up_to_whole_steps_and_never_exceeds_the_budget"

MUTANTS = (
    Mutant(
        "admission <= → < (Python)",
        "streamfilter/privacy/individual_filter.py",
        "fits = cost <= remaining",
        "fits = cost < remaining",
        ("tests/privacy/test_individual_filter.py::test_skip_admits_iff_spent_plus_cost_fits",),
        drop_native=True,
    ),
    Mutant(
        "admission <= → < (C twin)",
        "streamfilter/privacy/_filter.c",
        "int fits = st.cost[k] <= remaining",
        "int fits = st.cost[k] < remaining",
        (NATIVE_EDGE,),
    ),
    Mutant(
        "lattice rounding rint → trunc (Python)",
        "streamfilter/privacy/lattice.py",
        "r = np.rint(y).astype(np.int64)",
        "r = np.trunc(y).astype(np.int64)",
        ("tests/privacy/test_lattice.py::test_rounding_is_nearest_ties_to_even_when_it_fits",),
        drop_native=True,
    ),
    Mutant(
        "lattice rounding nearest → trunc (C twin)",
        "streamfilter/privacy/_filter.c",
        "    return bits - base;\n",
        "    (void)bits; (void)base; return (int64_t)v;\n",
        (NATIVE_TIES,),
    ),
    Mutant(
        "σ calibration ×√2 (σ = sqrt(B/ρ))",
        "streamfilter/privacy/accounting.py",
        "        sigma = math.nextafter(sigma, math.inf)\n    return sigma\n",
        "        sigma = math.nextafter(sigma, math.inf)\n    return sigma * math.sqrt(2.0)\n",
        (STATISTICAL,),
    ),
    Mutant(
        "σ calibration ÷√2",
        "streamfilter/privacy/accounting.py",
        "        sigma = math.nextafter(sigma, math.inf)\n    return sigma\n",
        "        sigma = math.nextafter(sigma, math.inf)\n    return sigma / math.sqrt(2.0)\n",
        (STATISTICAL,),
    ),
    Mutant(
        "lattice noise variance ×2 (s² = ceil(2σ²/γ²))",
        "streamfilter/privacy/lattice.py",
        "units = math.ceil(Fraction(sigma) ** 2 / self.gamma**2)",
        "units = math.ceil(2 * Fraction(sigma) ** 2 / self.gamma**2)",
        (STATISTICAL,),
    ),
    Mutant(
        "lattice noise variance ÷2 (s² = ceil(σ²/(2γ²)))",
        "streamfilter/privacy/lattice.py",
        "units = math.ceil(Fraction(sigma) ** 2 / self.gamma**2)",
        "units = math.ceil(Fraction(sigma) ** 2 / (2 * self.gamma**2))",
        (STATISTICAL,),
    ),
    Mutant(
        "coverage/continual noise without the factor m",
        "streamfilter/privacy/continual.py",
        "s2 = math.ceil(Fraction(self.counters * h.bit_length()) / (2 * Fraction(float(self.rho))))",
        "s2 = math.ceil(Fraction(h.bit_length()) / (2 * Fraction(float(self.rho))))",
        (EPOCHS, COVERAGE),
    ),
    Mutant(
        "coverage/continual σ ×√2 (s² = ceil(m·L/ρ))",
        "streamfilter/privacy/continual.py",
        "s2 = math.ceil(Fraction(self.counters * h.bit_length()) / (2 * Fraction(float(self.rho))))",
        "s2 = math.ceil(Fraction(self.counters * h.bit_length()) / Fraction(float(self.rho)))",
        (EPOCHS, COVERAGE),
    ),
    Mutant(
        "binary-tree counter (active set) variance ÷2",
        "streamfilter/privacy/continual.py",
        "s2 = math.ceil(Fraction(h.bit_length()) / (2 * Fraction(float(rho))))",
        "s2 = math.ceil(Fraction(h.bit_length()) / (4 * Fraction(float(rho))))",
        (ACTIVE,),
    ),
    Mutant(
        "odometer rounds down (floor instead of ceil)",
        "streamfilter/privacy/odometer.py",
        "return -(-spent // step) * step",
        "return (spent // step) * step",
        (ODOMETER, BUDGET),
    ),
    Mutant(
        "realized ρ halved (units/(4·s²))",
        "streamfilter/privacy/odometer.py",
        "return Fraction(units) / (2 * Fraction(variance_units))",
        "return Fraction(units) / (4 * Fraction(variance_units))",
        ("tests/privacy/test_accuracy_odometer.py::test_user_loss",),
    ),
    Mutant(
        "ρ → ε (Theorem 4.9 closed form) without the factor 2",
        "streamfilter/privacy/accounting.py",
        "return _up(r + 2.0 * math.sqrt(r * log_inv_delta), _CLOSED_FORM_MARGIN)",
        "return _up(r + math.sqrt(r * log_inv_delta), _CLOSED_FORM_MARGIN)",
        (THM49,),
    ),
    Mutant(
        "ρ → ε (GDP) with μ = sqrt(ρ)",
        "streamfilter/privacy/accounting.py",
        "return math.nextafter(math.sqrt(2.0 * r), math.inf)",
        "return math.nextafter(math.sqrt(r), math.inf)",
        (GDP,),
    ),
    Mutant(
        "ε → ρ (Theorem 4.9) ×2",
        "streamfilter/privacy/accounting.py",
        "return _down((e / denominator) ** 2, _CLOSED_FORM_MARGIN)",
        "return _down(2 * (e / denominator) ** 2, _CLOSED_FORM_MARGIN)",
        (THM49,),
    ),
)


def _build_c(source: Path) -> None:
    """Rebuild one extension in place with the flags setup.py declares for it."""
    spec = (ROOT / "setup.py").read_text()
    rel = source.relative_to(source.parents[1]).with_suffix("").as_posix()  # e.g. privacy/_filter
    line = next(x for x in spec.splitlines() if f'extension("{rel}"' in x)
    flags = ["-Wall", "-Wextra", *re.findall(r'"(-[^"]+)"', line)]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = source.with_name(source.stem + suffix)
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    cmd = [
        *cc,
        "-shared",
        "-fPIC",
        *flags,
        f"-I{sysconfig.get_paths()['include']}",
        f"-I{source.parents[1] / '_native'}",
        str(source),
        "-o",
        str(target),
    ]
    subprocess.run(cmd, check=True, capture_output=True)


def run(mutant: Mutant, workdir: Path) -> tuple[str | None, float]:
    """Apply ``mutant`` to a fresh copy; return (the test that killed it or None, seconds)."""
    start = time.monotonic()
    copy = workdir / re.sub(r"\W+", "_", mutant.name)
    _copy_tree(copy)
    target = copy / mutant.path
    text = target.read_text()
    if text.count(mutant.original) != 1:
        raise SystemExit(f"{mutant.name}: the original text occurs {text.count(mutant.original)}×")
    target.write_text(text.replace(mutant.original, mutant.replacement))
    if target.suffix == ".c":
        _build_c(target)
    if mutant.drop_native:
        for so in (copy / "streamfilter" / "privacy").glob("_filter*.so"):
            so.unlink()
    out = _pytest(copy, mutant.tests)
    killer = None
    if out.returncode != 0:
        failed = re.findall(r"^FAILED (\S+)", out.stdout, re.M)
        killer = failed[0] if failed else f"exit {out.returncode}: {out.stdout[-300:]}"
    return killer, time.monotonic() - start


def _copy_tree(copy: Path) -> None:
    """``streamfilter/`` and ``tests/`` copied (built extensions included); the rest linked."""
    shutil.copytree(ROOT / "streamfilter", copy / "streamfilter", symlinks=True)
    shutil.copytree(ROOT / "tests", copy / "tests", symlinks=True)
    for name in ("pyproject.toml", "deploy", "docs", "examples"):
        src = ROOT / name
        if src.is_dir():
            (copy / name).symlink_to(src, target_is_directory=True)
        elif src.exists():
            shutil.copy(src, copy / name)


def _pytest(copy: Path, tests: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """``pytest -x`` on ``tests`` in ``copy``, importing ``streamfilter`` from the copy."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTHONPATH")}
    env["PYTHONPATH"] = str(copy)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    check = subprocess.run(
        [sys.executable, "-c", "import streamfilter; print(streamfilter.__file__)"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert check.stdout.strip().startswith(str(copy)), check.stdout  # the copy, not the tree
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-rf",
            "-p",
            "no:cacheprovider",
            *PYTEST,
            *tests,
        ],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
    )


def _baseline(workdir: Path, tests: tuple[str, ...]) -> float:
    """The mutants' tests pass on an unmutated copy: a kill is the mutant's, not the copy's."""
    start = time.monotonic()
    _copy_tree(workdir / "unmutated")
    out = _pytest(workdir / "unmutated", tests)
    if out.returncode != 0:
        print(out.stdout[-3000:], out.stderr[-3000:])
        raise SystemExit("the mutants' tests fail on an unmutated copy")
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="run only mutants whose name contains this")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if args.k in m.name]
    tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
    survivors = 0
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="streamfilter-mutants-") as tmp,
        ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool,
    ):
        baseline = pool.submit(_baseline, Path(tmp), tests)
        results = pool.map(lambda m: run(m, Path(tmp)), chosen)
        for mutant, (killer, seconds) in zip(chosen, results, strict=True):
            status = f"killed by {killer}" if killer else "SURVIVED"
            print(f"{mutant.name:52s} {seconds:5.1f} s  {status}", flush=True)
            survivors += killer is None
        print(f"{'(the same tests, unmutated copy)':52s} {baseline.result():5.1f} s  pass")
    total = time.monotonic() - started
    print(f"mutants: {len(chosen)} in {total:.0f} s, ", end="")
    print(f"{survivors} survived" if survivors else "every mutant was killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
