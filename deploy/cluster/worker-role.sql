-- The database role streamfilter runs as: no superuser, no CREATEDB/CREATEROLE, no replication,
-- no BYPASSRLS. Run once by an administrator (docs/cluster.md), through postgres-init.sh or:
--
--   psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -v role=streamfilter_worker -v schema=streamfilter \
--        -v password="$WORKER_PASSWORD" -f deploy/cluster/worker-role.sql
--
-- The role owns exactly one schema (its state: budgets, partial sums, releases) and may connect
-- to the current database; it gets nothing else. Whoever can read that schema can read
-- unnoised aggregates and every user's spent budget: grant it to no one else.
CREATE ROLE :"role" LOGIN PASSWORD :'password'
    NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT;
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), :'role') \gexec
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
CREATE SCHEMA :"schema" AUTHORIZATION :"role";
