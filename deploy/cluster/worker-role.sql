-- The database role streamfilter's workers run as: no superuser, no CREATEDB/CREATEROLE, no
-- replication, no BYPASSRLS, and it owns nothing. Run once by an administrator (docs/cluster.md),
-- through postgres-init.sh or:
--
--   psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -v role=streamfilter_worker -v schema=streamfilter \
--        -v password="$WORKER_PASSWORD" -f deploy/cluster/worker-role.sql
--
-- The schema (the state: budgets, partial sums, releases) belongs to the administrator running
-- this script. The administrator then creates or migrates the state in it and grants the role
-- exactly what a worker needs, with streamfilter's own command (again after every upgrade):
--
--   STREAMFILTER_ADMIN_URL="$ADMIN_URL" python -m streamfilter.runtime.store.setup \
--        --schema streamfilter --worker-role streamfilter_worker
--
-- Whoever can read that schema can read unnoised aggregates and every user's spent budget:
-- grant it to no one else.
CREATE ROLE :"role" LOGIN PASSWORD :'password'
    NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT;
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), :'role') \gexec
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
CREATE SCHEMA :"schema";
