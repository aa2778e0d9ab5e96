"""Dependencies point one way: privacy ← engine ← runtime ← cli; the cores do no I/O.

``learn`` (the papers' learning experiments, issue #19) sits beside the runtime: it imports only
the privacy core, and nothing in the daemon, engine or client imports it."""

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "streamfilter"


def test_importing_the_cores_loads_no_io_library():
    code = (
        "import sys\n"
        "import streamfilter.privacy.lattice, streamfilter.privacy.individual, streamfilter.privacy.noise\n"
        "import streamfilter.privacy.accounting, streamfilter.engine.monitor, streamfilter.engine.day\n"
        "from streamfilter import Monitor\n"
        "bad = [m for m in ('kafka', 'prometheus_client', 'sqlite3', '_sqlite3') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == ""


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


LAYERS = {"privacy": 0, "client": 1, "engine": 1, "runtime": 2}


def test_layers_only_import_downward():
    violations = []
    for sub, level in LAYERS.items():
        for path in (PKG / sub).rglob("*.py"):
            for name in _imports(path):
                parts = name.split(".")
                if parts[0] != "streamfilter" or len(parts) < 2:
                    continue
                target = parts[1]
                if target in LAYERS and LAYERS[target] > level:
                    violations.append(f"{path.relative_to(PKG)} imports {name}")
                if sub == "client" and target not in ("privacy", "client"):
                    violations.append(f"{path.relative_to(PKG)} imports {name}")
                if sub in ("privacy", "engine") and target in (
                    "config",
                    "cli",
                    "metrics",
                    "runtime",
                    "testing",
                ):
                    violations.append(f"{path.relative_to(PKG)} imports {name}")
    assert violations == []


def test_the_client_loads_only_the_privacy_core_numpy_and_the_stdlib():
    """``streamfilter.client`` ships to devices: no server code, no server dependencies."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import streamfilter.client\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "ours = {m for m in set(sys.modules) - before if m.startswith('streamfilter.')}\n"
        "print(sorted(new - set(sys.stdlib_module_names)))\n"
        "print(sorted({m.split('.')[1] for m in ours}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    third_party, ours = out.stdout.strip().splitlines()
    # scipy (the privacy core's numerics) brings its private C modules and typing_extensions
    public = {m for m in ast.literal_eval(third_party) if not m.startswith("_")}
    assert public <= {"streamfilter", "numpy", "scipy", "cython_runtime", "typing_extensions"}
    assert set(ast.literal_eval(ours)) == {"client", "privacy"}


LEARN_MAY_IMPORT = {"privacy", "learn"}
#: third-party modules ``streamfilter.learn`` may import (scikit-learn lazily, for the digits)
LEARN_THIRD_PARTY = {"numpy", "scipy", "sklearn"}


def _absolute_imports(path: Path) -> set[str]:
    """Like ``_imports`` but without relative imports (``from .x import y`` stays in the package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_learn_imports_only_the_privacy_core_numpy_scipy_and_the_stdlib():
    violations = []
    for path in (PKG / "learn").rglob("*.py"):
        for name in _absolute_imports(path):
            top = name.split(".")[0]
            if top == "streamfilter":
                parts = name.split(".")
                if len(parts) < 2 or parts[1] not in LEARN_MAY_IMPORT:
                    violations.append(f"{path.relative_to(PKG)} imports {name}")
            elif top not in sys.stdlib_module_names and top not in LEARN_THIRD_PARTY:
                violations.append(f"{path.relative_to(PKG)} imports {name}")
    assert violations == []


def test_nothing_in_the_runtime_engine_or_client_imports_learn():
    violations = [
        f"{path.relative_to(PKG)} imports {name}"
        for sub in ("privacy", "client", "engine", "runtime")
        for path in (PKG / sub).rglob("*.py")
        for name in _imports(path)
        if name.startswith("streamfilter.learn") or name == "learn" or ".learn" in name
    ]
    assert violations == []
    code = (
        "import sys\n"
        "import streamfilter, streamfilter.client, streamfilter.engine.monitor\n"
        "import streamfilter.runtime.app, streamfilter.budget, streamfilter.report\n"
        "print(sorted(m for m in sys.modules if m.startswith('streamfilter.learn') or m == 'sklearn'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"
