"""The §5.1 experiment grid (Feldman & Zrnic): the privacy levels and the three regimes.

Kept apart from ``reproduce`` so the CLI can offer them as choices without loading model code.
"""

#: The paper's three privacy levels, then two larger ones for the signal-to-noise sweep.
EPSILONS = (0.3, 0.5, 1.0, 2.0, 4.0)
PAPER_EPSILONS = (0.3, 0.5, 1.0)
DELTA = 1e-5
REGIMES = ("tuned", "suboptimal_clip", "suboptimal_noise")
#: ``"paper"``: Appendix A exactly (exact, non-private checks); ``"private-checks"``: the checks
#: paid from the same (ε, δ) (:mod:`.calibration`).
PROTOCOLS = ("paper", "private-checks")
