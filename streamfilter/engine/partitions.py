"""Which partition of the events topic a user belongs to (docs/design.md §7.1).

Events are produced with key = ``user_id``, so Kafka's default partitioner (the Java client's and
kafka-python's) pins every user to one partition of a topic with ``n`` partitions:
``(murmur2(utf8(user_id)) & 0x7fffffff) % n``. A cluster worker checks each event against it
(``wrong_partition``) and keeps the budgets of its partitions' users (``store.cluster``).

One reference and one fast path: :func:`key_partition` is the reference (murmur2 in Python,
Kafka's ``Utils.murmur2``); :func:`partitions_of` gives the partition of every id of a batch at
once, with one native call (``engine/_packed_ids.c`` ``key_partitions``, chosen by
``streamfilter._native``) and no Python step per id; without it (not built, or
``STREAMFILTER_IMPL=python``) it maps the reference. ``tests/engine/test_partitions.py`` checks
the two equal, and both equal to kafka-python's partitioner.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamfilter.engine.native import packed_ids as _packed_ids  # None: the Python path

__all__ = ["key_partition", "murmur2", "partitions_of"]

_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(key: bytes) -> int:
    """Kafka's 32-bit murmur2 of ``key`` (seed ``0x9747b28c``), as an unsigned integer."""
    n = len(key)
    h = (0x9747B28C ^ n) & _MASK32
    whole = n & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    rest = n & 3
    if rest:
        if rest == 3:
            h ^= key[whole + 2] << 16
        if rest >= 2:
            h ^= key[whole + 1] << 8
        h ^= key[whole]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h


def key_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a record with ``key`` among
    ``partitions``: ``(murmur2(key) & 0x7fffffff) % partitions``."""
    if partitions < 1:
        raise ValueError("a topic has at least one partition")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def partitions_of(user_ids: Sequence[str] | np.ndarray, partitions: int) -> np.ndarray:
    """The partition of each user id (as a record key, UTF-8) among ``partitions`` (int32)."""
    ids = user_ids.tolist() if isinstance(user_ids, np.ndarray) else list(user_ids)
    if _packed_ids is not None:
        if partitions < 1:
            raise ValueError("a topic has at least one partition")
        out = _packed_ids.key_partitions(ids, partitions)
        if out is not None:
            return np.frombuffer(out, np.int32)
    return np.fromiter(
        (key_partition(u.encode("utf-8", "surrogatepass"), partitions) for u in ids),
        np.int32,
        count=len(ids),
    )
