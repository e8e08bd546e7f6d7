//! SQLite connection plumbing shared by the store and the warehouse.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};

use crate::error::{Error, Result};

/// How long a statement waits for another connection's write lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// sqlx options for `sqlite://PATH` (or `sqlite::memory:`): the file is created if
/// missing and opened in WAL mode, so readers never block the one writer.
pub fn connect_options(url: &str) -> Result<SqliteConnectOptions> {
    Ok(SqliteConnectOptions::from_str(url)
        .map_err(|e| Error::config(format!("bad sqlite url {url:?}: {e}")))?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(BUSY_TIMEOUT))
}
