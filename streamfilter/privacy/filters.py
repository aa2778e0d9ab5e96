"""Generic privacy filters and the filter-based odometer (Feldman & Zrnic, §4).

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

from streamfilter.privacy.accounting import (
    rho_from_epsilon_delta_cks,
    rho_from_epsilon_delta_thm49,
)
from streamfilter.privacy.rounding import float_down, float_up

__all__ = ["DPFilter", "MultiOrderRenyiFilter", "PrivacyOdometer", "RenyiFilter", "ZCDPFilter"]

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


class PrivacyOdometer:
    """Algorithm 5: track the privacy loss with a chain of Rényi filters of budget Δ.

    Starts with one open filter and ``value = Δ`` (``O_1 = Δ``). Each observed ``ρ_t`` goes into
    the open filter; when it would HALT, a new filter is opened starting with ``ρ_t`` and the value
    grows by Δ. By Proposition 4.10, at the last step before the m-th restart the loss so far is at
    most ``m·Δ`` (the prefix is an adaptive composition of m segments, each (α, Δ)-RDP by
    Theorem 4.3), and the same holds at every earlier step by post-processing — so ``value`` is an
    upper bound on the loss observed so far. Requires ``ρ_t <= Δ`` (Prop. 4.10's assumption;
    otherwise a fresh filter could not admit the step).

    The restart rule can charge more than ``ceil(Σρ_t/Δ)·Δ`` (a step that does not fit the open
    segment starts a new one, wasting the rest). :func:`streamfilter.privacy.odometer.
    discretised_odometer` uses nested budgets mΔ on the cumulative sum instead, which gives
    exactly the ceiling.

    Per-user values of this kind are sensitive (§4.4): show them to their owner only.
    """

    def __init__(self, delta_step: float) -> None:
        step = _exact_nonnegative("delta_step", delta_step)
        if step == 0:
            raise ValueError(f"delta_step must be > 0, got delta_step={delta_step!r}")
        self._step = step
        self._filters = 1
        self._window = Fraction(0)
        self._total = Fraction(0)

    @property
    def delta_step(self) -> float:
        return float(self._step)

    def observe(self, rho_t: float) -> float:
        """Record one step's loss and return the updated :attr:`value`."""
        loss = _exact_nonnegative("rho_t", rho_t)
        if loss > self._step:
            raise ValueError(
                f"rho_t must be <= delta_step={float(self._step)!r} (Proposition 4.10), "
                f"got rho_t={rho_t!r}"
            )
        if self._window + loss > self._step:  # the open filter halts: restart (Algorithm 5)
            self._filters += 1
            self._window = loss
        else:
            self._window += loss
        self._total += loss
        return self.value

    @property
    def value(self) -> float:
        """``m·Δ`` with m the number of filters opened so far, rounded up."""
        return float_up(self._filters * self._step)

    @property
    def restarts(self) -> int:
        return self._filters - 1

    @property
    def observed_total(self) -> float:
        """Exact sum of observed losses, rounded up (for comparison; not itself a guarantee)."""
        return float_up(self._total)
