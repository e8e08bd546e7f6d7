//! SQLite connection plumbing shared by the store and the warehouse.

use std::io::Read;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};

use crate::error::{Error, Result};

/// How long a statement waits for another connection's write lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// sqlx options for `sqlite://PATH` (or `sqlite::memory:`): the file is created if
/// missing and opened in WAL mode, so readers never block the one writer.
/// A URL with no path (`sqlite://`) is a configuration error (see also
/// [`check_database_file`]).
pub fn connect_options(url: &str) -> Result<SqliteConnectOptions> {
    let options = SqliteConnectOptions::from_str(url)
        .map_err(|e| Error::config(format!("bad sqlite url {url:?}: {e}")))?;
    if options.get_filename().as_os_str().is_empty() {
        return Err(Error::config(format!(
            "{url}: no file path (sqlite://PATH, e.g. sqlite://idem.db)"
        )));
    }
    Ok(options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(BUSY_TIMEOUT))
}

/// For the store, which opens its file at once: a path naming a folder, or a file that is
/// not a SQLite database, is a configuration error naming it. (A warehouse opens lazily:
/// a run a guard skips never reads its file, whatever it holds.)
pub fn check_database_file(url: &str, path: &Path) -> Result<()> {
    let bad = |what: String| Err(Error::config(format!("{url}: {what}")));
    if path == Path::new(":memory:") {
        return Ok(());
    }
    if path.is_dir() {
        return bad(format!(
            "{} is a folder, not a database file",
            path.display()
        ));
    }
    // An empty file is a new database to SQLite; anything else must start with its header.
    let empty = std::fs::metadata(path).is_ok_and(|m| m.len() == 0);
    if path.is_file() && !empty && !is_sqlite_database(path) {
        return bad(format!("{} is not a SQLite database", path.display()));
    }
    Ok(())
}

/// Whether `path` is a file that starts with SQLite's header.
pub fn is_sqlite_database(path: &Path) -> bool {
    let mut head = [0u8; 16];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && &head == b"SQLite format 3\0"
}
