"""Rounding exact rationals to floats in the safe direction.

Reported privacy losses are rounded up and remaining budgets down, never the other way: a float
shown to the operator is a bound on the exact rational it stands for.
"""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["float_down", "float_up"]


def float_up(value: Fraction) -> float:
    """The smallest float ``>= value`` (exact rational comparison)."""
    approx = float(value)
    while Fraction(approx) < value:
        approx = math.nextafter(approx, math.inf)
    return approx


def float_down(value: Fraction) -> float:
    """The largest float ``<= value`` (exact rational comparison)."""
    approx = float(value)
    while Fraction(approx) > value:
        approx = math.nextafter(approx, -math.inf)
    return approx
