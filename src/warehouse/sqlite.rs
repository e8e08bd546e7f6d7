//! SQLite as a warehouse for the SQL processor.

use async_trait::async_trait;
use sqlx::sqlite::{SqlitePool, SqlitePoolOptions, SqliteRow};
use sqlx::{ConnectOptions, Row, TypeInfo, ValueRef};

use super::{
    bind_values, in_statement, Cell, Dialect, Params, Rows, Statement, Warehouse, WarehouseError,
    WarehouseResult,
};
use crate::error::Result;

/// A SQLite database the SQL processor runs on.
#[derive(Debug, Clone)]
pub struct SqliteWarehouse {
    pool: SqlitePool,
    url: String,
    /// The database file (none for an in-memory database).
    path: Option<std::path::PathBuf>,
    /// Closes the pool when the last clone of this warehouse is dropped.
    _closer: std::sync::Arc<crate::backend::sqlite::Closer>,
}

impl SqliteWarehouse {
    /// Opens (creating if missing) `sqlite://PATH`.
    pub async fn connect(url: &str) -> Result<Self> {
        let options = crate::backend::sqlite::connect_options(url)?
            // Batch statements are slow by nature: no "slow statement" warnings.
            .disable_statement_logging();
        let path =
            Some(options.get_filename().to_path_buf()).filter(|p| p.as_os_str() != ":memory:");
        // Lazy: a run skipped by a guard never touches the warehouse; an unreachable
        // warehouse fails the run (recorded, exit 1) instead of the command.
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_lazy_with(options);
        Ok(SqliteWarehouse {
            _closer: std::sync::Arc::new(crate::backend::sqlite::Closer::new(&pool)),
            pool,
            url: url.to_string(),
            path,
        })
    }
}

fn bind<'q>(
    statement: &'q Statement,
    values: &[&'q str],
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
    let mut q = sqlx::query(&statement.sql);
    for v in values {
        q = q.bind(*v);
    }
    q
}

/// One cell, typed by the value's storage class (NULL, INTEGER, REAL, TEXT, BLOB).
fn cell(row: &SqliteRow, i: usize) -> Cell {
    let Ok(raw) = row.try_get_raw(i) else {
        return Cell::Null;
    };
    if raw.is_null() {
        return Cell::Null;
    }
    let kind = raw.type_info().name().to_string();
    // Unchecked: the storage class, not the declared column type, decides the decoder.
    let bytes = || row.try_get_unchecked::<Vec<u8>, _>(i);
    let cell = match kind.as_str() {
        "INTEGER" => row.try_get_unchecked::<i64, _>(i).map(Cell::Integer),
        "REAL" => row.try_get_unchecked::<f64, _>(i).map(Cell::Real),
        "BLOB" => bytes().map(Cell::Blob),
        // TEXT: SQLite keeps whatever bytes it was given, UTF-8 or not.
        _ => bytes().map(Cell::text_from_bytes),
    };
    cell.unwrap_or_else(|_| Cell::Other {
        type_name: kind.to_lowercase(),
        bytes: bytes().unwrap_or_default(),
    })
}

#[async_trait]
impl Warehouse for SqliteWarehouse {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn location(&self) -> String {
        self.url.clone()
    }

    async fn execute(&self, statements: &[Statement], params: &Params) -> WarehouseResult<u64> {
        // IMMEDIATE: take the write lock up front. A deferred transaction that reads and
        // then writes (`INSERT … WHERE NOT EXISTS …`) cannot upgrade its lock while another
        // connection writes, and SQLite then fails at once with "database is locked"
        // instead of waiting out the busy timeout.
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut affected = 0;
        for (n, statement) in statements.iter().enumerate() {
            let values = bind_values(statement, params)?;
            let done = bind(statement, &values)
                .execute(&mut *tx)
                .await
                .map_err(|e| in_statement(n, statements.len())(WarehouseError::from(e)))?;
            affected = done.rows_affected();
        }
        tx.commit().await?;
        Ok(affected)
    }

    async fn query_rows(&self, statement: &Statement, params: &Params) -> WarehouseResult<Rows> {
        let values = bind_values(statement, params)?;
        // A read never creates the database file (`idem explain` changes nothing): on a
        // file not made yet it reads an empty database in memory, which answers exactly as
        // the new empty file would.
        let fetched = if self.path.as_ref().is_some_and(|p| !p.exists()) {
            use sqlx::Connection;
            let mut empty = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
            bind(statement, &values).fetch_all(&mut empty).await?
        } else {
            bind(statement, &values).fetch_all(&self.pool).await?
        };
        Ok(Rows::from_sqlx(&fetched, cell))
    }
}
