"""``STREAMFILTER_IMPL`` (``streamfilter._native``) decides for the whole package, in a fresh
interpreter each time: ``python`` gives every import site its Python path, ``native`` every
extension (one not built is an error naming it), unset each one that is built."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from streamfilter import _native

PROBE = (
    "from streamfilter.engine import native, ingest\n"
    "from streamfilter.privacy import individual_filter\n"
    "from streamfilter import _native\n"
    "mods = [native.jsonl, native.packed_ids, native.user_codes, native.pair_set,"
    " native.cell_table, individual_filter._filter]\n"
    "print(sum(m is None for m in mods), ingest.SCANNER, ','.join(_native.missing()))\n"
)


def _probe(value: str | None, hide: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != _native.ENV}
    if value is not None:
        env[_native.ENV] = value
    return subprocess.run(
        [sys.executable, "-c", hide + PROBE], capture_output=True, text=True, env=env, timeout=60
    )


def _built() -> bool:
    return not any(_native.load(name) is None for name in _native.EXTENSIONS)


def test_python_turns_every_extension_off():
    out = _probe("python")
    assert out.returncode == 0, out.stderr
    n, scanner, missing = out.stdout.split()
    assert (int(n), scanner) == (6, "python")
    assert missing.split(",") == list(_native.EXTENSIONS.values())


@pytest.mark.skipif(not _built(), reason="the extensions are not built here")
@pytest.mark.parametrize("value", ["native", None, ""])
def test_native_or_unset_uses_every_built_extension(value):
    out = _probe(value)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "native"]


def test_native_when_an_extension_is_not_built_is_an_error_naming_it():
    hide = "import sys\nsys.modules['streamfilter.engine._pair_set'] = None\n"
    out = _probe("native", hide)
    assert out.returncode != 0
    assert (
        "NativeNotBuiltError: STREAMFILTER_IMPL=native but streamfilter/engine/_pair_set.c is not built"
        in out.stderr
    )
    unset = _probe(None, hide)  # unset: that one takes its Python path, the rest stay native
    assert unset.returncode == 0, unset.stderr
    assert unset.stdout.split()[0] == "1" and unset.stdout.split()[2] == "engine/_pair_set.c"


def test_another_value_is_refused(monkeypatch):
    monkeypatch.setenv(_native.ENV, "rust")
    with pytest.raises(ValueError, match="must be 'native' or 'python'"):
        _native.impl()
