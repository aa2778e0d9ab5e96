"""Exact per-cell sums of float64 values, folded as they arrive (docs/design.md §2.2).

A cell's value is the real sum of its values rounded once to the nearest float64 (ties to even;
an exact zero is +0.0) — what ``math.fsum`` returns. That is a function of the cell's multiset
of values, so it depends on no arrival or grouping order, and it can be accumulated online: the
open day keeps one fixed-point accumulator per cell instead of every value.

The accumulator is a fixed-point integer with ``FRACTION_BITS`` fraction bits held in ``LIMBS``
signed int64 limbs of 32 bits each (the top limb wider): ``sum = Σ_k limb_k · 2^(32k − 87)``.
Every float64 with ``|x| < 2^40`` whose lowest set bit is at least ``2^-87`` — every finite value
of magnitude ≥ 2^-36 ≈ 1.5e-11, and the contract caps values at 1e12 < 2^40 — splits into limbs
exactly, so integer addition makes the sum exact; a limb takes 2^31 additions before it can
overflow, and a day has fewer events than that. The rare value that does not fit (smaller, with
bits below 2^-87, or beyond 2^40) is kept as it is and added with ``math.fsum`` at the end, so
every sum is still exact before its one rounding.

Rounding the limbs is vectorised: the top 64 significant bits and a sticky bit for everything
below go through one uint64 → float64 conversion (round to nearest even; the sticky bit sits
below the rounding position, so the conversion sees whether the discarded part is above, at or
below half an ulp).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["CellSums", "exact_sums_by_key", "fixed_point_limbs", "round_limbs"]

#: the accumulator's fraction bits: limb k weighs 2^(32k − FRACTION_BITS)
FRACTION_BITS = 87
#: limbs per accumulator (three of 32 bits, the top one carries the sign and the rest)
LIMBS = 4
#: values of magnitude below 2^MAX_EXPONENT split into limbs (1e12 < 2^40)
MAX_EXPONENT = 40
_MASK = np.uint64(0xFFFFFFFF)
#: buffered values are folded into the accumulators once this many wait (and at least as many
#: as there are cells, so a fold costs O(1) amortised per value and the buffer never outgrows
#: the cells)
FOLD_MIN = 1 << 20
#: values handled per vectorised step (temporaries stay in cache)
CHUNK = 1 << 14
#: values converted to limbs at a time by a fold (bounds its temporaries to a few MiB)
FOLD_STEP = 1 << 18


def fixed_point_limbs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(limbs, fits): row ``i`` of ``limbs`` (int64, shape (n, LIMBS)) holds ``values[i]``
    exactly in fixed point where ``fits[i]``; rows that do not fit are zero."""
    values = np.asarray(values, np.float64)
    limbs = np.empty((len(values), LIMBS), np.int64)
    fits = np.empty(len(values), bool)
    for a in range(0, len(values), CHUNK):  # cache-sized steps: no large temporaries
        b = a + CHUNK
        fits[a:b] = _fixed_point_limbs(values[a:b], limbs[a:b])
    return limbs, fits


def _fixed_point_limbs(values: np.ndarray, limbs: np.ndarray) -> np.ndarray:
    """Fill ``limbs`` (rows) with ``values`` in fixed point; return where they fit.

    The magnitude is split from the top limb down with float operations that are all exact:
    scaling by a power of two, ``floor``, and subtracting the part taken (the rest is a subset
    of the value's own bits, so it is representable)."""
    values = np.asarray(values, np.float64)
    magnitude = np.abs(values)
    fits = magnitude < 2.0**MAX_EXPONENT  # False for inf and nan
    rest = np.where(fits, magnitude, 0.0)
    for k in range(LIMBS - 1, 0, -1):
        weight = 2.0 ** (32 * k - FRACTION_BITS)
        part = np.floor(rest / weight)
        rest -= part * weight
        limbs[:, k] = np.copysign(part, values)
    part = rest * 2.0**FRACTION_BITS  # an integer below 2^32 iff nothing lies below 2^-87
    fits &= part == np.floor(part)
    limbs[:, 0] = np.copysign(part, values)
    if not fits.all():
        limbs[~fits] = 0
    return fits


def normalize_limbs(limbs: np.ndarray) -> None:
    """Carry in place so that limbs 0..LIMBS-2 lie in [0, 2^32) (the same value)."""
    for k in range(LIMBS - 1):
        carry = limbs[:, k] >> 32  # floor division by 2^32
        limbs[:, k] -= carry << 32
        limbs[:, k + 1] += carry


def round_limbs(limbs: np.ndarray) -> np.ndarray:
    """Each accumulator's value rounded once to the nearest float64 (ties to even)."""
    out = np.empty(len(limbs))
    for a in range(0, len(out), CHUNK):
        out[a : a + CHUNK] = _round_limbs(limbs[a : a + CHUNK])
    return out


def _round_limbs(limbs: np.ndarray) -> np.ndarray:
    m = limbs.T.copy()  # a contiguous row per limb
    _carry(m)
    negative = m[LIMBS - 1] < 0
    if negative.any():
        m[:, negative] *= -1
        _carry(m)  # now every limb ≥ 0: the magnitude
    u = m.view(np.uint64)
    top = u[LIMBS - 1]
    digits = [*u[: LIMBS - 1], top & _MASK, top >> np.uint64(32)]  # 32-bit digits
    # the magnitude's bit length, from its highest non-zero digit
    length = np.zeros(m.shape[1], np.int32)
    for k, d in enumerate(digits):
        bits = np.frexp(d.astype(np.float64))[1]
        length = np.where(d != 0, 32 * k + bits, length)
    # word = the top 64 bits (magnitude >> low); sticky = whether any bit below them is set
    low = np.maximum(length - 64, -64)
    word = np.zeros(m.shape[1], np.uint64)
    sticky = np.zeros(m.shape[1], bool)
    for k, d in enumerate(digits):
        shift = 32 * k - low  # where digit k's lowest bit lands in the word
        up = np.clip(shift, 0, 63).astype(np.uint64)
        down = np.clip(-shift, 0, 63).astype(np.uint64)
        word |= np.where(shift >= 0, np.where(shift < 64, d << up, np.uint64(0)), d >> down)
        sticky |= (d & ((np.uint64(1) << down) - np.uint64(1))) != 0  # bits shifted out
    word |= sticky.astype(np.uint64)  # below the rounding bit: the conversion sees it
    out = np.ldexp(word.astype(np.float64), low - FRACTION_BITS)
    out[negative] *= -1.0
    return out


def _carry(rows: np.ndarray) -> None:
    """``normalize_limbs`` of a (LIMBS, n) array (a row per limb)."""
    for k in range(LIMBS - 1):
        carry = rows[k] >> 32
        rows[k] -= carry << 32
        rows[k + 1] += carry


def _limb_terms(limbs: np.ndarray) -> list[float]:
    """One accumulator as floats whose exact sum is its value (each term exact)."""
    m = limbs.reshape(1, LIMBS).copy()
    normalize_limbs(m)
    top = int(m[0, LIMBS - 1])
    terms = [math.ldexp(int(m[0, k]), 32 * k - FRACTION_BITS) for k in range(LIMBS - 1)]
    hi, lo = top >> 32, top & 0xFFFFFFFF
    terms += [math.ldexp(lo, 32 * (LIMBS - 1) - FRACTION_BITS)]
    terms += [math.ldexp(hi, 32 * LIMBS - FRACTION_BITS)]
    return terms


def _fsum(terms: list[float]) -> float:
    try:
        return math.fsum(terms) + 0.0
    except ValueError:  # inf + -inf (never a contract value)
        return math.nan


def _stored(limbs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Accumulators as kept between folds, 20 bytes each: carried (``normalize_limbs``, in
    place), the three low limbs as uint32 and the top limb as int64."""
    normalize_limbs(limbs)
    return limbs[:, : LIMBS - 1].astype(np.uint32), limbs[:, LIMBS - 1].copy()


def _loaded(low: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Stored accumulators back as int64 limbs (rows)."""
    limbs = np.empty((len(top), LIMBS), np.int64)
    limbs[:, : LIMBS - 1] = low
    limbs[:, LIMBS - 1] = top
    return limbs


def _sums(
    low: np.ndarray, top: np.ndarray, side_rows: np.ndarray, side_values: np.ndarray
) -> np.ndarray:
    """Round each stored accumulator; accumulator ``side_rows[i]`` also takes ``side_values[i]``
    (a value that does not fit the fixed point), added exactly with ``math.fsum``."""
    out = np.empty(len(top))
    for a in range(0, len(top), FOLD_STEP):  # loaded a step at a time: small temporaries
        out[a : a + FOLD_STEP] = round_limbs(
            _loaded(low[a : a + FOLD_STEP], top[a : a + FOLD_STEP])
        )
    if len(side_rows):
        order = np.argsort(side_rows, kind="stable")
        side_rows, side_values = side_rows[order], side_values[order]
        bounds = np.flatnonzero(np.r_[True, side_rows[1:] != side_rows[:-1], True])
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            j = int(side_rows[a])
            limbs = _loaded(low[j : j + 1], top[j : j + 1])[0]
            out[j] = _fsum(_limb_terms(limbs) + side_values[a:b].tolist())
    return out


#: ``exact_sums_by_key`` tries a table of ``key_bound`` slots (no sort) when it is at most this
#: many slots per key
DENSE_SLOTS_PER_KEY = 8


def _distinct_in_slots(key: np.ndarray, key_bound: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(``key`` ascending, the order that sorts it) read off a table of ``key_bound`` slots —
    linear, no sort — when no key repeats; None when one does (or a key is out of range)."""
    if len(key) and (int(key.min()) < 0 or int(key.max()) >= key_bound):
        return None
    slot = np.full(key_bound, -1, np.int64)
    slot[key] = np.arange(len(key), dtype=np.int64)
    ks = np.flatnonzero(slot >= 0)
    if len(ks) != len(key):  # a repeated key kept one slot
        return None
    return ks, slot[ks]


def exact_sums_by_key(
    key: np.ndarray, values: np.ndarray, key_bound: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct ``key`` (ascending) and the exact sum of its values rounded once — a
    function of the key's multiset of values, so of no arrival or grouping order.

    ``key_bound``: every key is in ``[0, key_bound)``, which lets distinct keys (the day's
    cells, once folded) be ordered through a table instead of a sort when the bound is small
    (``DENSE_SLOTS_PER_KEY``); the result is the same."""
    if key_bound is not None and key_bound <= DENSE_SLOTS_PER_KEY * len(key):
        distinct = _distinct_in_slots(key, key_bound)
        if distinct is not None:
            ks, order = distinct
            return ks, values[order] + 0.0
    ks, order = sorted_with_order(key)
    starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
    if len(starts) >= len(ks):  # no repeated key (or no key): each value as it is
        return ks, values[order] + 0.0
    limbs, fits = fixed_point_limbs(values[order])
    group = np.cumsum(np.r_[True, ks[1:] != ks[:-1]]) - 1
    summed = np.add.reduceat(limbs, starts, axis=0)
    side = np.flatnonzero(~fits)
    out = _sums(*_stored(summed), group[side], values[order][side])
    return ks[starts], out


class CellSums:
    """One coordinate's exact sums for the open day, keyed by non-negative int64 keys (the
    users' codes).

    A key that has taken one value keeps that value (its sum, exactly); a key that has taken
    more keeps a fixed-point accumulator (``fixed_point_limbs``). ``add`` buffers (key, value)
    pairs; ``fold`` sorts the buffer with the one-value keys (one ``np.sort`` of the keys packed
    above their positions), keeps the keys still alone as they are, sums the others' limbs and
    merges them into the sorted accumulators. The owner folds once the buffers hold at least
    as many values as there are keys, so memory is bounded by the cells, not by the values,
    and each value is sorted O(1) times amortised. A limb takes 2^31 additions before it could
    overflow and a day has fewer values than that, so accumulators are carried only when they
    are rounded.
    """

    def __init__(self) -> None:
        # keys with one value so far (ascending) and that value
        self._one_keys = np.zeros(0, np.int64)
        self._one_values = np.zeros(0)
        # keys with more (ascending) and their accumulators, stored in 20 bytes each (``_stored``)
        self._keys = np.zeros(0, np.int64)
        self._low = np.zeros((0, LIMBS - 1), np.uint32)  # stored accumulators (``_stored``)
        self._top = np.zeros(0, np.int64)
        self._buffer: list[tuple[np.ndarray, np.ndarray]] = []
        self.buffered = 0
        # values of accumulated keys that do not fit the fixed point: (keys, values), as they are
        self._side: list[tuple[np.ndarray, np.ndarray]] = []

    def __len__(self) -> int:
        """Keys folded so far (buffered values may add more)."""
        return len(self._one_keys) + len(self._keys)

    def add(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Add ``values[i]`` to key ``keys[i]`` (buffered until ``fold``)."""
        if len(keys):
            self._buffer.append((np.asarray(keys, np.int64), np.asarray(values, np.float64)))
            self.buffered += len(keys)

    def fold(self) -> None:
        """Fold every buffered value into its key's sum."""
        if not self._buffer:
            return
        keys = np.concatenate([self._one_keys, *(k for k, _ in self._buffer)])
        values = np.concatenate([self._one_values, *(v for _, v in self._buffer)])
        self._buffer, self.buffered = [], 0
        keys, order = sorted_with_order(keys)
        values = values[order]
        del order
        first = np.r_[True, keys[1:] != keys[:-1]]
        alone = first & np.r_[first[1:], True]  # the key's only value so far
        del first
        if len(self._keys):  # ... unless the key already has an accumulator
            candidates = np.flatnonzero(alone)
            at = np.minimum(np.searchsorted(self._keys, keys[candidates]), len(self._keys) - 1)
            alone[candidates[self._keys[at] == keys[candidates]]] = False
        self._one_keys, self._one_values = keys[alone], values[alone]
        if not alone.all():
            more = ~alone
            self._accumulate(keys[more], values[more])

    def _accumulate(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Add sorted (key, value) pairs into the accumulators, whole keys at a time, about
        ``FOLD_STEP`` values per step: each step's limbs are summed and merged into the rows of
        the keys already held, so the temporaries are a step's, not the fold's; the new keys'
        accumulators are inserted once at the end (their places are in the table as it was)."""
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        new_at: list[np.ndarray] = []
        new_keys: list[np.ndarray] = []
        new_low: list[np.ndarray] = []
        new_top: list[np.ndarray] = []
        g = 0
        while g < len(starts):
            g_end = max(g + 1, int(np.searchsorted(starts, starts[g] + FOLD_STEP)))
            a, b = starts[g], starts[g_end] if g_end < len(starts) else len(keys)
            part, fits = fixed_point_limbs(values[a:b])
            if not fits.all():
                self._side.append((keys[a:b][~fits], values[a:b][~fits]))
            limbs = np.add.reduceat(part, starts[g:g_end] - a, axis=0)
            del part
            step_keys = keys[starts[g:g_end]]
            at = np.searchsorted(self._keys, step_keys)
            found = at < len(self._keys)
            found[found] = self._keys[at[found]] == step_keys[found]
            if found.any():
                rows = at[found]
                held = _loaded(self._low[rows], self._top[rows])
                held += limbs[found]
                self._low[rows], self._top[rows] = _stored(held)
            if not found.all():
                new = ~found
                low, top = _stored(limbs[new])
                new_at.append(at[new])
                new_keys.append(step_keys[new])
                new_low.append(low)
                new_top.append(top)
            g = g_end
        if new_at:
            at = np.concatenate(new_at)
            self._keys = np.insert(self._keys, at, np.concatenate(new_keys))
            self._low = np.insert(self._low, at, np.concatenate(new_low), axis=0)
            self._top = np.insert(self._top, at, np.concatenate(new_top))

    def sums(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys ascending, each key's exact sum rounded once)."""
        self.fold()
        side_keys = np.concatenate([np.zeros(0, np.int64), *(k for k, _ in self._side)])
        side_values = np.concatenate([np.zeros(0), *(v for _, v in self._side)])
        rows = np.searchsorted(self._keys, side_keys)
        keys = np.concatenate([self._one_keys, self._keys])
        summed = np.concatenate(
            [self._one_values + 0.0, _sums(self._low, self._top, rows, side_values)]
        )
        if len(self._one_keys) and len(self._keys):
            order = np.argsort(keys, kind="stable")  # two sorted runs: one merge
            keys, summed = keys[order], summed[order]
        return keys, summed


def sorted_with_order(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``key`` ascending, the stable order that sorts it), by sorting int64 values that pack
    the key (or, when its range is too wide, its high bits) above the position — much faster
    than ``argsort``; positions whose high bits tie but whose keys differ are fixed up by a
    stable argsort of the then nearly sorted keys."""
    n = len(key)
    bits = max(1, (n - 1).bit_length())
    if n == 0 or bits > 40:
        by_argsort: np.ndarray = np.argsort(key, kind="stable")
        return key[by_argsort], by_argsort
    lo, hi = int(key.min()), int(key.max())
    fits = (hi - lo).bit_length() + bits <= 63  # the whole key fits above the position
    packed = ((key - lo) << bits) if fits else ((key >> bits) << bits)
    packed |= np.arange(n, dtype=np.int64)
    packed.sort()
    order: np.ndarray = packed & ((1 << bits) - 1)
    if fits:
        packed >>= bits
        packed += lo
        return packed, order
    ks = key[order]
    if not (ks[1:] >= ks[:-1]).all():
        fix = np.argsort(ks, kind="stable")
        order, ks = order[fix], ks[fix]
    return ks, order
