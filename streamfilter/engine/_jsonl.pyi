"""Types of the native column scanner (``engine/_jsonl.c``)."""

from collections.abc import Sequence

def scan_columns(
    lines: Sequence[bytes],
    names: tuple[bytes, ...],
    kinds: bytes,
    limits: tuple[int, int, int, float],
    /,
) -> tuple[list[str], list[str], list[str | None], list[list[str] | bytearray]] | None: ...
