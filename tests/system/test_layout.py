"""Tests a newcomer finds: ``tests/`` mirrors the package.

The test of ``streamfilter/x/y.py`` is ``tests/x/test_y.py``; a module's tests split by aspect
are ``tests/x/test_y_<aspect>.py``; the test of a C extension ``streamfilter/x/_y.c`` is
``tests/x/test_y.py``. Two folders do not mirror anything: ``tests/system/`` holds the tests of
properties no single module owns (chaos, golden releases, side channels, operability, the
repository's documents and architecture), and ``tests/support/`` holds what tests share (the
real Kafka broker and PostgreSQL server fixtures, helpers). ``tests/benchmarks/`` mirrors the
top-level ``benchmarks/`` package the same way. Every other folder is a package of
``streamfilter/`` and holds only tests.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
PKG = ROOT / "streamfilter"
#: folders of tests/ that mirror no package
UNMIRRORED = {"system", "support"}

#: suites that check one contract against every implementation of it, wherever that lives
CONTRACT_SUITES = {
    "runtime/io/test_broker_source_contract.py": "every broker source of runtime/io/",
    "runtime/io/test_feed_contract.py": "every query feed of runtime/io/",
    "runtime/io/test_sink_contract.py": "every sink of runtime/io/",
    "runtime/io/test_source_contract.py": "every source of runtime/io/",
    "runtime/store/test_store_contract.py": "every state store of runtime/store/",
}
#: files still named after a property rather than their module, each with the place it belongs;
#: moving one there means deleting its entry (test_the_allow_list_holds_only_real_exceptions)
NOT_YET_MIRRORED: dict[str, str] = {}


def _mirrored_folders() -> list[Path]:
    """``tests/`` and its folders outside ``system/`` and ``support/``."""
    out = [TESTS]
    for d in sorted(TESTS.rglob("*")):
        rel = d.relative_to(TESTS)
        if d.is_dir() and rel.parts[0] not in UNMIRRORED and "__pycache__" not in rel.parts:
            out.append(d)
    return out


def _module_names(package: Path) -> set[str]:
    """What a test file in the mirror of ``package`` may be named after."""
    names = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    names |= {p.stem.removeprefix("_") for p in package.glob("_*.c")}
    return names


def _source(rel: Path) -> Path:
    """The package a folder of ``tests/`` mirrors (``tests/benchmarks/`` → ``benchmarks/``)."""
    return PKG.parent / rel if rel.parts[:1] == ("benchmarks",) else PKG / rel


def _names_a_module(test_file: Path) -> bool:
    package = _source(test_file.parent.relative_to(TESTS))
    stem = test_file.stem.removeprefix("test_")
    return any(stem == n or stem.startswith(n + "_") for n in _module_names(package))


def _violations() -> list[str]:
    found = []
    for folder in _mirrored_folders():
        rel = folder.relative_to(TESTS)
        if not (_source(rel) / "__init__.py").exists():
            found.append(f"tests/{rel}/ mirrors no package streamfilter/{rel}/")
            continue
        for f in sorted(folder.glob("*.py")):
            name = f.relative_to(TESTS).as_posix()
            if f.name == "__init__.py" or (f.name == "conftest.py" and folder == TESTS):
                continue
            if not f.name.startswith("test_"):
                found.append(f"tests/{name}: not a test; shared code goes to tests/support/")
            elif not _names_a_module(f) and name not in CONTRACT_SUITES | NOT_YET_MIRRORED:
                found.append(
                    f"tests/{name} names no module of {_source(rel).relative_to(PKG.parent)}/"
                )
    return found


def test_every_test_outside_system_names_its_module():
    assert _violations() == []


def test_the_allow_list_holds_only_real_exceptions():
    """An entry whose file is gone, or that would now pass the rule, is removed from the list."""
    for name in CONTRACT_SUITES | NOT_YET_MIRRORED:
        f = TESTS / name
        assert f.exists(), f"{name}: no such file; delete its allow-list entry"
        assert not _names_a_module(f), f"{name} names its module now; delete its entry"


def test_the_rule_sees_a_misplaced_test(tmp_path, monkeypatch):
    """The check itself can fail: a property-named file in a mirrored folder, a helper module
    there and a folder with no package behind it are each reported."""
    tests = tmp_path / "tests"
    pkg = tmp_path / "streamfilter"
    for d in (pkg / "engine", tests / "engine", tests / "nowhere", tests / "system"):
        d.mkdir(parents=True)
    (pkg / "engine" / "__init__.py").touch()
    (pkg / "engine" / "day.py").touch()
    (pkg / "engine" / "_cells.c").touch()
    for name in ("test_day.py", "test_day_partial.py", "test_cells.py", "test_stuff.py"):
        (tests / "engine" / name).touch()
    (tests / "engine" / "harness.py").touch()
    (tests / "system" / "test_anything.py").touch()
    (pkg / "__init__.py").touch()
    monkeypatch.setattr(sys.modules[__name__], "TESTS", tests)
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    assert _violations() == [
        "tests/engine/harness.py: not a test; shared code goes to tests/support/",
        "tests/engine/test_stuff.py names no module of streamfilter/engine/",
        "tests/nowhere/ mirrors no package streamfilter/nowhere/",
    ]
