-- idem schema for SQLite. Timestamps are INTEGER microseconds since the Unix epoch (UTC),
-- dates are TEXT 'YYYY-MM-DD'.

-- One row per successful run and guard: written only on success.
CREATE TABLE IF NOT EXISTS processing_keys (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    processing_key  TEXT    NOT NULL,
    kind            TEXT    NOT NULL,           -- 'scope' | 'content'
    processor_name  TEXT    NOT NULL,
    scope           TEXT    NOT NULL,
    scope_date      TEXT    NOT NULL,
    processed_at    INTEGER NOT NULL,
    entity_count    INTEGER,
    metadata        TEXT,                       -- JSON
    run_id          TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS processing_keys_lookup
    ON processing_keys (processing_key, kind, processed_at);
CREATE INDEX IF NOT EXISTS processing_keys_processor
    ON processing_keys (processor_name, scope);
CREATE INDEX IF NOT EXISTS processing_keys_processed_at
    ON processing_keys (processed_at);

-- The run ledger: one row per invocation.
CREATE TABLE IF NOT EXISTS processing_runs (
    run_id            TEXT    PRIMARY KEY,
    processor_name    TEXT    NOT NULL,
    scope             TEXT    NOT NULL,
    scope_date        TEXT    NOT NULL,
    trigger_source    TEXT    NOT NULL,
    mode              TEXT    NOT NULL,
    started_at        INTEGER NOT NULL,
    finished_at       INTEGER NOT NULL,
    duration_ms       INTEGER NOT NULL,
    status            TEXT    NOT NULL,         -- completed | failed | skipped
    skip_reason       TEXT,
    would_skip_reason TEXT,
    previous_run_id   TEXT,
    records_processed INTEGER,
    processing_key    TEXT,
    error             TEXT,
    output            TEXT                      -- JSON
);
CREATE INDEX IF NOT EXISTS processing_runs_processor
    ON processing_runs (processor_name, scope, started_at);
CREATE INDEX IF NOT EXISTS processing_runs_started_at
    ON processing_runs (started_at);

-- Leases: one row per (processor, scope), kept after release so the fencing token only
-- ever grows.
CREATE TABLE IF NOT EXISTS processing_leases (
    processor_name TEXT    NOT NULL,
    scope          TEXT    NOT NULL,
    holder_run_id  TEXT,                        -- NULL when released
    token          INTEGER NOT NULL,
    acquired_at    INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    PRIMARY KEY (processor_name, scope)
);

-- Event keys seen by the event gate, per namespace.
CREATE TABLE IF NOT EXISTS event_keys (
    namespace  TEXT    NOT NULL,
    event_key  TEXT    NOT NULL,
    first_seen INTEGER NOT NULL,
    PRIMARY KEY (namespace, event_key)
);
CREATE INDEX IF NOT EXISTS event_keys_first_seen ON event_keys (first_seen);
