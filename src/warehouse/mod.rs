//! Warehouses: the databases a job's SQL runs on. [`Warehouse`] is what each dialect
//! implements (one file per dialect), [`open_warehouse`] picks one from a URL, and the
//! built-in [`SqlProcessor`] (in `processor`) runs a job's SQL on one. `conformance` holds
//! the checks every warehouse passes.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::backend::Backend;
use crate::error::{BoxError, Error, Result};

#[cfg(feature = "bigquery")]
mod bigquery;
mod cell;
pub mod conformance;
#[cfg(feature = "postgres")]
pub mod postgres;
mod processor;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use crate::backend::{cancels_sent, prepare, Dialect, Statement};
#[cfg(feature = "bigquery")]
pub use bigquery::BigQueryWarehouse;
pub use cell::{canonical_row, Cell, Rows};
pub use processor::{PreparedScripts, SqlProcessor, SqlScripts, BUILTIN_PARAMS};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteWarehouse;

/// Named parameter values bound into job SQL (`scope`, `run_id`, job `[sql.params]`).
pub type Params = BTreeMap<String, String>;

/// A failed warehouse call: the message the SQL processor records (the database's own,
/// with where it happened) and the driver's error, kept as the source.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct WarehouseError {
    /// What failed, in words (never empty).
    pub message: String,
    /// The driver's error, when there is one.
    #[source]
    pub source: Option<BoxError>,
}

impl WarehouseError {
    /// An error with no driver error behind it (a missing parameter, a bad value).
    pub fn new(message: impl Into<String>) -> Self {
        WarehouseError {
            message: message.into(),
            source: None,
        }
    }

    /// An error the driver reported: `message` says it in words, `source` is kept.
    pub fn driver(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        WarehouseError {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The same error with `prefix: ` before its message (`statement 2 of 3`).
    pub fn context(mut self, prefix: impl std::fmt::Display) -> Self {
        self.message = format!("{prefix}: {}", self.message);
        self
    }

    /// The [`Error::Sql`] the SQL processor reports for this failure in `phase`.
    pub fn into_sql(self, phase: &'static str, warehouse: String) -> Error {
        Error::Sql {
            phase,
            // Redacted whatever the caller gave: the message reaches the ledger.
            warehouse: crate::backend::redact_url(&warehouse),
            message: self.message,
            source: self.source,
        }
    }
}

/// A driver error, its text as the message.
impl From<sqlx::Error> for WarehouseError {
    fn from(e: sqlx::Error) -> Self {
        WarehouseError::driver(e.to_string(), e)
    }
}

#[cfg(feature = "bigquery")]
impl From<crate::backend::bigquery::ApiError> for WarehouseError {
    fn from(e: crate::backend::bigquery::ApiError) -> Self {
        WarehouseError::driver(e.to_string(), e)
    }
}

impl From<String> for WarehouseError {
    fn from(message: String) -> Self {
        WarehouseError::new(message)
    }
}

/// Prefixes an error of the `n`-th (from 0) of `total` statements with `statement N of M`.
pub(crate) fn in_statement(n: usize, total: usize) -> impl Fn(WarehouseError) -> WarehouseError {
    move |e| e.context(format_args!("statement {} of {}", n + 1, total))
}

/// What a [`Warehouse`] call returns.
pub type WarehouseResult<T> = std::result::Result<T, WarehouseError>;

/// A database the SQL processor can run statements on.
#[async_trait]
pub trait Warehouse: Send + Sync + Debug {
    /// Its dialect (decides the placeholder syntax).
    fn dialect(&self) -> Dialect;

    /// Its URL without secrets, for messages.
    fn location(&self) -> String;

    /// Runs the statements in order, in one transaction where the warehouse has them;
    /// returns the rows affected by the last statement (the one that usually writes the
    /// result: in `DELETE …; INSERT …` the INSERT), which the SQL processor reports as
    /// records processed.
    async fn execute(&self, statements: &[Statement], params: &Params) -> WarehouseResult<u64>;

    /// Runs one query and returns its rows typed, every column in order (the content
    /// query's rows are hashed from these, see [`Cell::canonical`]).
    async fn query_rows(&self, statement: &Statement, params: &Params) -> WarehouseResult<Rows>;

    /// Runs one query and returns its rows as JSON objects (column name → plain value),
    /// for display and tests; see [`Rows::to_objects`] for what that loses. The error is
    /// the message alone (use [`Warehouse::query_rows`] to keep the driver's error).
    async fn query(&self, statement: &Statement, params: &Params) -> Result<Vec<Value>, String> {
        self.query_rows(statement, params)
            .await
            .map(|rows| rows.to_objects())
            .map_err(|e| e.message)
    }
}

/// Looks up a statement's parameters, with an error naming a missing one.
pub fn bind_values<'a>(statement: &Statement, params: &'a Params) -> WarehouseResult<Vec<&'a str>> {
    statement
        .params
        .iter()
        .map(|name| {
            params.get(name).map(String::as_str).ok_or_else(|| {
                let known: Vec<&str> = params.keys().map(String::as_str).collect();
                WarehouseError::new(format!(
                    "unknown parameter @{name} (known: @{})",
                    known.join(", @")
                ))
            })
        })
        .collect()
}

fn unsupported_warehouse(url: &str) -> Error {
    Error::config(format!(
        "unsupported warehouse url {:?}: expected sqlite://PATH, postgres://… or bigquery://PROJECT/DATASET",
        crate::backend::redact_url(url)
    ))
}

/// The dialect of the warehouse a URL names, from its scheme alone (nothing is opened),
/// so job SQL can be checked before anything runs.
pub fn warehouse_dialect(url: &str) -> Result<Dialect> {
    Backend::of(url)
        .and_then(Backend::dialect)
        .ok_or_else(|| unsupported_warehouse(url))
}

/// One warehouse per URL for every run of a process (a scheduler's SQL jobs on one
/// warehouse share its pool); see [`crate::backend::shared`]. Cheap to clone: the clones
/// share the warehouses. For one tokio runtime.
#[derive(Debug, Clone, Default)]
pub struct Warehouses {
    open: std::sync::Arc<crate::backend::shared::OpenOnce<dyn Warehouse>>,
}

impl Warehouses {
    /// The warehouse `url` names, opened by the first caller ([`open_warehouse`]).
    pub async fn open(&self, url: &str) -> Result<Arc<dyn Warehouse>> {
        self.open.get_or_open(url, || open_warehouse(url)).await
    }
}

/// Opens the warehouse a URL names (`sqlite://…`, `postgres://…`, `bigquery://…`).
pub async fn open_warehouse(url: &str) -> Result<Arc<dyn Warehouse>> {
    match warehouse_dialect(url)? {
        #[cfg(feature = "sqlite")]
        Dialect::Sqlite => Ok(Arc::new(SqliteWarehouse::connect(url).await?)),
        #[cfg(feature = "bigquery")]
        Dialect::BigQuery => Ok(Arc::new(BigQueryWarehouse::connect(url).await?)),
        #[cfg(feature = "postgres")]
        Dialect::Postgres => Ok(Arc::new(postgres::PostgresWarehouse::connect(url).await?)),
        #[allow(unreachable_patterns)]
        _ => Err(unsupported_warehouse(url)),
    }
}
