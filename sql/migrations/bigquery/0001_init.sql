-- idem schema for BigQuery.
--
-- `{project}` and `{dataset}` are replaced by the store URL's project and dataset ids
-- (validated first: identifiers cannot be bound as query parameters). Nothing else is
-- substituted. The dataset itself is created through the REST API (datasets.insert), so
-- its location comes from the URL's `location` parameter.
--
-- Design (see docs/bigquery.md):
-- * Append-only writes with DML INSERT (not streaming insertAll), so cleanup and purge can
--   DELETE at once; a "latest row per key" read replaces updates.
-- * Keys and runs are partitioned by the day of their own timestamp, because every hot
--   read bounds that timestamp: a guard lookup asks for keys processed since the start of
--   its window, so `processed_at >= @since` prunes every older partition; cleanup deletes
--   whole old partitions; partition expiration means "keep N days". The scope date is kept
--   as a column (the seed's game_date) for reports.
-- * Clustering puts the lookup columns first, so the blocks read inside a partition are
--   the ones holding the wanted keys.
-- * No PRIMARY KEY / NOT ENFORCED constraints: BigQuery would not enforce them anyway.

-- One row per successful run and guard: written only on success.
CREATE TABLE IF NOT EXISTS `{project}.{dataset}.processing_keys` (
    processing_key STRING    NOT NULL,
    kind           STRING    NOT NULL,   -- 'scope' | 'content'
    processor_name STRING    NOT NULL,
    scope          STRING    NOT NULL,
    scope_date     DATE      NOT NULL,
    processed_at   TIMESTAMP NOT NULL,
    entity_count   INT64,
    metadata       JSON,
    run_id         STRING    NOT NULL
)
PARTITION BY DATE(processed_at)
CLUSTER BY processing_key, processor_name
OPTIONS (description = "idem processing keys: one row per successful run and guard (schema 1)");

-- The run ledger: one row per invocation.
CREATE TABLE IF NOT EXISTS `{project}.{dataset}.processing_runs` (
    run_id            STRING    NOT NULL,
    processor_name    STRING    NOT NULL,
    scope             STRING    NOT NULL,
    scope_date        DATE      NOT NULL,
    trigger_source    STRING    NOT NULL,
    mode              STRING    NOT NULL,
    started_at        TIMESTAMP NOT NULL,
    finished_at       TIMESTAMP NOT NULL,
    duration_ms       INT64     NOT NULL,
    status            STRING    NOT NULL,   -- completed | failed | skipped
    skip_reason       STRING,
    would_skip_reason STRING,
    previous_run_id   STRING,
    records_processed INT64,
    processing_key    STRING,
    error             STRING,
    output            JSON
)
PARTITION BY DATE(started_at)
CLUSTER BY processor_name, scope
OPTIONS (description = "idem run ledger: one row per invocation (schema 1)");

-- Leases: one row per (processor, scope), kept after release so the fencing token only
-- grows. Small and updated in place, so neither partitioned nor append-only. A claim is
-- always an UPDATE of an existing row (see docs/bigquery.md, "Concurrency").
CREATE TABLE IF NOT EXISTS `{project}.{dataset}.processing_leases` (
    processor_name STRING    NOT NULL,
    scope          STRING    NOT NULL,
    holder_run_id  STRING,                -- NULL when free
    token          INT64     NOT NULL,    -- 0 until first claimed
    acquired_at    TIMESTAMP NOT NULL,
    expires_at     TIMESTAMP NOT NULL
)
CLUSTER BY processor_name, scope
OPTIONS (description = "idem leases: one row per processor and scope (schema 1)");

-- Event keys seen by the event gate, per namespace. batch_id tells a marking call which
-- rows it inserted itself.
CREATE TABLE IF NOT EXISTS `{project}.{dataset}.event_keys` (
    namespace  STRING    NOT NULL,
    event_key  STRING    NOT NULL,
    first_seen TIMESTAMP NOT NULL,
    batch_id   STRING    NOT NULL
)
PARTITION BY DATE(first_seen)
CLUSTER BY namespace, event_key
OPTIONS (description = "idem event keys seen by the event gate (schema 1)");
