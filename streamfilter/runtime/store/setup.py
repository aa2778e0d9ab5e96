"""The administrator's command that creates or migrates a PostgreSQL state and lets the worker
role use it (docs/cluster.md, "Database roles").

    STREAMFILTER_ADMIN_URL=postgresql://admin@db/streamfilter PGPASSWORD=… \\
        python -m streamfilter.runtime.store.setup --schema streamfilter \\
        --worker-role streamfilter_worker [--single-process]
    STREAMFILTER_ADMIN_URL=… python -m streamfilter.runtime.store.setup --schema streamfilter \
        --fold-budgets

Connected as the administrator (who owns the schema: deploy/cluster/worker-role.sql), it opens
the state once — creating it at this code's schema version, or migrating an older one in one
transaction (versions.py) — and grants the worker role only what ``postgres.grant_worker``
lists. Workers connect as the worker role, which owns nothing and runs no DDL. Prints one line;
exit 4 (with one line) when the state cannot be created, migrated or granted. With
``--fold-budgets`` it folds a cluster ledger's budget records instead (``ClusterLedger.
fold_budgets``; the worker role may not), which workers may run alongside.
"""

from __future__ import annotations

import argparse
import os
import sys

from streamfilter.errors import StoreError
from streamfilter.runtime.store.cluster import ClusterLedger
from streamfilter.runtime.store.postgres import PostgresStateStore, _first_line, grant_worker
from streamfilter.runtime.store.versions import SCHEMA_VERSION_KEY

__all__ = ["main", "set_up"]


def set_up(url: str, *, schema: str, worker_role: str, single_process: bool = False) -> str:
    """Create or migrate the state in ``schema`` and grant ``worker_role`` its rights; the
    schema version it is at."""
    kind = PostgresStateStore if single_process else ClusterLedger
    store = kind(url, schema=schema)
    try:
        try:
            with store._db.transaction(), store._db.cursor() as cur:
                grant_worker(cur, schema, worker_role)
        except store._psycopg.Error as exc:
            raise StoreError(
                f"cannot grant {worker_role} its rights on {store.where}: {_first_line(exc)}"
            ) from None
        return str(store._meta(SCHEMA_VERSION_KEY))
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamfilter.runtime.store.setup")
    parser.add_argument("--schema", default="streamfilter")
    parser.add_argument("--worker-role", default="streamfilter_worker")
    parser.add_argument(
        "--single-process", action="store_true", help="a single process's state, not a cluster's"
    )
    parser.add_argument(
        "--fold-budgets",
        action="store_true",
        help="fold a cluster ledger's budget records into one per partition (docs/cluster.md)",
    )
    args = parser.parse_args(argv)
    url = os.environ.get("STREAMFILTER_ADMIN_URL", "")
    if not url:
        print("set STREAMFILTER_ADMIN_URL to the administrator's connection URL", file=sys.stderr)
        return 2
    if args.fold_budgets:
        try:
            ledger = ClusterLedger(url, schema=args.schema)
            try:
                folded = ledger.fold_budgets()
            finally:
                ledger.close()
        except StoreError as exc:
            print(str(exc), file=sys.stderr)
            return int(exc.exit_code)
        print(f"state {args.schema}: {folded} budget records folded into one per partition")
        return 0
    try:
        version = set_up(
            url,
            schema=args.schema,
            worker_role=args.worker_role,
            single_process=args.single_process,
        )
    except StoreError as exc:
        print(str(exc), file=sys.stderr)
        return int(exc.exit_code)
    print(f"state {args.schema} at schema version {version}; {args.worker_role} may use it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
