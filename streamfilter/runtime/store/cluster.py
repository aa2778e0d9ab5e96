"""The cluster ledger: the state that every worker of a cluster shares, in PostgreSQL
(docs/design.md §7).

It extends the PostgreSQL state store (same schema: the query book, releases with their outbox
flag, meta) without its single-writer lock, and adds:

* ``cluster_partitions``: per input partition its **epoch** (incremented by every worker that is
  assigned the partition), its input positions and the last day it committed;
* ``cluster_days``: per day the **pinned partition count** (fixed when the day is first seen:
  events are verified against it, §7.1) and whether the day's queries are frozen and whether it
  is released;
* ``cluster_commits`` and ``cluster_partials``: per (day, partition) who committed it and its
  exact named counters, and per (day, query, partition) the **exact integer partial sum**. They
  are as sensitive as the events: they never leave the database.
* ``cluster_budget_records``: per (partition, day) one packed record of the users whose budget
  changed (``schema.PackedBudgets``), appended only; a partition's budgets are the monotone
  merge of its records (:meth:`ClusterLedger.partition_budgets`, docs/design.md §7.4). No
  cluster worker writes the ``budgets`` table.

Transactions (all ``SERIALIZABLE``):

* :meth:`ClusterLedger.commit_partitions` — a worker's day close for its partitions: the epochs
  checked (``SELECT … FOR UPDATE``; a worker that lost a partition is refused with
  :class:`PartitionFencedError` and writes nothing), the day barrier checked (the day before is
  released, §7.2), each partition's budget record appended, the partials written, the
  positions advanced.
* :meth:`ClusterLedger.release_day` — the releaser's: once every pinned partition committed the
  day, the partials summed exactly, the noise drawn (by the caller, inside the transaction), the
  releases stored under their primary key ``(day, query_id)`` and the day marked released. Killed
  before the commit it left nothing; after it the stored noise is the only noise.
* :meth:`ClusterLedger.add_query` / :meth:`ClusterLedger.freeze_day` — the query book is one
  list in registration order; both take the same row lock, so registrations are serialised
  and a day's queries cannot change once the day is frozen.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamfilter.engine.contract import Reject, RejectReason
from streamfilter.engine.day import DayPartial
from streamfilter.engine.ledger import BudgetLedger, Hasher, python_hash
from streamfilter.engine.partitions import partitions_of
from streamfilter.errors import StoreError
from streamfilter.runtime.store.base import Position
from streamfilter.runtime.store.budget_records import RECORDS_TABLE
from streamfilter.runtime.store.postgres import PostgresStateStore, _first_line
from streamfilter.runtime.store.schema import PackedBudgets

__all__ = [
    "Claim",
    "ClusterLedger",
    "ClusterView",
    "MakeReleases",
    "PartitionFencedError",
    "ReleaserFencedError",
]

_CLUSTER_TABLES = """
CREATE TABLE IF NOT EXISTS {s}.cluster_partitions (
    partition INTEGER PRIMARY KEY, epoch BIGINT NOT NULL, owner TEXT NOT NULL,
    resume_offset BIGINT NOT NULL DEFAULT 0, high_offset BIGINT NOT NULL DEFAULT 0,
    committed_day TEXT
);
CREATE TABLE IF NOT EXISTS {s}.cluster_days (
    day TEXT PRIMARY KEY, partitions INTEGER NOT NULL CHECK (partitions > 0),
    frozen BOOLEAN NOT NULL DEFAULT FALSE, released BOOLEAN NOT NULL DEFAULT FALSE,
    releaser TEXT
);
CREATE TABLE IF NOT EXISTS {s}.cluster_commits (
    day TEXT NOT NULL, partition INTEGER NOT NULL, epoch BIGINT NOT NULL, worker TEXT NOT NULL,
    counters JSONB NOT NULL, PRIMARY KEY (day, partition)
);
CREATE TABLE IF NOT EXISTS {s}.cluster_partials (
    day TEXT NOT NULL, query_id TEXT NOT NULL, partition INTEGER NOT NULL,
    sums BIGINT[] NOT NULL, PRIMARY KEY (day, query_id, partition)
);
CREATE TABLE IF NOT EXISTS {s}.cluster_releaser (
    id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL, token BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
INSERT INTO {s}.meta(key, value) VALUES ('frozen_through', '') ON CONFLICT (key) DO NOTHING;
INSERT INTO {s}.meta(key, value) VALUES ('released_through', '') ON CONFLICT (key) DO NOTHING;
"""


#: how long a worker's session may sit inside an open transaction before the server ends it
IDLE_IN_TRANSACTION_S = 60

#: attempts of one transaction that PostgreSQL aborts for conflicting with another worker's
SERIAL_RETRIES = 30


#: the releaser's callback: (sums, counters, coverage state) → (releases, coverage state)
MakeReleases = Callable[
    [dict[str, np.ndarray], dict[str, int], bytes | None],
    tuple[list[tuple[str, bytes]], bytes | None],
]


class PartitionFencedError(StoreError):
    """A commit for a partition this worker no longer owns (its epoch moved on): refused."""


class ReleaserFencedError(StoreError):
    """A release by a worker whose releaser lease moved on or expired: refused."""


@dataclass(frozen=True)
class Claim:
    """A partition as a worker took it over: its new epoch and where to resume."""

    epoch: int
    position: Position
    committed_day: str | None


@dataclass(frozen=True)
class ClusterView:
    """The cluster's days: the last released, the last frozen, the first and last seen."""

    released_through: str | None
    frozen_through: str | None
    #: the cluster's first day, pinned by the first freeze (None before: no day froze yet)
    first_day: str | None
    first_seen: str | None
    last_day: str | None

    def next_day(self) -> str | None:
        """The day the cluster closes next: after the last released, else the first."""
        if self.released_through is not None:
            return _next(self.released_through)
        return self.first_day


def _next(day: str) -> str:
    return (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat()


def _prev_day(day: str) -> str:
    return (dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat()


class ClusterLedger(PostgresStateStore):
    """The shared ledger of a cluster's workers (see the module doc)."""

    single_writer = False

    def __init__(self, url: str, *, schema: str = "streamfilter", password: str | None = None):
        super().__init__(url, schema=schema, password=password)
        # a worker stopped inside a transaction (SIGSTOP, a pause) holds row locks that would
        # block the worker taking its partitions over: the server ends such a session (and with
        # it the stopped worker's transaction and locks) after this long
        try:
            self._db.execute(
                f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_S}s'"
            )
        except self._psycopg.Error as exc:
            self._db.close()
            raise StoreError(f"state store {self.where}: {_first_line(exc)}") from None

    def _create_more(self, cur: Any) -> None:
        cur.execute(_CLUSTER_TABLES.format(s=self.schema))
        cur.execute(RECORDS_TABLE.format(s=self.schema))

    def _complete(self, cur: Any) -> bool:
        for table in ("cluster_releaser", "cluster_budget_records"):
            cur.execute("SELECT to_regclass(%s)", (f"{self.schema}.{table}",))
            if cur.fetchone()[0] is None:
                return False
        return True

    def _serial(self, body: Callable[[Any], Any]) -> Any:
        """``body(cursor)`` in one serializable transaction, run again (after a short random
        wait) when PostgreSQL aborts it for a conflict with another worker's transaction
        (serialization failure, deadlock): the retried body reads everything afresh. Any other
        driver error is a ``StoreError`` (rolled back; fail closed)."""
        errors = self._psycopg.errors
        retry = (errors.SerializationFailure, errors.DeadlockDetected)
        for attempt in range(SERIAL_RETRIES):
            try:
                with self._db.transaction(), self._db.cursor() as cur:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                    return body(cur)
            except retry:
                time.sleep(random.uniform(0, 0.02 * 2 ** min(attempt, 6)))
            except self._psycopg.Error as exc:
                raise StoreError(
                    f"state store {self.where} failed to commit: {type(exc).__name__}: "
                    f"{_first_line(exc)}"
                ) from None
        raise StoreError(
            f"state store {self.where}: a transaction conflicted with other workers "
            f"{SERIAL_RETRIES} times in a row; failing closed"
        )

    def set_config_fingerprint(self, fingerprint: str) -> None:
        """Pin the fingerprint unless a worker starting at the same time pinned one first."""

        def body(cur: Any) -> None:
            if self._meta_for_update(cur, "config_fingerprint") is None:
                self._set_meta(cur, "config_fingerprint", fingerprint)

        self._serial(body)

    def mark_sent(self, keys: list[tuple[str, str]]) -> None:
        def body(cur: Any) -> None:
            self._mark_sent(cur, keys)

        self._serial(body)

    def load_fingerprint(self) -> str | None:
        """The configuration fingerprint the ledger was created with (None: a new ledger)."""
        return self._meta("config_fingerprint")

    # -- partitions ----------------------------------------------------------------------
    def claim(self, partitions: Sequence[int], worker: str) -> dict[int, Claim]:
        """Take over ``partitions``: each one's epoch incremented (a commit by the worker that
        had it is refused from now on), and where it resumes."""
        s = self.schema

        def body(cur: Any) -> dict[int, Claim]:
            out: dict[int, Claim] = {}
            for p in sorted(partitions):
                row = cur.execute(
                    f"INSERT INTO {s}.cluster_partitions(partition, epoch, owner) "
                    "VALUES (%s, 1, %s) ON CONFLICT (partition) DO UPDATE SET "
                    f"epoch = {s}.cluster_partitions.epoch + 1, owner = excluded.owner "
                    "RETURNING epoch, resume_offset, high_offset, committed_day",
                    (p, worker),
                ).fetchone()
                out[p] = Claim(int(row[0]), Position(int(row[1]), int(row[2])), row[3])
            return out

        claims: dict[int, Claim] = self._serial(body)
        return claims

    def pin_day(self, day: str, partitions: int) -> int:
        """The partition count of ``day``: ``partitions`` if the day is new, else the pinned."""
        s = self.schema

        def body(cur: Any) -> Any:
            cur.execute(
                f"INSERT INTO {s}.cluster_days(day, partitions) VALUES (%s, %s) "
                "ON CONFLICT (day) DO NOTHING",
                (day, partitions),
            )
            row = cur.execute(
                f"SELECT partitions FROM {s}.cluster_days WHERE day = %s", (day,)
            ).fetchone()
            return int(row[0])

        return int(self._serial(body))

    def view(self) -> ClusterView:
        rows = self._read(
            "SELECT (SELECT value FROM {s}.meta WHERE key = 'released_through'), "
            "(SELECT value FROM {s}.meta WHERE key = 'frozen_through'), "
            "(SELECT value FROM {s}.meta WHERE key = 'first_day'), "
            "(SELECT min(day) FROM {s}.cluster_days), (SELECT max(day) FROM {s}.cluster_days)"
        )
        released, frozen, first, first_seen, last = rows[0]
        return ClusterView(released or None, frozen or None, first or None, first_seen, last)

    # -- coverage (docs/design.md §2.11) ---------------------------------------------------
    def coverage_state(self) -> bytes | None:
        """The coverage tracker the ledger holds (None before the first worker charged it)."""
        rows = self._read("SELECT value FROM {s}.meta WHERE key = 'coverage_state'")
        return None if not rows else str(rows[0][0]).encode()

    # -- queries -------------------------------------------------------------------------
    def add_queries(self, canonical_jsons: Sequence[bytes]) -> None:
        """Each query in its own serialised registration (see :meth:`add_query`)."""
        for canonical_json in canonical_jsons:
            self.add_query(canonical_json)

    def add_query(self, canonical_json: bytes) -> None:
        """Register a query unless its first day is frozen (``Reject('closed_day')``) or its id
        is taken by another definition (``Reject('duplicate_query_id')``)."""
        obj = json.loads(canonical_json)
        s = self.schema

        def body(cur: Any) -> Any:
            frozen = self._meta_for_update(cur, "frozen_through")
            row = cur.execute(
                f"SELECT payload FROM {s}.queries WHERE query_id = %s", (obj["query_id"],)
            ).fetchone()
            if row is not None:
                if bytes(row[0]) != bytes(canonical_json):
                    raise Reject(
                        RejectReason.DUPLICATE_QUERY_ID,
                        "query_id is already registered with another definition",
                    )
                return
            if frozen and str(obj["from_day"]) <= frozen:
                raise Reject(
                    RejectReason.CLOSED_DAY,
                    "the query starts on a day whose queries are already frozen in the cluster",
                )
            cur.execute(
                f"INSERT INTO {s}.queries(query_id, payload) VALUES(%s, %s)",
                (obj["query_id"], bytes(canonical_json)),
            )

        self._serial(body)

    def queries_after(self, seen: int) -> list[bytes]:
        """The registered queries after the first ``seen``, in registration order."""
        rows = self._read("SELECT payload FROM {s}.queries ORDER BY seq OFFSET %s", (seen,))
        return [bytes(p) for (p,) in rows]

    def freeze_day(self, day: str) -> bool:
        """Freeze ``day``'s queries (no query starting on or before it is accepted after) if
        ``day`` is the day the cluster closes next: the day after the last released one, or,
        before any release, the cluster's first day — pinned here by the first freeze. False
        (nothing written) for any other day."""
        s = self.schema

        def body(cur: Any) -> bool:
            frozen = self._meta_for_update(cur, "frozen_through")
            meta = dict(
                cur.execute(
                    f"SELECT key, value FROM {s}.meta WHERE key IN "
                    "('released_through', 'first_day')"
                ).fetchall()
            )
            released, first = meta.get("released_through") or None, meta.get("first_day")
            if released is not None:
                if day != _next(released):
                    return False
            elif first is not None and day != first:
                return False
            if first is None:
                self._set_meta(cur, "first_day", day)
            if not frozen or frozen < day:
                self._set_meta(cur, "frozen_through", day)
            cur.execute(f"UPDATE {s}.cluster_days SET frozen = TRUE WHERE day = %s", (day,))
            return True

        return bool(self._serial(body))

    def release_history(self) -> list[bytes]:
        return [
            bytes(p) for (p,) in self._read("SELECT payload FROM {s}.releases ORDER BY day, ord")
        ]

    # -- budgets (docs/design.md §7.4) -------------------------------------------------------
    def budget_records(
        self, partition: int, partitions: int
    ) -> list[tuple[int, int, PackedBudgets]]:
        """The budget records a rebuild of ``partition`` (of ``partitions``) merges, as
        ``(partitions, partition, record)``: the partition's own, and every record written under
        another partition count (the caller keeps only the users that map to ``partition``)."""
        rows = self._read(
            "SELECT partitions, partition, n_users, id_lengths, ids, spent_units, retired "
            "FROM {s}.cluster_budget_records WHERE (partitions = %s AND partition = %s) "
            "OR partitions <> %s ORDER BY seq",
            (partitions, partition, partitions),
            binary=True,  # the packed columns as they are stored, not hex text
        )
        return [
            (int(n), int(p), PackedBudgets(int(k), *(bytes(b) for b in blobs)))
            for n, p, k, *blobs in rows
        ]

    def partition_budgets(
        self, partition: int, partitions: int, hasher: Hasher = python_hash
    ) -> BudgetLedger:
        """The budgets of the users of ``partition`` (Kafka's partitioner over ``partitions``),
        rebuilt from the ledger's records by the monotone merge (``merge_monotone``: per user the
        largest spend, retired if any record says so): no record — a hostile one included — can
        lower a spend another record holds. The records of another partition count (the topic
        grew) give the users among them that map to ``partition`` now."""
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for n, _p, packed in self.budget_records(partition, partitions):
            users, spent, retired = packed.unpack(self.where)
            ids = np.array(users, dtype=object)
            spent_units, flags = np.array(spent, np.int64), np.array(retired, bool)
            if n != partitions:
                mine = partitions_of(ids, partitions) == partition
                ids, spent_units, flags = ids[mine], spent_units[mine], flags[mine]
            parts.append((ids, spent_units, flags))
        ledger = BudgetLedger(hasher)
        if parts:  # one merge of all the records: one insertion into the ledger
            ledger.merge_monotone(*(np.concatenate(column) for column in zip(*parts, strict=True)))
        return ledger

    def fold_budgets(self) -> int:
        """The administrator's compaction of the budget records (docs/design.md §7.4): in one
        transaction, under a lock that holds appends back, every record is merged into one
        snapshot record per partition of the latest pinned count (the monotone merge, the
        rebuild's), and the folded records are deleted (the erase guard lifted for this
        transaction only: the table's owner alone may). A rebuild gives the same budgets
        before and after. Returns the number of records folded (0: nothing to fold)."""
        s = self.schema
        table = f"{s}.cluster_budget_records"
        with self._transaction() as cur:
            cur.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")  # before the snapshot
            pinned = cur.execute(
                f"SELECT partitions FROM {s}.cluster_days ORDER BY day DESC LIMIT 1"
            ).fetchone()
            rows = cur.execute(
                f"SELECT seq, partitions, partition, n_users, id_lengths, ids, spent_units, "
                f"retired FROM {table} ORDER BY seq"
            ).fetchall()
            if pinned is None or not rows:
                return 0
            n = int(pinned[0])
            ledgers = [BudgetLedger() for _ in range(n)]
            for _seq, count, partition, k, *blobs in rows:
                users, spent, retired = PackedBudgets(int(k), *map(bytes, blobs)).unpack(self.where)
                ids = np.array(users, dtype=object)
                spent_units, flags = np.array(spent, np.int64), np.array(retired, bool)
                where = (
                    np.full(len(ids), int(partition)) if int(count) == n else partitions_of(ids, n)
                )
                for p in np.unique(where).tolist():
                    mine = where == p
                    ledgers[p].merge_monotone(ids[mine], spent_units[mine], flags[mine])
            released = self._meta("released_through") or ""
            cur.execute(f"ALTER TABLE {table} DISABLE TRIGGER never_erased")
            cur.execute(f"DELETE FROM {table} WHERE seq <= %s", (int(rows[-1][0]),))
            cur.execute(f"ALTER TABLE {table} ENABLE TRIGGER never_erased")
            for p, ledger in enumerate(ledgers):
                if len(ledger):
                    entries = list(ledger.items())
                    packed = PackedBudgets.of(
                        np.array([u for u, _, _ in entries], dtype=object),
                        np.array([x for _, x, _ in entries], np.int64),
                        np.array([r for _, _, r in entries], bool),
                    )
                    cur.execute(
                        f"INSERT INTO {table}(day, partitions, partition, n_users, id_lengths, "
                        "ids, spent_units, retired) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                        (released, n, p, *packed.values()),
                    )
            return len(rows)

    def spent_units(self, user_id: str) -> tuple[int, bool] | None:
        """One user's budget: the monotone merge of every record that lists them."""
        found: tuple[int, bool] | None = None
        rows = self._read(
            "SELECT n_users, id_lengths, ids, spent_units, retired "
            "FROM {s}.cluster_budget_records ORDER BY seq"
        )
        for k, *blobs in rows:
            packed = PackedBudgets(int(k), *(bytes(b) for b in blobs))
            i = packed.find(user_id, self.where)
            if i is not None:
                spent = int(np.frombuffer(packed.spent_units, "<i8")[i])
                retired = bool(packed.retired[i])
                s0, r0 = found or (0, False)
                found = (max(s0, spent), r0 or retired)
        return found

    # -- a worker's day close --------------------------------------------------------------
    def commit_partitions(
        self,
        day: str,
        worker: str,
        epochs: dict[int, int],
        parts: dict[int, DayPartial],
        positions: dict[int, Position],
        partitions: int,
    ) -> None:
        """One transaction: epochs checked, barrier checked, each partition's budget record
        (its users whose budget changed, under the day's pinned count ``partitions``), partials,
        positions."""
        s = self.schema

        def body(cur: Any) -> Any:
            held = dict(
                cur.execute(
                    f"SELECT partition, epoch FROM {s}.cluster_partitions "
                    "WHERE partition = ANY(%s) ORDER BY partition FOR UPDATE",
                    (sorted(parts),),
                ).fetchall()
            )
            stale = sorted(p for p in parts if held.get(p) != epochs.get(p))
            if stale:
                raise PartitionFencedError(
                    f"partition(s) {', '.join(map(str, stale))} of {self.where} were taken over "
                    f"by another worker (epoch moved on); this worker's commit of {day} is refused"
                )
            released = cur.execute(
                f"SELECT value FROM {s}.meta WHERE key = 'released_through'"
            ).fetchone()[0]
            first = cur.execute(f"SELECT value FROM {s}.meta WHERE key = 'first_day'").fetchone()
            ok = (released or None) == _prev_day(day) or (
                not released and first is not None and day == first[0]
            )
            frozen = cur.execute(
                f"SELECT frozen FROM {s}.cluster_days WHERE day = %s", (day,)
            ).fetchone()
            if not ok or not frozen or not frozen[0]:
                raise StoreError(
                    f"day barrier: {day} cannot commit in {self.where} (the day before is not "
                    "released, or its queries are not frozen)"
                )
            for p, part in parts.items():
                if len(part.changed_users):
                    packed = PackedBudgets.of(part.changed_users, part.spent_units, part.retired)
                    cur.execute(  # %b: the packed columns sent as they are, not hex text
                        f"SELECT {s}.sf_append_budgets(%s, %s, %s, %s, %b, %b, %b, %b)",
                        (day, partitions, p, *packed.values()),
                    )
            cur.executemany(
                f"INSERT INTO {s}.cluster_partials(day, query_id, partition, sums) "
                "VALUES (%s, %s, %s, %s)",
                [
                    (day, q, p, [int(x) for x in sums])
                    for p, part in parts.items()
                    for q, sums in part.sums.items()
                ],
            )
            cur.executemany(
                f"INSERT INTO {s}.cluster_commits(day, partition, epoch, worker, counters) "
                "VALUES (%s, %s, %s, %s, %s)",
                [
                    (day, p, epochs[p], worker, json.dumps(part.counters))
                    for p, part in parts.items()
                ],
            )
            cur.executemany(
                f"UPDATE {s}.cluster_partitions SET resume_offset = %s, high_offset = %s, "
                "committed_day = %s WHERE partition = %s",
                [(positions[p].resume_offset, positions[p].high_offset, day, p) for p in parts],
            )

        self._serial(body)

    # -- the releaser ------------------------------------------------------------------------
    def hold_releaser_lease(
        self,
        worker: str,
        token: int | None,
        lease_s: float,
        holder_left: Callable[[str], bool] | None = None,
    ) -> int | None:
        """Renew this worker's releaser lease (``token``: the one it holds) or take it over if
        it has expired (a new token); the token held, or None when another worker holds a live
        lease. Expiry is the server's clock (``clock_timestamp()``): the workers' clocks never
        decide who releases.

        With ``holder_left``, a live lease of another worker is taken over at once (a new
        token) when ``holder_left(holder)`` says its holder has left the workers' consumer group
        (``io.kafka_group``): asked outside any transaction, then taken only if the lease is
        still that holder's token. Taking a lease early is as safe as after its expiry: the
        previous holder's release transaction is refused for its token (:meth:`release_day`)
        and its producer is fenced by the new holder's (docs/design.md §7.3).

        A worker that holds no lease never waits for the lease row: while the releaser's own
        transaction has it locked (or a stopped releaser's, until the server ends its session),
        the answer is None at once and the worker goes on with its partitions."""
        s = self.schema

        def body(cur: Any) -> tuple[int | None, tuple[str, int] | None]:
            wait = "" if token is not None else " SKIP LOCKED"
            row = cur.execute(
                f"SELECT holder, token, expires_at < clock_timestamp() FROM {s}.cluster_releaser "
                f"WHERE id = 1 FOR UPDATE{wait}"
            ).fetchone()
            until = "clock_timestamp() + make_interval(secs => %s)"
            if row is None:
                if cur.execute(f"SELECT 1 FROM {s}.cluster_releaser WHERE id = 1").fetchone():
                    return None, None  # locked by another worker's transaction
                cur.execute(
                    f"INSERT INTO {s}.cluster_releaser VALUES (1, %s, 1, {until})",
                    (worker, lease_s),
                )
                return 1, None
            holder, held, expired = str(row[0]), int(row[1]), bool(row[2])
            if holder == worker and held == token and not expired:
                cur.execute(
                    f"UPDATE {s}.cluster_releaser SET expires_at = {until} WHERE id = 1",
                    (lease_s,),
                )
                return held, None
            if not expired:
                return None, (holder, held)
            cur.execute(
                f"UPDATE {s}.cluster_releaser SET holder = %s, token = %s, expires_at = {until} "
                "WHERE id = 1",
                (worker, held + 1, lease_s),
            )
            return held + 1, None

        token_held, live = self._serial(body)
        if token_held is not None or live is None or holder_left is None:
            return token_held
        if live[0] == worker or not holder_left(live[0]):
            return None
        return self._take_releaser_lease(worker, live, lease_s)

    def _take_releaser_lease(
        self, worker: str, seen: tuple[str, int], lease_s: float
    ) -> int | None:
        """The lease taken over from ``seen`` (holder, token) if it is still that: the next
        token, else None (it moved on, or its row is locked: tried again at the next turn)."""
        s = self.schema

        def body(cur: Any) -> int | None:
            row = cur.execute(
                f"SELECT holder, token FROM {s}.cluster_releaser WHERE id = 1 "
                "FOR UPDATE SKIP LOCKED"
            ).fetchone()
            if row is None or (str(row[0]), int(row[1])) != seen:
                return None
            cur.execute(
                f"UPDATE {s}.cluster_releaser SET holder = %s, token = %s, "
                "expires_at = clock_timestamp() + make_interval(secs => %s) WHERE id = 1",
                (worker, seen[1] + 1, lease_s),
            )
            return seen[1] + 1

        token_held: int | None = self._serial(body)
        return token_held

    def hold_off_releasers(self, worker: str, token: int, wait_s: float) -> None:
        """The releaser ``worker`` (lease ``token``) cannot publish (its releases topic is
        gone): its lease, renewed for ``wait_s`` and given up by the worker, keeps every worker
        (itself too) from taking the releaser role for that long — one try of the topic per
        ``wait_s`` for the whole cluster, not one per worker and turn. Nothing if the lease
        moved on."""
        s = self.schema

        def body(cur: Any) -> None:
            cur.execute(
                f"UPDATE {s}.cluster_releaser SET "
                "expires_at = clock_timestamp() + make_interval(secs => %s) "
                "WHERE id = 1 AND holder = %s AND token = %s",
                (wait_s, worker, token),
            )

        self._serial(body)

    def release_day(
        self, day: str, make_releases: MakeReleases, lease: tuple[str, int] | None = None
    ) -> bool:
        """Release ``day`` if every pinned partition committed it and it is not released yet:
        ``make_releases(sums, counters, coverage_state)`` (exact sums and counters over the
        partitions, the stored coverage tracker; noise drawn by the caller) gives ``(query_id,
        payload)`` in publication order and the coverage tracker after the day, both stored in
        the same transaction that marks the day released. False when the day is not ready. With
        ``lease`` (worker, token), the transaction first checks that the releaser lease is
        still that one and live, else raises :class:`ReleaserFencedError` (nothing written)."""
        s = self.schema

        def body(cur: Any) -> Any:
            if lease is not None:
                row = cur.execute(
                    f"SELECT holder, token, expires_at > clock_timestamp() "
                    f"FROM {s}.cluster_releaser WHERE id = 1 FOR UPDATE"
                ).fetchone()
                if row is None or (str(row[0]), int(row[1])) != lease or not row[2]:
                    raise ReleaserFencedError(
                        f"the releaser lease of {self.where} moved to another worker or expired; "
                        "this worker releases nothing"
                    )
            row = cur.execute(
                f"SELECT partitions, frozen, released FROM {s}.cluster_days WHERE day = %s "
                "FOR UPDATE",
                (day,),
            ).fetchone()
            if row is None or not row[1] or row[2]:
                return False
            committed = cur.execute(
                f"SELECT count(*) FROM {s}.cluster_commits WHERE day = %s AND partition < %s",
                (day, int(row[0])),
            ).fetchone()[0]
            if int(committed) < int(row[0]):
                return False
            sums: dict[str, np.ndarray] = {
                str(query_id): np.array([int(x) for x in totals], dtype=np.int64)
                for query_id, totals in cur.execute(
                    f"SELECT query_id, sums FROM {s}.sf_day_sums(%s)", (day,)
                )
            }
            counters: dict[str, int] = {}
            for (blob,) in cur.execute(
                f"SELECT counters FROM {s}.cluster_commits WHERE day = %s", (day,)
            ):
                for k, v in (blob if isinstance(blob, dict) else json.loads(blob)).items():
                    counters[k] = counters.get(k, 0) + int(v)
            stored = self._meta_for_update(cur, "coverage_state")
            releases, coverage = make_releases(
                sums, counters, None if stored is None else stored.encode()
            )
            if coverage is not None:
                self._set_meta(cur, "coverage_state", coverage.decode())
            if releases:
                cur.executemany(
                    f"INSERT INTO {s}.releases(day, query_id, ord, payload) VALUES(%s, %s, %s, %s)",
                    [(day, q, i, bytes(p)) for i, (q, p) in enumerate(releases)],
                )
            cur.execute(
                f"UPDATE {s}.cluster_days SET released = TRUE, releaser = %s WHERE day = %s",
                (lease[0] if lease is not None else None, day),
            )
            self._set_meta(cur, "released_through", day)
            self._set_meta(cur, "last_closed_day", day)
            return True

        return bool(self._serial(body))
