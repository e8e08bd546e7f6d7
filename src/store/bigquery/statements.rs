//! Every statement the store sends, and their rendering for one dataset (tables
//! qualified, columns listed) once per store.

use crate::store::rows::{KEY_COLUMNS, LEASE_COLUMNS, RUN_COLUMNS};

use crate::backend::bigquery::BigQueryUrl;

use super::schema::LEASE_TABLES;

/// The per-run check: every guard lookup of a run in one statement. `@lookups` is an
/// `ARRAY<STRUCT<pos INT64, key STRING, kind STRING, since TIMESTAMP>>`; `@keys` the
/// distinct keys; `@oldest_since` the earliest `since`. `processed_at` is the partition
/// column (`PARTITION BY DATE(processed_at)`), so the `k.processed_at >= @oldest_since`
/// filter prunes every partition older than the longest guard window; `processing_key`
/// is the first clustering column, so `IN UNNEST(@keys)` limits the blocks read.
/// `{keys}` is the fully qualified `processing_keys` table.
pub const FIND_KEYS_SQL: &str = "\
SELECT l.pos AS pos, k.processing_key, k.kind, k.processor_name, k.scope, k.scope_date, \
k.processed_at, k.entity_count, k.metadata, k.run_id, k.keep_until
FROM {keys} AS k
JOIN UNNEST(@lookups) AS l
  ON k.processing_key = l.key AND k.kind = l.kind AND k.processed_at >= l.since
WHERE k.processed_at >= @oldest_since
  AND k.processing_key IN UNNEST(@keys)
QUALIFY ROW_NUMBER() OVER (PARTITION BY l.pos ORDER BY k.processed_at DESC, k.run_id DESC) = 1";

const LEASE_READ_SQL: &str = "\
SELECT {lease_columns} FROM {leases}
WHERE processor_name = @processor AND scope = @scope
ORDER BY token DESC LIMIT 1";

const LEASE_RENEW_SQL: &str = "\
UPDATE {leases} SET expires_at = @expires_at, renewed_at = @now
WHERE processor_name = @processor AND scope = @scope AND token = @token AND holder_run_id = @run_id";

const LEASE_RELEASE_SQL: &str = "\
UPDATE {leases} SET holder_run_id = NULL, expires_at = @now
WHERE processor_name = @processor AND scope = @scope AND token = @token AND holder_run_id = @run_id";

/// A run id is recorded once: the insert adds nothing when the id is already there.
/// `@run_id_since` ([`super::scripts::run_id_since`]) bounds the lookup to the partitions
/// a row carrying the id can be in (the epoch for an id idem did not make).
/// `wide_number_mode => 'round'`: a JSON number beyond FLOAT64 precision is rounded rather
/// than failing the insert (BigQuery's default is to reject it).
const RUN_INSERT_SQL: &str = "\
INSERT INTO {runs} ({run_columns})
SELECT @run_id, @processor, @scope, @scope_date, @trigger_source, @mode, @started_at, \
@finished_at, @duration_ms, @status, @skip_reason, @would_skip_reason, @previous_run_id, \
@records_processed, @processing_key, @error, PARSE_JSON(@output, wide_number_mode => 'round')
FROM UNNEST([1])
WHERE NOT EXISTS (SELECT 1 FROM {runs} WHERE run_id = @run_id AND started_at >= @run_id_since)";

/// Ledger rows; `started_at` is the partition column, so `@since` prunes.
const RUNS_SQL: &str = "\
SELECT {run_columns} FROM {runs}
WHERE started_at >= @since
  AND (@processor IS NULL OR processor_name = @processor)
  AND (@scope IS NULL OR scope = @scope)
  AND (@status IS NULL OR status = @status)
  AND (@trigger IS NULL OR trigger_source = @trigger)
  AND (@except_skip IS NULL OR skip_reason IS NULL OR skip_reason <> @except_skip)
  AND (@run_id IS NULL OR run_id = @run_id)
ORDER BY started_at DESC, run_id DESC
LIMIT @limit";

const PURGE_SQL: &str = "\
DELETE FROM {keys} WHERE processor_name = @processor AND (@scope IS NULL OR scope = @scope)";

// The rows past retention, per table: @before the table's cut-off, @processor the only
// processor (NULL = all; event keys are then kept), @keys_before the keys' cut-off (a
// ledger row a kept key points at stays), @now the cleanup's now (a key kept until then or
// later stays; NULL: written before keys carried their retention). Deleted with `DELETE
// FROM t WHERE ...`, counted with `SELECT COUNT(*) AS n FROM t WHERE ...`.
const CLEANUP_KEYS_SQL: &str = "{keys} WHERE processed_at < @before \
AND (@processor IS NULL OR processor_name = @processor) \
AND (keep_until IS NULL OR keep_until < @now)";

const CLEANUP_RUNS_SQL: &str = "{runs} WHERE started_at < @before \
AND (@processor IS NULL OR processor_name = @processor) \
AND run_id NOT IN (SELECT run_id FROM {keys} WHERE processed_at >= @keys_before \
OR keep_until >= @now)";

const CLEANUP_LEASES_SQL: &str = "{leases} WHERE expires_at < @before \
AND (@processor IS NULL OR processor_name = @processor)";

const CLEANUP_EVENTS_SQL: &str =
    "{events} WHERE expires_at IS NOT NULL AND expires_at < @before AND @processor IS NULL";

/// Checks and marks event keys, step 1: marks the first occurrence of each key (@marks)
/// that is absent or expired at @now, tagged with this call's batch id. (Two requests, not
/// one script: the emulator binds no parameters in scripts.)
const EVENTS_CHECK_SQL: &str = "\
MERGE {events} AS t
USING (SELECT m.event_key, m.fingerprint, m.decision, m.expires_at FROM UNNEST(@marks) AS m) AS s
ON t.namespace = @namespace AND t.event_key = s.event_key
WHEN MATCHED AND t.expires_at IS NOT NULL AND t.expires_at <= @now THEN
  UPDATE SET first_seen = @now, fingerprint = s.fingerprint, decision = s.decision,
    expires_at = s.expires_at, batch_id = @batch_id
WHEN NOT MATCHED THEN
  INSERT (namespace, event_key, first_seen, batch_id, fingerprint, decision, expires_at)
  VALUES (@namespace, s.event_key, @now, @batch_id, s.fingerprint, s.decision, s.expires_at)";

/// Step 2: the current unexpired row of every key: a row carrying this batch id is new.
const EVENTS_CHECKED_SQL: &str = "\
SELECT event_key, fingerprint, decision, first_seen, batch_id FROM {events}
WHERE namespace = @namespace AND event_key IN (SELECT m.event_key FROM UNNEST(@marks) AS m)
  AND (expires_at IS NULL OR expires_at > @now OR batch_id = @batch_id)
QUALIFY ROW_NUMBER() OVER (PARTITION BY event_key ORDER BY first_seen, batch_id) = 1";

/// The unexpired event keys among @keys.
const EVENTS_READ_SQL: &str = "\
SELECT DISTINCT event_key FROM {events}
WHERE namespace = @namespace AND event_key IN UNNEST(@keys)
  AND (expires_at IS NULL OR expires_at > @now)";

/// Stores the decision of a marked key.
const EVENTS_DECISION_SQL: &str = "\
UPDATE {events} SET decision = @decision WHERE namespace = @namespace AND event_key = @key";

#[derive(Debug, Clone)]
pub(super) struct Statements {
    pub(super) find_keys: String,
    /// The lease statements of each lease table, by shard.
    pub(super) leases: Vec<LeaseStatements>,
    pub(super) run_insert: String,
    pub(super) runs: String,
    pub(super) purge: String,
    pub(super) cleanup: [String; 4],
    /// The lease cleanup of each lease table (the shards, then the schema-1 table).
    pub(super) cleanup_leases: Vec<String>,
    pub(super) events_check: String,
    pub(super) events_checked: String,
    pub(super) events_read: String,
    pub(super) events_decision: String,
}

/// The lease statements on one lease table.
#[derive(Debug, Clone)]
pub(super) struct LeaseStatements {
    pub(super) read: String,
    /// The merged read: the lease row and the guards' keys in one query.
    pub(super) peek: String,
    pub(super) renew: String,
    pub(super) release: String,
}

impl Statements {
    pub(super) fn new(url: &BigQueryUrl) -> Self {
        let render = |sql: &str| {
            sql.replace("{run_columns}", RUN_COLUMNS)
                .replace("{key_columns}", KEY_COLUMNS)
                .replace("{lease_columns}", LEASE_COLUMNS)
                .replace("{keys}", &url.table("processing_keys"))
                .replace("{runs}", &url.table("processing_runs"))
                .replace("{events}", &url.table("event_keys"))
        };
        let leases = |table: &str| {
            let render = |sql: &str| render(sql).replace("{leases}", &url.table(table));
            LeaseStatements {
                read: render(LEASE_READ_SQL),
                peek: super::scripts::peek_sql(&url.table("processing_keys"), &url.table(table)),
                renew: render(LEASE_RENEW_SQL),
                release: render(LEASE_RELEASE_SQL),
            }
        };
        Statements {
            find_keys: render(FIND_KEYS_SQL),
            leases: LEASE_TABLES.iter().map(|t| leases(t)).collect(),
            run_insert: render(RUN_INSERT_SQL),
            runs: render(RUNS_SQL),
            purge: render(PURGE_SQL),
            cleanup: [
                render(CLEANUP_KEYS_SQL),
                render(CLEANUP_RUNS_SQL),
                render(CLEANUP_LEASES_SQL).replace("{leases}", &url.table("processing_leases")),
                render(CLEANUP_EVENTS_SQL),
            ],
            cleanup_leases: LEASE_TABLES
                .iter()
                .chain(["processing_leases"].iter())
                .map(|t| render(CLEANUP_LEASES_SQL).replace("{leases}", &url.table(t)))
                .collect(),
            events_check: render(EVENTS_CHECK_SQL),
            events_checked: render(EVENTS_CHECKED_SQL),
            events_read: render(EVENTS_READ_SQL),
            events_decision: render(EVENTS_DECISION_SQL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::schema::render_migration;
    use super::*;
    use crate::store::migrations;

    #[test]
    fn statements_are_qualified_and_parameterised() {
        let url = BigQueryUrl::parse("bigquery://proj-1/ds_1").unwrap();
        let sql = Statements::new(&url);
        assert!(sql
            .find_keys
            .contains("FROM `proj-1.ds_1.processing_keys` AS k"));
        assert!(sql
            .find_keys
            .contains("WHERE k.processed_at >= @oldest_since"));
        for s in [
            &sql.find_keys,
            &sql.run_insert,
            &sql.runs,
            &sql.leases[15].peek,
        ] {
            assert!(!s.contains('{'), "unrendered placeholder in {s}");
        }
        let ddl = render_migration(migrations::BIGQUERY[0].sql, &url);
        assert!(ddl.contains("`proj-1.ds_1.processing_keys`"));
        assert!(ddl.contains(
            "PARTITION BY DATE(processed_at)\nCLUSTER BY processing_key, processor_name"
        ));
        let statements = crate::backend::prepare(&ddl, crate::backend::Dialect::BigQuery).unwrap();
        assert_eq!(statements.len(), 4, "0001 creates the four schema-1 tables");
        assert!(statements.iter().all(|s| s.params.is_empty()));
    }
}
