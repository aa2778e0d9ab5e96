"""Dependencies point one way (docs/design.md §4): errors ← privacy ← engine/client/learn ← config
← runtime ← testing ← cli/verify, checked for every module, lazy imports included; the cores do
no I/O. ``learn`` (the papers' learning experiments) imports only the privacy core, and
nothing in the daemon, engine or client imports it."""

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "streamfilter"


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


#: Declared layers, lowest first: a module may import only from its own layer or a lower one.
#: Keys are the first component below ``streamfilter`` (a package or a top-level module);
#: ``__init__`` is the package's lazy facade (``Monitor``), ``policies`` an import shim.
LAYERS: dict[str, int] = {
    "errors": 0,
    "privacy": 1,
    "engine": 2,
    "client": 2,
    "learn": 2,
    "policies": 2,
    "__init__": 2,
    "config": 3,
    "runtime": 4,
    "testing": 5,
    "cli": 6,
    "verify": 6,
    "__main__": 7,
}
#: Packages of one layer that must not import each other, and what each may import at most.
ONLY_FROM: dict[str, set[str]] = {
    "privacy": {"errors", "privacy"},
    "client": {"errors", "privacy", "client"},
    "learn": {"errors", "privacy", "learn"},
    "engine": {"errors", "privacy", "engine"},
}
#: Sub-layers inside ``runtime``: adapters below the loop, the loop below the wiring.
RUNTIME_LAYERS: dict[str, int] = {
    "faults": 0,
    "io": 1,
    "store": 1,
    "observe": 1,
    "event_ids": 1,  # the day's event-id index that spills to disk (issue #17 point 2)
    "active_set": 2,
    "coverage": 2,  # coverage with every release (issue #16 point 1)
    "daemon": 2,
    "cluster": 2,  # the cluster worker: the daemon loop over a consumer group (issue #18)
    "budget": 2,
    "notebook": 2,  # PersistentMonitor: Monitor + the state store (issue #16)
    "app": 3,
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every ``streamfilter`` module ``path`` imports, at the top or inside a function (lazy
    imports count: they are dependencies all the same); relative imports resolved."""
    tree = ast.parse(path.read_text())
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base:
                names.add(base)
                # ``from streamfilter.x import y`` may name a submodule y
                names.update(f"{base}.{a.name}" for a in node.names)
    return {n for n in names if n == "streamfilter" or n.startswith("streamfilter.")}


def _modules() -> dict[str, set[str]]:
    """Module name → the existing ``streamfilter`` modules it imports."""
    paths = {_module_name(p): p for p in PKG.rglob("*.py")}
    return {
        name: {imp for imp in _imports(path) if imp in paths and imp != name}
        for name, path in paths.items()
    }


def _room(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, deps in sorted(graph.items()):
        room = _room(module)
        if room not in LAYERS:
            out.append(f"{module}: not in any declared layer (add it to LAYERS)")
            continue
        for dep in sorted(deps):
            target = _room(dep)
            if target not in LAYERS:
                continue  # reported as its own module
            if LAYERS[target] > LAYERS[room]:
                out.append(f"{module} imports {dep}: {target} is above {room}")
            elif room in ONLY_FROM and target not in ONLY_FROM[room]:
                out.append(f"{module} imports {dep}: {room} may import only {ONLY_FROM[room]}")
            elif room == target == "runtime":
                mine, theirs = module.split(".")[2:3], dep.split(".")[2:3]
                if mine and theirs and mine[0] in RUNTIME_LAYERS and theirs[0] in RUNTIME_LAYERS:
                    if RUNTIME_LAYERS[theirs[0]] > RUNTIME_LAYERS[mine[0]]:
                        out.append(f"{module} imports {dep}: runtime.{theirs[0]} is above")
                elif mine and mine[0] not in RUNTIME_LAYERS:
                    out.append(f"{module}: runtime.{mine[0]} is not in RUNTIME_LAYERS")
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_imports_only_its_own_or_lower_layers():
    assert _violations(_modules()) == []


def test_no_import_cycles_lazy_imports_included():
    graph = _modules()
    # the root facade imports the engine lazily for ``Monitor``; the engine never imports it
    assert _cycles(graph) == []


def test_the_layer_check_catches_an_upward_and_a_cyclic_import():
    """The checks themselves can fail: an engine module importing the runtime, a client module
    importing the engine, and a two-module cycle are all reported."""
    graph = {
        "streamfilter.engine.day": {"streamfilter.runtime.daemon"},
        "streamfilter.client.core": {"streamfilter.engine.day"},
        "streamfilter.runtime.store.base": {"streamfilter.runtime.app"},
        "streamfilter.runtime.app": {"streamfilter.runtime.store.base"},
        "streamfilter.runtime.daemon": set(),
        "streamfilter.somewhere": set(),
    }
    problems = "\n".join(_violations(graph))
    assert "engine.day imports streamfilter.runtime.daemon" in problems
    assert "client.core imports streamfilter.engine.day" in problems
    assert "runtime.app is above" in problems
    assert "not in any declared layer" in problems
    assert _cycles(graph) == [["streamfilter.runtime.app", "streamfilter.runtime.store.base"]]


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
        "import streamfilter.runtime.app, streamfilter.runtime.budget\n"
        "print(sorted(m for m in sys.modules if m.startswith('streamfilter.learn') or m == 'sklearn'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"
    # the CLI registers ``streamfilter learn``: argparse wiring and the experiment grid only,
    # no model code, numpy-heavy module or scikit-learn until a learn command runs
    cli = subprocess.run(
        [
            sys.executable,
            "-c",
            code.replace("streamfilter.runtime.budget", "streamfilter.cli.main"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded = ["streamfilter.learn", "streamfilter.learn.commands", "streamfilter.learn.grid"]
    assert cli.stdout.strip() == str(loaded)
