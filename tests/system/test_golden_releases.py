"""Releases under a test seed are pinned byte for byte: a refactoring changes no released byte.

``tests/system/data/golden/*.releases.jsonl`` were produced by commit d101528, *before* the package was
rearranged into its current rooms, from the inputs and configurations beside them
(``make_inputs.py`` wrote the inputs). Three runs cover both mechanisms, all three exhaustion
policies, rejects, duplicates-free multi-event days, every query kind and the opt-in active-set
estimate. A change that alters any released byte fails here; a deliberate change of the release
format must replace these files in the same commit and say why.

Adding Corollary 4.7's bound to each release (``linf_bound``, ``linf_failure_probability``)
regenerated the files, the ones before kept as ``*.releases.before16.jsonl``, and a test shows
that without the two keys every release is the old one byte for byte.
(``dg_skip_activeset.toml`` states the telemetry amounts it was pinned with, since their
defaults became fractions of the query ρ.) Adding the private coverage estimate to each query's
release (``coverage``, drawn from its own per-release noise key) regenerated them again, and the
same test shows that every other byte is still the one pinned before either was added.
"""

import json
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


#: fields added to each release after the old files were pinned (Corollary 4.7's bound, the
#: coverage estimate); every
#: other byte is unchanged
ADDED_FIELDS = ("linf_bound", "linf_failure_probability", "coverage")


@pytest.mark.parametrize("name", RUNS)
def test_the_noisy_values_did_not_move_when_the_accuracy_statement_was_added(name):
    """``*.releases.before16.jsonl`` are the files pinned before the bound and coverage were
    added to the release format: without the added keys, every release is byte for byte the old one (value, sigma,
    ci95 and the rest); the added bound is Corollary 4.7's for the release's d, and every query
    release (not the ``_active_set`` telemetry) carries a coverage estimate."""
    from streamfilter.privacy.accuracy import linf_bound_for_variance

    new = (GOLDEN / f"{name}.releases.jsonl").read_text().splitlines()
    old = (GOLDEN / f"{name}.releases.before16.jsonl").read_text().splitlines()
    assert len(new) == len(old)
    for new_line, old_line in zip(new, old, strict=True):
        rel = json.loads(new_line)
        added = {k: rel.pop(k) for k in ADDED_FIELDS if k in rel}
        assert json.dumps(rel) == old_line
        if rel["query_id"] == "_active_set":
            assert added == {}  # the binary-tree estimate states no bound and no coverage
            continue
        assert set(added["coverage"]) == {
            "users",
            "sigma",
            "ci95",
            "fraction",
            "counted_users",
            "threshold",
        }
        assert added["linf_failure_probability"] == 0.05
        d, mech = len(rel["value"]), rel["mechanism"]
        variance = rel["sigma"] ** 2  # σ² (continuous) or s²γ² (discrete: σ = sqrt(s²)·γ)
        assert added["linf_bound"] == pytest.approx(
            linf_bound_for_variance(variance, d, 0.05, mechanism=mech), rel=1e-12
        )


def test_a_restart_loads_and_checks_the_state_once(tmp_path, monkeypatch):
    """Start-up reads the whole state once (fingerprint, active-set tracker, engine, positions
    all come from that one checked load) and hands it to the engine through ``Engine.restore``."""
    from streamfilter.config import load_config
    from streamfilter.engine.engine import Engine
    from streamfilter.runtime.app import build_daemon
    from streamfilter.runtime.store import SQLiteStateStore

    name = "dg_skip_activeset"
    for f in ("events.jsonl", "queries.jsonl", f"{name}.toml"):
        shutil.copy(GOLDEN / f, tmp_path / f)
    config = tmp_path / f"{name}.toml"
    assert main(["run", "--config", str(config), "--until-end", "--testing"]) == 0
    loads, restores = [], []
    real_load, real_restore = SQLiteStateStore.load, Engine.restore
    monkeypatch.setattr(SQLiteStateStore, "load", lambda s: loads.append(1) or real_load(s))
    monkeypatch.setattr(
        Engine, "restore", lambda s, **kw: restores.append(kw) or real_restore(s, **kw)
    )
    parts = build_daemon(load_config(config), follow=False, allow_test_seed=True)
    try:
        assert len(loads) == 1 and len(restores) == 1
        assert restores[0]["last_closed_day"] == "2026-03-06"
        assert parts.daemon.engine.active_set is not None  # from the same load
        with pytest.raises(ValueError, match="fresh engine"):
            parts.daemon.engine.restore(**restores[0])
    finally:
        parts.close()


@pytest.mark.parametrize("name", RUNS)
def test_a_postgres_state_gives_the_same_releases(name, tmp_path, postgres_url, monkeypatch):
    """The state backend changes nothing that is released: the same seeded runs on a
    PostgreSQL state (password from the environment) publish the golden bytes."""
    import uuid
    from urllib.parse import urlsplit, urlunsplit

    url = urlsplit(postgres_url)
    bare = urlunsplit(url._replace(netloc=f"{url.username}@{url.hostname}:{url.port}"))
    monkeypatch.setenv("SF_TEST_PG_PASSWORD", url.password or "")
    for f in ("events.jsonl", "queries.jsonl"):
        shutil.copy(GOLDEN / f, tmp_path / f)
    schema = f"golden_{uuid.uuid4().hex[:10]}"
    config = (
        (GOLDEN / f"{name}.toml")
        .read_text()
        .replace(
            '[state]\npath = "state.db"',
            f'[state]\nkind = "postgres"\nurl = "{bare}"\npg_schema = "{schema}"\n'
            'password_env = "SF_TEST_PG_PASSWORD"',
        )
    )
    assert f'pg_schema = "{schema}"' in config
    (tmp_path / f"{name}.toml").write_text(config)
    assert (
        main(["run", "--config", str(tmp_path / f"{name}.toml"), "--until-end", "--testing"]) == 0
    )
    assert (tmp_path / "releases.jsonl").read_bytes() == (
        GOLDEN / f"{name}.releases.jsonl"
    ).read_bytes()
    assert not (tmp_path / "state.db").exists()
    # a restart resumes from the database: nothing is drawn or published again
    assert (
        main(["run", "--config", str(tmp_path / f"{name}.toml"), "--until-end", "--testing"]) == 0
    )
    assert (tmp_path / "releases.jsonl").read_bytes() == (
        GOLDEN / f"{name}.releases.jsonl"
    ).read_bytes()


@pytest.mark.parametrize("name", RUNS)
def test_small_batches_take_the_columnar_path_and_release_the_same_bytes(
    name, tmp_path, monkeypatch
):
    """Read in batches of 2 lines, many batches are of one schema and are decoded as columns
    (``parse_columns`` → ``DayAccumulator.add_columns``), the others event by event; the
    releases are still the pinned ones, byte for byte."""
    from streamfilter.engine.records import DayAccumulator
    from streamfilter.runtime.io.files import FileSource

    poll = FileSource.poll_batches
    monkeypatch.setattr(FileSource, "poll_batches", lambda self, n: poll(self, min(n, 2)))
    add_columns = DayAccumulator.add_columns
    columnar = []

    def counted(self, batch):
        columnar.append(len(batch))
        return add_columns(self, batch)

    monkeypatch.setattr(DayAccumulator, "add_columns", counted)
    for f in ("events.jsonl", "queries.jsonl", f"{name}.toml"):
        shutil.copy(GOLDEN / f, tmp_path / f)
    assert (
        main(["run", "--config", str(tmp_path / f"{name}.toml"), "--until-end", "--testing"]) == 0
    )
    assert sum(columnar) > 1000, sum(columnar)  # of the 2,738 lines
    produced = (tmp_path / "releases.jsonl").read_bytes()
    assert produced == (GOLDEN / f"{name}.releases.jsonl").read_bytes()


@pytest.mark.parametrize("name", RUNS)
def test_a_spilling_event_id_index_releases_the_same_bytes(name, tmp_path, monkeypatch):
    """Each day's events twice (the second time in reverse order: every one a repeated event
    id, within a batch and across batches), read 10 lines at a time, with the daemon's event-id
    index spilling past 5 pairs: the repeats are all found — the releases are the pinned ones,
    byte for byte — while the index really spilled and merged, and the day's close removed its
    files."""
    from streamfilter.dedup import spill as event_ids
    from streamfilter.runtime.io.files import FileSource

    poll = FileSource.poll_batches
    monkeypatch.setattr(FileSource, "poll_batches", lambda self, n: poll(self, min(n, 10)))
    merges = []
    merge = event_ids.SpillingEventIds._merge

    def counted(self, inputs, tier):
        merges.append(tier)
        return merge(self, inputs, tier)

    monkeypatch.setattr(event_ids.SpillingEventIds, "_merge", counted)
    lines = (GOLDEN / "events.jsonl").read_text().splitlines(keepends=True)
    days = [json.loads(line)["day"] for line in lines]
    doubled = []
    for day in sorted(set(days)):
        block = [line for line, d in zip(lines, days, strict=True) if d == day]
        doubled += block + block[::-1]
    (tmp_path / "events.jsonl").write_text("".join(doubled))
    shutil.copy(GOLDEN / "queries.jsonl", tmp_path / "queries.jsonl")
    spill = tmp_path / "spill"
    spill.mkdir()
    config = (GOLDEN / f"{name}.toml").read_text()
    (tmp_path / "run.toml").write_text(
        f'{config}\n[spill]\nevent_ids_in_memory = 5\ndir = "{spill.name}"\n'
    )
    assert main(["run", "--config", str(tmp_path / "run.toml"), "--until-end", "--testing"]) == 0
    assert merges and max(merges) >= 2  # segments spilled, merged, and merged again
    assert list(spill.iterdir()) == []
    produced = (tmp_path / "releases.jsonl").read_bytes()
    assert produced == (GOLDEN / f"{name}.releases.jsonl").read_bytes()
