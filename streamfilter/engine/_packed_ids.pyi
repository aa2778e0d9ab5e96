"""Types of the native id packing (``engine/_packed_ids.c``)."""

import numpy as np

def pack_words(
    ids: list[str], canonical: np.ndarray, max_bytes: int, /
) -> tuple[bytearray, bytearray, bytearray] | None: ...
def concat_utf8(ids: list[str], /) -> tuple[bytes, bytearray] | None: ...
def hashes(ids: list[str], /) -> bytearray: ...
def key_partitions(ids: list[str], partitions: int, /) -> bytearray | None: ...
def canonical_users(
    ids: list[str], present: np.ndarray, in_order: np.ndarray, max_bytes: int, /
) -> tuple[bytearray, bytearray, bytearray, bytearray, bytearray] | None: ...
def locate_sorted(
    key: np.ndarray,
    len: np.ndarray,
    woff: np.ndarray,
    words: np.ndarray,
    hashes: np.ndarray,
    lengths: np.ndarray,
    qwoff: np.ndarray,
    qwords: np.ndarray,
    /,
) -> tuple[bytearray, bytearray]: ...
def merge_entries(
    key: np.ndarray,
    spent: np.ndarray,
    retired: np.ndarray,
    len: np.ndarray,
    woff: np.ndarray,
    words: np.ndarray,
    nkey: np.ndarray,
    nspent: np.ndarray,
    nretired: np.ndarray,
    nlen: np.ndarray,
    nwoff: np.ndarray,
    nwords: np.ndarray,
    /,
) -> tuple[bytearray, bytearray, bytearray, bytearray, bytearray, bytearray]: ...
