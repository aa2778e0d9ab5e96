"""Two-sided χ² test of a Gaussian noise scale, shared by the statistical tests in tests/learn.

Given N independent draws of N(0, σ²) and the σ₀ a test computed itself from the configuration
and the cited formula, ``S = Σx²/σ₀²`` is ``(σ/σ₀)²·χ²_N``. The test accepts iff
``χ²_N.ppf(5e-4) <= S <= χ²_N.ppf(1 − 5e-4)``:

* a correct σ (σ = σ₀) passes with probability exactly 0.999;
* σ = √2·σ₀ passes only if ``χ²_N <= hi/2``, σ = σ₀/√2 only if ``χ²_N >= 2·lo``;
  :func:`assert_sigma` asserts both probabilities are <= 0.001 for the N it is given, so a σ off
  by √2 either way fails with probability >= 0.999.
"""

import numpy as np
from scipy.stats import chi2

ALPHA_EACH_SIDE = 5e-4


def assert_sigma(draws: np.ndarray, sigma_expected: float) -> None:
    x = np.asarray(draws, dtype=np.float64).ravel()
    n = x.size
    lo, hi = chi2.ppf(ALPHA_EACH_SIDE, n), chi2.ppf(1.0 - ALPHA_EACH_SIDE, n)
    # power against a √2 error either way (needs N of a few hundred)
    assert chi2.cdf(hi / 2.0, n) <= 1e-3, f"N={n} draws cannot tell σ from √2·σ"
    assert chi2.sf(2.0 * lo, n) <= 1e-3, f"N={n} draws cannot tell σ from σ/√2"
    s = float(np.sum(x * x)) / sigma_expected**2
    assert lo <= s <= hi, f"Σx²/σ₀² = {s:.1f} outside [{lo:.1f}, {hi:.1f}] (N = {n})"
