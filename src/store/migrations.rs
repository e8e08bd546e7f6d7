//! One migration mechanism for the SQL stores: one embedded list per dialect, built from
//! `sql/migrations/<dialect>/NNNN_name.sql`, and one runner (`run`) that every store applies
//! the same way — one cheap query when the schema is current, otherwise the pending
//! migrations in order under the dialect's lock, each recorded, exactly once across
//! concurrent first uses.
//!
//! Why not `sqlx::migrate::Migrator`: it records versions in its own `_sqlx_migrations`
//! table, so databases created by earlier idem versions (SQLite: `PRAGMA user_version`;
//! Postgres: `idem_schema_migrations`) would look empty and `0001` would run again; its
//! skip path is several statements (create the table, lock, read the dirty version, list
//! the applied ones) instead of one cheap query; and BigQuery has no sqlx driver. So each
//! dialect keeps its existing record (`Schema`), and this runner drives them all.

use async_trait::async_trait;

use crate::error::Result;

/// One schema migration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Migration {
    /// Its version: the file name's leading number.
    pub version: i64,
    /// The file name without `.sql` (`0001_init`).
    pub name: &'static str,
    /// The script.
    pub sql: &'static str,
}

impl Migration {
    /// The migration in file `name`.sql holding `sql`; the version is the name's leading
    /// digits.
    pub const fn new(name: &'static str, sql: &'static str) -> Self {
        let bytes = name.as_bytes();
        let mut version = 0i64;
        let mut i = 0;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            version = version * 10 + (bytes[i] - b'0') as i64;
            i += 1;
        }
        assert!(
            i > 0,
            "a migration file name starts with its version number"
        );
        Migration { version, name, sql }
    }
}

/// The migrations of a dialect, embedded from `sql/migrations/<dialect>/<name>.sql`, in order.
macro_rules! embed {
    ($dialect:literal: $($name:literal),+ $(,)?) => {
        &[$(Migration::new(
            $name,
            include_str!(concat!("../../sql/migrations/", $dialect, "/", $name, ".sql")),
        )),+]
    };
}

/// SQLite's migrations.
pub const SQLITE: &[Migration] = embed!("sqlite": "0001_init", "0002_report_indexes", "0003_event_dedup", "0004_report_covering", "0005_event_cursors");

/// Postgres's migrations.
pub const POSTGRES: &[Migration] = embed!("postgres": "0001_init", "0002_report_indexes", "0003_event_dedup", "0005_event_cursors", "0006_event_keys_bytes", "0007_event_keys_fillfactor", "0008_event_pending");

/// BigQuery's migrations (`{project}` and `{dataset}` are replaced by the validated ids).
pub const BIGQUERY: &[Migration] = embed!(
    "bigquery": "0001_init",
    "0003_event_dedup",
    "0004_lease_shards"
);

/// The latest version of a list (0 when empty).
pub fn latest(migrations: &[Migration]) -> i64 {
    migrations.last().map_or(0, |m| m.version)
}

/// The migrations after version `current`, in order. Versions need not be contiguous: a
/// gap (0001, 0003) is fine, every version above `current` is applied.
pub fn pending(migrations: &[Migration], current: i64) -> impl Iterator<Item = &Migration> {
    migrations.iter().filter(move |m| m.version > current)
}

/// How one dialect records its schema version and applies migrations under its lock.
#[async_trait]
pub(crate) trait Schema: Send + Sync {
    /// The dialect's migrations, in order.
    fn migrations(&self) -> &'static [Migration];

    /// The version applied, read with one cheap query (0 for a new database).
    async fn version(&self) -> Result<i64>;

    /// Under the dialect's lock, reads the version again and applies (and records) the
    /// migrations after it ([`pending`]), so concurrent callers apply each exactly once.
    async fn apply(&self) -> Result<()>;
}

/// Brings a schema up to date: one cheap query when it already is.
pub(crate) async fn run(schema: &(impl Schema + ?Sized)) -> Result<()> {
    if schema.version().await? >= latest(schema.migrations()) {
        return Ok(());
    }
    schema.apply().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_file_names_in_order() {
        for list in [SQLITE, POSTGRES, BIGQUERY] {
            assert_eq!(list[0].version, 1);
            assert_eq!(list[0].name, "0001_init");
            assert!(list.windows(2).all(|w| w[0].version < w[1].version));
            assert_eq!(latest(list), list.last().unwrap().version);
        }
        assert_eq!(pending(SQLITE, 0).count(), SQLITE.len());
        assert_eq!(pending(SQLITE, 1).count(), SQLITE.len() - 1);
        assert_eq!(pending(SQLITE, latest(SQLITE)).count(), 0);
        // A gap in the versions: everything above the current one is pending.
        let gap = [
            Migration::new("0001_a", ""),
            Migration::new("0003_c", ""),
            Migration::new("0004_d", ""),
        ];
        let names: Vec<_> = pending(&gap, 1).map(|m| m.name).collect();
        assert_eq!(names, ["0003_c", "0004_d"]);
        assert_eq!(pending(&gap, 2).count(), 2);
    }
}
