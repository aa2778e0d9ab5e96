"""The SQLite state's schema and row format, shared by the writer and the reader.

Every row carries a CRC-32 of its values (``crc`` column), written with the row and checked
whenever the row is read, so a damaged budget, release, query, position or meta value is refused
instead of silently used (``integrity_check`` sees only SQLite's page structure). The CRC is
``zlib.crc32`` of the row packed as binary (``pack_row``: each value type-tagged, numbers
fixed-width, text and blobs length-prefixed); meta ``row_format`` names that format. A state
written before it (each value's ``repr``) is converted when the writer opens it, in one
transaction, every row first checked against its old checksum (``legacy_row_crc``).

Budgets are log-structured: a day's debits are one ``budget_log`` row of packed columns (ids,
spent units, retired flags); a user's state is their newest log entry, else their ``budgets`` row.
The log's oldest entries are folded into ``budgets`` (sqlite.py), a whole row or a prefix of the
oldest row at a time; the entries of a prefix already folded stay in the row until the whole row
is (reading them again gives the same state: the table holds the same values, or newer ones).
"""

from __future__ import annotations

import sqlite3
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamfilter.engine.ledger import UserKeys, encode_ids
from streamfilter.errors import StoreError
from streamfilter.runtime.store.base import TelemetryCharge


def sqlite_error_text(exc: sqlite3.Error) -> str:
    """SQLite's message with its error code name and, for write failures, the likely cause."""
    name = getattr(exc, "sqlite_errorname", None)
    text = f"{exc} ({name})" if name else str(exc)
    if name is not None and (name == "SQLITE_FULL" or name.startswith("SQLITE_IOERR")):
        text += " — disk full, a file size limit, or failing storage?"
    elif name is not None and name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        text += " — the state file is damaged: restore the newest intact copy of the state"
    return text


SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL, crc INTEGER);
CREATE TABLE IF NOT EXISTS budgets (
    user_id TEXT PRIMARY KEY, spent_units INTEGER NOT NULL, retired INTEGER NOT NULL, crc INTEGER
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS queries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, query_id TEXT UNIQUE NOT NULL, payload BLOB NOT NULL,
    crc INTEGER
);
CREATE TABLE IF NOT EXISTS days (day TEXT PRIMARY KEY, seq INTEGER NOT NULL, crc INTEGER);
CREATE TABLE IF NOT EXISTS releases (
    day TEXT NOT NULL, query_id TEXT NOT NULL, ord INTEGER NOT NULL, payload BLOB NOT NULL,
    sent INTEGER NOT NULL DEFAULT 0, crc INTEGER, PRIMARY KEY (day, query_id)
);
CREATE TABLE IF NOT EXISTS positions (
    partition TEXT PRIMARY KEY, resume_offset INTEGER NOT NULL, high_offset INTEGER NOT NULL,
    crc INTEGER
);
CREATE TABLE IF NOT EXISTS budget_log (
    seq INTEGER PRIMARY KEY, n_users INTEGER NOT NULL, id_lengths BLOB NOT NULL, ids BLOB NOT NULL,
    spent_units BLOB NOT NULL, retired BLOB NOT NULL, crc INTEGER
);
CREATE TABLE IF NOT EXISTS telemetry_ledger (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, rho REAL NOT NULL,
    record BLOB NOT NULL, crc INTEGER
);
"""


#: the columns each row's ``crc`` covers, and the primary key (to backfill older states)
CRC_COLUMNS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "meta": (("key", "value"), ("key",)),
    "budgets": (("user_id", "spent_units", "retired"), ("user_id",)),
    "budget_log": (
        ("seq", "n_users", "id_lengths", "ids", "spent_units", "retired"),
        ("seq",),
    ),
    "queries": (("seq", "query_id", "payload"), ("seq",)),
    "days": (("day", "seq"), ("day",)),
    "releases": (("day", "query_id", "ord", "payload", "sent"), ("day", "query_id")),
    "positions": (("partition", "resume_offset", "high_offset"), ("partition",)),
    "telemetry_ledger": (("seq", "kind", "rho", "record"), ("seq",)),
}


#: meta ``row_format`` of a state whose checksums are over ``pack_row``; absent: ``repr``
ROW_FORMAT = "packed-1"
#: the command that converts an older state (the writer converts it when it opens it)
MIGRATE_COMMAND = "streamfilter migrate-state"

_INT = struct.Struct("<cq")
_FLOAT = struct.Struct("<cd")
_HEAD = struct.Struct("<cI")


def pack_row(*values: object) -> bytes:
    """A row's values as bytes, each type-tagged: an integer (``bool`` too, as SQLite stores
    it) as ``i`` + int64, a float as ``f`` + float64, text as ``t`` + length + UTF-8 (lone
    surrogates kept), a blob as ``b`` + length + its bytes, NULL as ``n``; little-endian. One
    changed byte, or a value of another type, gives other bytes."""
    parts: list[bytes] = []
    for v in values:
        if isinstance(v, int):
            parts.append(_INT.pack(b"i", v))
        elif isinstance(v, float):
            parts.append(_FLOAT.pack(b"f", v))
        elif isinstance(v, str):
            data = v.encode("utf-8", "surrogatepass")
            parts += (_HEAD.pack(b"t", len(data)), data)
        elif isinstance(v, bytes | bytearray | memoryview):
            data = bytes(v)
            parts += (_HEAD.pack(b"b", len(data)), data)
        elif v is None:
            parts.append(b"n")
        else:
            raise TypeError(f"pack_row: no row value is a {type(v).__name__}")
    return b"".join(parts)


def row_crc(*values: object) -> int:
    """CRC-32 of a row's values (``pack_row``)."""
    return zlib.crc32(pack_row(*values))


def _crc32_tables() -> tuple[np.ndarray, np.ndarray]:
    """zlib's CRC-32 (reflected polynomial 0xEDB88320) as lookup tables: the register's step
    over one byte (256 entries) and over two bytes at once (65,536 entries, 256 KiB)."""
    one = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        one = np.where(one & 1, (one >> 1) ^ np.uint32(0xEDB88320), one >> 1)
    two = np.arange(1 << 16, dtype=np.uint32)
    for _ in range(2):
        two = one[two & 0xFF] ^ (two >> 8)
    return one, two


_CRC32_BYTE, _CRC32_PAIR = _crc32_tables()


def _crc32_columns(block: np.ndarray, crc: int) -> np.ndarray:
    """``zlib.crc32(column, crc)`` of each column of a ``(bytes, rows)`` ``uint8`` array: the
    table-driven CRC run over all columns at once, one numpy step per pair of byte positions."""
    size, columns = block.shape
    reg = np.full(columns, crc ^ 0xFFFFFFFF, np.uint32)
    pairs = block[0 : size - 1 : 2].astype(np.uint32)
    pairs |= block[1:size:2].astype(np.uint32) << 8  # little-endian: byte 2k low, 2k + 1 high
    index = np.empty_like(reg)
    for pair in pairs:
        reg ^= pair
        np.bitwise_and(reg, 0xFFFF, out=index)
        reg >>= 16
        reg ^= _CRC32_PAIR[index]
    if size % 2:
        reg ^= block[-1]
        np.bitwise_and(reg, 0xFF, out=index)
        reg >>= 8
        reg ^= _CRC32_BYTE[index]
    reg ^= 0xFFFFFFFF
    return reg


def budget_crcs(packed: PackedBudgets, path: Path) -> np.ndarray:
    """``row_crc(user, spent, int(retired))`` of each entry of a packed budget row (the upkeep's
    fold writes one ``budgets`` row per entry), as ``uint32``. The entries whose ids have one
    byte length share their ``pack_row`` head (tag and length: one ``zlib.crc32``); the rest of
    their bytes are laid out as the columns of one array from the packed columns and
    checksummed together (``_crc32_columns``) — no Python step per entry."""
    lengths = packed.lengths(path)
    n = len(lengths)
    ids = np.frombuffer(packed.ids, np.uint8)
    id_starts = np.cumsum(lengths) - lengths
    spent = np.frombuffer(packed.spent_units, np.uint8).reshape(n, 8)  # <i8 bytes
    retired = np.frombuffer(packed.retired, np.uint8)  # 0 or 1: int64 of it is it, then zeros
    crcs = np.empty(n, np.uint32)
    for length in np.unique(lengths).tolist():
        group = np.flatnonzero(lengths == length)
        tail = np.zeros((length + 2 * _INT.size, len(group)), np.uint8)
        tail[:length] = ids[id_starts[group] + np.arange(length)[:, None]]
        tail[length] = tail[length + _INT.size] = ord("i")
        tail[length + 1 : length + _INT.size] = spent[group].T
        tail[length + _INT.size + 1] = retired[group]
        crcs[group] = _crc32_columns(tail, zlib.crc32(_HEAD.pack(b"t", length)))
    return crcs


def legacy_row_crc(*values: object) -> int:
    """The checksum of a state without meta ``row_format``: CRC-32 of each value type-tagged
    and length-prefixed, ``repr`` for numbers and text, raw bytes for blobs. Only to check an
    older state's rows before converting them (``SQLiteStateStore``)."""
    parts: list[bytes] = []
    for v in values:
        if not isinstance(v, bytes):
            v = repr(v).encode("utf-8", "surrogatepass")
            parts.append(b"r" + len(v).to_bytes(8, "little"))
        else:
            parts.append(b"b" + len(v).to_bytes(8, "little"))
        parts.append(v)
    return zlib.crc32(b"".join(parts))


class OldRowFormatError(StoreError):
    def __init__(self, path: Path) -> None:
        super().__init__(
            f"state store {path} has the row checksums of an older streamfilter; convert it "
            f"once with `{MIGRATE_COMMAND} {path}` (one transaction; `streamfilter run` on it "
            "converts it too)"
        )


BUDGET_UPSERT = (
    "INSERT INTO budgets(user_id, spent_units, retired, crc) VALUES(?, ?, ?, ?) "
    "ON CONFLICT(user_id) DO UPDATE SET spent_units = excluded.spent_units, "
    "retired = excluded.retired, crc = excluded.crc"
)


LOG_COLUMNS = "seq, n_users, id_lengths, ids, spent_units, retired, crc"


@dataclass(frozen=True)
class PackedBudgets:
    """One day's budget changes as one ``budget_log`` row: the UTF-8 ids back to back, their
    byte lengths (``<u4``), spent units (``<i8``) and retired flags (``u1``). The one
    serialisation of users' budgets: the cluster ledger's per-(partition, day) budget records
    (``store.cluster``) are the same columns."""

    n_users: int
    id_lengths: bytes
    ids: bytes
    spent_units: bytes
    retired: bytes

    @classmethod
    def of(cls, users: np.ndarray, spent_units: np.ndarray, retired: np.ndarray) -> PackedBudgets:
        """The row of these changes; the UTF-8 of ids the engine already encoded (``users`` a
        ``KeyedUsers``, as a closed day gives them) is reused."""
        keys = getattr(users, "keys", None)
        if isinstance(keys, UserKeys) and len(keys) == len(users):
            ids, lengths = keys.utf8()
        else:
            buffer, _starts, lengths = encode_ids(users)
            ids = buffer[: int(lengths.sum())]
        return cls(
            len(lengths),
            lengths.astype("<u4").tobytes(),
            ids,
            np.asarray(spent_units, dtype="<i8").tobytes(),
            np.asarray(retired, dtype=bool).astype(np.uint8).tobytes(),
        )

    def values(self) -> tuple[int, bytes, bytes, bytes, bytes]:
        return self.n_users, self.id_lengths, self.ids, self.spent_units, self.retired

    def lengths(self, path: Path | str) -> np.ndarray:
        """The ids' byte lengths; ``StoreError`` if the columns do not fit together."""
        n = self.n_users
        if not (
            n >= 0
            and len(self.id_lengths) == 4 * n
            and len(self.spent_units) == 8 * n
            and len(self.retired) == n
        ):
            raise CorruptRowError(path, "budget_log")
        lengths = np.frombuffer(self.id_lengths, dtype="<u4").astype(np.int64)
        if int(lengths.sum()) != len(self.ids) or bool(
            (np.frombuffer(self.retired, np.uint8) > 1).any()
        ):
            raise CorruptRowError(path, "budget_log")
        return lengths

    def offsets(self, path: Path | str) -> np.ndarray:
        """Byte offset of each id in ``ids``, and the end: ``n_users + 1`` values."""
        return np.concatenate(([0], np.cumsum(self.lengths(path))))

    def entries(
        self, start: int, stop: int, path: Path | str, offsets: np.ndarray | None = None
    ) -> PackedBudgets:
        """Entries ``start`` to ``stop`` (exclusive) as a packed row of their own (``offsets``:
        this row's :meth:`offsets`, if already known)."""
        offsets = self.offsets(path) if offsets is None else offsets
        a, b = int(offsets[start]), int(offsets[stop])
        return PackedBudgets(
            stop - start,
            self.id_lengths[4 * start : 4 * stop],
            self.ids[a:b],
            self.spent_units[8 * start : 8 * stop],
            self.retired[start:stop],
        )

    def unpack(
        self, path: Path | str, order: np.ndarray | None = None
    ) -> tuple[list[str], list[int], list[bool]]:
        """``(users, spent_units, retired)``, in entry order or that of the indices ``order``;
        ``StoreError`` if the columns do not decode."""
        lengths = self.lengths(path)
        at = slice(None) if order is None else order
        try:
            ends = np.cumsum(lengths)
            starts = (ends - lengths)[at].tolist()
            ends = ends[at].tolist()
            text = self.ids.decode("utf-8", "surrogatepass")
            if len(text) == len(self.ids):  # ASCII: character offsets are byte offsets
                users = [text[a:b] for a, b in zip(starts, ends, strict=True)]
            else:
                raw = self.ids
                users = [
                    raw[a:b].decode("utf-8", "surrogatepass")
                    for a, b in zip(starts, ends, strict=True)
                ]
        except ValueError:  # UnicodeDecodeError included
            raise CorruptRowError(path, "budget_log") from None
        spent = np.frombuffer(self.spent_units, dtype="<i8")[at].tolist()
        retired = np.frombuffer(self.retired, dtype=np.uint8)[at].astype(bool).tolist()
        return users, spent, retired

    def id_order(self, path: Path | str) -> np.ndarray:
        """The entries' indices sorted by id, stably (a user listed twice keeps their entry
        order): the order of the ids as ``str`` (UTF-8 byte order is code point order, lone
        surrogates included). A least-significant-first radix sort of the ids as big-endian
        8-byte words, zero past an id's end, shorter ids first among equal words (``"a"``
        before ``"a\\0"``): one stable numpy sort per word position, none per entry."""
        lengths = self.lengths(path)
        ids = np.frombuffer(self.ids, np.uint8)
        id_starts = np.cumsum(lengths) - lengths
        order = np.argsort(lengths, kind="stable")
        words = (int(lengths.max()) + 7) // 8 if len(lengths) else 0
        for first in range(8 * (words - 1), -1, -8):
            word = np.zeros((len(lengths), 8), np.uint8)
            for k in range(8):
                has = np.flatnonzero(lengths > first + k)
                word[has, k] = ids[id_starts[has] + first + k]
            key = word.view(">u8").ravel()
            order = order[np.argsort(key[order], kind="stable")]
        return order

    def find(self, user_id: str, path: Path | str) -> int | None:
        """Index of ``user_id`` in this row (the last one if listed twice), or None."""
        lengths = self.lengths(path)
        needle = np.frombuffer(user_id.encode("utf-8", "surrogatepass"), np.uint8)
        starts = np.cumsum(lengths) - lengths
        cand = np.flatnonzero(lengths == len(needle))
        if len(cand) and len(needle):
            data = np.frombuffer(self.ids, np.uint8)
            cand = cand[
                (data[starts[cand][:, None] + np.arange(len(needle))] == needle).all(axis=1)
            ]
        return int(cand[-1]) if len(cand) else None


def log_rows(
    db: sqlite3.Connection, path: Path, *, newest_first: bool = False
) -> Iterator[PackedBudgets]:
    """The budget log's rows in commit order (or newest first), each checked against its
    ``crc``."""
    order = "DESC" if newest_first else "ASC"
    for row in db.execute(f"SELECT {LOG_COLUMNS} FROM budget_log ORDER BY seq {order}"):
        _seq, n, *blobs = checked_row(path, "budget_log", row)
        yield PackedBudgets(as_int(n), *map(as_blob, blobs))


def newest_in_log(db: sqlite3.Connection, path: Path) -> dict[str, tuple[int, bool]]:
    """Each user in the budget log with their newest ``(spent_units, retired)``."""
    newest: dict[str, tuple[int, bool]] = {}
    for packed in log_rows(db, path):
        users, spent, retired = packed.unpack(path)
        newest.update(zip(users, zip(spent, retired, strict=True), strict=True))
    return newest


def fold_rows(
    packed: PackedBudgets, path: Path
) -> tuple[list[str], list[int], list[int], list[int]]:
    """The ``budgets`` rows folding ``packed``'s entries upserts, as columns ``(users, spent
    units, retired, crcs)`` (``zip`` gives the rows), sorted by id — in key order the upserts walk
    the table's B-tree pages in sequence (a day's users come in hash order; a 600k-entry fold
    took 10 s unsorted) — and stable, so a user listed twice keeps their newest entry last
    (:meth:`PackedBudgets.id_order`). :meth:`PackedBudgets.unpack` names a corrupt row."""
    order = packed.id_order(path)
    users, spent, _retired = packed.unpack(path, order)
    return (
        users,
        spent,
        np.frombuffer(packed.retired, np.uint8)[order].tolist(),
        budget_crcs(packed, path)[order].tolist(),
    )


def lookup_budget(db: sqlite3.Connection, path: Path, user_id: str) -> tuple[int, bool] | None:
    """``(spent_units, retired)`` of one user: the newest log row that lists them, else their
    ``budgets`` row. Run inside one read transaction (a consistent snapshot)."""
    for packed in log_rows(db, path, newest_first=True):
        i = packed.find(user_id, path)
        if i is not None:
            return int(np.frombuffer(packed.spent_units, "<i8")[i]), bool(packed.retired[i])
    row = db.execute(
        "SELECT user_id, spent_units, retired, crc FROM budgets WHERE user_id = ?", (user_id,)
    ).fetchone()
    if row is None:
        return None
    _user, spent_units, retired = checked_row(path, "budgets", row)
    return as_int(spent_units), bool(retired)


class CorruptRowError(StoreError):
    def __init__(self, path: Path | str, table: str) -> None:
        super().__init__(
            f"state store {path} is corrupt: a row of table {table} does not match its checksum; "
            "refusing to use it — restore the newest intact copy of the state"
        )


def checked_row(path: Path, table: str, row: tuple[object, ...]) -> tuple[object, ...]:
    """``row`` = the covered values then ``crc``; returns the values if they match."""
    *values, crc = row
    if crc != row_crc(*values):
        raise CorruptRowError(path, table)
    return tuple(values)


def as_int(value: object) -> int:
    if type(value) is not int:
        raise StoreError("the state store holds a value of the wrong type where an integer belongs")
    return value


def as_blob(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise StoreError("the state store holds a value of the wrong type where a blob belongs")
    return value


def read_ledger(db: sqlite3.Connection, path: Path) -> list[TelemetryCharge]:
    rows = db.execute("SELECT seq, kind, rho, record, crc FROM telemetry_ledger ORDER BY seq")
    checked = [checked_row(path, "telemetry_ledger", row) for row in rows]
    return [TelemetryCharge(str(k), float(r), as_blob(p)) for _s, k, r, p in checked]  # type: ignore[arg-type]
