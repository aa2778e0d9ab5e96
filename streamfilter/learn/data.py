"""Datasets for the learning experiments: scikit-learn's bundled digits, and a synthetic set.

Neither downloads anything. ``load_digits`` ships inside the scikit-learn wheel (1,797 8×8
images, 10 classes); scikit-learn is imported lazily, only here (the ``learn`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Dataset", "digits", "one_hot", "synthetic"]


@dataclass(frozen=True)
class Dataset:
    """A train/test split: features (n, d) float64, labels (n,) int64, ``classes`` labels 0..k−1."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])


def one_hot(labels: np.ndarray, classes: int) -> np.ndarray:
    """(n, classes) float64 indicator rows."""
    out = np.zeros((labels.shape[0], classes))
    out[np.arange(labels.shape[0]), labels] = 1.0
    return out


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    """A fixed, data-independent permutation split (the split is public, not private)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got test_fraction={test_fraction!r}")
    order = np.random.default_rng(seed).permutation(x.shape[0])
    n_test = round(test_fraction * x.shape[0])
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def digits(test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """scikit-learn's bundled digits, pixels scaled from 0..16 to [0, 1] (no data-dependent
    normalisation, so preprocessing costs no privacy). 1,438 train / 359 test by default."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise RuntimeError(
            "the digits data needs scikit-learn: pip install 'streamfilter[learn]'"
        ) from exc
    bunch = load_digits()
    x = np.asarray(bunch.data, dtype=np.float64) / 16.0
    y = np.asarray(bunch.target, dtype=np.int64)
    x_tr, y_tr, x_te, y_te = _split(x, y, test_fraction, seed)
    return Dataset("digits", x_tr, y_tr, x_te, y_te, 10)


def synthetic(
    n: int = 60_000, d: int = 784, classes: int = 10, seed: int = 0, test_fraction: float = 1 / 7
) -> Dataset:
    """A Gaussian-mixture classification set with MNIST's shape (60k × 784 by default).

    Class means are random unit vectors scaled by 3; features are ``mean + N(0, I)/sqrt(d)``
    clipped to [0, 1] after an affine map, so norms are like those of pixel images. For timing
    and for the accounting experiments when the digits are too small.
    """
    if n < 2 or d < 1 or classes < 2:
        raise ValueError(f"need n >= 2, d >= 1, classes >= 2, got n={n}, d={d}, classes={classes}")
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(classes, d))
    means *= 3.0 / np.linalg.norm(means, axis=1, keepdims=True)
    y = rng.integers(0, classes, size=n)
    x = means[y] + rng.normal(size=(n, d))
    x = np.clip(0.5 + x / 6.0, 0.0, 1.0)
    x_tr, y_tr, x_te, y_te = _split(x, y.astype(np.int64), test_fraction, seed + 1)
    return Dataset(f"synthetic-{n}x{d}", x_tr, y_tr, x_te, y_te, classes)
