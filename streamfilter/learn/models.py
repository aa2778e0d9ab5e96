"""Softmax regression and a one-hidden-layer MLP with per-example gradient norms.

Private GD needs, at each step, every example's gradient norm (to clip it) and the sum of the
clipped gradients. Materialising the per-example gradients costs n × d memory (60k × 7,850
floats ≈ 3.8 GB for softmax regression on MNIST-sized data). Neither model needs that: a
dense layer's per-example gradient is an outer product ``a_i ⊗ δ_i`` (input activation times
back-propagated error), whose Frobenius norm is ``‖a_i‖·‖δ_i‖`` (Goodfellow 2015, "Efficient
per-example gradient computations"), and the weighted sum ``Σ_i w_i·a_i ⊗ δ_i`` is the matrix
product ``Aᵀ·diag(w)·Δ``. So one forward and one backward pass give both, in O(n·d) time and
O(n·(inputs + outputs)) memory.

Parameters are one flat float64 vector (so the noise is one draw of the right length); each
model knows its layout. The loss is the per-example cross-entropy (no regulariser).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["MLP", "Model", "Pass", "SoftmaxRegression", "per_example_gradients"]


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    out: np.ndarray = e / e.sum(axis=1, keepdims=True)
    return out


def _with_bias(a: np.ndarray) -> np.ndarray:
    return np.hstack([a, np.ones((a.shape[0], 1))])


@dataclass(frozen=True)
class Pass:
    """One forward/backward pass over a batch: the layers' inputs and back-propagated errors.

    ``inputs[l]``: (n, fan_in) activations entering layer l (the bias input 1 is implicit, so
    the data are never copied to append a column); ``errors[l]``: (n, fan_out)
    ∂loss_i/∂(pre-activation) of layer l; ``probs``: (n, k). Example i's gradient for layer l
    (weights, then the bias row) is ``[inputs[l][i], 1] ⊗ errors[l][i]``.
    """

    inputs: tuple[np.ndarray, ...]
    errors: tuple[np.ndarray, ...]
    probs: np.ndarray

    def grad_norm2(self) -> np.ndarray:
        """Each example's squared gradient norm ``Σ_l ‖a_i‖²·‖δ_i‖²`` (n,), no n × d array."""
        total = np.zeros(self.probs.shape[0])
        for a, d in zip(self.inputs, self.errors, strict=True):
            total += (np.einsum("ij,ij->i", a, a) + 1.0) * np.einsum("ij,ij->i", d, d)
        return total

    def weighted_gradient_sum(self, weights: np.ndarray) -> np.ndarray:
        """``Σ_i w_i·∇loss_i`` as a flat vector (layer by layer ``Aᵀ·diag(w)·Δ``)."""
        parts = []
        for a, d in zip(self.inputs, self.errors, strict=True):
            wd = d * weights[:, None]
            parts.append(np.vstack([a.T @ wd, wd.sum(axis=0, keepdims=True)]).ravel())
        return np.concatenate(parts)


class Model(Protocol):
    """What private GD needs from a model."""

    @property
    def n_params(self) -> int: ...

    @property
    def classes(self) -> int: ...

    def init(self, rng: np.random.Generator) -> np.ndarray: ...

    def backward(self, params: np.ndarray, x: np.ndarray, y_onehot: np.ndarray) -> Pass: ...

    def predict(self, params: np.ndarray, x: np.ndarray) -> np.ndarray: ...

    def losses(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray: ...


def _cross_entropy(probs: np.ndarray, y: np.ndarray) -> np.ndarray:
    p = probs[np.arange(y.shape[0]), y]
    out: np.ndarray = -np.log(np.maximum(p, 1e-300))
    return out


@dataclass(frozen=True)
class SoftmaxRegression:
    """Multinomial logistic regression: ``p = softmax([x, 1]·W)``, W of shape (d+1, k)."""

    features: int
    classes: int

    @property
    def n_params(self) -> int:
        return (self.features + 1) * self.classes

    def init(self, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(self.n_params)

    def _w(self, params: np.ndarray) -> np.ndarray:
        return params.reshape(self.features + 1, self.classes)

    def _probs(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        w = self._w(params)
        return _softmax(x @ w[:-1] + w[-1])

    def backward(self, params: np.ndarray, x: np.ndarray, y_onehot: np.ndarray) -> Pass:
        p = self._probs(params, x)
        return Pass(inputs=(x,), errors=(p - y_onehot,), probs=p)

    def predict(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        return self._probs(params, x).argmax(axis=1)

    def losses(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return _cross_entropy(self._probs(params, x), y)


@dataclass(frozen=True)
class MLP:
    """One hidden ReLU layer: ``h = relu([x,1]·W1)``, ``p = softmax([h,1]·W2)``."""

    features: int
    hidden: int
    classes: int

    @property
    def _sizes(self) -> tuple[int, int]:
        return (self.features + 1) * self.hidden, (self.hidden + 1) * self.classes

    @property
    def n_params(self) -> int:
        return sum(self._sizes)

    def init(self, rng: np.random.Generator) -> np.ndarray:
        """He-normal first layer, zero second layer (the init uses no data)."""
        w1 = rng.normal(scale=np.sqrt(2.0 / self.features), size=(self.features + 1, self.hidden))
        w1[-1] = 0.0
        return np.concatenate([w1.ravel(), np.zeros(self._sizes[1])])

    def _unpack(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s1, _ = self._sizes
        w1 = params[:s1].reshape(self.features + 1, self.hidden)
        w2 = params[s1:].reshape(self.hidden + 1, self.classes)
        return w1, w2

    def _forward(
        self, params: np.ndarray, x: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        w1, w2 = self._unpack(params)
        pre = x @ w1[:-1] + w1[-1]
        h = np.maximum(pre, 0.0)
        return pre, h, _softmax(h @ w2[:-1] + w2[-1])

    def backward(self, params: np.ndarray, x: np.ndarray, y_onehot: np.ndarray) -> Pass:
        _, w2 = self._unpack(params)
        pre, h, p = self._forward(params, x)
        d2 = p - y_onehot
        d1 = (d2 @ w2[:-1].T) * (pre > 0.0)
        return Pass(inputs=(x, h), errors=(d1, d2), probs=p)

    def predict(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        return self._forward(params, x)[2].argmax(axis=1)

    def losses(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return _cross_entropy(self._forward(params, x)[2], y)


def per_example_gradients(step: Pass) -> np.ndarray:
    """The (n, n_params) matrix of per-example gradients, materialised. FOR TESTS: checks that
    :meth:`Pass.grad_norm2` and :meth:`Pass.weighted_gradient_sum` equal the explicit ones."""
    rows = [
        np.einsum("ij,ik->ijk", _with_bias(a), d).reshape(a.shape[0], -1)
        for a, d in zip(step.inputs, step.errors, strict=True)
    ]
    return np.hstack(rows)
