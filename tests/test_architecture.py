"""Dependencies point one way: privacy ← engine ← runtime ← cli; the cores do no I/O."""

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
