"""A cluster ledger's budget records (docs/design.md §7.4): the table, the worker's one
function that appends to it, and the step that turns per-user ``budgets`` rows into records.

A record is one partition's users whose budget changed on a day, in the columns of
``schema.PackedBudgets`` — the one serialisation of users' budgets, the SQLite budget log's."""

from __future__ import annotations

from typing import Any

import numpy as np

from streamfilter.engine.partitions import partitions_of
from streamfilter.runtime.store.schema import PackedBudgets

__all__ = ["APPEND_FUNCTION", "APPEND_SIGNATURE", "RECORDS_TABLE", "budgets_to_records"]

#: a cluster worker's only write of budgets: one packed record of a partition's users whose
#: budget changed on a day, appended, never updated or erased (``postgres._WRITTEN_ONCE``).
#: The table's checks refuse columns that do not fit together; what a record says is only ever
#: merged upwards (docs/design.md §7.4). Stored uncompressed (``EXTERNAL``): compressing a
#: day's ids cost the server ten times the insert itself (218 ms against 22 ms for 20,000 users).
RECORDS_TABLE = """
CREATE TABLE IF NOT EXISTS {s}.cluster_budget_records (
    seq BIGSERIAL PRIMARY KEY, day TEXT NOT NULL, partitions INTEGER NOT NULL,
    partition INTEGER NOT NULL, n_users INTEGER NOT NULL, id_lengths BYTEA NOT NULL,
    ids BYTEA NOT NULL, spent_units BYTEA NOT NULL, retired BYTEA NOT NULL,
    CHECK (partitions > 0 AND partition >= 0 AND partition < partitions AND n_users >= 0
           AND octet_length(id_lengths) = 4 * n_users
           AND octet_length(spent_units) = 8 * n_users AND octet_length(retired) = n_users)
);
CREATE INDEX IF NOT EXISTS cluster_budget_records_of
    ON {s}.cluster_budget_records (partitions, partition);
ALTER TABLE {s}.cluster_budget_records ALTER COLUMN id_lengths SET STORAGE EXTERNAL,
    ALTER COLUMN ids SET STORAGE EXTERNAL, ALTER COLUMN spent_units SET STORAGE EXTERNAL,
    ALTER COLUMN retired SET STORAGE EXTERNAL;
"""
APPEND_FUNCTION = """
CREATE OR REPLACE FUNCTION {s}.sf_append_budgets(
    d TEXT, n INTEGER, p INTEGER, n_users INTEGER, id_lengths BYTEA, ids BYTEA, spent BYTEA,
    retired BYTEA)
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO {s}.cluster_budget_records(
        day, partitions, partition, n_users, id_lengths, ids, spent_units, retired)
    VALUES (d, n, p, n_users, id_lengths, ids, spent, retired)
$$;
REVOKE ALL ON FUNCTION {s}.sf_append_budgets(TEXT, INTEGER, INTEGER, INTEGER, BYTEA, BYTEA,
    BYTEA, BYTEA) FROM PUBLIC;
"""
APPEND_SIGNATURE = "sf_append_budgets(TEXT, INTEGER, INTEGER, INTEGER, BYTEA, BYTEA, BYTEA, BYTEA)"


def budgets_to_records(cur: Any, s: str) -> None:
    """Schema version 2 → 3 (``postgres._version_3_partition_budgets``): each partition's
    users' ``budgets`` rows become the partition's first record."""
    rows = cur.execute(f"SELECT user_id, spent_units, retired FROM {s}.budgets").fetchall()
    pinned = cur.execute(
        f"SELECT partitions FROM {s}.cluster_days ORDER BY day DESC LIMIT 1"
    ).fetchone()
    if not rows:
        return
    # without a pinned day, one record under one partition: a rebuild under any count takes
    # from it the users that map to its partition (ClusterLedger.partition_budgets)
    n = 1 if pinned is None else int(pinned[0])
    day = cur.execute(f"SELECT value FROM {s}.meta WHERE key = 'released_through'").fetchone()
    users = np.array([str(u) for u, _, _ in rows], dtype=object)
    spent = np.array([int(x) for _, x, _ in rows], np.int64)
    retired = np.array([bool(r) for _, _, r in rows], bool)
    where = partitions_of(users, n)
    for p in np.unique(where).tolist():
        sel = where == p
        packed = PackedBudgets.of(users[sel], spent[sel], retired[sel])
        cur.execute(
            f"INSERT INTO {s}.cluster_budget_records(day, partitions, partition, n_users, "
            "id_lengths, ids, spent_units, retired) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            ("" if day is None else str(day[0]), n, p, *packed.values()),
        )
