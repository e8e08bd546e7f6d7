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
///
/// A path that can never hold a database is a configuration error naming it (exit 2), not
/// a store outage: no path (`sqlite://`), a folder, a file that is not a SQLite database.
/// A folder that does not exist stays an outage (an unmounted volume comes back; a typo is
/// named by the message, and under `best_effort` the run is spooled, not lost).
pub fn connect_options(url: &str) -> Result<SqliteConnectOptions> {
    let options = SqliteConnectOptions::from_str(url)
        .map_err(|e| Error::config(format!("bad sqlite url {url:?}: {e}")))?;
    check_path(url, options.get_filename())?;
    Ok(options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(BUSY_TIMEOUT))
}

fn check_path(url: &str, path: &Path) -> Result<()> {
    let bad = |what: String| Err(Error::config(format!("{url}: {what}")));
    if path.as_os_str().is_empty() {
        return bad("no file path (sqlite://PATH, e.g. sqlite://idem.db)".into());
    }
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
    let mut head = [0u8; 16];
    let header = std::fs::File::open(path).and_then(|mut f| f.read(&mut head));
    if matches!(header, Ok(n) if n > 0 && (n < 16 || &head != b"SQLite format 3\0")) {
        return bad(format!("{} is not a SQLite database", path.display()));
    }
    Ok(())
}
