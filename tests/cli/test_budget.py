"""``streamfilter budget``: one user's realized loss and odometer, read without the writer lock."""

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from streamfilter.cli import budget
from streamfilter.cli.budget import user_budget
from streamfilter.cli.main import main
from streamfilter.config import config_fingerprint, load_config
from streamfilter.privacy.accounting import epsilon_from_rho_cks, epsilon_from_rho_gdp
from streamfilter.privacy.odometer import user_loss
from streamfilter.runtime.store import (
    DayCommit,
    Position,
    SQLiteStateReader,
    SQLiteStateStore,
    StoreError,
)

CONFIG = """
[privacy]
b_norm = 4.0
rho = 0.5
granularity = 0.0009765625
mechanism = "{mechanism}"
[source]
kind = "synthetic"
[state]
path = "state.db"
"""
UNIT = 2**20  # lattice units per data unit² at γ = 2^-10


def make_state(tmp: Path, mechanism: str = "discrete_gaussian", users=None) -> Path:
    cfg = tmp / "streamfilter.toml"
    cfg.write_text(CONFIG.format(mechanism=mechanism))
    settings = load_config(cfg)
    store = SQLiteStateStore(settings.state.path)
    try:
        store.set_config_fingerprint(config_fingerprint(settings.privacy_params()))
        users = users or {"u-1": (3 * UNIT // 2, False), "u-2": (4 * UNIT, True), "u-3": (7, False)}
        store.commit_day(
            DayCommit(
                day="2026-01-03",
                releases=[],
                changed_users=np.array(list(users), dtype=object),
                spent_units=np.array([s for s, _ in users.values()], dtype=np.int64),
                retired=np.array([r for _, r in users.values()], dtype=bool),
                positions={"p0": Position(0, 0)},
            )
        )
    finally:
        store.close()
    return cfg


def test_discrete_gaussian_user_loss_is_the_exact_ratio_and_cks(tmp_path):
    settings = load_config(make_state(tmp_path))
    params = settings.privacy_params()
    b = user_budget(settings, "u-1")
    assert b["user_id"] == "u-1" and b["spent"] == 1.5 and b["spent_units"] == 3 * UNIT // 2
    assert b["remaining"] == 2.5 and b["budget_units"] == 4 * UNIT and not b["retired"]
    exact = Fraction(b["spent_units"], 2 * params.sigma2_units)
    assert Fraction(b["rho_spent"]) >= exact and b["rho_spent"] == pytest.approx(float(exact))
    assert b["method"] == "cks" and b["delta"] == params.delta
    assert b["epsilon_spent"] == epsilon_from_rho_cks(b["rho_spent"], params.delta)
    # the same numbers as the odometer module's own per-user loss
    ref = user_loss(
        b["spent_units"], params.granularity, params.sigma2_units, params.delta, "discrete_gaussian"
    )
    assert (b["spent"], b["rho_spent"], b["epsilon_spent"]) == (
        ref.spent,
        ref.rho_spent,
        ref.epsilon_spent,
    )
    assert b["rho_spent"] + b["rho_remaining"] <= b["rho_budget"] * (1 + 1e-12)


def test_the_odometer_rounds_up_to_whole_steps_and_never_exceeds_the_budget(tmp_path):
    settings = load_config(make_state(tmp_path))
    default = user_budget(settings, "u-1")["odometer"]
    assert 0.04 <= default["step"] < 0.04 + 2**-20  # b_norm / 100, up to whole lattice units
    assert default["step_units"] == math.ceil(Fraction(4.0) / 100 * UNIT)
    o = user_budget(settings, "u-1", step=1.0)["odometer"]
    assert o["spent"] == 2.0 and o["spent_units"] == 2 * UNIT  # ceil(1.5/1)·1
    assert o["epsilon"] >= user_budget(settings, "u-1")["epsilon_spent"]
    o = user_budget(settings, "u-2", step=3.0)["odometer"]
    assert o["spent"] == 4.0  # min(ceil(4/3)·3, B) = B
    o = user_budget(settings, "u-3", step=1e-9)["odometer"]  # below one lattice unit: one unit
    assert o["step_units"] == 1 and o["spent_units"] == 7


def test_a_user_never_charged_has_spent_nothing(tmp_path):
    b = user_budget(load_config(make_state(tmp_path)), "nobody")
    assert (b["spent"], b["rho_spent"], b["epsilon_spent"], b["odometer"]["spent"]) == (0, 0, 0, 0)
    assert b["remaining"] == 4.0


def test_gaussian_mechanism_uses_the_continuous_sigma_and_gdp(tmp_path):
    settings = load_config(make_state(tmp_path, mechanism="gaussian"))
    params = settings.privacy_params()
    b = user_budget(settings, "u-1")
    exact = (
        Fraction(b["spent_units"])
        * Fraction(params.granularity) ** 2
        / (2 * Fraction(params.sigma) ** 2)
    )
    # never below the exact loss (ceil(σ²/γ²) would understate it for the continuous mechanism)
    assert Fraction(b["rho_spent"]) >= exact and b["rho_spent"] == pytest.approx(float(exact))
    assert b["method"] == "gdp"
    assert b["epsilon_spent"] == epsilon_from_rho_gdp(b["rho_spent"], params.delta)


def test_budget_reads_while_the_daemon_holds_the_lock_and_never_writes(tmp_path, capsys):
    cfg = make_state(tmp_path)
    db = tmp_path / "state.db"
    writer = SQLiteStateStore(db)  # the running daemon
    try:
        assert main(["budget", "--config", str(cfg), "--user", "u-1", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert {"user_id", "spent", "rho_spent", "epsilon_spent", "delta"} <= set(out)
        # the writer commits another day: the next read sees it (the last committed day)
        writer.commit_day(
            DayCommit(
                day="2026-01-04",
                releases=[],
                changed_users=np.array(["u-1"], dtype=object),
                spent_units=np.array([2 * UNIT], dtype=np.int64),
                retired=np.zeros(1, bool),
                positions={"p0": Position(0, 0)},
            )
        )
        assert main(["budget", "--config", str(cfg), "--user", "u-1", "--json"]) == 0
        again = json.loads(capsys.readouterr().out)
        assert again["spent"] == 2.0 and again["last_closed_day"] == "2026-01-04"
        with SQLiteStateReader(db) as reader, pytest.raises(Exception, match="readonly"):
            reader._db.execute("DELETE FROM budgets")
    finally:
        writer.close()
    assert writer_budget(db, "u-1") == (2 * UNIT, False)  # untouched by the reads


def writer_budget(db, user):
    store = SQLiteStateStore(db)
    try:
        return store.spent_units(user)
    finally:
        store.close()


def test_budget_text_says_it_is_for_that_user_only(tmp_path, capsys):
    cfg = make_state(tmp_path)
    assert main(["budget", "--config", str(cfg), "--user", "u-2", "--step", "0.5"]) == 0
    text = capsys.readouterr().out
    assert "for this user only" in text and "[retired]" in text and "odometer" in text
    assert "for that user alone" in budget.__doc__ and "no network endpoint" in budget.__doc__


def test_budget_refuses_a_different_privacy_configuration_and_a_missing_state(tmp_path, capsys):
    cfg = make_state(tmp_path)
    cfg.write_text(cfg.read_text().replace("b_norm = 4.0", "b_norm = 8.0"))
    assert main(["budget", "--config", str(cfg), "--user", "u-1"]) == 2
    assert "[privacy] differs" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "streamfilter.toml").write_text(CONFIG.format(mechanism="discrete_gaussian"))
    assert main(["budget", "--config", str(other / "streamfilter.toml"), "--user", "u-1"]) == 4
    assert "no state store" in capsys.readouterr().err
    assert not (other / "state.db").exists()  # a read never creates a state
    with pytest.raises(StoreError, match="no state store"):
        SQLiteStateReader(other / "state.db")
