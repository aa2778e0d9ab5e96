"""References to the repository's markdown documents point at files and sections that exist.

A *reference* is a markdown path written in code, tests or documents:

* a path with a directory, ``docs/odometer.md`` or ``deploy/kafka/README.md`` (resolved from the
  repository root);
* a top-level name in capitals, ``README.md`` or ``SECURITY.md`` (resolved from the repository
  root, or from the citing file's own directory, as ``deploy/kafka/README.md`` would be);
* either of them followed by a section, ``§2``, ``§6.11`` or ``§6 item 11`` (the same as
  ``§6.11``; ``§6 items 9-10`` names each item of the range). Quotes, backticks, comment markers
  and line breaks may stand between the file and the ``§``.

Lower-case bare names (``results.md``) are file names a program writes, not references, and
addresses inside URLs are not references either. A reference fails when its file does not exist
or when the section has no heading in that file: a heading whose title starts with the number
(``## 6. Security checklist``, ``### 6.11 Per-user budgets``), or an item ``11.`` of a numbered
list under heading ``6``. A capitalised design document cited without its directory is refused
because no such file exists at the root: the project's design document is ``docs/design.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: what is scanned, relative to the repository root
SCANNED = ("streamfilter", "tests", "docs", "benchmarks", "deploy", "README.md", "SECURITY.md")
#: not the project's text: caches, environments, and hidden directories (tools' state, e.g. the
#: test broker's live data under ``deploy/kafka/.run``: gigabytes of preallocated index files)
_SKIP_DIRS = {"__pycache__", ".venv", ".git", "node_modules", ".mypy_cache", ".ruff_cache"}

_SECTION = (
    r"§\s*(?P<section>\d+(?:\.\d+)*)(?:\s+items?\s+(?P<item>\d+)(?:\s*[-–]\s*(?P<last>\d+))?)?"
)
_REFERENCE = re.compile(
    # not inside a longer path or URL: no path character right before the reference
    r"(?<![\w./:{}-])"
    r"(?P<path>(?:[\w-]+/)+[\w.-]+\.md|[A-Z][A-Z0-9_-]*\.md)\b"
    # an optional section: closing quote or backtick, blank, comment marker or line break first
    rf"(?:[`'\")\]]?[ \t]*(?:\n[ \t]*(?:#|//|\*)?[ \t]*)?{_SECTION})?"
)
_HEADING = re.compile(r"^#{1,6}[ \t]+(\d+(?:\.\d+)*)\.?(?=[ \t]|$)")
_LIST_ITEM = re.compile(r"^[ \t]*(\d+)\.[ \t]")


@dataclass(frozen=True)
class Reference:
    source: str  # the citing file, relative to the root
    line: int
    path: str
    sections: tuple[str, ...]  # "", or the section numbers it names

    def __str__(self) -> str:
        where = f" §{', §'.join(self.sections)}" if self.sections else ""
        return f"{self.source}:{self.line}: {self.path}{where}"


def find_references(text: str, source: str) -> list[Reference]:
    """Every reference to a markdown file (and its sections) in ``text``."""
    refs: list[Reference] = []
    for m in _REFERENCE.finditer(text):
        sections: tuple[str, ...] = ()
        if m.group("section"):
            sec, item, last = m.group("section"), m.group("item"), m.group("last")
            if item is None:
                sections = (sec,)
            else:
                first = int(item)
                end = int(last) if last else first
                sections = tuple(f"{sec}.{n}" for n in range(first, max(first, end) + 1))
        line = text.count("\n", 0, m.start()) + 1
        refs.append(Reference(source, line, m.group("path"), sections))
    return refs


def section_numbers(markdown: str) -> set[str]:
    """Numbers of the headings of a markdown file, and ``N.k`` for the k-th item of a numbered
    list under heading ``N`` (fenced code blocks are skipped)."""
    numbers: set[str] = set()
    current: str | None = None
    in_code = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if m := _HEADING.match(line):
            current = m.group(1)
            numbers.add(current)
        elif line.startswith("#"):
            current = None
        elif current is not None and (m := _LIST_ITEM.match(line)):
            numbers.add(f"{current}.{m.group(1)}")
    return numbers


def _scanned_files(root: Path, scanned: tuple[str, ...]) -> list[Path]:
    files: list[Path] = []
    for name in scanned:
        top = root / name
        if top.is_file():
            files.append(top)
        elif top.is_dir():
            for path in sorted(top.rglob("*")):
                rel = path.relative_to(root)
                hidden = any(part.startswith(".") for part in rel.parts[:-1])
                if path.is_file() and not hidden and not _SKIP_DIRS.intersection(rel.parts):
                    files.append(path)
    return files


def _resolve(root: Path, ref: Reference) -> Path | None:
    candidates = [root / ref.path]
    if "/" not in ref.path:
        candidates.append((root / ref.source).parent / ref.path)
    for candidate in candidates:
        # the exact spelling: on a case-insensitive file system an upper-case name must not find
        # the lower-case file
        if candidate.is_file() and candidate.name in {p.name for p in candidate.parent.iterdir()}:
            return candidate
    return None


def broken_references(root: Path, scanned: tuple[str, ...] = SCANNED) -> list[str]:
    """One message per reference under ``root`` whose file or section does not exist."""
    problems: list[str] = []
    sections_of: dict[Path, set[str]] = {}
    for path in _scanned_files(root, scanned):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files cite nothing
        for ref in find_references(text, path.relative_to(root).as_posix()):
            target = _resolve(root, ref)
            if target is None:
                problems.append(f"{ref}: no file {ref.path} in the repository")
                continue
            if not ref.sections:
                continue
            if target not in sections_of:
                sections_of[target] = section_numbers(target.read_text(encoding="utf-8"))
            for sec in ref.sections:
                if sec not in sections_of[target]:
                    problems.append(f"{ref}: {ref.path} has no section {sec}")
    return problems


# ------------------------------------------------------------------------------- the repository


def test_every_markdown_reference_in_the_repository_exists() -> None:
    problems = broken_references(ROOT)
    assert not problems, "broken references:\n" + "\n".join(problems)


def test_the_design_document_has_the_security_checklist_in_order() -> None:
    numbers = section_numbers((ROOT / "docs" / "design.md").read_text(encoding="utf-8"))
    assert {str(n) for n in range(1, 10)} <= numbers
    assert {f"6.{n}" for n in range(1, 13)} <= numbers
    assert "6.13" not in numbers


# ------------------------------------------------------------------- the check, on a fake tree

# The texts below spell ".md" as "·md" (restored by _md) so that this file, which the repository
# test scans too, holds no reference to a document that does not exist.


def _md(text: str) -> str:
    return text.replace("·md", ".md")


_DESIGN_UPPER = "DESIGN·md"
_FAKE_DESIGN = """# Design

## 1. What it is

## 6. Checklist

### 6.11 Budgets for their owners

## 7. Lists

1. first
2. second

```
## 8. inside a code block: not a heading
```
"""


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text(_FAKE_DESIGN, encoding="utf-8")
    (tmp_path / "README.md").write_text("# readme\n", encoding="utf-8")
    (tmp_path / "pkg").mkdir()
    return tmp_path


def _problems(root: Path, text: str) -> list[str]:
    (root / "pkg" / "mod.py").write_text(_md(text), encoding="utf-8")
    return broken_references(root, ("pkg", "docs", "README.md"))


@pytest.mark.parametrize(
    "text",
    [
        '"""See docs/design·md §6.11."""\n',
        "# docs/design·md §1 and docs/design·md §7 item 2, `docs/design·md` §7 items 1-2\n",
        "# the budget is for its owner only, docs/design·md\n# §6.11\n",
        "see README·md and docs/design·md (no section)\n",
        "a generated results·md, a URL https://example.org/docs/missing·md\n",
    ],
)
def test_existing_files_and_sections_pass(fake_tree: Path, text: str) -> None:
    assert _problems(fake_tree, text) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"# {_DESIGN_UPPER} §6.11\n", "no file"),
        (f"# see {_DESIGN_UPPER}\n", "no file"),
        ("# docs/missing·md\n", "no file"),
        ("# docs/design·md §6.12\n", "no section 6.12"),
        ("# docs/design·md §2\n", "no section 2"),
        ("# docs/design·md §7 items 2-3\n", "no section 7.3"),
        ("# docs/design·md §8\n", "no section 8"),  # only inside a code block
        ("# SECURITY·md\n", "no file"),
    ],
)
def test_missing_files_and_sections_fail(fake_tree: Path, text: str, expected: str) -> None:
    problems = _problems(fake_tree, text)
    assert len(problems) == 1 and expected in problems[0], problems
    assert problems[0].startswith("pkg/mod.py:1: ")


def test_hidden_directories_are_not_read(fake_tree: Path) -> None:
    """Tools' state under a scanned tree (e.g. a test broker's data in ``deploy/kafka/.run``) is
    not the project's text: not read, however large; the same file outside it is checked."""
    for where in (fake_tree / "pkg" / ".run" / "data", fake_tree / "pkg" / "data"):
        where.mkdir(parents=True)
        (where / "log.txt").write_text(_md("# docs/missing·md\n"), encoding="utf-8")
    problems = broken_references(fake_tree, ("pkg",))
    assert len(problems) == 1 and problems[0].startswith("pkg/data/log.txt:1: "), problems


def test_a_bare_capitalised_name_resolves_beside_the_citing_file(fake_tree: Path) -> None:
    (fake_tree / "pkg" / _md("NOTES·md")).write_text("## 3. Notes\n", encoding="utf-8")
    assert _problems(fake_tree, "# NOTES·md §3\n") == []
    assert "no section 4" in _problems(fake_tree, "# NOTES·md §4\n")[0]


def test_references_are_parsed_with_their_sections() -> None:
    refs = find_references(_md("x docs/design·md §6 items 9-10, y `SECURITY·md` §2\n"), "a.py")
    assert [(r.path, r.sections) for r in refs] == [
        ("docs/design.md", ("6.9", "6.10")),
        ("SECURITY.md", ("2",)),
    ]


# ------------------------------------------------------------------------------- the README


def _fenced_blocks(markdown: str, heading: str) -> list[str]:
    """The fenced code blocks of the section whose ``##`` heading starts with ``heading``."""
    m = re.search(rf"^## {re.escape(heading)}.*?$(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    assert m is not None, f"no section {heading!r}"
    return re.findall(r"^```[^\n]*\n(.*?)^```", m.group(1), re.M | re.S)


README_TEXT = (ROOT / "README.md").read_text(encoding="utf-8")


def architecture_problems(readme: str, package: Path) -> list[str]:
    """What the README's architecture tree gets wrong about ``package``.

    The tree is the first code block under "## Architecture": one line per subpackage (a name
    ending in ``/``, indented two spaces per level) or top-level module, with a description that
    may end with its main module in parentheses, ``(day.py)``. Every listed path must exist and
    every subpackage (a directory with ``__init__.py``) must be listed."""
    block = _fenced_blocks(readme, "Architecture")[0]
    lines = [line for line in block.splitlines() if line.strip()]
    assert lines[0].strip() == f"{package.name}/", lines[0]
    problems: list[str] = []
    listed: set[Path] = set()
    stack: list[str] = []
    for line in lines[1:]:
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name, _, description = line.strip().partition(" ")
        stack = [*stack[: depth - 1], name.rstrip("/")]
        path = package.joinpath(*stack)
        if name.endswith("/"):
            listed.add(path)
            if not (path / "__init__.py").is_file():
                problems.append(f"{name} is listed but {path} is not a package")
            main = re.search(r"\(([\w./]+\.py)\)\s*$", description)
            if main is None:
                problems.append(f"{name} names no main module")
            elif not (path / main.group(1)).is_file():
                problems.append(f"{name}: no module {main.group(1)} in {path}")
        elif not path.is_file():
            problems.append(f"{name} is listed but {path} does not exist")
    for init in sorted(package.rglob("__init__.py")):
        sub = init.parent
        if sub != package and "__pycache__" not in sub.parts and sub not in listed:
            problems.append(f"subpackage {sub.relative_to(package.parent)} is not listed")
    return problems


def test_the_readme_architecture_tree_matches_the_package() -> None:
    problems = architecture_problems(README_TEXT, ROOT / "streamfilter")
    assert not problems, "README.md's architecture tree is stale:\n" + "\n".join(problems)


def test_the_architecture_check_fails_a_stale_tree(tmp_path: Path) -> None:
    pkg = tmp_path / "streamfilter"
    for sub in ("engine", "runtime", "runtime/io", "cli"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "engine" / "day.py").write_text("", encoding="utf-8")
    (pkg / "errors.py").write_text("", encoding="utf-8")
    readme = (
        "## Architecture\n\n```\nstreamfilter/\n  errors.py   errors\n"
        "  engine/     the day step (day.py)\n  runtime/    adapters (gone.py)\n"
        "    io/       sources\n  config.py   settings\n```\n"
    )
    assert architecture_problems(readme, pkg) == [
        "runtime/: no module gone.py in " + str(pkg / "runtime"),
        "io/ names no main module",
        f"config.py is listed but {pkg / 'config.py'} does not exist",
        "subpackage streamfilter/cli is not listed",
    ]


def _commands(block: str) -> list[str]:
    """The command lines of a code block: output (``$`` prompts, log lines) and comments cut."""
    out = []
    for line in block.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).strip()
        if line.startswith("$ "):
            line = line[2:]
        elif any(line.startswith(p) for p in ("...", "streamfilter check —", "(days:")):
            continue
        if line:
            out.append(line)
    return out


def _readme_commands() -> list[str]:
    blocks = re.findall(r"^```\n(.*?)^```", README_TEXT, re.M | re.S)
    return [c for block in blocks for c in _commands(block)]


#: placeholders of the README's synopsis lines, and a value each
_PLACEHOLDERS = {"PATH": "x.toml", "ID": "u-17", "N": "10", "D": "2", "DIR": "out"}


def test_every_streamfilter_command_of_the_readme_parses() -> None:
    from streamfilter.cli.main import build_parser

    commands = [c for c in _readme_commands() if c.startswith("streamfilter ")]
    assert len(commands) >= 10, commands
    parser = build_parser()
    for command in commands:
        words = re.sub(r"\[[^\]]*\]", "", command).split()[1:]  # optional parts dropped
        words = [_PLACEHOLDERS.get(w, w) for w in words]
        parser.parse_args(words)  # exits (SystemExit) on an unknown command or option
        optional = re.findall(r"\[([^\]]*)\]", command)
        if optional:  # and with every optional part given
            full = words + [_PLACEHOLDERS.get(w, w) for o in optional for w in o.split()]
            parser.parse_args(full)


def test_every_make_target_and_path_of_the_readme_exists() -> None:
    makefiles = [ROOT / "Makefile", *ROOT.glob("deploy/*/*.mk")]
    targets = {
        m.group(1)
        for f in makefiles
        for m in re.finditer(r"^([\w.-]+):", f.read_text(encoding="utf-8"), re.M)
    }
    make_words = re.findall(r"\bmake ([\w-]+)", README_TEXT)
    assert {"demo", "test", "kafka-up", "kafka-down"} <= set(make_words)
    assert set(make_words) <= targets, set(make_words) - targets
    paths = set(
        re.findall(
            r"(?<![\w./-])((?:examples|deploy|docs|benchmarks|tests|\.ci)/[\w./-]*\w)", README_TEXT
        )
    )
    paths |= set(re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README_TEXT))  # relative links
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing


def test_the_readme_file_quickstart_runs_as_written(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (block,) = _fenced_blocks(README_TEXT, "Quickstart: files")[:1]
    commands = _commands(block)
    assert commands[0] == "streamfilter check --config examples/file.toml"
    for command in commands:
        args = command.split()[1:]
        proc = subprocess.run(
            [sys.executable, "-m", "streamfilter", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"{command}: exit {proc.returncode}\n{proc.stderr}"
    releases = (tmp_path / "examples" / "out" / "releases.jsonl").read_text().splitlines()
    assert len(releases) == 6
    assert (tmp_path / "report.html").stat().st_size > 0


def test_the_readme_python_api_runs_as_written() -> None:
    (block,) = re.findall(r"^```python\n(.*?)^```", README_TEXT, re.M | re.S)
    events = [{"user_id": "u-17", "day": "2026-01-05", "values": {"active": 1}}]
    scope: dict[str, Any] = {"events": events}
    exec(compile(block, "README.md", "exec"), scope)  # the README's own example, as written
    assert len(scope["releases"]) == 1
    assert scope["m"].spent("u-17") == 1.0


def test_the_readme_stays_a_page_for_users() -> None:
    """Logs of measurements belong to docs/performance.md (current figures) and git history."""
    assert README_TEXT.count("\n") <= 300
    assert "<!-- benchmarks/results.md: begin -->" not in README_TEXT


# ------------------------------------------------------------------- docs/performance.md, §3.5


def test_the_performance_page_includes_the_current_results_table() -> None:
    from benchmarks.run import BEGIN, END

    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    start, end = page.index(BEGIN) + len(BEGIN) + 1, page.index(END)
    results = (ROOT / "benchmarks" / "results.md").read_text(encoding="utf-8")
    assert page[start:end] == results, "python -m benchmarks.run --render rewrites the page"


def test_every_configuration_key_is_in_the_design_table() -> None:
    from pydantic import BaseModel

    from streamfilter.config import Settings

    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    rows = {
        m.group(1): m.group(2) for m in re.finditer(r"^\| `\[([\w.]+)\]` \|(.*)$", design, re.M)
    }
    missing = []
    for section, field in Settings.model_fields.items():
        model = field.annotation
        if getattr(model, "__origin__", None) is dict:  # one table per name: [analysts.<name>]
            model = model.__args__[1]
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            model = next(a for a in getattr(model, "__args__", ()) if a is not type(None))
        for key, sub in model.model_fields.items():
            is_table = isinstance(sub.annotation, type) and issubclass(sub.annotation, BaseModel)
            row = rows.get(section, "")
            if f"`{key}`" not in row and not (is_table and f"`[{section}.{key}]`" in row):
                missing.append(f"[{section}] {key}")
    assert not missing, "docs/design.md §3.5 lacks: " + ", ".join(missing)


# ------------------------------------------------------------------------- no issue numbers

#: an issue number ("issue" and a number, or "#" and one or two digits), not an HTML entity
_ISSUE = re.compile(r"issue #?[0-9]+|(?<![&\w])#[0-9]{1,2}\b", re.I)
#: where issue numbers must not appear: the package, its tests, benchmarks and documents
NO_ISSUES = ("streamfilter", "tests", "benchmarks", "docs", "deploy", "examples", "README.md")


def issue_number_mentions(root: Path, scanned: tuple[str, ...] = NO_ISSUES) -> list[str]:
    found = []
    for path in _scanned_files(root, scanned):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # compiled extensions and data
        for m in _ISSUE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{path.relative_to(root)}:{line}: {m.group(0)}")
    return found


def test_no_issue_numbers_in_code_tests_or_documents() -> None:
    """A comment says the reason, not the ticket that asked for it: the ticket's number means
    nothing to a reader of the code and outlives its tracker."""
    found = issue_number_mentions(ROOT)
    assert not found, "say the reason instead:\n" + "\n".join(found)


def test_the_issue_number_check_finds_them(fake_tree: Path) -> None:
    hash_ = "#"
    (fake_tree / "pkg" / "a.py").write_text(
        f'"""Fixed (Issue {hash_}16 point 2)."""\nx = 1  # since {hash_}7\n'
        f"y = '&{hash_}39;'  # an HTML entity, {hash_}1f77b4 a colour, {hash_}123 a count\n",
        encoding="utf-8",
    )
    assert issue_number_mentions(fake_tree, ("pkg",)) == [
        f"pkg/a.py:1: Issue {hash_}16",
        f"pkg/a.py:2: {hash_}7",
    ]
