-- The PostgreSQL state and cluster-ledger schema before versions were recorded (version 1),
-- in schema {s}: streamfilter/runtime/store/postgres.py and cluster.py
CREATE SCHEMA {s};
CREATE TABLE IF NOT EXISTS {s}.meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.budgets (
    user_id TEXT PRIMARY KEY, spent_units BIGINT NOT NULL CHECK (spent_units >= 0),
    retired BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.queries (
    seq BIGSERIAL PRIMARY KEY, query_id TEXT UNIQUE NOT NULL, payload BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.days (day TEXT PRIMARY KEY, seq BIGINT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.releases (
    day TEXT NOT NULL, query_id TEXT NOT NULL, ord INTEGER NOT NULL, payload BYTEA NOT NULL,
    sent BOOLEAN NOT NULL DEFAULT FALSE, PRIMARY KEY (day, query_id)
);
CREATE TABLE IF NOT EXISTS {s}.positions (
    partition TEXT PRIMARY KEY, resume_offset BIGINT NOT NULL, high_offset BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.telemetry_ledger (
    seq BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, rho DOUBLE PRECISION NOT NULL,
    record BYTEA NOT NULL
);
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
