"""Per-analyst quotas under the per-user filter (docs/design.md §2.13), pure integer arithmetic.

Each analyst ``a`` gets, for every user, a sub-budget ``B_a = floor(share_a · B)`` lattice units,
``share_a`` read as the decimal it is written as (the float's shortest ``repr``: ``0.3`` is 3/10)
and the product floored exactly, so ``B_a`` is never above the real ``share_a·B``; the
default analyst — the owner of every query that names none — gets ``floor(share · B)`` if it is
declared, else the remainder ``B − Σ_a B_a``. Shares summing to more than 1 are refused, so
``Σ_a B_a ≤ B``.

A contribution of cost ``c`` to a query of analyst ``a`` is admitted only if it fits both the
user's global budget and the analyst's sub-budget:

    spent + c ≤ B   and   spent_a + c ≤ B_a,

i.e. ``c ≤ remaining = min(B − spent, B_a − spent_a)``. The global filter is Feldman & Zrnic's
(Theorem 4.5, Remark 4.4) with a more restrictive admission rule that still depends only on the
user's own past charges, so the run stays ρ-zCDP (§2.13 proves it under cross-analyst
adaptivity).

Only the named analysts' spends are stored; the default analyst's is derived,
``spent_default = spent − Σ_named spent_a``, so a state from before analysts (all of whose spend
came from queries without an analyst) counts every unit against the default analyst with no
rewriting. A named analyst's entry is kept in the same per-user budget rows as the global one,
under the key :func:`analyst_key` (``analyst`` + U+001F + user id): user ids never contain a
control character (the contract refuses them), so the keys never collide with a user.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

__all__ = [
    "ANALYST_KEY_SEPARATOR",
    "ANALYST_NAME_PATTERN",
    "DEFAULT_ANALYST",
    "AnalystQuotas",
    "analyst_key",
    "analyst_keys",
    "split_budgets",
]

#: the analyst of every query that names none
DEFAULT_ANALYST = "default"
#: an analyst's name: 1 to 64 letters, digits, ``_`` or ``-``
ANALYST_NAME_PATTERN = r"^[A-Za-z0-9_\-]{1,64}$"
#: between the analyst and the user id in a stored sub-budget key (a control character: never
#: part of a user id)
ANALYST_KEY_SEPARATOR = "\x1f"


def analyst_key(analyst: str, user_id: str) -> str:
    """The stored key of ``user_id``'s spend on ``analyst``'s sub-budget."""
    return f"{analyst}{ANALYST_KEY_SEPARATOR}{user_id}"


def analyst_keys(analyst: str, users: np.ndarray) -> np.ndarray:
    """:func:`analyst_key` of each user (object array)."""
    prefix = analyst + ANALYST_KEY_SEPARATOR
    return np.array([prefix + u for u in np.asarray(users, dtype=object).tolist()], dtype=object)


def split_budgets(
    budgets: Iterable[tuple[str, int, bool]],
) -> tuple[list[tuple[str, int, bool]], dict[str, list[tuple[str, int, bool]]]]:
    """Stored per-user budget entries → (the users' global entries, each named analyst's
    entries keyed by user id)."""
    plain: list[tuple[str, int, bool]] = []
    named: dict[str, list[tuple[str, int, bool]]] = {}
    for key, spent, retired in budgets:
        analyst, sep, user = key.partition(ANALYST_KEY_SEPARATOR)
        if sep:
            named.setdefault(analyst, []).append((user, spent, retired))
        else:
            plain.append((key, spent, retired))
    return plain, named


@dataclass(frozen=True)
class AnalystQuotas:
    """The analysts' per-user sub-budgets (lattice units) under the global budget ``B``.

    ``sub_budget_units`` holds every analyst, the default one included; ``shares`` the
    configured shares (the default analyst's is the remainder when it was not configured).
    """

    budget_units: int
    sub_budget_units: Mapping[str, int]
    shares: Mapping[str, Fraction]

    @classmethod
    def from_shares(cls, shares: Mapping[str, float], budget_units: int) -> AnalystQuotas:
        """Sub-budgets ``floor(share·B)``, each share the decimal it is written as, exactly;
        the default analyst, unless given a share, gets ``B − Σ floor(share_a·B)``. Shares must
        be in (0, 1] and sum to at most 1 (exactly, as decimals: 0.1 + 0.2 + 0.7 is 1):
        oversubscription is refused."""
        exact: dict[str, Fraction] = {}
        for name, share in shares.items():
            if isinstance(share, bool) or not isinstance(share, int | float):
                raise ValueError(f"analysts.{name}.share must be a number")
            if not 0 < share <= 1:  # NaN too
                raise ValueError(f"analysts.{name}.share must be in (0, 1]")
            value = Fraction(repr(float(share)))  # the decimal written: 0.3 is 3/10
            if not 0 < value <= 1:
                raise ValueError(f"analysts.{name}.share must be in (0, 1]")
            exact[name] = value
        total = sum(exact.values(), Fraction(0))
        if total > 1:
            raise ValueError(
                f"the shares sum to {float(total):.6g} > 1; oversubscribing every "
                "user's budget is refused — lower the shares so they sum to at most 1"
            )
        units = {name: (value * budget_units).__floor__() for name, value in exact.items()}
        if DEFAULT_ANALYST not in exact:
            units[DEFAULT_ANALYST] = budget_units - sum(units.values())
            exact[DEFAULT_ANALYST] = 1 - total
        return cls(budget_units, units, exact)

    @classmethod
    def single(cls, budget_units: int) -> AnalystQuotas:
        """No analysts configured: the default analyst owns the whole budget."""
        return cls.from_shares({}, budget_units)

    @property
    def analysts(self) -> tuple[str, ...]:
        """Every analyst, sorted (the default one included)."""
        return tuple(sorted(self.sub_budget_units))

    @property
    def named(self) -> tuple[str, ...]:
        """The analysts whose spend is stored (all but the default one), sorted."""
        return tuple(a for a in self.analysts if a != DEFAULT_ANALYST)

    @property
    def active(self) -> bool:
        """Whether any analyst besides the default one is declared."""
        return bool(self.named)

    def owner(self, analyst: str | None) -> str:
        """The analyst a query belongs to; ``ValueError`` for an undeclared one."""
        name = DEFAULT_ANALYST if analyst is None else analyst
        if name not in self.sub_budget_units:
            raise ValueError(f"analyst {name!r} is not declared in [analysts]")
        return name

    def default_spent(self, spent: np.ndarray, named_spent: Sequence[np.ndarray]) -> np.ndarray:
        """The default analyst's spend: the global spend minus the named analysts'."""
        out = np.asarray(spent, np.int64).copy()
        for s in named_spent:
            out -= s
        if (out < 0).any():
            raise ValueError("an analyst's spend exceeds the user's spend: the ledger is corrupt")
        return out

    def remaining_units(
        self, analyst: str, spent: np.ndarray, analyst_spent: np.ndarray
    ) -> np.ndarray:
        """``min(B − spent, B_a − spent_a)``, at least 0 (a state from before analysts may hold
        more default spend than the default analyst's sub-budget): what a contribution to one of
        ``analyst``'s queries may cost (exact int64)."""
        glob = self.budget_units - np.asarray(spent, np.int64)
        own = self.sub_budget_units[analyst] - np.asarray(analyst_spent, np.int64)
        return np.maximum(np.minimum(glob, own), 0)
