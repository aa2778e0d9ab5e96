"""Types of the native id packing (``engine/_packed_ids.c``)."""

import numpy as np

def pack_words(
    ids: list[str], canonical: np.ndarray, max_bytes: int, /
) -> tuple[bytearray, bytearray, bytearray] | None: ...
def concat_utf8(ids: list[str], /) -> tuple[bytes, bytearray] | None: ...
