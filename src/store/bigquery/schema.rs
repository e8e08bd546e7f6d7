//! The tables: which exist, creating what is missing, the partition expiration.

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::store::migrations::{self, Migration, Schema};
use crate::store::MAX_PARTITION_EXPIRATION_DAYS;

use crate::backend::bigquery::BigQueryUrl;

use super::BigQueryStore;

/// The lease tables (migration 0004): a lease lives in `processing_leases_NN`, NN =
/// [`lease_shard`] of its processor and scope. BigQuery's DML limits are per table (2
/// mutating statements running, 20 queued) and concurrent mutating statements conflict
/// per table, so 16 tables take 16 times the claims, renewals and releases at once.
/// `processing_leases` (schema 1) is no longer written; cleanup still empties it.
pub const LEASE_TABLES: [&str; 16] = [
    "processing_leases_00",
    "processing_leases_01",
    "processing_leases_02",
    "processing_leases_03",
    "processing_leases_04",
    "processing_leases_05",
    "processing_leases_06",
    "processing_leases_07",
    "processing_leases_08",
    "processing_leases_09",
    "processing_leases_10",
    "processing_leases_11",
    "processing_leases_12",
    "processing_leases_13",
    "processing_leases_14",
    "processing_leases_15",
];

/// The lease table of (processor, scope): an index into [`LEASE_TABLES`], from the first
/// four bytes of SHA-256(processor NUL scope), so it is the same for every idem process
/// and version.
pub fn lease_shard(processor: &str, scope: &str) -> usize {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(processor.as_bytes());
    hash.update([0u8]);
    hash.update(scope.as_bytes());
    let digest = hash.finalize();
    let n = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    n as usize % LEASE_TABLES.len()
}

/// The tables the migrations ([`migrations::BIGQUERY`]) create. BigQuery keeps no version
/// record: a dataset holding them all is at the latest version, which one `tables.list`
/// call (not billed) tells. A migration that only alters a table must add a marker to
/// this check.
pub fn tables() -> impl Iterator<Item = &'static str> {
    [
        "processing_keys",
        "processing_runs",
        "processing_leases",
        "event_keys",
    ]
    .into_iter()
    .chain(LEASE_TABLES)
}

/// The partitioned tables (partition expiration applies to these).
pub(super) const PARTITIONED_TABLES: &[&str] =
    &["processing_keys", "processing_runs", "event_keys"];

/// The migrations' statements for a dataset holding the tables `existing`, with each
/// `ALTER TABLE t ADD COLUMN IF NOT EXISTS c …` folded into the `CREATE TABLE IF NOT EXISTS
/// t (…)` before it when `t` is not in `existing`: that CREATE makes the table, so it makes
/// it with the column (appended last, where the ALTER would put it) and the ALTER is not
/// sent. A fresh dataset is then its CREATE statements alone, however many columns later
/// versions added (0011 adds 49, one statement each: BigQuery takes one at a time on the
/// emulator, and every DDL statement is a job). A table that exists gets the ALTERs.
fn fold_added_columns(statements: Vec<String>, existing: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(statements.len());
    for sql in statements {
        if let Some((table, column)) = added_column(&sql) {
            let new = !existing.iter().any(|t| *t == table_id(table));
            let created = out.iter().enumerate().rev().find_map(|(i, s)| {
                created_table(s)
                    .filter(|(t, _)| *t == table)
                    .map(|(_, end)| (i, end))
            });
            if let (true, Some((i, end))) = (new, created) {
                out[i].insert_str(end, &format!(", {column}"));
                continue;
            }
        }
        out.push(sql);
    }
    out
}

/// A statement without the comments before it.
fn without_leading_comments(sql: &str) -> &str {
    let mut rest = sql.trim_start();
    loop {
        if let Some(line) = rest.strip_prefix("--") {
            rest = line.split_once('\n').map_or("", |(_, r)| r).trim_start();
        } else if let Some(block) = rest.strip_prefix("/*") {
            rest = block.split_once("*/").map_or("", |(_, r)| r).trim_start();
        } else {
            return rest;
        }
    }
}

/// `ALTER TABLE t ADD COLUMN IF NOT EXISTS c TYPE`: (t as written, `c TYPE`).
fn added_column(sql: &str) -> Option<(&str, &str)> {
    let rest = without_leading_comments(sql).strip_prefix("ALTER TABLE ")?;
    let (table, rest) = rest.split_once(char::is_whitespace)?;
    let column = rest
        .trim_start()
        .strip_prefix("ADD COLUMN IF NOT EXISTS ")?;
    let column = column.trim().trim_end_matches(';').trim_end();
    (!column.contains(',')).then_some((table, column))
}

/// `CREATE TABLE IF NOT EXISTS t (…) …`: (t as written, the byte offset in `sql` of the
/// parenthesis that closes the column list).
fn created_table(sql: &str) -> Option<(&str, usize)> {
    let start = sql.len() - without_leading_comments(sql).len();
    let rest = sql[start..].strip_prefix("CREATE TABLE IF NOT EXISTS ")?;
    let table = rest.split(|c: char| c.is_whitespace() || c == '(').next()?;
    let open = start + sql[start..].find('(')?;
    let mut depth = 0usize;
    for (i, c) in sql[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some((table, open + i));
                }
            }
            _ => {}
        }
    }
    None
}

/// A table's id from its name as written (`` `project.dataset.t` `` → `t`).
fn table_id(written: &str) -> &str {
    let bare = written.trim_matches('`');
    bare.rsplit('.').next().unwrap_or(bare)
}

pub(super) fn render_migration(sql: &str, url: &BigQueryUrl) -> String {
    sql.replace("{project}", &url.project)
        .replace("{dataset}", &url.dataset)
}

impl BigQueryStore {
    /// `ALTER TABLE … SET OPTIONS (partition_expiration_days = N | NULL)` on each
    /// partitioned table. DDL options cannot be bound as parameters: `days` is an integer,
    /// checked to be from 1 to [`MAX_PARTITION_EXPIRATION_DAYS`].
    pub(super) async fn alter_partition_expiration(
        &self,
        operation: &str,
        days: Option<u32>,
    ) -> Result<()> {
        let days = match days {
            Some(d) if (1..=MAX_PARTITION_EXPIRATION_DAYS).contains(&d) => d.to_string(),
            Some(d) => {
                return Err(Error::input(format!(
                    "partition expiration must be from 1 to {MAX_PARTITION_EXPIRATION_DAYS} days, got {d}"
                )))
            }
            None => "NULL".to_string(),
        };
        for table in PARTITIONED_TABLES {
            // Event keys are partitioned by first sighting, but a key's life is its TTL (a
            // gate's default is never): expiring their partitions would let a 31-day-old
            // payment through again, so they expire only by `idem cleanup`, by TTL.
            let days = if *table == "event_keys" {
                "NULL"
            } else {
                days.as_str()
            };
            let sql = format!(
                "ALTER TABLE {} SET OPTIONS (partition_expiration_days = {days})",
                self.config.table(table)
            );
            self.query(operation, &sql, Vec::new()).await?;
        }
        Ok(())
    }

    /// Whether every table of [`tables`] exists.
    async fn tables_exist(&self) -> Result<bool> {
        let found = self.existing_tables().await?;
        Ok(tables().all(|t| found.iter().any(|f| f == t)))
    }

    /// The dataset's tables (none when the dataset does not exist).
    async fn existing_tables(&self) -> Result<Vec<String>> {
        use gcp_bigquery_client::table::ListOptions;
        let mut found: Vec<String> = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let list = self
                .conn
                .rest("migrate.check", || {
                    let mut options = ListOptions::default().max_results(1000);
                    if let Some(token) = &page {
                        options = options.page_token(token.clone());
                    }
                    self.conn.client().table().list(
                        &self.config.project,
                        &self.config.dataset,
                        options,
                    )
                })
                .await;
            let list = match list {
                Ok(list) => list,
                Err(e) if e.is_not_found() => return Ok(Vec::new()),
                Err(e) => return Err(self.err(e)),
            };
            found.extend(
                list.tables
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| t.table_reference.table_id),
            );
            match list.next_page_token {
                Some(token) if !token.is_empty() => page = Some(token),
                _ => break,
            }
        }
        Ok(found)
    }

    /// Whether `table` has the column `column` (one `tables.get`, not billed): the marker
    /// of a migration that only adds columns.
    async fn has_column(&self, table: &str, column: &str) -> Result<bool> {
        let table = self
            .conn
            .rest("migrate.check", || {
                self.conn.client().table().get(
                    &self.config.project,
                    &self.config.dataset,
                    table,
                    None,
                )
            })
            .await
            .map_err(|e| self.err(e))?;
        let fields = table.schema.fields.unwrap_or_default();
        Ok(fields.iter().any(|f| f.name == column))
    }

    async fn ensure_dataset(&self) -> Result<()> {
        use gcp_bigquery_client::model::dataset::Dataset;
        let (project, dataset) = (&self.config.project, &self.config.dataset);
        match self
            .conn
            .rest("migrate.dataset", || {
                self.conn.client().dataset().get(project, dataset)
            })
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(self.err(e)),
        }
        let mut new = Dataset::new(project, dataset);
        if let Some(location) = &self.config.location {
            new = new.location(location);
        }
        match self
            .conn
            .rest("migrate.dataset", || {
                self.conn.client().dataset().create(new.clone())
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_already_exists() => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }
}

/// No version record: the tables all there is the latest version; no lock either: every
/// statement is idempotent, and a table created meanwhile by another process is fine.
#[async_trait]
impl Schema for BigQueryStore {
    fn migrations(&self) -> &'static [Migration] {
        &migrations::BIGQUERY
    }

    /// The markers, newest first (one `tables.get` when current): `processing_keys.
    /// keep_until` (0011), `event_keys.expires_at` (0003).
    async fn version(&self) -> Result<i64> {
        Ok(if !self.tables_exist().await? {
            0
        } else if self.has_column("processing_keys", "keep_until").await? {
            migrations::latest(&migrations::BIGQUERY)
        } else if self.has_column("event_keys", "expires_at").await? {
            10
        } else {
            1
        })
    }

    async fn apply(&self) -> Result<()> {
        self.ensure_dataset().await?;
        // Every migration, every time: the DDL is idempotent (`IF NOT EXISTS`). A table
        // this apply creates is created with the columns later migrations add to it.
        let existing = self.existing_tables().await?;
        let mut statements = Vec::new();
        for migration in migrations::pending(&migrations::BIGQUERY, 0).filter(|m| !m.is_blank()) {
            let script = render_migration(migration.sql, &self.config);
            for statement in crate::backend::prepare(&script, crate::backend::Dialect::BigQuery)? {
                statements.push(statement.sql);
            }
        }
        for sql in fold_added_columns(statements, &existing) {
            match self
                .conn
                .query("migrate.create_table", &sql, Vec::new())
                .await
            {
                Ok(_) => {}
                // Another process created it between IF NOT EXISTS and the create.
                Err(e) if e.is_already_exists() => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        if let Some(days) = self.config.partition_expiration_days {
            self.alter_partition_expiration("migrate.partition_expiration", Some(days))
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statements() -> Vec<String> {
        [
            "-- the keys\nCREATE TABLE IF NOT EXISTS `p.d.keys` (key STRING NOT NULL, at TIMESTAMP) PARTITION BY DATE(at) OPTIONS (description = \"keys (v1)\")",
            "CREATE TABLE IF NOT EXISTS `p.d.leases_00` (scope STRING, token INT64 NOT NULL) CLUSTER BY scope",
            "-- 0011: one column per statement\nALTER TABLE `p.d.leases_00` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP",
            "ALTER TABLE `p.d.leases_00` ADD COLUMN IF NOT EXISTS holder_pid INT64;",
            "ALTER TABLE `p.d.keys` ADD COLUMN IF NOT EXISTS keep_until TIMESTAMP",
            "ALTER TABLE `p.d.other` ADD COLUMN IF NOT EXISTS x INT64",
        ]
        .map(str::to_string)
        .to_vec()
    }

    #[test]
    fn a_fresh_dataset_gets_its_added_columns_in_the_creates() {
        let sql = fold_added_columns(statements(), &[]);
        assert_eq!(
            sql,
            [
                "-- the keys\nCREATE TABLE IF NOT EXISTS `p.d.keys` (key STRING NOT NULL, at TIMESTAMP, keep_until TIMESTAMP) PARTITION BY DATE(at) OPTIONS (description = \"keys (v1)\")",
                "CREATE TABLE IF NOT EXISTS `p.d.leases_00` (scope STRING, token INT64 NOT NULL, renewed_at TIMESTAMP, holder_pid INT64) CLUSTER BY scope",
                // No CREATE of it here: sent as it is.
                "ALTER TABLE `p.d.other` ADD COLUMN IF NOT EXISTS x INT64",
            ]
        );
    }

    #[test]
    fn a_table_that_exists_gets_the_alters() {
        let existing = ["leases_00".to_string()];
        let sql = fold_added_columns(statements(), &existing);
        assert_eq!(sql.len(), 5, "{sql:#?}");
        assert!(
            sql[1].ends_with("token INT64 NOT NULL) CLUSTER BY scope"),
            "{sql:#?}"
        );
        assert!(sql[2].contains("ALTER TABLE `p.d.leases_00` ADD COLUMN IF NOT EXISTS renewed_at"));
        assert!(sql[3].contains("holder_pid"));
        assert!(
            sql[0].contains("at TIMESTAMP, keep_until TIMESTAMP)"),
            "{sql:#?}"
        );
    }

    /// The real migrations, on a fresh dataset: no ALTER is sent, and every column an ALTER
    /// adds is in its table's CREATE.
    #[test]
    fn the_migrations_make_a_fresh_dataset_without_alters() {
        let url = BigQueryUrl::parse("bigquery://p/d").unwrap();
        let mut all = Vec::new();
        for m in migrations::pending(&migrations::BIGQUERY, 0).filter(|m| !m.is_blank()) {
            let script = render_migration(m.sql, &url);
            for st in crate::backend::prepare(&script, crate::backend::Dialect::BigQuery).unwrap() {
                all.push(st.sql);
            }
        }
        let alters: Vec<(String, String)> = all
            .iter()
            .filter_map(|s| added_column(s).map(|(t, c)| (t.to_string(), c.to_string())))
            .collect();
        assert!(alters.len() >= 49, "{}", alters.len());
        let fresh = fold_added_columns(all.clone(), &[]);
        assert!(
            fresh.iter().all(|s| added_column(s).is_none()),
            "{fresh:#?}"
        );
        for (table, column) in alters {
            let create = fresh
                .iter()
                .find(|s| created_table(s).is_some_and(|(t, _)| t == table))
                .unwrap();
            assert!(create.contains(&format!(", {column}")), "{table}: {column}");
        }
    }
}
