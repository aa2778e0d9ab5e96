"""Types of the native column scanner (``engine/_jsonl.c``)."""

from collections.abc import Sequence

import numpy as np

def scan_columns(
    lines: Sequence[bytes],
    start: int,
    stop: int,
    names: tuple[bytes, ...],
    kinds: bytes,
    limits: tuple[int, int, int, float],
    prefix: bool = False,
    /,
) -> tuple[list[str], list[str], list[str | None], list[list[str] | bytearray]] | None: ...
def scan_spans(
    block: bytes,
    starts: np.ndarray | bytes | bytearray,
    ends: np.ndarray | bytes | bytearray,
    names: tuple[bytes, ...],
    kinds: bytes,
    limits: tuple[int, int, int, float],
    id_spans: bool = False,
    prefix: bool = False,
    /,
) -> (
    tuple[
        list[str],
        list[str],
        list[str | None] | tuple[bytearray, bytearray],
        list[list[str] | bytearray],
    ]
    | None
): ...
def split_lines(
    block: bytes, need: int, final: bool, /
) -> tuple[bytearray, bytearray, int, int, int]: ...
def lines_of(
    block: bytes, starts: np.ndarray | bytes | bytearray, ends: np.ndarray | bytes | bytearray, /
) -> list[bytes]: ...
def ids_of(
    block: bytes, starts: np.ndarray | bytes | bytearray, lengths: np.ndarray | bytes | bytearray, /
) -> list[str | None]: ...
