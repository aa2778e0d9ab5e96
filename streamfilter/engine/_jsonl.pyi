"""Types of the native column scanner (``engine/_jsonl.c``)."""

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

def scan_columns(
    lines: Sequence[bytes],
    names: tuple[bytes, ...],
    kinds: bytes,
    limits: tuple[int, int, int, float],
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

_E = TypeVar("_E", bound=tuple[str, str, dict[str, float | str], str | None])

def scan_events(
    lines: Sequence[bytes],
    event_type: type[_E],
    feature_kinds: dict[str, bool],
    limits: tuple[int, int, int, float, int],
    /,
) -> tuple[list[_E | None], set[str]]: ...
def scan_event_spans(
    block: bytes,
    starts: np.ndarray | bytes | bytearray,
    ends: np.ndarray | bytes | bytearray,
    event_type: type[_E],
    feature_kinds: dict[str, bool],
    limits: tuple[int, int, int, float, int],
    /,
) -> tuple[list[_E | None], set[str]]: ...
def split_lines(
    block: bytes, need: int, final: bool, /
) -> tuple[bytearray, bytearray, int, int, int]: ...
def lines_of(
    block: bytes, starts: np.ndarray | bytes | bytearray, ends: np.ndarray | bytes | bytearray, /
) -> list[bytes]: ...
def ids_of(
    block: bytes, starts: np.ndarray | bytes | bytearray, lengths: np.ndarray | bytes | bytearray, /
) -> list[str | None]: ...
