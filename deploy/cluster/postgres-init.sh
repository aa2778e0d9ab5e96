#!/usr/bin/env bash
# First start of the PostgreSQL container (docker-entrypoint-initdb.d): create the role the
# workers run as (owning nothing) and the administrator's schema for the state, with
# deploy/cluster/worker-role.sql. The administrator is the image's POSTGRES_USER; the worker's
# password comes from STREAMFILTER_PG_PASSWORD. The state's tables and the worker's rights come
# next, from `python -m streamfilter.runtime.store.setup` run as the administrator (the
# compose file's ledger-setup service).
# Also usable by hand against any server (libpq's PGHOST/PGPORT/PGPASSWORD, and
# STREAMFILTER_ROLE_SQL pointing at worker-role.sql); tests/runtime/store/test_postgres_role.py does.
set -euo pipefail
: "${STREAMFILTER_PG_PASSWORD:?set the password of the workers role}"
psql -X -q -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" \
    --dbname "${POSTGRES_DB:-streamfilter}" \
    -v role="${STREAMFILTER_PG_ROLE:-streamfilter_worker}" \
    -v schema="${STREAMFILTER_PG_SCHEMA:-streamfilter}" \
    -v password="$STREAMFILTER_PG_PASSWORD" \
    -f "${STREAMFILTER_ROLE_SQL:-/docker-entrypoint-initdb.d/worker-role.sql.in}"
