"""Configuration text shared by tests that run ``streamfilter run`` on files in a temporary
directory: ``file_run(privacy_and_more)`` puts the usual file source, query feed, sink and
state after the test's own sections."""

from __future__ import annotations

FILE_IO = """
[source]
kind = "file"
path = "events.jsonl"
[queries]
kind = "file"
path = "queries.jsonl"
[sink]
kind = "file"
path = "releases.jsonl"
[state]
path = "state.db"
"""


def file_run(sections: str) -> str:
    """``sections`` (at least ``[privacy]``; any others but the four above) with the file I/O."""
    return sections.rstrip("\n") + "\n" + FILE_IO
