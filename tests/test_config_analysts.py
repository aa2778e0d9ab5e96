"""``[analysts.<name>] share``: strictly typed, shares summing to at most 1 (docs/design.md
§2.13)."""

import pytest

from streamfilter.config import ConfigError, load_config

PRIVACY = (
    '[privacy]\nb_norm = 4.0\nrho = 0.5\ngranularity = 0.0009765625\n[queries]\nkind = "none"\n'
)


def _load(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(PRIVACY + text)
    return load_config(path)


def test_shares_become_exact_sub_budgets_and_the_default_analyst_gets_the_rest(tmp_path):
    settings = _load(tmp_path, "[analysts.growth]\nshare = 0.3\n[analysts.ops]\nshare = 0.1\n")
    quotas = settings.analyst_quotas()
    budget = settings.privacy_params().budget_units  # 4·2^20
    assert quotas.sub_budget_units == {
        "growth": (3 * budget) // 10,
        "ops": budget // 10,
        "default": budget - (3 * budget) // 10 - budget // 10,
    }
    assert sum(quotas.sub_budget_units.values()) == budget


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[analysts.growth]\nshare = "0.3"\n', "analysts.growth.share"),
        ("[analysts.growth]\nshare = true\n", "analysts.growth.share"),
        ("[analysts.growth]\nshare = 1.5\n", "analysts.growth.share"),
        ("[analysts.growth]\nshare = 0\n", "analysts.growth.share"),
        ("[analysts.growth]\nshare = 0.3\nquota = 1\n", "unknown key"),
        ('[analysts."bad name"]\nshare = 0.3\n', "analysts.bad name"),
        (
            "[analysts.growth]\nshare = 0.6\n[analysts.ops]\nshare = 0.5\n",
            "the shares sum to 1.1 > 1; oversubscribing every user's budget is refused",
        ),
        (
            "[analysts.growth]\nshare = 0.3\n[telemetry]\npopulation = true\n",
            "the population estimate does not support analysts yet",
        ),
        (
            '[analysts.growth]\nshare = 0.3\n[state]\nkind = "postgres"\n'
            'url = "postgresql://u@127.0.0.1:1/db"\n',
            "analysts need a SQLite state for now",
        ),
    ],
)
def test_loose_or_oversubscribed_quotas_are_refused(tmp_path, text, needle):
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, text)
    assert needle in str(exc.value)


def test_shares_are_the_decimals_written(tmp_path):
    """0.1 + 0.2 + 0.7 is 1, as written (the binary floats sum above 1)."""
    text = "".join(
        f"[analysts.{n}]\nshare = {s}\n" for n, s in (("a", 0.1), ("b", 0.2), ("c", 0.7))
    )
    quotas = _load(tmp_path, text).analyst_quotas()
    budget = quotas.budget_units  # 4·2^20: 0.1·B and 0.7·B are not whole units
    assert [quotas.sub_budget_units[n] for n in "abc"] == [
        budget // 10,
        budget // 5,
        7 * budget // 10,
    ]
    assert quotas.sub_budget_units["default"] == 2  # what the floors leave, nothing more
