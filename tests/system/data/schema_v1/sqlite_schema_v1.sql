-- The SQLite state schema before versions were recorded (version 1): streamfilter/runtime/store/schema.py
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
