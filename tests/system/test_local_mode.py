"""Local mode end to end: server validation, simulate-local, central ≡ local, the wire, noise."""

from __future__ import annotations

import json
import math
import os
import sqlite3
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfilter.cli.main import main
from streamfilter.client import Announcement, DeviceConfig, DeviceFleet
from streamfilter.engine.contract import Reject, parse_query
from streamfilter.engine.local import LOCAL_NOISE, LocalEngine
from streamfilter.engine.params import PrivacyParams
from streamfilter.privacy.noise import SeededRandomBits
from tests.support import oracle
from tests.support.cli import stored_budgets

GAMMA = 2.0**-10
PARAMS = PrivacyParams.create(b_norm=4.0, rho=0.5, granularity=GAMMA)
QUERY = {
    "query_id": "plans",
    "kind": "histogram",
    "feature": "plan",
    "categories": ["free", "pro", "team", "rare"],
    "clip": 1.0,
    "from_day": "2026-01-01",
}
NONCE = "0123456789abcdef0123456789abcdef"


def config_text(tmp: Path, mode: str, extra: str = "", source: str = "") -> str:
    source = source or (
        '[source]\nkind = "synthetic"\n[source.synthetic]\nusers = 3000\ndays = 12\n'
        "p_active = 0.3\n"
    )
    return (
        "[privacy]\nb_norm = 3.0\nrho = 0.5\n"
        + source
        + '[queries]\nkind = "policy"\npolicy = "streamfilter.policies:drill_down"\n'
        + f'[sink]\nkind = "file"\npath = "{tmp}/{mode}-releases.jsonl"\n'
        + f'[state]\npath = "{tmp}/{mode}.db"\n'
        + f'[mode]\nkind = "{mode}"\n'
        + f'[local]\npath = "{tmp}/contributions.jsonl"\n'
        + "[testing]\nnoise_seed = 11\n"
        + extra
    )


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- conformance
def test_central_and_local_central_noise_release_identical_bytes(tmp_path):
    """Same events (synthetic), same adaptive policy, same test seed: the local-mode server fed
    by per-device filters publishes byte for byte what the central daemon publishes."""
    # the central run opts out of the population estimate: its departure rule needs the
    # per-user state a local-mode server does not keep (docs/design.md §2.12)
    central_text = config_text(tmp_path, "central", "[telemetry]\npopulation = false\n")
    central = write(tmp_path, "central.toml", central_text)
    local = write(tmp_path, "local.toml", config_text(tmp_path, "local"))
    assert main(["run", "--until-end", "--testing", "--config", str(central)]) == 0
    assert main(["simulate-local", "--testing", "--config", str(local)]) == 0
    a = (tmp_path / "central-releases.jsonl").read_bytes()
    b = (tmp_path / "local-releases.jsonl").read_bytes()
    # the central daemon adds its coverage estimate (per-user state, drawn from its own noise
    # key); the local-mode server keeps no per-user state and has none (docs/local-mode.md).
    # Everything else is the same bytes.
    central_rel = [json.loads(x) for x in a.splitlines()]
    assert all("coverage" in r for r in central_rel) and b"coverage" not in b
    a = b"".join(
        json.dumps({k: v for k, v in r.items() if k != "coverage"}).encode() + b"\n"
        for r in central_rel
    )
    assert len(a.splitlines()) >= 12 and a == b
    # the server kept no per-user state
    for table in ("budgets", "budget_log"):
        with sqlite3.connect(tmp_path / "local.db") as db:
            assert db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0
    assert stored_budgets(tmp_path / "central.db")


def test_an_exhausted_device_sends_nothing_on_the_wire(tmp_path):
    """One user alone has plan 'rare'; with B = 3 and clip 1 (cost 1 a day) their device stops
    sending after three days although the user keeps being active — seen on the wire."""
    events = tmp_path / "events.jsonl"
    lines = []
    for d in range(1, 9):
        day = f"2026-01-{d:02d}"
        lines.append({"user_id": "rare-user", "day": day, "values": {"plan": "rare"}})
        for u in range(20):
            lines.append({"user_id": f"u{u}", "day": day, "values": {"plan": "free"}})
    events.write_text("".join(json.dumps(e) + "\n" for e in lines))
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps(QUERY) + "\n")
    source = f'[source]\nkind = "file"\npath = "{events}"\n'
    text = config_text(tmp_path, "local", source=source).replace(
        '[queries]\nkind = "policy"\npolicy = "streamfilter.policies:drill_down"\n',
        f'[queries]\nkind = "file"\npath = "{queries}"\n',
    )
    cfg = write(tmp_path, "l.toml", text)
    assert main(["simulate-local", "--testing", "--config", str(cfg)]) == 0
    wire = [json.loads(x) for x in (tmp_path / "contributions.jsonl").read_text().splitlines()]
    rare_days = sorted(c["day"] for c in wire if c["units"][3] != 0)
    assert rare_days == ["2026-01-01", "2026-01-02", "2026-01-03"]
    free_per_day = {d: sum(1 for c in wire if c["day"] == d and c["units"][0]) for d in rare_days}
    assert set(free_per_day.values()) == {20}  # everybody else still sends every day
    assert len({c["nonce"] for c in wire}) == len(wire)
    assert all(set(c) == {"day", "query_id", "units", "nonce"} for c in wire)  # no identifiers


# ----------------------------------------------------------------------------- validation
def engine(variant: str = "central_noise", s2_local: int | None = None) -> LocalEngine:
    eng = LocalEngine(PARAMS, SeededRandomBits(1), variant, s2_local)
    eng.register_query(parse_query(QUERY))
    return eng


def contribution(units, day="2026-01-01", query_id="plans", nonce=NONCE) -> bytes:
    return json.dumps({"day": day, "query_id": query_id, "units": units, "nonce": nonce}).encode()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (contribution([1025, 0, 0, 0]), "over_clip"),  # ‖u‖ just above clip/γ = 1024
        (contribution([724, 725, 0, 0]), "over_clip"),  # 724² + 725² > 1024²
        (contribution([1, 0, 0]), "invalid_dimension"),
        (contribution([0.5, 0, 0, 0]), "invalid_units"),
        (contribution([True, 0, 0, 0]), "invalid_units"),
        (contribution([2**64, 0, 0, 0]), "invalid_units"),
        (contribution([]), "invalid_units"),
        (contribution([1, 0, 0, 0], query_id="nope"), "unknown_query"),
        (contribution([1, 0, 0, 0], day="2025-12-31"), "inactive_query"),
        (contribution([1, 0, 0, 0], day="2026-02-30"), "invalid_day"),
        (contribution([1, 0, 0, 0], nonce="xyz"), "invalid_nonce"),
        (b'{"day": "2026-01-01"}', "missing_field"),
        (
            b'{"day": "2026-01-01", "query_id": "plans", "units": [1], "nonce": "'
            + NONCE.encode()
            + b'", "user_id": "u1"}',
            "unknown_field",
        ),
        (b"[1, 2]", "not_an_object"),
        (b"\xff\xfe", "malformed_json"),
        (
            b'{"day": "2026-01-01", "query_id": "plans", "units": [NaN], "nonce": "x"}',
            "invalid_number",
        ),
    ],
)
def test_untrusted_contributions_are_refused_with_a_reason(raw, reason):
    with pytest.raises(Reject) as exc:
        engine().parse_record(raw)
    assert exc.value.reason == reason
    assert "1025" not in str(exc.value) and "u1" not in str(exc.value)  # no values quoted


def test_a_contribution_at_the_clip_is_accepted_and_duplicates_count_once():
    eng = engine()
    acc = eng.new_day("2026-01-01")
    assert acc.add(eng.parse_record(contribution([0, 1024, 0, 0])))
    assert acc.add(eng.parse_record(contribution([724, 724, 0, 0], nonce="f" * 32)))
    assert not acc.add(eng.parse_record(contribution([0, 1024, 0, 0])))  # resent: same nonce
    outcome = eng.prepare_day(acc)
    assert [r.query_id for r in outcome.releases] == ["plans"]
    assert len(outcome.changed_users) == 0


contribution_lines = st.one_of(
    st.binary(max_size=200),
    st.builds(
        lambda units, day, qid, nonce: contribution(units, day, qid, nonce),
        st.lists(st.one_of(st.integers(), st.floats(), st.booleans(), st.text()), max_size=6),
        st.sampled_from(["2026-01-01", "2026-01-02", "1969-12-31", "x"]),
        st.sampled_from(["plans", "other", ""]),
        st.sampled_from([NONCE, "0" * 31, "A" * 32]),
    ),
)


@given(st.lists(contribution_lines, max_size=30), st.sampled_from(["central_noise", LOCAL_NOISE]))
@settings(max_examples=200, deadline=None)
def test_fuzzed_contributions_never_crash_or_leak_into_sums(lines, variant):
    """Every line either validates (then it is within the bound the variant allows) or is
    refused with a reason; releases stay finite."""
    eng = engine(variant, 4096 if variant == LOCAL_NOISE else None)
    acc = eng.new_day("2026-01-01")
    bound = eng.max_norm2_units(eng.queries.get("plans"))  # type: ignore[arg-type]
    for raw in lines:
        try:
            rec = eng.parse_record(raw)
        except Reject as rej:
            assert rej.reason and rej.detail
            continue
        assert sum(u * u for u in rec.units) <= bound  # type: ignore[attr-defined]
        acc.add(rec)
    for release in eng.prepare_day(acc).releases:
        assert all(math.isfinite(v) for v in release.value)
        assert math.isfinite(release.sigma)


# ----------------------------------------------------------------------------- local noise
def test_local_noise_releases_carry_the_noise_they_report():
    """n devices each add ``N_Z(0, s_l²)`` lattice units, ``s_l² = ceil(σ_l²/γ²)`` (the oracle,
    computed here from the configuration): the sum's variance is ``n·Var N_Z(0, s_l²)·γ²``.
    The errors pass a two-sided χ² check against it (α = 10⁻³ shared by the checks; a σ off by
    √2 either way fails with probability ≥ 0.999). With n = 64 (a power of two) the reported σ
    is exactly the oracle's; for n = 48 it is the power-of-two bound: true σ ≤ reported ≤
    √2·true. A device that forgot its noise (var 0) or a σ off by √n fails by far."""
    sigma_local = 0.25
    cfg = DeviceConfig.create(
        b_norm=1e6, granularity=GAMMA, variant="local_noise", sigma_local=sigma_local
    )
    s2 = math.ceil(Fraction(sigma_local) ** 2 / Fraction(GAMMA) ** 2)
    assert cfg.sigma2_units == s2
    announcement = Announcement.parse(parse_query(QUERY).canonical_json())
    for n in (64, 48):
        fleet = DeviceFleet(cfg, SeededRandomBits(n))
        eng = engine(LOCAL_NOISE, s2)
        errors, reported = [], set()
        days = 1000 if n == 64 else 400
        matrix = np.zeros((n, 4))
        matrix[:, 1] = 1.0  # every device counts 'pro' once: exact sum n·1024 units
        for k in range(days):
            day = np.datetime64("2026-01-01") + k
            ans = fleet.answer(str(day), [announcement], [f"d{i}" for i in range(n)], [matrix])
            acc = eng.new_day(str(day))
            for row in ans.units[0].tolist():
                acc.add(
                    eng.parse_record(contribution(row, str(day), nonce=f"{len(acc._nonces):032x}"))
                )
            release = eng.prepare_day(acc).releases[0]
            eng.last_closed_day = str(day)
            errors.append(np.array(release.value) - np.array([0, n, 0, 0]))
            reported.add(release.sigma)
        err = np.concatenate(errors)
        true_var = n * oracle.discrete_gaussian_variance(s2) * GAMMA**2
        (sigma,) = reported
        oracle.assert_mean_zero(err, true_var, checks=4)
        oracle.assert_variance(err, true_var, checks=4)
        if n == 64:
            assert sigma**2 == pytest.approx(true_var, rel=1e-9)
        else:
            assert math.sqrt(true_var) < sigma <= math.sqrt(2 * true_var) * (1 + 1e-9)


def test_local_noise_simulation_and_guarantee(tmp_path, capsys):
    extra = ""
    text = config_text(tmp_path, "local", extra).replace(
        "[local]\n", '[local]\nvariant = "local_noise"\nsigma_local = 0.5\n'
    )
    cfg = write(tmp_path, "ln.toml", text)
    assert main(["simulate-local", "--testing", "--config", str(cfg)]) == 0
    releases = [json.loads(x) for x in (tmp_path / "local-releases.jsonl").read_text().splitlines()]
    assert releases and all(r["mechanism"] == "local_discrete_gaussian" for r in releases)
    assert main(["guarantee", "--json", "--config", str(cfg)]) == 0
    g = json.loads(capsys.readouterr().out)
    assert g["mode"] == "local" and g["local_variant"] == "local_noise"
    # B = 3/γ² units, s_l² = 0.25/γ² units: ρ = B/(2 s_l²) = 6 per device against the server
    assert g["rho_local_per_device"] == 6.0 and g["epsilon_local_per_device"] > 6.0
    wire = [json.loads(x) for x in (tmp_path / "contributions.jsonl").read_text().splitlines()]
    # devices' noise makes the wire values non-lattice-aligned multiples of the clip
    assert any(abs(u) not in (0, 1024) for c in wire for u in c["units"])


def test_local_mode_config_errors_name_the_key(tmp_path, capsys):
    text = config_text(tmp_path, "local").replace("[local]\n", '[local]\nvariant = "local_noise"\n')
    assert main(["simulate-local", "--config", str(write(tmp_path, "a.toml", text))]) == 2
    assert "local.sigma_local" in capsys.readouterr().err
    text = config_text(tmp_path, "central")
    assert (
        main(["simulate-local", "--testing", "--config", str(write(tmp_path, "b.toml", text))]) == 2
    )
    assert "[mode] kind = 'local'" in capsys.readouterr().err
    text = config_text(tmp_path, "local", "[telemetry]\nactive_set = true\n")
    assert main(["run", "--testing", "--config", str(write(tmp_path, "c.toml", text))]) == 2
    assert "not available in local mode" in capsys.readouterr().err


# ----------------------------------------------------------------------------- kafka
@pytest.mark.kafka
def test_local_mode_over_kafka_matches_the_file_wire(tmp_path, kafka_bootstrap):
    from streamfilter.runtime.io.kafka import TopicSpec, create_topics
    from tests.support.kafka_broker import unique_topic

    topic = unique_topic("contributions")
    create_topics({"bootstrap_servers": [kafka_bootstrap]}, [TopicSpec("local.topic", topic, 2, 1)])
    file_cfg = write(tmp_path, "f.toml", config_text(tmp_path, "local"))
    assert main(["simulate-local", "--testing", "--config", str(file_cfg)]) == 0
    kdir = tmp_path / "k"
    kdir.mkdir()
    text = (
        config_text(kdir, "local").replace(
            "[local]\n", f'[local]\nkind = "kafka"\ntopic = "{topic}"\n'
        )
        + f'[kafka]\nbootstrap_servers = "{kafka_bootstrap}"\ngroup_id = "{topic}"\n'
    )
    assert main(["simulate-local", "--testing", "--config", str(write(kdir, "k.toml", text))]) == 0
    a = (tmp_path / "local-releases.jsonl").read_bytes()
    assert a and a == (kdir / "local-releases.jsonl").read_bytes()


@given(st.lists(contribution_lines, max_size=20))
@settings(max_examples=300, deadline=None)
def test_the_batch_path_agrees_with_the_line_parser(lines):
    eng = engine()
    batch = eng.parse_records(lines)
    for raw, got in zip(lines, batch, strict=True):
        try:
            want = eng.parse_record(raw)
        except Reject as rej:
            assert isinstance(got, Reject) and (got.reason, got.detail) == (rej.reason, rej.detail)
        else:
            assert got == want


# ----------------------------------------------------------------------------- exactly once
def test_local_server_restarts_after_sigkill_with_identical_releases(tmp_path):
    """The local-mode server uses the central day close: killed at each crash point and
    restarted, it ends with exactly the releases of the uninterrupted simulation."""
    import shutil
    import signal
    import subprocess
    import sys

    queries = tmp_path / "queries.jsonl"
    qs = [{**QUERY, "from_day": "2026-01-02"}, {**QUERY, "query_id": "p2", "clip": 2.0}]
    queries.write_text("".join(json.dumps(q) + "\n" for q in qs))

    def cfg(where: Path) -> Path:
        text = config_text(where, "local").replace(
            '[queries]\nkind = "policy"\npolicy = "streamfilter.policies:drill_down"\n',
            f'[queries]\nkind = "file"\npath = "{queries}"\n',
        )
        return write(where, "local.toml", text)

    assert main(["simulate-local", "--testing", "--config", str(cfg(tmp_path))]) == 0
    expected = (tmp_path / "local-releases.jsonl").read_bytes()
    assert len(expected.splitlines()) >= 20
    for point in ("after_commit:3", "after_publish:2", "before_mark_sent:4"):
        work = tmp_path / point.replace(":", "_")
        work.mkdir()
        shutil.copy(tmp_path / "contributions.jsonl", work / "contributions.jsonl")
        args = [sys.executable, "-m", "streamfilter", "run", "--until-end", "--testing"]
        args += ["--config", str(cfg(work))]
        crashed = subprocess.run(
            args, env={**os.environ, "STREAMFILTER_CRASH_AT": point}, capture_output=True
        )
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr
        subprocess.run(args, check=True, capture_output=True)
        assert (work / "local-releases.jsonl").read_bytes() == expected, point


def test_local_noise_guarantee_matches_the_releases_and_local_path_defaults(tmp_path, capsys):
    """``[local] path`` defaults beside the state; ``guarantee`` for
    ``local_noise`` states no central σ and the variance each release's σ is built from."""
    text = config_text(tmp_path, "local").replace(
        f'[local]\npath = "{tmp_path}/contributions.jsonl"\n',
        '[local]\nvariant = "local_noise"\nsigma_local = 0.5\n',
    )
    assert "local.path" not in text and 'path = "' + str(tmp_path) + "/contrib" not in text
    cfg = write(tmp_path, "ln.toml", text)
    assert main(["simulate-local", "--testing", "--config", str(cfg)]) == 0
    assert (tmp_path / "contributions.jsonl").stat().st_size > 0  # beside local.db
    releases = [json.loads(x) for x in (tmp_path / "local-releases.jsonl").read_text().splitlines()]
    assert main(["guarantee", "--json", "--config", str(cfg)]) == 0
    g = json.loads(capsys.readouterr().out)
    assert "sigma" not in g and g["release_sigma"] == "sqrt(n_bucket * variance_local)"
    for r in releases:
        n_bucket = r["sigma"] ** 2 / g["variance_local"]
        assert n_bucket == pytest.approx(round(n_bucket), rel=1e-9)
        assert round(n_bucket) & (round(n_bucket) - 1) == 0  # a power of two
    assert main(["guarantee", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "server adds no noise" in out and "  mechanism" not in out
    assert f"variance {g['variance_local']:.6g}" in out


def test_sigma_local_calibrates_from_a_per_device_target(tmp_path, capsys):
    """``device_rho`` (or ``device_epsilon`` + ``device_delta``) gives the
    σ_local whose per-device guarantee meets the target (the lattice only rounds it safer)."""
    base = config_text(tmp_path, "local")
    for target, check in (
        ("device_rho = 2.0\n", lambda g: 0.999 * 2.0 <= g["rho_local_per_device"] <= 2.0),
        (
            "device_epsilon = 4.0\ndevice_delta = 1e-6\n",
            lambda g: g["epsilon_local_per_device"] <= 4.0 + 1e-9,
        ),
    ):
        text = base.replace("[local]\n", f'[local]\nvariant = "local_noise"\n{target}')
        cfg = write(tmp_path, "t.toml", text)
        assert main(["guarantee", "--json", "--config", str(cfg)]) == 0
        assert check(json.loads(capsys.readouterr().out))
    text = base.replace("[local]\n", '[local]\nvariant = "local_noise"\ndevice_epsilon = 4.0\n')
    assert main(["guarantee", "--config", str(write(tmp_path, "u.toml", text))]) == 2
    assert "device_delta" in capsys.readouterr().err
