"""Types of the native budget-row checksums (``runtime/store/_row_crc.c``)."""

import numpy as np

def budget_crcs(users: list[str], spent: np.ndarray, retired: np.ndarray, /) -> bytearray: ...
def budget_rows(
    ids: bytes, lengths: bytes, spent: bytes, retired: bytes, /
) -> list[tuple[str, int, int, int]] | None: ...
