//! Postgres upkeep: purge and the cleanup job's deletes.

use super::*;

#[async_trait]
impl MaintenanceStore for PostgresStore {
    async fn purge(&self, processor: &str, scope: Option<&str>) -> Result<u64> {
        let done = match scope {
            Some(scope) => {
                sqlx::query("DELETE FROM processing_keys WHERE processor_name = $1 AND scope = $2")
                    .bind(processor)
                    .bind(scope)
                    .execute(&mut self.conn().await?)
                    .await
            }
            None => {
                sqlx::query("DELETE FROM processing_keys WHERE processor_name = $1")
                    .bind(processor)
                    .execute(&mut self.conn().await?)
                    .await
            }
        }
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }

    async fn cleanup(&self, policy: &CleanupPolicy) -> Result<CleanupReport> {
        // $1 the table's cut-off, $2 the processor (or NULL = all), $3 the keys' cut-off,
        // $4 the cleanup's now: a key goes once older than $1 and past its own
        // `keep_until` (NULL: written before keys carried one); a ledger row a kept key
        // points at stays (a NOT IN over the kept keys' run ids, evaluated once per
        // statement rather than once per row); $5 the batch size.
        const CONDITIONS: [&str; 4] = [
            "processed_at < $1 AND ($2::text IS NULL OR processor_name = $2) AND $3::timestamptz IS NOT NULL \
                 AND (keep_until IS NULL OR keep_until < $4)",
            "started_at < $1 AND ($2::text IS NULL OR processor_name = $2) AND run_id NOT IN \
                 (SELECT run_id FROM processing_keys WHERE processed_at >= $3 OR keep_until >= $4)",
            "expires_at < $1 AND ($2::text IS NULL OR processor_name = $2) AND $3::timestamptz IS NOT NULL \
                 AND $4::timestamptz IS NOT NULL",
            // Expired, or of a pending batch whose deadline passed unconfirmed.
            "(expires_at < $1 OR (pending, first_seen) IN \
                   (SELECT id, first_seen FROM event_pending WHERE deadline < $1)) \
                 AND $2::text IS NULL AND $3::timestamptz IS NOT NULL AND $4::timestamptz IS NOT NULL",
        ];
        cleanup_tables(
            policy,
            true,
            |i, cutoff| async move {
                let sql = format!(
                    "SELECT count(*) FROM {} WHERE {}",
                    CLEANUP_TABLES[i], CONDITIONS[i]
                );
                let n: i64 = statements::cleanup(&sql, cutoff, policy.processor.as_deref(), (policy.keys_before, policy.now))
                    .fetch_one(&mut self.conn().await?)
                    .await
                    .and_then(|row| row.try_get(0))
                    .map_err(|e| self.err(e))?;
                Ok(n as u64)
            },
            // One bounded batch per statement, each its own transaction.
            |i, cutoff| async move {
                let (table, condition) = (CLEANUP_TABLES[i], CONDITIONS[i]);
                let sql = format!(
                    "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE {condition} LIMIT $5))"
                );
                let deleted = statements::cleanup(&sql, cutoff, policy.processor.as_deref(), (policy.keys_before, policy.now))
                    .bind(policy.limit())
                    .execute(&mut self.conn().await?)
                    .await
                    .map_err(|e| self.err(e))?
                    .rows_affected();
                if table == "event_keys"
                    && policy.processor.is_none()
                    && deleted < policy.limit() as u64
                {
                    // After the last batch of keys: the rows of dead pending batches none
                    // of whose keys is left, each probed through the first-seen index (a
                    // batch's keys share its first-seen time; a per-row probe, not a join
                    // the planner could run as a scan of every key). Never before their
                    // keys: a key whose batch row is gone reads as confirmed.
                    sqlx::query(
                        "DELETE FROM event_pending d WHERE d.deadline < $1 AND ( \
                           SELECT 1 FROM event_keys e WHERE e.first_seen = d.first_seen \
                             AND e.namespace = d.namespace AND e.pending = d.id LIMIT 1) IS NULL",
                    )
                    .bind(cutoff)
                    .execute(&mut self.conn().await?)
                    .await
                    .map_err(|e| self.err(e))?;
                    // Rows of gates' batches (migration 0012) untouched since the cut-off:
                    // their gates are long gone.
                    sqlx::query("DELETE FROM event_turns WHERE marked_at < $1")
                        .bind(cutoff)
                        .execute(&mut self.conn().await?)
                        .await
                        .map_err(|e| self.err(e))?;
                }
                Ok(deleted)
            },
        )
        .await
    }

    /// No partitions.
    async fn partition_expiration(
        &self,
    ) -> crate::error::Result<Option<Vec<crate::store::PartitionExpiration>>> {
        Ok(None)
    }

    async fn set_partition_expiration(&self, _days: Option<u32>) -> crate::error::Result<()> {
        Err(crate::store::fallback::no_partitions(self))
    }
}
