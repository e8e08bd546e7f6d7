//! One migration mechanism for the SQL stores: one embedded list per dialect, read from the
//! folder `sql/migrations/<dialect>/` (every `NNNN_name.sql` in it; one version space across
//! dialects, a version a dialect does not need being a file of comments there), and one
//! runner (`run`) that every store applies the same way — one cheap query when the schema is current, otherwise the pending
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
    /// Whether the script holds no statement, only comments: a version this dialect does
    /// not need (one version space across dialects). It is recorded without being sent.
    pub fn is_blank(&self) -> bool {
        self.sql.lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with("--")
        })
    }

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

/// The migrations of one dialect: the `.sql` files of `sql/migrations/<dialect>/`, embedded
/// at build time ([`include_dir`]: adding a file is all a new migration takes), in version
/// order. Dereferences to the list.
pub struct Dialect {
    dir: include_dir::Dir<'static>,
    /// The list, read at first use and kept (null before). Published with a
    /// compare-and-swap, not a `OnceLock`: a thread reading it at the instant of a `fork`
    /// would leave a `OnceLock` in progress for good in the child.
    list: std::sync::atomic::AtomicPtr<Vec<Migration>>,
}

impl Dialect {
    const fn new(dir: include_dir::Dir<'static>) -> Self {
        Dialect {
            dir,
            list: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The files of the folder, or why one cannot be a migration (a file not named
    /// `NNNN_name.sql`, not UTF-8, or two files of one version). `tests` holds every
    /// dialect's folder to it, so the lists read at run time never meet these.
    pub fn read(&self) -> std::result::Result<Vec<Migration>, String> {
        let mut list = Vec::new();
        for file in self.dir.files() {
            let path = file.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".sql"))
                .filter(|n| n.len() > 5 && n[..4].bytes().all(|b| b.is_ascii_digit()))
                .filter(|n| n.as_bytes()[4] == b'_')
                .ok_or_else(|| format!("{}: not a NNNN_name.sql file", path.display()))?;
            let sql = file
                .contents_utf8()
                .ok_or_else(|| format!("{}: not UTF-8", path.display()))?;
            list.push(Migration::new(name, sql));
        }
        list.sort_by_key(|m| m.version);
        if let Some(w) = list.windows(2).find(|w| w[0].version == w[1].version) {
            return Err(format!(
                "two migrations of version {}: {} and {}",
                w[0].version, w[0].name, w[1].name
            ));
        }
        Ok(list)
    }
}

impl Drop for Dialect {
    fn drop(&mut self) {
        let kept = *self.list.get_mut();
        if !kept.is_null() {
            // SAFETY: published by `deref` (a `Box`); nothing borrows it past `self`.
            drop(unsafe { Box::from_raw(kept) });
        }
    }
}

impl std::ops::Deref for Dialect {
    type Target = [Migration];

    fn deref(&self) -> &[Migration] {
        let kept = self.list.load(std::sync::atomic::Ordering::Acquire);
        if kept.is_null() {
            // A folder `read` refuses is caught by this module's tests, before any release.
            let list = self.read().unwrap_or_default();
            let now = crate::per_process::publish(&self.list, kept, list);
            // SAFETY: published, freed only when `self` is dropped.
            return unsafe { &*now };
        }
        // SAFETY: as above.
        unsafe { &*kept }
    }
}

/// SQLite's migrations (`sql/migrations/sqlite/`).
pub static SQLITE: Dialect = Dialect::new(include_dir::include_dir!(
    "$CARGO_MANIFEST_DIR/sql/migrations/sqlite"
));

/// Postgres's migrations (`sql/migrations/postgres/`).
pub static POSTGRES: Dialect = Dialect::new(include_dir::include_dir!(
    "$CARGO_MANIFEST_DIR/sql/migrations/postgres"
));

/// BigQuery's migrations (`sql/migrations/bigquery/`; `{project}` and `{dataset}` are
/// replaced by the validated ids).
pub static BIGQUERY: Dialect = Dialect::new(include_dir::include_dir!(
    "$CARGO_MANIFEST_DIR/sql/migrations/bigquery"
));

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

    /// Every dialect's folder reads as migrations, and the three share one version space:
    /// the same versions, each with the same name (a version a dialect does not need is a
    /// file of comments there).
    #[test]
    fn the_folders_hold_one_version_space() {
        let lists: Vec<Vec<Migration>> = [&SQLITE, &POSTGRES, &BIGQUERY]
            .iter()
            .map(|d| d.read().expect("a migrations folder"))
            .collect();
        let names = |l: &[Migration]| l.iter().map(|m| m.name).collect::<Vec<_>>();
        assert!(lists[0].len() >= 9, "{:?}", names(&lists[0]));
        assert_eq!(names(&lists[0]), names(&lists[1]), "sqlite and postgres");
        assert_eq!(names(&lists[0]), names(&lists[2]), "sqlite and bigquery");
        for (list, embedded) in lists.iter().zip([&SQLITE, &POSTGRES, &BIGQUERY]) {
            assert_eq!(list.as_slice(), &**embedded, "what the stores run");
            assert!(!list[0].is_blank(), "0001 creates the schema");
        }
        // Blank: only comments.
        assert!(SQLITE
            .iter()
            .any(|m| m.name == "0009_lease_shards" && m.is_blank()));
        assert!(!BIGQUERY
            .iter()
            .any(|m| m.name == "0009_lease_shards" && m.is_blank()));
    }

    #[test]
    fn versions_come_from_file_names_in_order() {
        for list in [&*SQLITE, &*POSTGRES, &*BIGQUERY] {
            assert_eq!(list[0].version, 1);
            assert_eq!(list[0].name, "0001_init");
            assert!(list.windows(2).all(|w| w[0].version < w[1].version));
            assert_eq!(latest(list), list.last().unwrap().version);
        }
        assert_eq!(pending(&SQLITE, 0).count(), SQLITE.len());
        assert_eq!(pending(&SQLITE, 1).count(), SQLITE.len() - 1);
        assert_eq!(pending(&SQLITE, latest(&SQLITE)).count(), 0);
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
