"""``budget`` and ``budget-stats`` say what they spend and what is left before spending, refuse
cleanly once the telemetry budget cannot afford a call, and word a state with no closed day."""

from __future__ import annotations

import re

from streamfilter.cli.main import main

CONFIG = '[privacy]\nb_norm = 4.0\nrho = 0.1\n[source]\nkind = "synthetic"\n[state]\npath = "{}"\n'


def test_budget_stats_spends_its_share_five_times_then_refuses_in_one_clean_line(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.format(tmp_path / "state.db"))
    # telemetry.rho = 0.01 by default and budget-stats a fifth of it: five calls fit
    for left in (4, 3, 2, 1, 0):
        assert main(["budget-stats", "--config", str(cfg)]) == 0
        out, err = capsys.readouterr()
        assert re.search(r"budget-stats spends telemetry\.stats_rho = 0\.002 of the \S+ left", err)
        cost = next(line for line in out.splitlines() if "cost" in line)
        assert f"({left} more budget-stats call(s))" in cost, cost
        assert "e-" not in cost  # no float dust such as 1.73472e-18
        assert "no day has closed yet" in out and "None" not in out
    assert "remaining 0 (0 more" in cost
    assert main(["budget-stats", "--config", str(cfg)]) == 5
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.startswith("streamfilter: ")]
    assert out == "" and len(lines) == 1 and "e-" not in lines[0], err
    assert "costs telemetry.stats_rho = 0.002 but 0 of telemetry.rho = 0.01 remains" in lines[0]


def test_budget_says_it_spends_nothing_and_words_a_state_with_no_closed_day(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.format(tmp_path / "state.db"))
    assert main(["budget-stats", "--config", str(cfg)]) == 0  # creates the state
    capsys.readouterr()
    assert main(["budget", "--config", str(cfg), "--user", "u-1"]) == 0
    out = capsys.readouterr().out
    assert "no budget is spent by looking" in out
    assert "no day has closed yet" in out and "None" not in out
