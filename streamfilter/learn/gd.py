"""Private gradient descent (Algorithm 6) and private GD with individual filtering (Algorithm 7).

Feldman & Zrnic, §5. Both run full-batch gradient descent on a :class:`~.models.Model`; at every
step each example's gradient is clipped, the clipped gradients are summed, Gaussian noise
``N(0, σ²C²·I)`` is added and the step is ``θ ← θ − η·(Σ_i g̃_i + noise)/n``.

* Algorithm 6 clips every gradient to norm ``C`` for ``k`` steps: ``k/(2σ²)``-zCDP
  (Proposition 5.1).
* Algorithm 7 keeps, per example, the running sum of the squared norms actually added, and
  clips example i's gradient to ``min(C, sqrt(B_norm − spent_i))`` (clip to the remaining
  budget): ``B_norm/(2σ²C²)``-zCDP whatever the number of steps ``k_max`` (Proposition 5.2).

Admission is the privacy core's exact integer filter: :func:`streamfilter.privacy.individual_filter.
filter_squared_norms` (policy ``clip``) on the squared norms from the model's outer-product
trick, so no n × d matrix is built and no float comparison decides what an example may spend.
Algorithm 6 uses the same function with a one-step budget ``floor(C²/γ²)`` renewed at every
step, so the two algorithms clip *identically* until some example's budget binds; with
``B_norm = k·C²`` and ``k_max = k`` no budget ever binds and the iterates are identical under the
same random bits (the paper's remark after Algorithm 7; ``tests/learn/test_gd.py``).

Noise is drawn from the privacy core's randomness (:func:`streamfilter.privacy.noise.gaussian`,
the OS CSPRNG by default). Floating-point caveat: that sampler is the continuous Gaussian in
float64 (Box–Muller); the zCDP/GDP statements are proven for real-valued noise (Mironov 2012
on least significant bits applies to released float iterates). Accepted here, as in every
float DP-SGD implementation; the monitoring engine uses the exact discrete Gaussian instead.

The adaptive stopping rule of §5.1 (Appendix A) is *paid for*: each training-accuracy check is
the count of correctly classified examples plus ``N(0, s²)`` noise (sensitivity 1), i.e.
``1/(2s²)``-zCDP, and :mod:`.calibration` adds the checks to the stated guarantee.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamfilter.privacy.individual_filter import Exhaustion, filter_squared_norms
from streamfilter.privacy.lattice import Lattice
from streamfilter.privacy.noise import RandomBits, SystemRandomBits, gaussian

from .data import one_hot
from .models import Model

__all__ = ["DEFAULT_LATTICE", "AccuracyChecks", "GDRun", "private_gd", "private_gd_filtered"]

#: γ = 2^-20 data units: C up to 2^11 and B_norm up to 2^21 fit the lattice's int64 limits, and a
#: unit (2^-40 squared-norm units) is far below any gradient's squared norm.
DEFAULT_LATTICE = Lattice(2.0**-20)


@dataclass(frozen=True)
class AccuracyChecks:
    """Private training-accuracy checks for the adaptive stopping rule (§5.1, Appendix A).

    ``count`` checks, after steps ``start, start + every, …``; each releases
    ``(#correct + N(0, sigma_count²))/n``. The returned model is the checked iterate with the
    highest released accuracy (post-processing of the releases). ``sigma_count = 0``: exact
    counts, **not private** — the paper's protocol (Appendix A), for reproducing its figures.
    """

    start: int
    every: int
    count: int
    sigma_count: float

    def __post_init__(self) -> None:
        if self.start < 0 or self.every < 1 or self.count < 1:
            raise ValueError(
                f"need start >= 0, every >= 1, count >= 1, got start={self.start}, "
                f"every={self.every}, count={self.count}"
            )
        if not (np.isfinite(self.sigma_count) and self.sigma_count >= 0):
            raise ValueError(f"sigma_count must be >= 0, got sigma_count={self.sigma_count!r}")

    @property
    def last_step(self) -> int:
        return self.start + self.every * (self.count - 1)

    def due(self, step: int) -> bool:
        return (
            step >= self.start and (step - self.start) % self.every == 0 and step <= self.last_step
        )


@dataclass
class GDRun:
    """What a run returns. ``params``: the model (Algorithm 7 with checks: the best-checked
    iterate). ``spent_units``: Algorithm 7's per-example ledger (lattice units). The ``record``
    fields exist only when asked for (tests): every iterate, every step's scale and charge."""

    params: np.ndarray
    steps: int
    spent_units: np.ndarray | None = None
    budget_units: int | None = None
    released_accuracies: list[tuple[int, float]] = field(default_factory=list)
    chosen_step: int | None = None
    iterates: list[np.ndarray] = field(default_factory=list)
    scales: list[np.ndarray] = field(default_factory=list)
    charges_units: list[np.ndarray] = field(default_factory=list)
    grad_norm2: list[np.ndarray] = field(default_factory=list)


def _check_common(clip: float, sigma: float, learning_rate: float, x: np.ndarray) -> None:
    if not (np.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be > 0, got clip={clip!r}")
    if not (np.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be >= 0, got sigma={sigma!r}")
    if not (np.isfinite(learning_rate) and learning_rate > 0):
        raise ValueError(f"learning_rate must be > 0, got learning_rate={learning_rate!r}")
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"x must be a non-empty (n, d) array, got shape {x.shape}")


def _descend(
    model: Model,
    x: np.ndarray,
    y: np.ndarray,
    *,
    clip: float,
    sigma: float,
    learning_rate: float,
    steps: int,
    budget_units: int | None,
    bits: RandomBits,
    params: np.ndarray,
    lattice: Lattice,
    checks: AccuracyChecks | None,
    record: bool,
) -> GDRun:
    n = x.shape[0]
    y1 = one_hot(y, model.classes)
    one_step = lattice.max_cost_units(clip)
    filtered = budget_units is not None
    spent = np.zeros(n, np.int64)
    live = np.zeros(n, bool)
    run = GDRun(params=params, steps=0, budget_units=budget_units)
    best: tuple[float, int, np.ndarray] | None = None
    theta = params.copy()
    for t in range(1, steps + 1):
        step = model.backward(theta, x, y1)
        norm2 = step.grad_norm2()
        decision = filter_squared_norms(
            norm2,
            clip,
            lattice,
            spent if filtered else np.zeros(n, np.int64),
            live,
            one_step if budget_units is None else budget_units,  # Alg. 6: a fresh one-step budget
            Exhaustion.CLIP,
        )
        if filtered:
            spent = spent + decision.cost_units  # Algorithm 7's ledger (committed every step)
        total = step.weighted_gradient_sum(decision.scale)
        noise = gaussian(bits, sigma * clip, total.size)
        theta = theta - learning_rate * (total + noise) / n
        if record:
            run.iterates.append(theta.copy())
            run.scales.append(decision.scale)
            run.charges_units.append(decision.cost_units)
            run.grad_norm2.append(norm2)
        if checks is not None and checks.due(t):
            correct = float(np.count_nonzero(model.predict(theta, x) == y))
            count_noise = (
                float(gaussian(bits, checks.sigma_count, 1)[0]) if checks.sigma_count else 0.0
            )
            released = (correct + count_noise) / n
            run.released_accuracies.append((t, released))
            if best is None or released > best[0]:
                best = (released, t, theta.copy())
    run.steps = steps
    run.params = theta if best is None else best[2]
    run.chosen_step = steps if best is None else best[1]
    run.spent_units = spent if filtered else None
    return run


def private_gd(
    model: Model,
    x: np.ndarray,
    y: np.ndarray,
    *,
    clip: float,
    sigma: float,
    learning_rate: float,
    steps: int,
    bits: RandomBits | None = None,
    params: np.ndarray | None = None,
    lattice: Lattice = DEFAULT_LATTICE,
    record: bool = False,
) -> GDRun:
    """Algorithm 6: ``steps`` (= k) full-batch steps, gradients clipped to ``clip`` (C), noise
    ``N(0, sigma²·clip²·I)`` on the sum. ``k/(2σ²)``-zCDP (Proposition 5.1). ``params``
    defaults to the model's data-independent init with seed 0."""
    _check_common(clip, sigma, learning_rate, x)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got steps={steps}")
    theta0 = model.init(np.random.default_rng(0)) if params is None else params
    return _descend(
        model,
        x,
        y,
        clip=clip,
        sigma=sigma,
        learning_rate=learning_rate,
        steps=steps,
        budget_units=None,
        bits=SystemRandomBits() if bits is None else bits,
        params=theta0,
        lattice=lattice,
        checks=None,
        record=record,
    )


def private_gd_filtered(
    model: Model,
    x: np.ndarray,
    y: np.ndarray,
    *,
    clip: float,
    sigma: float,
    learning_rate: float,
    b_norm: float,
    k_max: int,
    bits: RandomBits | None = None,
    params: np.ndarray | None = None,
    checks: AccuracyChecks | None = None,
    lattice: Lattice = DEFAULT_LATTICE,
    record: bool = False,
) -> GDRun:
    """Algorithm 7: ``k_max`` steps; example i's gradient is clipped to
    ``min(C, sqrt(B_norm − spent_i))`` and ``spent_i`` grows by the squared norm added.
    ``B_norm/(2σ²C²)``-zCDP for any ``k_max`` (Proposition 5.2); the ``checks``, if any, add
    ``count/(2·sigma_count²)`` (see :mod:`.calibration`)."""
    _check_common(clip, sigma, learning_rate, x)
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got k_max={k_max}")
    if checks is not None and checks.last_step > k_max:
        raise ValueError(
            f"the last accuracy check (step {checks.last_step}) is after k_max={k_max}"
        )
    theta0 = model.init(np.random.default_rng(0)) if params is None else params
    return _descend(
        model,
        x,
        y,
        clip=clip,
        sigma=sigma,
        learning_rate=learning_rate,
        steps=k_max,
        budget_units=lattice.budget_units(b_norm),
        bits=SystemRandomBits() if bits is None else bits,
        params=theta0,
        lattice=lattice,
        checks=checks,
        record=record,
    )
