//! The one error type of the library.
//!
//! Messages are lower-case and say what failed and, where it helps, what to do. Every
//! backend converts its private errors into [`Error`], so callers (and the CLI's exit
//! codes) can tell bad input from an unreachable store from a failed processor.

use std::fmt;

/// A boxed error from user code (a processor, a custom guard).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in idem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bad configuration: a malformed job file, an unknown job, a bad store or warehouse
    /// URL, settings that contradict each other.
    #[error("{0}")]
    Config(String),

    /// Bad input: a command-line value (a date, a name, a flag out of range) or a
    /// malformed line of data.
    #[error("{0}")]
    Input(String),

    /// Reading or writing a file failed.
    #[error("cannot {action} {}: {source}", .path.display())]
    Io {
        /// What idem was doing (`read`, `write`, `create`, `list`).
        action: &'static str,
        /// The file or folder.
        path: std::path::PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// Writing an output failed after work was done (keys marked, a run recorded): not a
    /// usage error (exit 1), as what was done stays done and recorded.
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        /// The file written (or `standard output`).
        path: std::path::PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The store could not be reached or answered with an error.
    #[error("store {store} unavailable: {message}")]
    StoreUnavailable {
        /// The store, as a URL with any password removed.
        store: String,
        /// What went wrong.
        message: String,
        /// The driver's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },

    /// The store answered, but refused an operation (a statement error, a value it
    /// cannot hold, a schema it does not have). Not an outage: retrying the same thing
    /// fails the same way.
    #[error("store {store} rejected {operation}: {message}")]
    StoreRejected {
        /// The store, as a URL with any password removed.
        store: String,
        /// What idem asked of it.
        operation: String,
        /// The store's message.
        message: String,
        /// The driver's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },

    /// A ledger row with this run id exists already. A run id names one invocation; the
    /// runner records a run whose id is taken under a derived one instead.
    #[error("run id {run_id:?} is already recorded in {store}")]
    DuplicateRunId {
        /// The store.
        store: String,
        /// The run id.
        run_id: String,
    },

    /// The store's circuit breaker is open after repeated failures; the store is not
    /// contacted until the breaker half-opens.
    #[error("store {store} unavailable: circuit breaker open after {failures} consecutive failures (retry after {retry_in_ms} ms)")]
    CircuitOpen {
        /// The store.
        store: String,
        /// Consecutive failures that opened the breaker.
        failures: u32,
        /// Time until the breaker lets one probe through.
        retry_in_ms: u64,
    },

    /// The run's lease expired and was taken over by another run; the late run must not
    /// record its result over the newer holder's.
    #[error("lease on {processor}/{scope} lost: token {token} was superseded{}", holder_suffix(.current_holder))]
    LeaseLost {
        /// Processor (job) name.
        processor: String,
        /// Scope.
        scope: String,
        /// The fencing token the late run held.
        token: i64,
        /// The run that holds the lease now, if any.
        current_holder: Option<String>,
    },

    /// A store does not support an operation; see its capability flags.
    #[error("{store} does not support {operation}")]
    Unsupported {
        /// The store kind.
        store: &'static str,
        /// The operation.
        operation: &'static str,
    },

    /// The processor (or its content description) failed.
    #[error("processor {processor} failed: {source}")]
    Processor {
        /// Processor name.
        processor: String,
        /// The processor's error.
        #[source]
        source: BoxError,
    },

    /// Stopped by a signal before the work could finish (a gate's batch that waited on
    /// keys pending for another gate): exit code 1, as a run stopped by a signal.
    #[error("{0}")]
    Interrupted(String),

    /// A SQL statement of a job failed in its warehouse.
    #[error("sql {phase} failed in {warehouse}: {message}")]
    Sql {
        /// `setup`, `content` or `process`.
        phase: &'static str,
        /// Where it ran.
        warehouse: String,
        /// The database's message.
        message: String,
        /// The driver's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
}

fn holder_suffix(holder: &Option<String>) -> String {
    match holder {
        Some(h) => format!(" by run {h}"),
        None => String::new(),
    }
}

impl Error {
    /// Shorthand for [`Error::Config`].
    pub fn config(message: impl fmt::Display) -> Self {
        Error::Config(message.to_string())
    }

    /// Shorthand for [`Error::Input`].
    pub fn input(message: impl fmt::Display) -> Self {
        Error::Input(message.to_string())
    }

    /// Shorthand for [`Error::Write`]: an output written after work was done.
    pub fn write(path: impl Into<std::path::PathBuf>, source: std::io::Error) -> Self {
        Error::Write {
            path: path.into(),
            source,
        }
    }

    /// Shorthand for [`Error::Io`]: `action` is what idem was doing (`read`, `write`).
    pub fn io(
        action: &'static str,
        path: impl Into<std::path::PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// Shorthand for [`Error::StoreUnavailable`] without a source error.
    /// `store` is shown redacted ([`crate::redact::RedactedUrl`]), whatever the caller
    /// gave.
    pub fn store(store: impl fmt::Display, message: impl fmt::Display) -> Self {
        Error::StoreUnavailable {
            store: crate::redact::redact_url(&store.to_string()),
            message: message.to_string(),
            source: None,
        }
    }

    /// [`Error::StoreUnavailable`] keeping the driver's error as its source.
    pub fn store_source(
        store: impl fmt::Display,
        message: impl fmt::Display,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::StoreUnavailable {
            store: crate::redact::redact_url(&store.to_string()),
            message: message.to_string(),
            source: Some(source.into()),
        }
    }

    /// The same error again, for a second caller who waited on the same attempt (an open
    /// shared by many jobs): the same variant and message, without the driver's source
    /// error (which cannot be copied).
    pub fn again(&self) -> Error {
        match self {
            Error::Config(m) => Error::Config(m.clone()),
            Error::Input(m) => Error::Input(m.clone()),
            Error::Interrupted(m) => Error::Interrupted(m.clone()),
            Error::Io {
                action,
                path,
                source,
            } => Error::Io {
                action,
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Error::Write { path, source } => Error::Write {
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Error::StoreUnavailable { store, message, .. } => Error::store(store, message),
            Error::StoreRejected {
                store,
                operation,
                message,
                ..
            } => Error::StoreRejected {
                store: store.clone(),
                operation: operation.clone(),
                message: message.clone(),
                source: None,
            },
            Error::CircuitOpen {
                store,
                failures,
                retry_in_ms,
            } => Error::CircuitOpen {
                store: store.clone(),
                failures: *failures,
                retry_in_ms: *retry_in_ms,
            },
            Error::Unsupported { store, operation } => Error::Unsupported { store, operation },
            // Nothing else comes out of opening a store or a warehouse; kept as a failure
            // of the store, in the error's own words.
            other => Error::store("the store", other),
        }
    }

    /// True for errors in what the user gave idem (configuration, input, a file it could
    /// not read, an operation the store does not support): exit code 2.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::Config(_) | Error::Input(_) | Error::Io { .. } | Error::Unsupported { .. }
        )
    }

    /// True when the error means the store could not be used (unreachable, refusing the
    /// operation, or behind an open breaker): the store failure policy applies to these.
    pub fn is_store_failure(&self) -> bool {
        matches!(
            self,
            Error::StoreUnavailable { .. }
                | Error::StoreRejected { .. }
                | Error::CircuitOpen { .. }
        )
    }

    /// True when the store could not be reached at all (the circuit breaker counts these;
    /// a refused statement is the store working).
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            Error::StoreUnavailable { .. } | Error::CircuitOpen { .. }
        )
    }

    /// Classifies a sqlx error of `store` during `operation`: connection problems are
    /// [`Error::StoreUnavailable`], anything the server answered is
    /// [`Error::StoreRejected`]; either keeps `e` as its source.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn from_sqlx(store: &str, operation: &str, e: sqlx::Error, message: String) -> Self {
        let outage = match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_) => true,
            sqlx::Error::Database(db) => db.code().is_some_and(|code| match code.parse::<i64>() {
                // SQLite result codes (primary code in the low byte): BUSY, LOCKED, IOERR,
                // FULL, CANTOPEN.
                Ok(n) => matches!(n & 0xff, 5 | 6 | 10 | 13 | 14),
                // Postgres SQLSTATE: connection exceptions, shutdown, too many connections.
                Err(_) => code.starts_with("08") || code.starts_with("57P") || code == "53300",
            }),
            _ => false,
        };
        if outage {
            Error::store_source(store, message, e)
        } else {
            Error::StoreRejected {
                store: crate::redact::redact_url(store),
                operation: operation.to_string(),
                message,
                source: Some(Box::new(e)),
            }
        }
    }
}
