"""Types of the block filter's native twin (``privacy/_filter.c``)."""

import numpy as np

def filter_totals(
    x: np.ndarray,
    clip: float,
    granularity: float,
    cap: int,
    spent: np.ndarray,
    retired: np.ndarray,
    budget: int,
    policy: int,
    /,
) -> tuple[bytearray, bytearray, bytearray, bytearray, int, int]: ...
