"""The documents' exit-code and reject-reason tables come from the code, so they cannot drift.

README.md shows the exit codes, docs/design.md §3.4 the reject reasons. Each table sits between
``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` markers and must equal what :func:`render`
builds from ``streamfilter.errors.EXIT_CODES`` and ``streamfilter.engine.contract.RejectReason``.
After changing either, rewrite them with ``python -m tests.system.test_readme_tables``.
"""

import re
import sys
from pathlib import Path

import pytest

from streamfilter.engine.contract import REJECT_REASON_MEANING, RejectReason
from streamfilter.errors import EXIT_CODES, ExitCode, StreamfilterError

ROOT = Path(__file__).resolve().parents[2]


def _exit_codes() -> str:
    classes: dict[int, list[str]] = {}

    def walk(cls: type[StreamfilterError]) -> None:
        # the hierarchy of streamfilter/errors.py only: a subclass defined elsewhere (the store's
        # CorruptRowError) exists only once its module is imported, which made the table depend
        # on which tests ran first
        if cls is not StreamfilterError and cls.__module__ == "streamfilter.errors":
            classes.setdefault(int(cls.exit_code), []).append(cls.__name__)
        for sub in cls.__subclasses__():
            walk(sub)

    walk(StreamfilterError)
    rows = ["| exit | meaning | raised as |", "| --- | --- | --- |"]
    for code, meaning in sorted(EXIT_CODES.items()):
        raised = ", ".join(f"`{n}`" for n in sorted(classes.get(int(code), []))) or "—"
        rows.append(f"| {int(code)} | {meaning} | {raised} |")
    return "\n".join(rows)


def _reject_reasons() -> str:
    rows = ["| reason | meaning |", "| --- | --- |"]
    rows += [f"| `{r.value}` | {REJECT_REASON_MEANING[r]} |" for r in RejectReason]
    return "\n".join(rows)


TABLES = {"exit-codes": _exit_codes, "reject-reasons": _reject_reasons}
#: the document each table lives in (one place each)
DOCUMENT = {"exit-codes": ROOT / "README.md", "reject-reasons": ROOT / "docs" / "design.md"}


def _section(text: str, name: str) -> str | None:
    m = re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", text, re.S)
    return None if m is None else m.group(1).rstrip("\n")


def render(text: str) -> str:
    for name, build in TABLES.items():
        text = re.sub(
            rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)",
            lambda m, b=build: m.group(1) + b() + "\n" + m.group(2),
            text,
            flags=re.S,
        )
    return text


@pytest.mark.parametrize("name", sorted(TABLES))
def test_document_table_matches_the_code(name):
    doc = DOCUMENT[name]
    found = _section(doc.read_text(), name)
    assert found is not None, f"{doc.name} lacks the {name} markers"
    assert found == TABLES[name](), f"{doc.name}'s {name} table is stale: python -m {__name__}"


@pytest.mark.parametrize("name", sorted(TABLES))
def test_each_table_is_in_one_document_only(name):
    holders = [
        p.name
        for p in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
        if f"<!-- {name}:begin -->" in p.read_text()
    ]
    assert holders == [DOCUMENT[name].name], holders


def test_render_rewrites_a_stale_table():
    stale = "x\n<!-- exit-codes:begin -->\n| old |\n<!-- exit-codes:end -->\ny\n"
    assert _section(render(stale), "exit-codes") == _exit_codes()
    assert render(stale).startswith("x\n") and render(stale).endswith("y\n")


def test_every_reason_has_a_meaning_and_every_exit_code_a_line():
    assert set(REJECT_REASON_MEANING) == set(RejectReason)
    assert set(EXIT_CODES) == set(ExitCode)


def test_an_unknown_reason_cannot_be_emitted():
    from streamfilter.engine.contract import Reject

    with pytest.raises(ValueError, match="is not a valid RejectReason"):
        Reject("made_up_reason", "nothing")


if __name__ == "__main__":
    for doc in set(DOCUMENT.values()):
        doc.write_text(render(doc.read_text()))
    sys.exit(0)
