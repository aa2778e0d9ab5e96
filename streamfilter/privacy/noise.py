"""Noise for the Gaussian mechanism on an integer lattice.

All noise is in *lattice units*: the engine adds an integer ``Z`` to an exact integer sum, with
``Z ~ N_Z(0, sigma2_units)``, the discrete Gaussian of Canonne, Kamath and Steinke, "The Discrete
Gaussian for Differential Privacy" (NeurIPS 2020, arXiv:2004.00010; "CKS" below). Its variance
parameter is an integer ``sigma2_units >= 1`` (the engine rounds ``sigma^2/gamma^2`` up).

Exactness is the point: privacy is never approximated downward. Every random decision of the
discrete samplers is an integer comparison against a uniformly random integer; no probability is
ever computed in floating point. Floats appear only in (a) sizing batches (how many candidates to
draw: affects speed, never the output distribution) and (b) the continuous :func:`gaussian`. The
reporting helpers (exact variance, half-widths) are ``privacy/discrete_gaussian_moments.py``.

Random bits come from a :class:`RandomBits` source: :class:`SystemRandomBits` (the OS CSPRNG,
production) or :class:`SeededRandomBits` (reproducible, tests only).
"""

from __future__ import annotations

import math
import os
from fractions import Fraction
from typing import Final, Protocol

import numpy as np
from numpy.typing import NDArray

from streamfilter.privacy.discrete_gaussian_moments import theta_dual

__all__ = [
    "RandomBits",
    "SeededRandomBits",
    "SystemRandomBits",
    "bernoulli_exp_neg",
    "discrete_gaussian",
    "discrete_gaussian_reference",
    "discrete_laplace",
    "gaussian",
    "uniform_below",
]

U64 = NDArray[np.uint64]
I64 = NDArray[np.int64]
Bools = NDArray[np.bool_]

#: Largest bound accepted by :func:`uniform_below` and largest product formed in uint64 below.
_TWO62: Final = 1 << 62
#: Largest ``sigma2_units`` accepted by :func:`discrete_gaussian` (the lattice's cap).
MAX_SIGMA2_UNITS: Final = 1 << 62
#: Up to here :func:`discrete_gaussian` is vectorised (keeps ``2*s2 <= 2**61``, ``t <= 2**30+1``);
#: beyond it (sigma above 2**30 lattice units) it runs the exact scalar sampler.
_VECTOR_MAX_SIGMA2: Final = 1 << 60
#: Largest scale accepted by :func:`discrete_laplace` (keeps ``U + t*V`` far from 2**63).
MAX_LAPLACE_SCALE: Final = 1 << 31
#: The direct acceptance test of Alg. 3 is used while ``2*s2*t*t`` is at most this (see below);
#: a module constant so that tests can force the decomposed path.
_DIRECT_DEN_MAX: int = _TWO62


# --------------------------------------------------------------------------------------------
# Random bit sources
# --------------------------------------------------------------------------------------------


class RandomBits(Protocol):
    """A source of independent, uniformly random 64-bit words."""

    def uint64(self, size: int) -> np.ndarray:
        """Return ``size`` independent uniform ``np.uint64`` values (1-D array)."""
        ...


class SystemRandomBits:
    """Random bits from the operating system's CSPRNG (``os.urandom``, i.e. ``getrandom(2)``).

    Every call asks the kernel afresh and the object holds no state, so ``fork()``ed workers
    draw independent bits (DESIGN §6 item 1). This is the only source to use in production.
    """

    def uint64(self, size: int) -> np.ndarray:
        if size < 0:
            raise ValueError(f"size must be >= 0, got size={size}")
        return np.frombuffer(bytearray(os.urandom(8 * size)), dtype=np.uint64)

    def __repr__(self) -> str:
        return "SystemRandomBits()"


class SeededRandomBits:
    """Reproducible bits from numpy's PCG64 seeded with ``seed``. FOR TESTS ONLY.

    PCG64 is not a cryptographically secure generator (its output can be predicted from a few
    words), and its state is copied by ``fork()``, so forked workers would add identical noise.
    Never use it to protect real data.
    """

    def __init__(self, seed: int) -> None:
        self._gen = np.random.PCG64(seed)

    def uint64(self, size: int) -> np.ndarray:
        if size < 0:
            raise ValueError(f"size must be >= 0, got size={size}")
        return np.asarray(self._gen.random_raw(size), dtype=np.uint64)


def _words(bits: RandomBits, n: int) -> U64:
    """``n`` words from ``bits``, checked to be a 1-D uint64 array of the right length."""
    w = np.ascontiguousarray(bits.uint64(n))
    if w.dtype != np.uint64 or w.shape != (n,):
        raise TypeError(f"RandomBits.uint64({n}) must return a uint64 array of shape ({n},)")
    return w if w.flags.writeable else w.copy()


_SMALL_DTYPES: Final = {8: np.uint8, 16: np.uint16, 32: np.uint32}


def _draw(bits: RandomBits, n: int, k: int) -> U64:
    """``n`` independent uniform integers in ``[0, 2**k)`` for k in (8, 16, 32, 64), as uint64.

    A uniform 64-bit word is 64/k independent uniform k-bit fields, so small draws cut a word up
    instead of wasting it (the OS CSPRNG costs about 15 ns per word).
    """
    if k == 64:
        return _words(bits, n)
    w = _words(bits, -(-n // (64 // k)))
    return w.view(_SMALL_DTYPES[k])[:n].astype(np.uint64)


def _sign_bits(bits: RandomBits, n: int) -> Bools:
    """``n`` independent fair coins (Bernoulli(1/2)), one random bit each."""
    w = _words(bits, -(-n // 64))
    return np.unpackbits(w.view(np.uint8))[:n].astype(np.bool_)


# --------------------------------------------------------------------------------------------
# Exact uniform integers and Bernoulli(rational)
# --------------------------------------------------------------------------------------------


def _chunk_bits(nmax: int) -> int:
    """Width of the random fields used for bounds ``<= nmax``: rejection rate below 1/16."""
    for k in (8, 16, 32):
        if nmax <= 1 << (k - 4):
            return k
    return 64


def _fields_below(w: U64, nn: int | U64, k: int) -> tuple[U64, Bools]:
    """Map uniform ``k``-bit fields ``w`` to ``[0, nn)``: (values, rejected) — exact on accept.

    * ``k < 64`` (then ``n <= 2**(k-4)``, so ``w*n < 2**60`` fits in uint64): Lemire's method
      (ACM TOMS 2019, "Fast random integer generation in an interval"): with ``m = w*n``, reject
      iff ``m mod 2**k < 2**k mod n``, else return ``m >> k``. Exactly ``floor(2**k/n)`` accepted
      fields map to each value, so accepted outputs are exactly uniform.
    * ``k == 64``: ``thr = 2**64 mod n``; accept iff ``w >= thr`` and return ``w mod n``. The
      accepted range ``[thr, 2**64)`` has length divisible by ``n`` and is contiguous, so each
      residue is hit equally often.
    """
    if k < 64:
        prod: U64 = np.multiply(w, nn, dtype=np.uint64)
        val: U64 = prod >> np.uint64(k)
        low = prod & np.uint64((1 << k) - 1)
        if isinstance(nn, int):
            bad = low < np.uint64((1 << k) % nn)
        else:
            # 2**k mod n < n: only fields with low < n can be rejected (Lemire's shortcut).
            bad = low < nn
            cand = np.flatnonzero(bad)
            if cand.size:
                bad[cand] = low[cand] < (np.uint64(1 << k) % nn[cand])
        return val, bad
    if isinstance(nn, int):
        thr: int | U64 = ((1 << 64) - nn) % nn
    else:
        thr = (np.uint64(0) - nn) % nn  # (2**64 - n) mod n, wrapping uint64 arithmetic
    return np.remainder(w, nn, dtype=np.uint64), w < thr


def _below(bits: RandomBits, n: int | U64, size: int) -> U64:
    """Exact uniform integers in ``[0, n)``, ``1 <= n <= 2**62``; ``n`` a scalar or per element.

    Fields are mapped by :func:`_fields_below`; rejected elements are redrawn with fresh
    fields, independently of the accepted ones, so every output is exactly uniform.
    """
    out = np.empty(size, dtype=np.uint64)
    if size == 0:
        return out
    nmax = int(n) if isinstance(n, int) else int(n.max())
    k = _chunk_bits(nmax)
    todo: NDArray[np.intp] | None = None  # None: all elements
    m = size
    while True:
        nn: int | U64 = n if isinstance(n, int) or todo is None else n[todo]
        val, bad = _fields_below(_draw(bits, m, k), nn, k)
        if todo is None:
            out[:] = val
            todo = np.flatnonzero(bad)
        else:
            out[todo] = val
            todo = todo[bad]
        m = todo.size
        if m == 0:
            return out


def uniform_below(bits: RandomBits, n: int | np.ndarray, size: int) -> np.ndarray:
    """Exact uniform integers in ``[0, n)`` as int64 (rejection sampling, no modulo bias).

    ``n`` is an int or an integer array of ``size`` per-element bounds, each ``1 <= n <= 2**62``.
    Used for CKS's "to sample Bernoulli(n/d), draw a uniform D and compare" (remark after their
    Algorithm 1).
    """
    _check_size(size)
    if isinstance(n, bool):
        raise TypeError("n must be an integer or an integer array, got a bool")
    if isinstance(n, int | np.integer):
        nv = int(n)
        if not 1 <= nv <= _TWO62:
            raise ValueError(f"n must be in [1, 2**62], got n={nv}")
        return _below(bits, nv, size).astype(np.int64)
    arr = np.asarray(n)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"n must be an integer array, got dtype {arr.dtype}")
    if arr.shape != (size,):
        raise ValueError(f"n must have shape ({size},), got {arr.shape}")
    if size and (int(arr.min()) < 1 or int(arr.max()) > _TWO62):
        raise ValueError("every n must be in [1, 2**62]")
    return _below(bits, arr.astype(np.uint64), size).astype(np.int64)


def _bern_ratio(bits: RandomBits, a: U64, b: int | U64) -> Bools:
    """Bernoulli(a/b) per element, ``0 <= a <= b <= 2**62``: a uniform ``D < b`` is ``< a``."""
    return _below(bits, b, a.size) < a


# --------------------------------------------------------------------------------------------
# Bernoulli(exp(-gamma)) — CKS Algorithm 1
# --------------------------------------------------------------------------------------------
#
# CKS Algorithm 1 (von Neumann / Forsythe), for gamma in [0, 1]: for K = 1, 2, ... draw
# A_K ~ Bernoulli(gamma/K) until the first A_K = 0; return 1 iff that K is odd. Since
# P(A_1 = ... = A_k = 1) = gamma^k/k!, P(return 1) = sum_{j>=0} (gamma^{2j}/(2j)! -
# gamma^{2j+1}/(2j+1)!) = exp(-gamma). For gamma > 1, CKS (same section) multiply independent
# samples: Bernoulli(exp(-gamma)) = AND of floor(gamma) Bernoulli(exp(-1)) and one
# Bernoulli(exp(-(gamma - floor(gamma)))). Two more facts are used below:
#  (P) Bernoulli(p*q) = AND of independent Bernoulli(p) and Bernoulli(q) — used to split a ratio
#      whose denominator would exceed 2**62 (e.g. gamma/K = (a/b)*(1/K)).
#  (G) For gamma = 1 the stopping index K* of the loop has P(K* > k) = 1/k!. With M = c*N!
#      (< 2**32, N = 11) and W uniform on [0, M), the events {W < M/k!} (k = 1..N) are nested
#      with probabilities exactly 1/k!, so K* = 1 + #{k <= N : W < M/k!} has the right law on
#      {K* <= N}; when W < M/N! (prob 1/11!, ~2.5e-8) the loop simply continues at K = N+1
#      with fresh Bernoulli(1/K) draws. One 32-bit field thus replaces ~1.7 draws on average.


def _alg1_factorial_grid(n: int, field_bits: int) -> tuple[int, int, U64]:
    """(N, M, thresholds ascending) for fact (G): M = c*N! <= 2**field_bits - 1, c maximal."""
    fact = math.factorial(n)
    c = ((1 << field_bits) - 1) // fact
    m = c * fact
    thr = [m // math.factorial(k) for k in range(n, 0, -1)]  # ascending: M/N!, ..., M/1!
    return n, m, np.array(thr, dtype=np.uint64)


_E1_N, _E1_M, _E1_THR = _alg1_factorial_grid(11, 32)  # M = 107 * 11!, 99.4% of 2**32


def _bern_exp_neg_one(bits: RandomBits, size: int) -> Bools:
    """``size`` independent Bernoulli(exp(-1)) — CKS Alg. 1 with gamma = 1, via fact (G)."""
    w = _draw(bits, size, 32)
    bad = np.flatnonzero(w >= np.uint64(_E1_M))
    while bad.size:  # W must be uniform on [0, M): redraw the (rare, ~0.6%) others
        w[bad] = _draw(bits, bad.size, 32)
        bad = bad[w[bad] >= np.uint64(_E1_M)]
    j = np.searchsorted(_E1_THR, w, side="right")  # #{k : M/k! <= W}; K* = N + 1 - j
    out: Bools = ((_E1_N - j) % 2) == 0  # K* odd
    tail = np.flatnonzero(j == 0)  # K* > N: continue the loop at K = N + 1
    kk = _E1_N + 1
    while tail.size:
        cont = _below(bits, kk, tail.size) == 0  # A_K ~ Bernoulli(1/K)
        out[tail[~cont]] = kk % 2 == 1
        tail = tail[cont]
        kk += 1
    return out


def _bern_exp_neg_unit(bits: RandomBits, a: U64, b: int | U64, k0: int = 1) -> Bools:
    """Bernoulli(exp(-a/b)) per element, ``0 <= a <= b <= 2**62`` (CKS Alg. 1, gamma <= 1).

    With ``k0 > 1``: the rest of the loop, given that A_1 = ... = A_{k0-1} = 1 were drawn.
    """
    out = np.full(a.size, k0 % 2 == 1)  # a = 0: A_k0 = 0 surely, the loop stops at K = k0
    idx = np.flatnonzero(a)
    aa = a[idx]
    bb: int | U64 = b if isinstance(b, int) else b[idx]
    k = k0
    while idx.size:
        bmax = bb if isinstance(bb, int) else int(bb.max())
        if bmax <= _TWO62 // k:  # gamma/K = a/(b*K), one uniform draw
            cont = _bern_ratio(bits, aa, bb * k)
        else:  # fact (P): Bernoulli(a/b) AND Bernoulli(1/K)
            cont = _bern_ratio(bits, aa, bb) & (_below(bits, k, idx.size) == 0)
        out[idx[~cont]] = k % 2 == 1  # stopped at K: 1 iff K is odd
        idx = idx[cont]
        aa = aa[cont]
        if not isinstance(bb, int):
            bb = bb[cont]
        k += 1
    return out


def _bern_exp_neg_split(bits: RandomBits, whole: U64, num: U64, den: int | U64) -> Bools:
    """Bernoulli(exp(-(whole + num/den))), ``0 <= num < den <= 2**62`` (CKS Alg. 1, any gamma).

    Integer part first (each Bernoulli(exp(-1)) kills ~63% of the survivors, so the loop ends
    after a few rounds whatever ``whole`` is), then the fractional part on the survivors.
    """
    alive = np.ones(whole.size, dtype=np.bool_)
    idx = np.flatnonzero(whole)
    left = whole[idx]
    while idx.size:
        ok = _bern_exp_neg_one(bits, idx.size)
        alive[idx[~ok]] = False
        idx = idx[ok]
        left = left[ok] - np.uint64(1)
        more = left > 0
        idx = idx[more]
        left = left[more]
    sel = np.flatnonzero(alive & (num > 0))
    if sel.size:
        alive[sel] = _bern_exp_neg_unit(bits, num[sel], den if isinstance(den, int) else den[sel])
    return alive


def bernoulli_exp_neg(bits: RandomBits, num: np.ndarray, den: np.ndarray | int) -> np.ndarray:
    """Exact Bernoulli(exp(-num/den)) per element (CKS Algorithm 1, both cases), vectorised.

    ``num``: nonnegative integers (int64/uint64 array); ``den``: positive integers ``<= 2**62``,
    an array of the same shape or a scalar. Returns a bool array.
    """
    a = np.asarray(num)
    if a.dtype.kind not in "iu":
        raise TypeError(f"num must be an integer array, got dtype {a.dtype}")
    if a.size and int(a.min()) < 0:
        raise ValueError("num must be >= 0")
    a = a.astype(np.uint64).reshape(-1)
    d: int | U64
    if isinstance(den, int | np.integer) and not isinstance(den, bool):
        d = int(den)
        if not 1 <= d <= _TWO62:
            raise ValueError(f"den must be in [1, 2**62], got den={d}")
        whole: U64 = a // np.uint64(d)
        frac: U64 = a % np.uint64(d)
    else:
        darr = np.asarray(den)
        if darr.dtype.kind not in "iu":
            raise TypeError(f"den must be an integer array, got dtype {darr.dtype}")
        if darr.shape != np.shape(num):
            raise ValueError(f"den must have the shape of num, got {darr.shape}")
        if darr.size and (int(darr.min()) < 1 or int(darr.max()) > _TWO62):
            raise ValueError("every den must be in [1, 2**62]")
        d = darr.astype(np.uint64).reshape(-1)
        whole = a // d
        frac = a % d
    return _bern_exp_neg_split(bits, whole, frac, d).reshape(np.shape(num))


# --------------------------------------------------------------------------------------------
# Discrete Laplace — CKS Algorithm 2 (s = 1)
# --------------------------------------------------------------------------------------------
#
# CKS Algorithm 2 with s = 1 returns Lap_Z(t), P(Y = y) proportional to exp(-|y|/t): draw U
# uniform on {0..t-1}, D ~ Bernoulli(exp(-U/t)) (restart if D = 0), V = number of successes of
# Bernoulli(exp(-1)) before the first failure, X = U + t*V, a fair sign bit B; restart if
# B = 1 and X = 0; return (1 - 2B) X. Vectorised: each step runs on the whole batch, restarts
# are dropped and the caller draws more candidates. Elements are independent and dropping
# depends only on each element's own coins, so survivors are i.i.d. Lap_Z(t).
# Overflow: U < t <= 2**31 and X <= t*(V+1); reaching V = 2**31 needs 2**31 consecutive
# successes (probability exp(-2**31)) and is checked anyway.


def _geometric_e1(bits: RandomBits, n: int) -> I64:
    """Number of Bernoulli(exp(-1)) successes before the first failure, per element."""
    v = np.zeros(n, dtype=np.int64)
    idx = np.arange(n)
    while idx.size:
        idx = idx[_bern_exp_neg_one(bits, idx.size)]
        v[idx] += 1
    return v


def _dlap_raw(bits: RandomBits, t: int, n: int) -> I64:
    """Run ``n`` attempts of CKS Alg. 2 (s = 1); return the outputs of the successful ones."""
    # U and the first Alg. 1 coin A_1 ~ Bernoulli(U/t) from one uniform W on [0, t^2)
    # (t <= 2**31, so t^2 <= 2**62): (W // t, W % t) is uniform on {0..t-1}^2.
    w = _below(bits, t * t, n)
    u = w // np.uint64(t)
    cont = (w - u * np.uint64(t)) < u
    d = ~cont  # A_1 = 0: K = 1 is odd, D = 1
    more = np.flatnonzero(cont)
    if more.size:  # continue Alg. 1 at K = 2 on those with A_1 = 1
        d[more] = _bern_exp_neg_unit(bits, u[more], t, k0=2)
    u = u[d]
    m = u.size
    v = _geometric_e1(bits, m)
    if m and int(v.max()) >= (1 << 62) // t - 1:
        raise OverflowError("discrete Laplace magnitude overflow (probability < exp(-2**31))")
    x = u.astype(np.int64) + np.int64(t) * v
    neg = _sign_bits(bits, m)
    keep = ~(neg & (x == 0))
    return np.where(neg, -x, x)[keep]


def _dlap_yield(t: int) -> float:
    """Probability that one attempt of Alg. 2 (s = 1) succeeds; only sizes batches."""
    p_d = -math.expm1(-1.0) / (t * -math.expm1(-1.0 / t))  # P(D = 1)
    p_zero = (1.0 / (t * p_d)) * -math.expm1(-1.0)  # P(U = 0, V = 0 | D = 1)
    return p_d * (1.0 - 0.5 * p_zero)


def discrete_laplace(bits: RandomBits, t: int, size: int) -> np.ndarray:
    """Exact Lap_Z(t) samples, ``P(y) ∝ exp(-|y|/t)``, int64 (CKS Algorithm 2 with s = 1).

    ``t`` is an integer scale, ``1 <= t <= 2**31``.
    """
    _check_size(size)
    if isinstance(t, bool) or not isinstance(t, int | np.integer):
        raise TypeError(f"t must be an integer, got {t!r}")
    t = int(t)
    if not 1 <= t <= MAX_LAPLACE_SCALE:
        raise ValueError(f"t must be in [1, 2**31], got t={t}")
    rate = _dlap_yield(t)
    parts: list[I64] = []
    need = size
    while need > 0:
        n = min(int(need / rate * 1.02) + 32, _BATCH)
        y = _dlap_raw(bits, t, n)[:need]
        parts.append(y)
        need -= y.size
    return _concat(parts)


# --------------------------------------------------------------------------------------------
# Discrete Gaussian — CKS Algorithm 3
# --------------------------------------------------------------------------------------------
#
# CKS Algorithm 3, sigma^2 = s2 (integer): t = floor(sqrt(s2)) + 1; draw Y ~ Lap_Z(t) (Alg. 2)
# and accept with probability exp(-(|Y| - s2/t)^2 / (2 s2)); CKS prove accepted values are
# exactly N_Z(0, s2) (and that ~76% of candidates are accepted for large s2). In integers:
#
#     x = (|Y| - s2/t)^2 / (2 s2) = u^2 / (2 s2 t^2),   u = | |Y| t - s2 |.
#
# The batch is split by element into three exact tiers; which tier decides an element depends
# only on that element's own Y, and each tier samples exactly Bernoulli(exp(-x)):
#  (1) direct, if 2 s2 t^2 <= 2**62 (s2 up to ~2**30) and u <= 2**31: x = u^2/(2 s2 t^2) with
#      numerator and denominator <= 2**62; whole/frac by integer divmod, then Alg. 1 as above.
#  (2) decomposed, if Q < min(s2, 2**31) where u = t Q + R, 0 <= R < t: since
#      u^2/t^2 = Q^2 + (R/t)(2Q + R/t),
#          exp(-x) = exp(-Q^2/(2 s2)) * exp(-g),   g = (R/t) * (2Q + R/t)/(2 s2),
#      the AND of two independent Bernoullis. The first has numerator Q^2 < 2**62 and
#      denominator 2 s2 <= 2**61. For the second, 0 <= g < (2Q + 1)/(2 s2) <= 1 (as Q < s2), so
#      Alg. 1 applies, and each step's Bernoulli(g/K) is by fact (P) the AND of Bernoulli(R/t)
#      and Bernoulli((2Q + R/t)/D), D = 2 s2 K (if 2 s2 K > 2**62: D = 2 s2 AND a separate
#      Bernoulli(1/K)). The latter takes W uniform on [0, D): 1 if W < 2Q, Bernoulli(R/t) if
#      W = 2Q, 0 otherwise, so its probability is 2Q/D + (1/D)(R/t) exactly, and 2Q + 1 <= D
#      makes it valid. Every integer formed is <= 2**62.
#  (3) Python integers (the reference code's Alg. 1) for anything else: |Y| t > 2**62 or
#      Q >= 2**31 (|Y| beyond ~2**31 or thousands of sigmas: never seen in practice), or
#      Q >= s2 (|Y| >~ s2: only reachable for tiny s2, which the direct tier serves).
# Vectorised rejection: candidates are independent and acceptance depends only on each
# candidate's own coins, so the accepted values are i.i.d. N_Z(0, s2); taking the first ones
# in array order (an order fixed before any coin is drawn) keeps that.

_BATCH: Final = 1 << 16  # candidates per vectorised round: keeps the working set in cache
_SCALAR_MAX_SIZE: Final = 8  # up to here one scalar sample (~10 us) beats a numpy round (~150 us)


def _bern_g(bits: RandomBits, q: U64, r: U64, t: int, s2: int, fold_max: int = _TWO62) -> Bools:
    """Bernoulli(exp(-g)), ``g = (r/t)(2q + r/t)/(2 s2)`` with ``r < t``, ``q < s2`` (tier 2).

    ``fold_max``: largest denominator into which 1/K is folded (lowered by tests only).
    """
    out = np.ones(q.size, dtype=np.bool_)
    idx = np.flatnonzero(r)  # r = 0: g = 0
    qq2 = q[idx] * np.uint64(2)
    rr = r[idx]
    k = 1
    while idx.size:
        # A_K ~ Bernoulli(g/K) = Bernoulli(r/t) AND Bernoulli((2q + r/t)/(2 s2 K))
        cont = _bern_ratio(bits, rr, t)
        live = np.flatnonzero(cont)
        if live.size:
            folded = 2 * s2 * k <= fold_max
            w = _below(bits, 2 * s2 * k if folded else 2 * s2, live.size)
            q2 = qq2[live]
            hit = w < q2
            tie = np.flatnonzero(w == q2)
            if tie.size:
                hit[tie] = _bern_ratio(bits, rr[live[tie]], t)
            if not folded:
                hit &= _below(bits, k, live.size) == 0
            cont[live] = hit
        out[idx[~cont]] = k % 2 == 1  # stopped at K: 1 iff K is odd
        idx = idx[cont]
        qq2 = qq2[cont]
        rr = rr[cont]
        k += 1
    return out


def _accept_alg3(bits: RandomBits, y: I64, s2: int, t: int) -> Bools:
    """The accept coin C of CKS Alg. 3 for each candidate ``y`` (see the comment block above)."""
    n = y.size
    acc = np.zeros(n, dtype=np.bool_)
    a = np.abs(y).astype(np.uint64)
    fits = a <= np.uint64(_TWO62 // t)
    at = np.where(fits, a, np.uint64(0)) * np.uint64(t)
    s2u = np.uint64(s2)
    u = np.where(at >= s2u, at - s2u, s2u - at)
    todo = fits.copy()  # not yet decided by a vectorised tier
    den = 2 * s2 * t * t
    if den <= _DIRECT_DEN_MAX:  # tier 1
        direct = np.flatnonzero(fits & (u <= np.uint64(1 << 31)))
        if direct.size:
            ud = u[direct]
            sq = ud * ud
            dd = np.uint64(den)
            acc[direct] = _bern_exp_neg_split(bits, sq // dd, sq % dd, den)
            todo[direct] = False
    tt = np.uint64(t)
    rest = np.flatnonzero(todo)
    q = u[rest] // tt
    tier2 = q < np.uint64(min(s2, 1 << 31))
    dec = rest[tier2]
    if dec.size:  # tier 2
        qd = q[tier2]
        rd = u[dec] - qd * tt
        sq = qd * qd
        d1 = np.uint64(2 * s2)
        c1 = _bern_exp_neg_split(bits, sq // d1, sq % d1, 2 * s2)
        live = np.flatnonzero(c1)
        if live.size:
            c1[live] = _bern_g(bits, qd[live], rd[live], t, s2)
        acc[dec] = c1
        todo[dec] = False
    todo |= ~fits  # tier 3
    slow = np.flatnonzero(todo)
    if slow.size:
        ws = _WordStream(bits)
        two_s2tt = 2 * s2 * t * t
        for i in slow.tolist():
            uu = abs(abs(int(y[i])) * t - s2)
            acc[i] = _ref_bern_exp_neg(ws, uu * uu, two_s2tt)
    return acc


def _dgauss_yield(s2: int, t: int) -> float:
    """Probability that one attempt (Alg. 2 then Alg. 3's coin) yields a sample; sizing only.

    exp(-|y|/t) * exp(-(|y| - s2/t)^2/(2 s2)) = exp(-y^2/(2 s2)) * exp(-s2/(2 t^2)), so
    P(accept | Y valid) = exp(-s2/(2t^2)) * sum_y exp(-y^2/(2 s2)) / sum_y exp(-|y|/t).
    """
    q = math.exp(-1.0 / t)
    z_lap = (1.0 + q) / (1.0 - q)
    z_gauss = math.sqrt(2.0 * math.pi * s2) * theta_dual(s2)[0]
    return _dlap_yield(t) * math.exp(-s2 / (2.0 * t * t)) * z_gauss / z_lap


def discrete_gaussian(bits: RandomBits, sigma2_units: int, size: int) -> np.ndarray:
    """Exact samples of N_Z(0, sigma2_units), int64 — CKS Algorithm 3, vectorised.

    ``P(Z = z) ∝ exp(-z^2 / (2 sigma2_units))`` on the integers, ``1 <= sigma2_units <= 2**62``.
    Candidates come from CKS Alg. 2 (t = floor(sqrt(s2)) + 1); the accept coin is computed in
    exact integer arithmetic without overflow (see the comment block above the code). For
    ``size <= 8`` (where numpy's per-call overhead dominates) and above ``2**60`` the exact
    scalar sampler of :func:`discrete_gaussian_reference` is used instead.
    """
    _check_size(size)
    if isinstance(sigma2_units, bool) or not isinstance(sigma2_units, int | np.integer):
        raise TypeError(f"sigma2_units must be an integer, got {sigma2_units!r}")
    s2 = int(sigma2_units)
    if not 1 <= s2 <= MAX_SIGMA2_UNITS:
        raise ValueError(f"sigma2_units must be in [1, 2**62], got sigma2_units={s2}")
    if size <= _SCALAR_MAX_SIZE or s2 > _VECTOR_MAX_SIGMA2:
        ws = _WordStream(bits, block=32 if size <= _SCALAR_MAX_SIZE else 256)
        sigma2 = Fraction(s2)
        return np.array([_ref_discrete_gaussian(ws, sigma2) for _ in range(size)], dtype=np.int64)
    t = math.isqrt(s2) + 1
    rate = _dgauss_yield(s2, t)
    parts: list[I64] = []
    need = size
    while need > 0:
        n = min(int(need / rate * 1.02) + 32, _BATCH)
        y = _dlap_raw(bits, t, n)
        y = y[_accept_alg3(bits, y, s2, t)][:need]
        parts.append(y)
        need -= y.size
    return _concat(parts)


# --------------------------------------------------------------------------------------------
# Scalar reference sampler (Python integers)
# --------------------------------------------------------------------------------------------


class _WordStream:
    """Scalar exact uniform integers of any size from a :class:`RandomBits`, words buffered."""

    def __init__(self, bits: RandomBits, block: int = 256) -> None:
        self._bits = bits
        self._block = block
        self._buf: list[int] = []

    def _word(self) -> int:
        if not self._buf:
            self._buf = _words(self._bits, self._block).tolist()
        return self._buf.pop()

    def below(self, n: int) -> int:
        """Uniform on ``[0, n)``: the low ``bit_length(n - 1)`` bits of fresh words, rejected
        while ``>= n`` (acceptance >= 1/2)."""
        if n <= 1:
            return 0
        nbits = (n - 1).bit_length()
        nwords = (nbits + 63) // 64
        mask = (1 << nbits) - 1
        while True:
            x = 0
            for _ in range(nwords):
                x = (x << 64) | self._word()
            x &= mask
            if x < n:
                return x


def _ref_bern_exp_neg_unit(ws: _WordStream, num: int, den: int) -> bool:
    """CKS Algorithm 1 for gamma = num/den in [0, 1]; Bernoulli(gamma/K) = [uniform(den K) < num]."""
    k = 1
    while ws.below(den * k) < num:
        k += 1
    return k % 2 == 1


def _ref_bern_exp_neg(ws: _WordStream, num: int, den: int) -> bool:
    """CKS Algorithm 1 for any gamma = num/den >= 0: floor(gamma) x exp(-1), then the rest."""
    whole, frac = divmod(num, den)
    for _ in range(whole):
        if not _ref_bern_exp_neg_unit(ws, 1, 1):
            return False
    return _ref_bern_exp_neg_unit(ws, frac, den)


def _ref_discrete_laplace(ws: _WordStream, t: int) -> int:
    """CKS Algorithm 2 with s = 1."""
    while True:
        u = ws.below(t)
        if not _ref_bern_exp_neg_unit(ws, u, t):
            continue
        v = 0
        while _ref_bern_exp_neg_unit(ws, 1, 1):
            v += 1
        x = u + t * v
        neg = ws.below(2) == 1
        if neg and x == 0:
            continue
        return -x if neg else x


def _ref_discrete_gaussian(ws: _WordStream, sigma2: Fraction) -> int:
    """CKS Algorithm 3 for sigma2 = p/q.

    The accept exponent (|y| - sigma2/t)^2 / (2 sigma2) equals (|y| q t - p)^2 / (2 p q t^2),
    kept as that (unreduced) integer ratio.
    """
    p, q = sigma2.numerator, sigma2.denominator
    t = math.isqrt(p * q) // q + 1  # floor(sqrt(p/q)) + 1
    den = 2 * p * q * t * t
    while True:
        y = _ref_discrete_laplace(ws, t)
        u = abs(y) * q * t - p
        if _ref_bern_exp_neg(ws, u * u, den):
            return y


def discrete_gaussian_reference(bits: RandomBits, sigma2: Fraction, size: int) -> list[int]:
    """Straightforward scalar exact N_Z(0, sigma2) sampler (CKS Algorithms 1-3, Python ints).

    Kept as the correctness and benchmark baseline for :func:`discrete_gaussian`; ``sigma2`` is
    any positive rational (a :class:`~fractions.Fraction` or an int).
    """
    _check_size(size)
    s = Fraction(sigma2)
    if s <= 0:
        raise ValueError(f"sigma2 must be > 0, got sigma2={s}")
    ws = _WordStream(bits)
    return [_ref_discrete_gaussian(ws, s) for _ in range(size)]


# --------------------------------------------------------------------------------------------
# Continuous Gaussian
# --------------------------------------------------------------------------------------------


def gaussian(bits: RandomBits, sigma: float, size: int) -> np.ndarray:
    """Continuous N(0, sigma^2) float64 samples by Box–Muller on 53-bit uniforms from ``bits``.

    Floating-point caveat: the zCDP guarantee of the Gaussian mechanism is proven for real-valued
    noise. Floating-point samples are only an approximation: values lie on an uneven grid, the
    tails are cut at about 8.6 sigma, and low-order bits of ``value + noise`` can reveal the
    value (Mironov, CCS 2012, "On significance of the least significant bits for differential
    privacy"). Use the exact :func:`discrete_gaussian` unless that caveat is accepted.
    """
    _check_size(size)
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be finite and >= 0, got sigma={sigma}")
    half = -(-size // 2)
    w = _words(bits, 2 * half)
    scale = 2.0**-53
    u1 = ((w[:half] >> np.uint64(11)).astype(np.float64) + 1.0) * scale  # (0, 1]
    u2 = (w[half:] >> np.uint64(11)).astype(np.float64) * scale  # [0, 1)
    r = np.sqrt(-2.0 * np.log(u1))
    ang = 2.0 * math.pi * u2
    z = np.concatenate([r * np.cos(ang), r * np.sin(ang)])[:size]
    return z * float(sigma)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _check_size(size: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 0:
        raise ValueError(f"size must be an integer >= 0, got size={size!r}")


def _concat(parts: list[I64]) -> I64:
    if not parts:
        return np.empty(0, dtype=np.int64)
    return np.concatenate(parts).astype(np.int64, copy=False)
