"""The §5.1 experiment grid (Feldman & Zrnic): the privacy levels and the three regimes.

Kept apart from ``reproduce`` so the CLI can offer them as choices without loading model code.
"""

EPSILONS = (0.3, 0.5, 1.0)
DELTA = 1e-5
REGIMES = ("tuned", "suboptimal_clip", "suboptimal_noise")
