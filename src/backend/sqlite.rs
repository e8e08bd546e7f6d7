//! SQLite connection plumbing shared by the store and the warehouse.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};

use crate::error::{Error, Result};
use crate::per_process::PerProcess;

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

/// Closes a SQLite pool when the last store or warehouse holding it is dropped, in a task
/// of the runtime that [`closed`] waits for. Without it the pool's connections close on
/// their worker threads after the handles are gone, and a command that returns at once
/// exits before SQLite has checkpointed and removed its `-wal` and `-shm` files: they were
/// left beside the ledger, some of the time, after every command.
#[derive(Debug)]
pub struct Closer(sqlx::SqlitePool);

impl Closer {
    /// Closes `pool` when dropped (hold it in an `Arc` beside the pool).
    pub fn new(pool: &sqlx::SqlitePool) -> Self {
        Closer(pool.clone())
    }
}

impl Drop for Closer {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = self.0.clone();
        let task = runtime.spawn(async move {
            // sqlx 0.8's close() can return with a connection left open, idle, when that
            // connection was still on its way back to the pool as close() began (its
            // return is a task of its own, which waits on the connection's thread): seen
            // with one connection (`idem migrate` kept its ledger open to the end) and
            // with the report's four under load. Close again once such connections are
            // back, until the pool holds none (its size drops once SQLite has closed the
            // file), for as long as a process waits on exit and no longer.
            let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
            loop {
                pool.close().await;
                if pool.size() == 0 || tokio::time::Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        let mut closing = CLOSING.get().lock().unwrap_or_else(|e| e.into_inner());
        closing.retain(|t| !t.is_finished());
        closing.push(task);
        drop(closing);
        let options = (*self.0.connect_options()).clone();
        let mut closed = CLOSED.get().lock().unwrap_or_else(|e| e.into_inner());
        if !closed
            .iter()
            .any(|o| o.get_filename() == options.get_filename())
        {
            closed.push(options);
        }
    }
}

/// The databases of the pools closed (their options), for [`closed`]'s last look. This
/// process's own (a forked child's are its own: [`PerProcess`]).
static CLOSED: PerProcess<std::sync::Mutex<Vec<SqliteConnectOptions>>> =
    PerProcess::new(Default::default);

/// How long a dropped pool's close waits for connections still on their way back to it.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// The closes under way ([`Closer`]), this process's own.
static CLOSING: PerProcess<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> =
    PerProcess::new(Default::default);

/// Waits (at most `timeout`) until every SQLite pool whose last holder was dropped has
/// closed its connections: SQLite has checkpointed the write-ahead log into the database
/// file and removed it. A process calls it before it exits.
pub async fn closed(timeout: Duration) {
    let pending = std::mem::take(&mut *CLOSING.get().lock().unwrap_or_else(|e| e.into_inner()));
    let all = async {
        for task in pending {
            let _ = task.await;
        }
    };
    let all = async {
        all.await;
        let databases =
            std::mem::take(&mut *CLOSED.get().lock().unwrap_or_else(|e| e.into_inner()));
        for options in databases {
            close_alone(options).await;
        }
    };
    if tokio::time::timeout(timeout, all).await.is_err() {
        tracing::warn!("a SQLite database was not closed within {timeout:?}");
    }
}

/// A database whose write-ahead log is still there once this process's pools of it have
/// closed is opened and closed once more, by one connection alone. SQLite checkpoints the
/// log and removes it when the last connection to the file closes, which it tells by
/// taking the file's exclusive lock; two connections closing at the same moment (two pools
/// of one file, or a connection closed on its way back to its pool while the pool closes
/// the others) can each find the other's lock and each leave the log behind. While
/// another process has the file open the log stays, as it must.
async fn close_alone(options: SqliteConnectOptions) {
    use sqlx::{ConnectOptions, Connection};
    let path = options.get_filename().to_path_buf();
    if path == Path::new(":memory:") || path.as_os_str().is_empty() {
        return;
    }
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    if !Path::new(&wal).exists() {
        return;
    }
    match options.create_if_missing(false).connect().await {
        Ok(conn) => {
            if let Err(e) = conn.close().await {
                tracing::debug!("closing {} again: {e}", path.display());
            }
        }
        Err(e) => tracing::debug!("opening {} to close it alone: {e}", path.display()),
    }
}

/// For the store, which opens its file at once: a path naming a folder is a configuration
/// error naming it. Only the file's metadata is read (`stat`), never its contents: a process
/// that opens and closes a database file with ordinary file I/O drops every POSIX lock it
/// holds on that file, SQLite's own included ("How To Corrupt An SQLite Database File",
/// §2.2), which lets a second writer in beside a connection of this process. Whether a file
/// is a database is asked of SQLite ([`is_not_a_database`], [`is_sqlite_database`]).
pub fn check_database_file(url: &str, path: &Path) -> Result<()> {
    if path != Path::new(":memory:") && path.is_dir() {
        return Err(Error::config(format!(
            "{url}: {} is a folder, not a database file",
            path.display()
        )));
    }
    Ok(())
}

/// Whether SQLite refused a file as not a database (`SQLITE_NOTADB`: it exists and does not
/// start with SQLite's header).
pub fn is_not_a_database(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i64>().ok())
            .is_some_and(|code| code & 0xff == 26),
        _ => false,
    }
}

/// The error for a file SQLite refused as not a database.
pub fn not_a_database(url: &str, path: &Path) -> Error {
    Error::config(format!(
        "{url}: {} is not a SQLite database",
        path.display()
    ))
}

/// Whether `path` is an existing, non-empty SQLite database, asked of SQLite itself through
/// a read-only connection (never read with ordinary file I/O: see
/// [`check_database_file`]): SQLite's own file handling keeps the locks of the process's
/// other connections when this one closes. A missing file, a folder or an empty file is
/// not one; a file SQLite cannot open for another reason (permissions, a lock) counts as
/// one, the safe answer for a caller deciding whether it may overwrite it. Blocking: it
/// runs on a thread of its own, so it may be called from anywhere.
pub fn is_sqlite_database(path: &Path) -> bool {
    use sqlx::{ConnectOptions, Connection};
    if !path.is_file() || std::fs::metadata(path).is_ok_and(|m| m.len() == 0) {
        return false;
    }
    let options = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .create_if_missing(false);
    let probe = async move {
        let mut conn = match options.connect().await {
            Ok(conn) => conn,
            Err(e) => return Some(!is_not_a_database(&e)),
        };
        let answer = sqlx::query("SELECT count(*) FROM sqlite_master")
            .fetch_one(&mut conn)
            .await;
        let _ = conn.close().await;
        Some(answer.map_or_else(|e| !is_not_a_database(&e), |_| true))
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .ok()
                .and_then(|rt| rt.block_on(probe))
        })
        .join()
        .ok()
        .flatten()
        .unwrap_or(true)
    })
}
