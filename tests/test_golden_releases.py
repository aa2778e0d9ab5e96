"""Releases under a test seed are pinned byte for byte (issue #14: no behaviour change).

``tests/data/golden/*.releases.jsonl`` were produced by commit d101528, *before* the package was
rearranged into its current rooms, from the inputs and configurations beside them
(``make_inputs.py`` wrote the inputs). Three runs cover both mechanisms, all three exhaustion
policies, rejects, duplicates-free multi-event days, every query kind and the opt-in active-set
estimate. A change that alters any released byte fails here; a deliberate change of the release
format must replace these files in the same commit and say why.
"""

import shutil
from pathlib import Path

import pytest

from streamfilter.cli import main

GOLDEN = Path(__file__).parent / "data" / "golden"
RUNS = sorted(p.stem for p in GOLDEN.glob("*.toml"))


def test_the_golden_runs_exist():
    assert RUNS == ["dg_retire", "dg_skip_activeset", "g_clip"]


@pytest.mark.parametrize("name", RUNS)
def test_releases_are_byte_identical_to_the_ones_produced_before_the_moves(name, tmp_path, capsys):
    for f in ("events.jsonl", "queries.jsonl", f"{name}.toml"):
        shutil.copy(GOLDEN / f, tmp_path / f)
    assert (
        main(["run", "--config", str(tmp_path / f"{name}.toml"), "--until-end", "--testing"]) == 0
    )
    produced = (tmp_path / "releases.jsonl").read_bytes()
    assert produced == (GOLDEN / f"{name}.releases.jsonl").read_bytes()
