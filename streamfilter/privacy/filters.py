"""Generic privacy filters (Feldman & Zrnic, §4). The odometer is
:func:`streamfilter.privacy.odometer.discretised_odometer`.

Each filter has an immutable description (its parameters, fixed at construction and exposed as
read-only properties) and a ledger that only :meth:`spend` changes. ``would_continue`` is a dry
run; ``spend`` runs the same check and commits only on CONT. A HALT leaves the ledger exactly as it
was, so a later, cheaper step may still continue: the halted step never ran, so it cost nothing
(the analyst may replace a halted computation, remark after Lemma 4.2; Algorithm 3 skips a user in
the same way).

When *not* to use these classes
-------------------------------
streamfilter's per-user admission (Algorithm 3) does **not** use them: it works with exact integer
costs in lattice units (``streamfilter.privacy.individual_filter``), so no floating-point comparison ever
decides admission. These classes take float losses for use on their own (notebooks, tests, other
pipelines). Callers must pass losses that are *upper bounds* on the true per-step loss; a loss
rounded down before it gets here is outside what this module can fix.

Floating point: the comparison direction
----------------------------------------
A filter must never answer CONT when the exact sum of the losses exceeds the budget. A
correctly rounded sum (``math.fsum``) is not enough on its own: an exact sum a fraction of an ulp
above the budget rounds to the budget itself and would compare ``<=``. So the ledger keeps the
*exact* rational sum of the float inputs (``fractions.Fraction``; every float is a dyadic
rational, so this is exact) and compares it with the exact budget. Reported ``spent`` values are
rounded up and ``remaining`` values down.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Literal

import numpy as np

from streamfilter.privacy.accounting import (
    rho_from_epsilon_delta_cks,
    rho_from_epsilon_delta_thm49,
)
from streamfilter.privacy.rounding import float_down, float_up

__all__ = [
    "DPFilter",
    "IndividualMultiOrderFilters",
    "MultiOrderRenyiFilter",
    "RenyiFilter",
    "ZCDPFilter",
]

DPConversion = Literal["thm49", "cks"]


def _exact_nonnegative(name: str, value: object) -> Fraction:
    """Validate a finite ``>= 0`` real number and return it as an exact rational."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {name}={value!r}")
    number = float(value)
    if not (math.isfinite(number) and number >= 0.0):
        raise ValueError(f"{name} must be finite and >= 0, got {name}={value!r}")
    return Fraction(number)


class _SumFilter:
    """CONT iff (exact sum of admitted losses) + (candidate loss) <= budget (Theorem 4.3)."""

    _loss_name = "rho_t"

    def __init__(self, budget: Fraction) -> None:
        self._budget = budget
        self._spent = Fraction(0)
        self._steps = 0

    def _loss(self, value: object) -> Fraction:
        return _exact_nonnegative(self._loss_name, value)

    def _check(self, loss: Fraction) -> bool:
        return self._spent + loss <= self._budget

    def would_continue(self, loss: float) -> bool:
        """Dry run: would a step with this loss get CONT? Never changes the ledger."""
        return self._check(self._loss(loss))

    def spend(self, loss: float) -> bool:
        """CONT: record the loss and return True. HALT: return False, ledger unchanged."""
        exact = self._loss(loss)
        if not self._check(exact):
            return False
        self._spent += exact
        self._steps += 1
        return True

    @property
    def spent(self) -> float:
        """Sum of the admitted losses, rounded up."""
        return float_up(self._spent)

    @property
    def remaining(self) -> float:
        """Budget minus spent, rounded down (``>= 0``)."""
        return float_down(self._budget - self._spent)

    @property
    def steps(self) -> int:
        """Number of admitted (CONT) steps."""
        return self._steps


class RenyiFilter(_SumFilter):
    """The Rényi privacy filter ``F_{α,B}`` of Theorem 4.3.

    CONT iff ``Σ_t ρ_t <= B``, where ``ρ_t`` is the order-α RDP parameter of step t given the past
    outputs; the composed output is then (α, B)-RDP, for any adaptively chosen sequence.
    """

    _alpha: float

    def __init__(self, alpha: float, budget: float) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
            raise ValueError(f"alpha must be a real number, got alpha={alpha!r}")
        if not (math.isfinite(float(alpha)) and float(alpha) >= 1.0):
            raise ValueError(f"alpha must be finite and >= 1, got alpha={alpha!r}")
        super().__init__(_exact_nonnegative("budget", budget))
        self._alpha = float(alpha)

    @property
    def alpha(self) -> float:
        return self._alpha

    @property
    def budget(self) -> float:
        return float(self._budget)

    def would_continue(self, rho_t: float) -> bool:
        """Dry run of Theorem 4.3 for a step with order-α RDP ``rho_t``."""
        return super().would_continue(rho_t)

    def spend(self, rho_t: float) -> bool:
        """Theorem 4.3: commit ``rho_t`` iff CONT; on HALT the ledger is unchanged."""
        return super().spend(rho_t)


class MultiOrderRenyiFilter:
    """Rényi filters at a set of orders run together (Feldman & Zrnic, Remark 4.4, last sentence).

    One filter ``F_{α_j, B_j}`` per order; a step continues iff *every* order continues, i.e.
    ``Σ_t ρ_t(α_j) + ρ(α_j) <= B_j`` for all j (exact rational sums, as in
    :class:`RenyiFilter`). The composed output is then ``(α_j, B_j)``-RDP for every j at once;
    any of those, converted to (ε, δ)-DP, is a valid guarantee (e.g.
    :func:`streamfilter.privacy.subsampled.epsilon_from_rdp` takes the best).

    Use it for mechanisms whose RDP is not linear in α (the subsampled Gaussian): a zCDP filter
    would have to charge the worst ratio ρ(α)/α over all orders. For Gaussian steps without
    subsampling use :class:`ZCDPFilter`, which is the same rule with one number.
    """

    def __init__(self, orders: object, budgets: object) -> None:
        order_list = list(orders)  # type: ignore[call-overload]
        budget_list = list(budgets)  # type: ignore[call-overload]
        if not order_list or len(order_list) != len(budget_list):
            raise ValueError(
                f"orders and budgets must be non-empty and of equal length, got "
                f"{len(order_list)} orders and {len(budget_list)} budgets"
            )
        self._filters = tuple(
            RenyiFilter(a, b) for a, b in zip(order_list, budget_list, strict=True)
        )
        alphas = [f.alpha for f in self._filters]
        if len(set(alphas)) != len(alphas):
            raise ValueError(f"orders must be distinct, got orders={order_list!r}")

    def _losses(self, rdp_t: object) -> list[Fraction]:
        values = list(rdp_t)  # type: ignore[call-overload]
        if len(values) != len(self._filters):
            raise ValueError(
                f"rdp_t must have one value per order ({len(self._filters)}), got {len(values)}"
            )
        return [_exact_nonnegative("rdp_t", float(v)) for v in values]

    def would_continue(self, rdp_t: object) -> bool:
        """Dry run: would a step with per-order RDP ``rdp_t`` continue at every order?"""
        losses = self._losses(rdp_t)
        return all(f._check(x) for f, x in zip(self._filters, losses, strict=True))

    def spend(self, rdp_t: object) -> bool:
        """CONT at every order: commit all orders and return True; else False, ledger unchanged."""
        losses = self._losses(rdp_t)  # check everything first ...
        if not all(f._check(x) for f, x in zip(self._filters, losses, strict=True)):
            return False
        for f, x in zip(self._filters, losses, strict=True):  # ... then commit
            f._spent += x
            f._steps += 1
        return True

    @property
    def orders(self) -> tuple[float, ...]:
        return tuple(f.alpha for f in self._filters)

    @property
    def budgets(self) -> tuple[float, ...]:
        return tuple(f.budget for f in self._filters)

    @property
    def spent(self) -> tuple[float, ...]:
        """Per-order sums of the admitted RDP, each rounded up."""
        return tuple(f.spent for f in self._filters)

    @property
    def remaining(self) -> tuple[float, ...]:
        """Per-order budget minus spent, each rounded down."""
        return tuple(f.remaining for f in self._filters)

    @property
    def steps(self) -> int:
        return self._filters[0].steps


class IndividualMultiOrderFilters:
    """One :class:`MultiOrderRenyiFilter` per individual (Algorithm 3 with Remark 4.4's
    multi-order filter), for n individuals at once.

    Individual i's step continues iff ``spent_i(α_j) + ρ_i(α_j) <= B_j`` at *every* order j
    (Remark 4.4: if all filters output CONT, the composition is ``(α_j, B_j)``-RDP for all j);
    a HALT leaves i's ledger unchanged. Theorem 4.5 makes the composition ``(α_j, B_j)``-RDP
    for every j when each ``ρ_i`` bounds the step's order-α RDP with respect to individual i
    given the past outputs (it may depend on i's own record).

    Vectorised and exact in integer arithmetic: losses are rounded *up* and budgets *down* to
    multiples of ``unit`` (a power of two, 2^-40 by default, so the scaling is exact and
    ``ceil``/``floor`` are exact), and sums are int64. The rounding only makes the filter
    stricter than :class:`MultiOrderRenyiFilter` (identical decisions on multiples of
    ``unit``).
    """

    def __init__(self, n: int, orders: object, budgets: object, unit_exponent: int = -40) -> None:
        order_arr = np.asarray(list(orders), dtype=np.float64)  # type: ignore[call-overload]
        budget_arr = np.asarray(list(budgets), dtype=np.float64)  # type: ignore[call-overload]
        if n < 1 or order_arr.ndim != 1 or order_arr.size == 0:
            raise ValueError(f"need n >= 1 and a non-empty list of orders, got n={n}")
        if order_arr.shape != budget_arr.shape:
            raise ValueError(
                f"orders and budgets must be of equal length, got {order_arr.size} orders and "
                f"{budget_arr.size} budgets"
            )
        if not (np.all(np.isfinite(order_arr)) and np.all(order_arr >= 1.0)):
            raise ValueError(f"orders must be finite and >= 1, got orders={orders!r}")
        if np.unique(order_arr).size != order_arr.size:
            raise ValueError(f"orders must be distinct, got orders={orders!r}")
        if not (np.all(np.isfinite(budget_arr)) and np.all(budget_arr >= 0.0)):
            raise ValueError(f"budgets must be finite and >= 0, got budgets={budgets!r}")
        self._scale = math.ldexp(1.0, -unit_exponent)
        scaled = budget_arr * self._scale
        if np.any(scaled >= 2.0**62):
            raise ValueError(f"budgets too large for 2^{unit_exponent} units in int64")
        self._orders = tuple(float(a) for a in order_arr)
        self._budget_units = np.floor(scaled).astype(np.int64)
        self._spent_units = np.zeros((n, order_arr.size), np.int64)

    def units(self, rdp: np.ndarray) -> np.ndarray:
        """Losses in units, rounded up (``inf`` or values above the int64 range: 2^62)."""
        x = np.asarray(rdp, dtype=np.float64)
        if x.shape[-1:] != (len(self._orders),) or np.any(~(x >= 0)):
            raise ValueError(f"rdp must be >= 0 with one value per order, got shape {x.shape}")
        scaled = np.minimum(x * self._scale, 2.0**62)
        return np.ceil(scaled).astype(np.int64)

    def fits(self, index: np.ndarray, loss_units: np.ndarray) -> np.ndarray:
        """Dry run: which individuals ``index`` would continue with ``loss_units`` (len(index),
        orders) — every order within its budget."""
        total = self._spent_units[index] + loss_units
        ok: np.ndarray = np.all(total <= self._budget_units[None, :], axis=1)
        return ok

    def spend(self, index: np.ndarray, loss_units: np.ndarray) -> np.ndarray:
        """CONT for those that fit at every order (ledgers charged), HALT for the rest (ledgers
        unchanged). Returns the CONT mask over ``index``, which must be strictly increasing (so
        no individual is charged twice in one call)."""
        idx = np.asarray(index, dtype=np.int64)
        if idx.size > 1 and not bool(np.all(idx[1:] > idx[:-1])):
            raise ValueError("index must be strictly increasing (no individual repeated)")
        ok = self.fits(idx, loss_units)
        self._spent_units[idx[ok]] += loss_units[ok]
        return ok

    @property
    def orders(self) -> tuple[float, ...]:
        return self._orders

    @property
    def budgets(self) -> tuple[float, ...]:
        """Per-order budgets as enforced (rounded down to units)."""
        return tuple(float(b) / self._scale for b in self._budget_units)

    def spent(self) -> np.ndarray:
        """(n, orders) spent RDP, exact multiples of the unit (an upper bound of the sums of
        the losses passed in). Individual values: private (show each to its owner only)."""
        out: np.ndarray = self._spent_units.astype(np.float64) / self._scale
        return out


class ZCDPFilter(_SumFilter):
    """zCDP filter (Remark 4.4): CONT iff ``Σ_t ρ_t <= ρ``, with ``ρ_t`` the zCDP of step t.

    Running Theorem 4.3 at order α with budget αρ on losses αρ_t gives the same, α-free rule, so
    the output is (α, αρ)-RDP for every α at once, i.e. ρ-zCDP.
    """

    def __init__(self, rho_budget: float) -> None:
        super().__init__(_exact_nonnegative("rho_budget", rho_budget))

    @property
    def rho_budget(self) -> float:
        return float(self._budget)

    def would_continue(self, rho_t: float) -> bool:
        """Dry run of the zCDP filter for a step that is ``rho_t``-zCDP."""
        return super().would_continue(rho_t)

    def spend(self, rho_t: float) -> bool:
        """Commit ``rho_t`` iff CONT; on HALT the ledger is unchanged."""
        return super().spend(rho_t)


class DPFilter(_SumFilter):
    """The (ε_g, δ_g)-DP filter of Theorem 4.9 for pure ε_t-DP steps.

    An ε_t-DP step is ½ε_t²-zCDP, so the zCDP filter with budget ``B*`` — the largest ρ for which
    ρ-zCDP implies (ε_g, δ_g)-DP — continues iff ``½·Σ ε_t² <= B*``. ``conversion`` picks how B*
    is computed: ``"thm49"`` (the closed form in Theorem 4.9) or ``"cks"`` (the tight CKS 2020
    conversion; larger B*, same validity). B* is rounded down; ``½ε_t²`` is computed exactly.
    GDP is not offered: pure-DP steps are not Gaussian mechanisms.
    """

    _loss_name = "epsilon_t"
    _epsilon_g: float
    _delta_g: float
    _conversion: DPConversion

    def __init__(
        self, epsilon_g: float, delta_g: float, conversion: DPConversion = "thm49"
    ) -> None:
        epsilon_g = float(_exact_nonnegative("epsilon_g", epsilon_g))
        if isinstance(delta_g, bool) or not isinstance(delta_g, numbers.Real):
            raise ValueError(f"delta_g must be a real number, got delta_g={delta_g!r}")
        if not 0.0 < float(delta_g) < 1.0:
            raise ValueError(f"delta_g must be in (0, 1), got delta_g={delta_g!r}")
        if conversion == "thm49":
            rho_budget = rho_from_epsilon_delta_thm49(epsilon_g, delta_g)
        elif conversion == "cks":
            rho_budget = rho_from_epsilon_delta_cks(epsilon_g, delta_g)
        else:
            raise ValueError(f"conversion must be 'thm49' or 'cks', got conversion={conversion!r}")
        super().__init__(Fraction(rho_budget))
        self._epsilon_g = float(epsilon_g)
        self._delta_g = float(delta_g)
        self._conversion = conversion

    def _loss(self, value: object) -> Fraction:
        epsilon_t = _exact_nonnegative(self._loss_name, value)
        return epsilon_t * epsilon_t / 2

    @property
    def epsilon_g(self) -> float:
        return self._epsilon_g

    @property
    def delta_g(self) -> float:
        return self._delta_g

    @property
    def conversion(self) -> DPConversion:
        return self._conversion

    @property
    def rho_budget(self) -> float:
        """B*, the zCDP budget the filter enforces (rounded down)."""
        return float(self._budget)

    def would_continue(self, epsilon_t: float) -> bool:
        """Dry run of Theorem 4.9 for an ``epsilon_t``-DP step."""
        return super().would_continue(epsilon_t)

    def spend(self, epsilon_t: float) -> bool:
        """Commit ``½·epsilon_t²`` iff CONT; on HALT the ledger is unchanged. ``spent`` is in
        zCDP units (``½·Σ ε_t²``)."""
        return super().spend(epsilon_t)
