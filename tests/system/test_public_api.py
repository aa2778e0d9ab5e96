"""The package's public face: ``streamfilter.__all__`` is explicit and ``dir(streamfilter)``
lists exactly it, every name of which resolves."""

import subprocess
import sys

import streamfilter


def test_dir_shows_exactly_the_public_names():
    assert dir(streamfilter) == sorted(streamfilter.__all__)
    assert set(streamfilter.__all__) == {"Monitor", "Release", "__version__"}
    for name in streamfilter.__all__:
        assert getattr(streamfilter, name) is not None


def test_star_import_gives_the_public_names_and_nothing_else():
    code = (
        "before = set(globals())\n"
        "from streamfilter import *\n"
        "print(sorted(set(globals()) - before - {'before'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == str(sorted(streamfilter.__all__))


def test_an_unknown_name_is_an_attribute_error():
    try:
        streamfilter.Any  # noqa: B018 - the typing helper is not public
    except AttributeError:
        pass
    else:
        raise AssertionError("streamfilter.Any resolved")
