-- idem schema for Postgres. Times are TIMESTAMPTZ (microsecond precision, like every idem
-- store), partition dates are DATE, JSON is JSONB. Applied once per database by the store
-- (see src/store/postgres.rs), under an advisory lock, and recorded in
-- idem_schema_migrations.

-- One row per successful run and guard: written only on success.
CREATE TABLE IF NOT EXISTS processing_keys (
    id              BIGSERIAL   PRIMARY KEY,
    processing_key  TEXT        NOT NULL,
    kind            TEXT        NOT NULL,       -- 'scope' | 'content'
    processor_name  TEXT        NOT NULL,
    scope           TEXT        NOT NULL,
    scope_date      DATE        NOT NULL,
    processed_at    TIMESTAMPTZ NOT NULL,
    entity_count    BIGINT,
    metadata        JSONB,
    run_id          TEXT        NOT NULL
);
CREATE INDEX IF NOT EXISTS processing_keys_lookup
    ON processing_keys (processing_key, kind, processed_at);
CREATE INDEX IF NOT EXISTS processing_keys_processor
    ON processing_keys (processor_name, scope);
CREATE INDEX IF NOT EXISTS processing_keys_processed_at
    ON processing_keys (processed_at);

-- The run ledger: one row per invocation.
CREATE TABLE IF NOT EXISTS processing_runs (
    run_id            TEXT        PRIMARY KEY,
    processor_name    TEXT        NOT NULL,
    scope             TEXT        NOT NULL,
    scope_date        DATE        NOT NULL,
    trigger_source    TEXT        NOT NULL,
    mode              TEXT        NOT NULL,
    started_at        TIMESTAMPTZ NOT NULL,
    finished_at       TIMESTAMPTZ NOT NULL,
    duration_ms       BIGINT      NOT NULL,
    status            TEXT        NOT NULL,     -- completed | failed | skipped
    skip_reason       TEXT,
    would_skip_reason TEXT,
    previous_run_id   TEXT,
    records_processed BIGINT,
    processing_key    TEXT,
    error             TEXT,
    output            JSONB
);
CREATE INDEX IF NOT EXISTS processing_runs_processor
    ON processing_runs (processor_name, scope, started_at);
CREATE INDEX IF NOT EXISTS processing_runs_started_at
    ON processing_runs (started_at);

-- Leases: one row per (processor, scope), kept after release so the fencing token only
-- ever grows.
CREATE TABLE IF NOT EXISTS processing_leases (
    processor_name TEXT        NOT NULL,
    scope          TEXT        NOT NULL,
    holder_run_id  TEXT,                        -- NULL when released
    token          BIGINT      NOT NULL,
    acquired_at    TIMESTAMPTZ NOT NULL,
    expires_at     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (processor_name, scope)
);

-- Event keys seen by the event gate, per namespace.
CREATE TABLE IF NOT EXISTS event_keys (
    namespace  TEXT        NOT NULL,
    event_key  TEXT        NOT NULL,
    first_seen TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (namespace, event_key)
);
CREATE INDEX IF NOT EXISTS event_keys_first_seen ON event_keys (first_seen);
