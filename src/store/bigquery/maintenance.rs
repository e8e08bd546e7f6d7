//! Purge, cleanup (one DML statement per table) and the partition expiration.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::Result;
use crate::model::micros;
use crate::store::common::cleanup_tables;
use crate::store::{CleanupPolicy, CleanupReport, MaintenanceStore, PartitionExpiration};

use crate::backend::bigquery::{opt_string, string, timestamp};

use super::schema::PARTITIONED_TABLES;
use super::BigQueryStore;

impl BigQueryStore {
    /// The rows past retention of cleanup table `i` ([`super::common::CLEANUP_TABLES`]),
    /// one `{table} WHERE …` per BigQuery table: the leases are in the lease shards and
    /// the schema-1 `processing_leases`.
    fn cleanup_rows(&self, i: usize) -> Vec<&String> {
        if i == 2 {
            self.sql.cleanup_leases.iter().collect()
        } else {
            vec![&self.sql.cleanup[i]]
        }
    }
}

#[async_trait]
impl MaintenanceStore for BigQueryStore {
    async fn purge(&self, processor: &str, scope: Option<&str>) -> Result<u64> {
        self.mutate(
            "purge",
            &self.sql.purge,
            vec![string("processor", processor), opt_string("scope", scope)],
        )
        .await
    }

    async fn cleanup(&self, policy: &CleanupPolicy) -> Result<CleanupReport> {
        // BigQuery deletes each table's rows in one DML statement (no LIMIT in DML; its
        // DML does not lock out the runs' inserts), so `batch` does not apply.
        const OPERATIONS: [&str; 4] = [
            "cleanup.keys",
            "cleanup.runs",
            "cleanup.leases",
            "cleanup.event_keys",
        ];
        let params = |cutoff: DateTime<Utc>| {
            vec![
                timestamp("before", micros(cutoff)),
                opt_string("processor", policy.processor.as_deref()),
                timestamp("keys_before", micros(policy.keys_before)),
                timestamp("now", micros(policy.now)),
            ]
        };
        let params = &params;
        cleanup_tables(
            policy,
            false,
            |i, cutoff| async move {
                let operation = OPERATIONS[i];
                let sql = match self.cleanup_rows(i).as_slice() {
                    [rows] => format!("SELECT COUNT(*) AS n FROM {rows}"),
                    tables => format!(
                        "SELECT COUNT(*) AS n FROM ({})",
                        tables
                            .iter()
                            .map(|rows| format!("SELECT 1 FROM {rows}"))
                            .collect::<Vec<_>>()
                            .join(" UNION ALL ")
                    ),
                };
                let out = self.query(operation, &sql, params(cutoff)).await?;
                let n = out
                    .records()
                    .next()
                    .map(|r| r.i64("n"))
                    .transpose()
                    .map_err(|e| self.bad_row(operation, e))?
                    .unwrap_or(0);
                Ok(u64::try_from(n).unwrap_or(0))
            },
            |i, cutoff| async move {
                let mut deleted = 0;
                for rows in self.cleanup_rows(i) {
                    let sql = format!("DELETE FROM {rows}");
                    deleted += self.mutate(OPERATIONS[i], &sql, params(cutoff)).await?;
                }
                Ok(deleted)
            },
        )
        .await
    }

    /// Each partitioned table's `timePartitioning.expirationMs`, by `tables.get` (not
    /// billed).
    async fn partition_expiration(&self) -> Result<Option<Vec<PartitionExpiration>>> {
        let mut found = Vec::with_capacity(PARTITIONED_TABLES.len());
        for table in PARTITIONED_TABLES {
            let got = self
                .conn
                .rest("cleanup.partition_expiration", || {
                    self.conn.client().table().get(
                        &self.config.project,
                        &self.config.dataset,
                        table,
                        None,
                    )
                })
                .await
                .map_err(|e| self.err(e))?;
            let partitioning = got.time_partitioning.as_ref();
            found.push(PartitionExpiration::from_api(
                table,
                partitioning.map(|p| p.expiration_ms.as_deref()),
            ));
        }
        Ok(Some(found))
    }

    async fn set_partition_expiration(&self, days: Option<u32>) -> Result<()> {
        self.alter_partition_expiration("cleanup.partition_expiration", days)
            .await
    }
}
