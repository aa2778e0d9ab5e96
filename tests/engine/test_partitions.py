"""The partition of a user id (``engine/partitions.py``): the native batch path
(``engine/_packed_ids.c`` ``key_partitions``) gives, id for id, what the Python reference
``key_partition`` gives, and both give what kafka-python's default partitioner (the Java
client's murmur2) gives — the partition a producer keyed by ``user_id`` writes to."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_murmur2

from streamfilter.engine import partitions
from streamfilter.engine.partitions import key_partition, murmur2, partitions_of
from tests.support.native_build import check_built_in_ci, needs

native = needs(partitions._packed_ids, "engine/_packed_ids.c")

# every length's tail (0 to 3 bytes after whole words), multi-byte UTF-8, bytes >= 0x80
ids = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)


def test_the_native_partitioner_is_built_in_ci():
    check_built_in_ci(partitions._packed_ids, "engine/_packed_ids.c")


@given(st.binary(max_size=64))
def test_the_reference_is_kafkas_murmur2(key):
    assert murmur2(key) & 0x7FFFFFFF == kafka_murmur2(key) & 0x7FFFFFFF
    for n in (1, 6, 8, 64, 1000):
        assert key_partition(key, n) == (kafka_murmur2(key) & 0x7FFFFFFF) % n


def test_known_partitions():
    """Fixed points (the Java client's ``Utils.murmur2``): a wrong rotation or seed fails."""
    assert murmur2(b"") == 0x106E08D9
    assert [key_partition(f"u{i}".encode(), 6) for i in range(8)] == [
        (kafka_murmur2(f"u{i}".encode()) & 0x7FFFFFFF) % 6 for i in range(8)
    ]


@native
@settings(max_examples=300)
@given(st.lists(ids, max_size=50), st.integers(1, 2**31 - 1))
def test_the_native_batch_equals_the_reference(users, n):
    got = partitions_of(users, n)
    assert got.dtype == np.int32 and len(got) == len(users)
    assert got.tolist() == [key_partition(u.encode(), n) for u in users]


def test_the_python_path_equals_the_reference(monkeypatch):
    monkeypatch.setattr(partitions, "_packed_ids", None)
    users = [f"user-{i}" for i in range(200)] + ["é", "日本語", ""]
    assert partitions_of(users, 8).tolist() == [key_partition(u.encode(), 8) for u in users]


@native
def test_an_id_without_utf8_goes_to_the_python_path():
    """A lone surrogate has no UTF-8 form: the native call declines, the reference answers
    (with ``surrogatepass``, as the budget records encode ids)."""
    users = ["a", "\ud800", "b"]
    assert partitions._packed_ids.key_partitions(users, 4) is None
    expected = [key_partition(u.encode("utf-8", "surrogatepass"), 4) for u in users]
    assert partitions_of(users, 4).tolist() == expected


def test_no_partitions_is_refused():
    with pytest.raises(ValueError):
        partitions_of(["a"], 0)
    with pytest.raises(ValueError):
        key_partition(b"a", 0)
