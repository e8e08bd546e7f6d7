//! SQLite as a warehouse for the SQL processor.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
};
use sqlx::{Column, ConnectOptions, Row, TypeInfo, ValueRef};

use super::{bind_values, Dialect, Params, Statement, Warehouse};
use crate::error::{Error, Result};

/// A SQLite database the SQL processor runs on.
#[derive(Debug, Clone)]
pub struct SqliteWarehouse {
    pool: SqlitePool,
    url: String,
}

impl SqliteWarehouse {
    /// Opens (creating if missing) `sqlite://PATH`.
    pub async fn connect(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| Error::config(format!("bad sqlite url {url:?}: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30))
            // Batch statements are slow by nature: no "slow statement" warnings.
            .disable_statement_logging();
        // Lazy: a run skipped by a guard never touches the warehouse; an unreachable
        // warehouse fails the run (recorded, exit 1) instead of the command.
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_lazy_with(options);
        Ok(SqliteWarehouse {
            pool,
            url: url.to_string(),
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

fn row_to_json(row: &SqliteRow) -> Value {
    let mut map = Map::new();
    for (i, col) in row.columns().iter().enumerate() {
        let raw = row.try_get_raw(i).ok();
        let kind = raw
            .as_ref()
            .filter(|r| !r.is_null())
            .map(|r| r.type_info().name().to_string());
        let value = match kind.as_deref() {
            None | Some("NULL") => Value::Null,
            Some("INTEGER") => row
                .try_get::<i64, _>(i)
                .map(Value::from)
                .unwrap_or(Value::Null),
            Some("REAL") => row
                .try_get::<f64, _>(i)
                .map(Value::from)
                .unwrap_or(Value::Null),
            Some("BLOB") => row
                .try_get::<Vec<u8>, _>(i)
                .map(|b| Value::from(b.iter().map(|x| format!("{x:02x}")).collect::<String>()))
                .unwrap_or(Value::Null),
            _ => row
                .try_get::<String, _>(i)
                .map(Value::from)
                .unwrap_or(Value::Null),
        };
        map.insert(col.name().to_string(), value);
    }
    Value::Object(map)
}

#[async_trait]
impl Warehouse for SqliteWarehouse {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn describe(&self) -> String {
        self.url.clone()
    }

    async fn execute(&self, statements: &[Statement], params: &Params) -> Result<u64, String> {
        // IMMEDIATE: take the write lock up front. A deferred transaction that reads and
        // then writes (`INSERT … WHERE NOT EXISTS …`) cannot upgrade its lock while another
        // connection writes, and SQLite then fails at once with "database is locked"
        // instead of waiting out the busy timeout.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| e.to_string())?;
        let mut affected = 0;
        for (n, statement) in statements.iter().enumerate() {
            let values = bind_values(statement, params)?;
            let done = bind(statement, &values)
                .execute(&mut *tx)
                .await
                .map_err(|e| format!("statement {} of {}: {e}", n + 1, statements.len()))?;
            affected = done.rows_affected();
        }
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(affected)
    }

    async fn query(&self, statement: &Statement, params: &Params) -> Result<Vec<Value>, String> {
        let values = bind_values(statement, params)?;
        let rows = bind(statement, &values)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| e.to_string())?;
        Ok(rows.iter().map(row_to_json).collect())
    }
}
