//! Postgres as a warehouse for the SQL processor.
//!
//! [`PostgresWarehouse`] runs job SQL for the built-in SQL processor. `@name` parameters
//! become `$1..$n` and their string values are bound, never spliced. They behave like
//! untyped literals (`'2025-11-18'`): `WHERE sale_date = @scope` compares with a DATE
//! column. Postgres infers each parameter's type from its context, and the value is
//! converted from text by that type's input function (see [`PostgresWarehouse`] for how).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{NaiveDate, NaiveDateTime, NaiveTime, SecondsFormat};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{
    PgArgumentBuffer, PgArguments, PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow,
    PgTypeInfo, Postgres,
};
use sqlx::{Arguments, ConnectOptions, Either, Executor, Row, Statement as _, TypeInfo, ValueRef};

use super::{
    bind_values, in_statement, Cell, Dialect, Params, Rows, Statement, Warehouse, WarehouseError,
    WarehouseResult,
};
use crate::backend::postgres::{connect_options, sqlx_message};
use crate::error::Result;

/// Type OIDs whose binary wire format is the UTF-8 text itself.
const TEXT_LIKE: &[u32] = &[
    25,   // text
    1043, // varchar
    1042, // bpchar
    19,   // name
    705,  // unknown
    114,  // json
];
const JSONB: u32 = 3802;

/// A Postgres database the SQL processor runs on.
///
/// How string parameters bind like untyped literals: sqlx sends every parameter in the
/// *binary* format (its `Bind` message hard-codes it), so declaring a parameter as
/// `unknown` (OID 705) and sending UTF-8 bytes does not work: Postgres infers the real
/// type (say DATE) and decodes the bytes with that type's *binary* receive function
/// (`incorrect binary data format`). Instead each statement is prepared first (sqlx caches
/// it per connection) and the parameter types Postgres inferred are read back. Values of
/// text-like types (text, varchar, char, name, json, jsonb) are sent as their UTF-8 bytes;
/// values of any other type are converted by the server in one extra round trip per
/// statement, `SELECT CAST(CAST($1 AS text) AS <type>), …`, i.e. by the type's own input
/// function, exactly as an untyped literal would be, and the binary result is sent on
/// unchanged. A value the type rejects fails with Postgres's own message (`invalid input
/// syntax for type date: "…"`).
///
/// A name used twice in one statement is one parameter of one type (`$1` both times):
/// where the two uses need different types, cast one of them (`@scope::text`).
#[derive(Clone)]
pub struct PostgresWarehouse {
    pool: PgPool,
    options: PgConnectOptions,
    /// How long to wait for a connection (the URL's `connect_timeout`).
    connect_timeout: Duration,
    url: crate::backend::RedactedUrl,
    type_names: Arc<Mutex<HashMap<u32, String>>>,
}

/// By hand: the pool and the connect options hold the password; the URL is redacted.
impl std::fmt::Debug for PostgresWarehouse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresWarehouse")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// Cancels the statement a connection (backend `pid`) is running when dropped armed.
///
/// sqlx does not cancel a statement whose future is dropped: the server runs it to the end
/// (an interrupted run's `process` would go on beside the next run of its scope). So each
/// warehouse call holds one of these while it runs, and disarms it when its statements
/// finished; dropped before that, it sends `pg_cancel_backend(pid)` from a fresh
/// connection, in the background ([`crate::backend::send_cancel`]: a `Drop` cannot wait), and the
/// runner waits for the send ([`super::cancels_sent`]). The cancelled statement fails,
/// so its transaction rolls back.
struct CancelOnDrop {
    pid: i32,
    options: Option<PgConnectOptions>,
    /// How long the cancellation may take, connecting included.
    timeout: Duration,
}

impl CancelOnDrop {
    fn disarm(&mut self) {
        self.options = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(options) = self.options.take() else {
            return;
        };
        let (pid, timeout) = (self.pid, self.timeout);
        crate::backend::send_cancel(async move {
            let send = async {
                let mut conn = options.connect().await?;
                let cancelled: bool = sqlx::query_scalar("SELECT pg_cancel_backend($1)")
                    .bind(pid)
                    .fetch_one(&mut conn)
                    .await?;
                let _ = sqlx::Connection::close(conn).await;
                Ok::<_, sqlx::Error>(cancelled)
            };
            match tokio::time::timeout(timeout, send).await {
                Ok(Ok(true)) => tracing::info!(
                    "cancelled the interrupted statement on the warehouse (backend {pid})"
                ),
                Ok(Ok(false)) => tracing::debug!("backend {pid} had nothing left to cancel"),
                Ok(Err(e)) => tracing::warn!(
                    "could not cancel the interrupted statement on the warehouse (backend {pid}): {}",
                    sqlx_message(&e, timeout)
                ),
                Err(_) => tracing::warn!(
                    "could not cancel the interrupted statement on the warehouse (backend {pid}): no answer within {timeout:?}"
                ),
            }
        });
    }
}

/// A parameter already in its binary wire format, of a type Postgres inferred.
struct WireParam {
    ty: PgTypeInfo,
    bytes: Vec<u8>,
}

impl sqlx::Type<Postgres> for WireParam {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(Oid(705))
    }
    fn compatible(_: &PgTypeInfo) -> bool {
        true
    }
}

impl sqlx::Encode<'_, Postgres> for WireParam {
    fn encode_by_ref(
        &self,
        buf: &mut PgArgumentBuffer,
    ) -> std::result::Result<IsNull, BoxDynError> {
        buf.extend_from_slice(&self.bytes);
        Ok(IsNull::No)
    }
    fn produces(&self) -> Option<PgTypeInfo> {
        Some(self.ty.clone())
    }
    fn size_hint(&self) -> usize {
        self.bytes.len()
    }
}

impl PostgresWarehouse {
    /// A warehouse at `postgres://…`. Connects on first use (a bad URL fails now; an
    /// unreachable server fails the statement that needs it).
    pub async fn connect(url: &str) -> Result<Self> {
        // Job SQL may run for long: no per-statement logs, no slow-statement warnings.
        let (options, connect_timeout) = connect_options(url)?;
        let options = options.disable_statement_logging();
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .min_connections(0)
            .acquire_timeout(connect_timeout)
            .connect_lazy_with(options.clone());
        Ok(PostgresWarehouse {
            pool,
            options,
            connect_timeout,
            url: crate::backend::RedactedUrl::new(url),
            type_names: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// A guard that cancels, on the server, what `conn` is running if the caller's future
    /// is dropped before it disarms the guard (see [`CancelOnDrop`]).
    async fn cancel_on_drop(&self, conn: &mut PgConnection) -> WarehouseResult<CancelOnDrop> {
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await?;
        Ok(CancelOnDrop {
            pid,
            options: Some(self.options.clone()),
            timeout: self.connect_timeout,
        })
    }

    async fn type_name(&self, conn: &mut PgConnection, oid: Oid) -> WarehouseResult<String> {
        if let Some(name) = self
            .type_names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&oid.0)
        {
            return Ok(name.clone());
        }
        let name: String = sqlx::query_scalar("SELECT format_type($1, NULL)")
            .bind(oid)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| {
                WarehouseError::driver(format!("cannot name parameter type oid {}: {e}", oid.0), e)
            })?;
        self.type_names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(oid.0, name.clone());
        Ok(name)
    }

    /// The statement's parameters, typed as Postgres infers them from their context.
    async fn arguments(
        &self,
        conn: &mut PgConnection,
        statement: &Statement,
        params: &Params,
    ) -> WarehouseResult<PgArguments> {
        let values = bind_values(statement, params)?;
        let mut args = PgArguments::default();
        if values.is_empty() {
            return Ok(args);
        }
        let prepared = (&mut *conn).prepare_with(&statement.sql, &[]).await?;
        let types: Vec<PgTypeInfo> = match prepared.parameters() {
            Some(Either::Left(types)) => types.to_vec(),
            _ => {
                return Err(WarehouseError::new(
                    "postgres did not describe the statement's parameters",
                ))
            }
        };
        if types.len() != values.len() {
            return Err(WarehouseError::new(format!(
                "the statement has {} parameters but {} values",
                types.len(),
                values.len()
            )));
        }
        let mut wire: Vec<Option<Vec<u8>>> = Vec::with_capacity(values.len());
        let mut convert: Vec<(usize, String)> = Vec::new();
        for (i, (ty, value)) in types.iter().zip(&values).enumerate() {
            let oid = ty.oid().ok_or_else(|| {
                WarehouseError::new(format!("parameter ${} has an unresolved type", i + 1))
            })?;
            if TEXT_LIKE.contains(&oid.0) {
                wire.push(Some(value.as_bytes().to_vec()));
            } else if oid.0 == JSONB {
                let mut bytes = Vec::with_capacity(value.len() + 1);
                bytes.push(1); // jsonb binary format version
                bytes.extend_from_slice(value.as_bytes());
                wire.push(Some(bytes));
            } else {
                wire.push(None);
                convert.push((i, self.type_name(conn, oid).await?));
            }
        }
        if !convert.is_empty() {
            let mut sql = String::from("SELECT ");
            let mut convert_args = PgArguments::default();
            for (n, (i, name)) in convert.iter().enumerate() {
                if n > 0 {
                    sql.push_str(", ");
                }
                let _ = write!(sql, "CAST(CAST(${} AS text) AS {name})", n + 1);
                convert_args
                    .add(values[*i])
                    .map_err(|e| WarehouseError::new(e.to_string()))?;
            }
            let row = sqlx::query_with(&sql, convert_args)
                .persistent(false)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| {
                    let names: Vec<String> = convert
                        .iter()
                        .map(|(i, ty)| format!("@{} as {ty}", statement.params[*i]))
                        .collect();
                    WarehouseError::driver(format!("cannot bind {}: {e}", names.join(", ")), e)
                })?;
            for (n, (i, _)) in convert.iter().enumerate() {
                let raw = row.try_get_raw(n)?;
                if raw.is_null() {
                    return Err(WarehouseError::new(format!(
                        "parameter @{} converts to NULL",
                        statement.params[*i]
                    )));
                }
                let bytes = raw
                    .as_bytes()
                    .map_err(|e| WarehouseError::new(e.to_string()))?;
                wire[*i] = Some(bytes.to_vec());
            }
        }
        for (ty, bytes) in types.into_iter().zip(wire) {
            let bytes = bytes.unwrap_or_default();
            args.add(WireParam { ty, bytes })
                .map_err(|e| WarehouseError::new(e.to_string()))?;
        }
        Ok(args)
    }
}

/// Postgres's binary NUMERIC as a decimal string (`"12.340"`, `"-0.5"`, `"NaN"`).
fn numeric_string(bytes: &[u8]) -> Option<String> {
    let word = |i: usize| -> Option<i16> {
        Some(i16::from_be_bytes([
            *bytes.get(2 * i)?,
            *bytes.get(2 * i + 1)?,
        ]))
    };
    let ndigits = word(0)? as i64;
    let weight = word(1)? as i64;
    let sign = word(2)? as u16;
    let dscale = word(3)? as u16 as i64;
    match sign {
        0xC000 => return Some("NaN".into()),
        0xD000 => return Some("Infinity".into()),
        0xF000 => return Some("-Infinity".into()),
        _ => {}
    }
    let digit = |p: i64| -> Option<i16> {
        if p < 0 || p >= ndigits {
            Some(0)
        } else {
            word(4 + p as usize)
        }
    };
    let mut s = String::new();
    if sign == 0x4000 {
        s.push('-');
    }
    if weight < 0 {
        s.push('0');
    } else {
        for p in 0..=weight {
            let d = digit(p)?;
            if p == 0 {
                let _ = write!(s, "{d}");
            } else {
                let _ = write!(s, "{d:04}");
            }
        }
    }
    if dscale > 0 {
        let mut frac = String::new();
        let groups = (dscale + 3) / 4;
        for k in 1..=groups {
            let _ = write!(frac, "{:04}", digit(weight + k)?);
        }
        frac.truncate(dscale as usize);
        s.push('.');
        s.push_str(&frac);
    }
    Some(s)
}

/// One cell, typed from its column's Postgres type. A value of a type not listed (or
/// one the typed decoder refuses, such as `'infinity'::date`) is [`Cell::Other`] with
/// its binary wire bytes: exact, never NULL.
fn cell(row: &PgRow, i: usize) -> Cell {
    let Ok(raw) = row.try_get_raw(i) else {
        return Cell::Null;
    };
    if raw.is_null() {
        return Cell::Null;
    }
    let kind = raw.type_info().name().to_string();
    let bytes = raw.as_bytes().map(<[u8]>::to_vec).unwrap_or_default();
    let other = |bytes: Vec<u8>| Cell::Other {
        type_name: kind.to_lowercase(),
        bytes,
    };
    fn array<T>(v: Vec<Option<T>>, f: impl Fn(T) -> Cell) -> Cell {
        Cell::Array(
            v.into_iter()
                .map(|x| x.map(&f).unwrap_or(Cell::Null))
                .collect(),
        )
    }
    let got: std::result::Result<Cell, sqlx::Error> = match kind.as_str() {
        "INT2" => row.try_get::<i16, _>(i).map(|n| Cell::Integer(n.into())),
        "INT4" => row.try_get::<i32, _>(i).map(|n| Cell::Integer(n.into())),
        "INT8" => row.try_get::<i64, _>(i).map(Cell::Integer),
        "OID" => row.try_get::<Oid, _>(i).map(|o| Cell::Integer(o.0.into())),
        // The shortest text of the f32, read as f64: 1.1::float4 is 1.1, not 1.100000023….
        "FLOAT4" => row
            .try_get::<f32, _>(i)
            .map(|f| Cell::Real(f.to_string().parse::<f64>().unwrap_or(f as f64))),
        "FLOAT8" => row.try_get::<f64, _>(i).map(Cell::Real),
        "NUMERIC" => Ok(numeric_string(&bytes)
            .map(Cell::Numeric)
            .unwrap_or_else(|| other(bytes.clone()))),
        "BOOL" => row.try_get::<bool, _>(i).map(Cell::Bool),
        // Text-like types: the binary format is the text itself.
        "TEXT" | "VARCHAR" | "BPCHAR" | "NAME" | "UNKNOWN" => {
            Ok(Cell::text_from_bytes(bytes.clone()))
        }
        "BYTEA" => Ok(Cell::Blob(bytes.clone())),
        // Dates and times from their wire format (sqlx's decoders panic on
        // `'infinity'::date` and on dates beyond chrono's range).
        "DATE" => Ok(date_cell(&bytes).unwrap_or_else(|| other(bytes.clone()))),
        "TIMESTAMPTZ" => Ok(timestamp_cell(&bytes, true).unwrap_or_else(|| other(bytes.clone()))),
        "TIMESTAMP" => Ok(timestamp_cell(&bytes, false).unwrap_or_else(|| other(bytes.clone()))),
        "TIME" => Ok(bytes
            .as_slice()
            .try_into()
            .ok()
            .map(i64::from_be_bytes)
            .and_then(|us| {
                let secs = u32::try_from(us.div_euclid(1_000_000)).ok()?;
                let nanos = (us.rem_euclid(1_000_000) * 1000) as u32;
                NaiveTime::from_num_seconds_from_midnight_opt(secs, nanos)
            })
            .map(|t| Cell::Time(t.format("%H:%M:%S%.f").to_string()))
            .unwrap_or_else(|| other(bytes.clone()))),
        // The text Postgres sent (jsonb: after its one-byte format version).
        "JSON" => Ok(String::from_utf8(bytes.clone())
            .map(Cell::Json)
            .unwrap_or_else(|e| other(e.into_bytes()))),
        "JSONB" => Ok(match bytes.split_first() {
            Some((1, text)) => std::str::from_utf8(text)
                .map(|t| Cell::Json(t.to_string()))
                .unwrap_or_else(|_| other(bytes.clone())),
            _ => other(bytes.clone()),
        }),
        "UUID" => Ok(uuid::Uuid::from_slice(&bytes)
            .map(|u| Cell::Uuid(u.to_string()))
            .unwrap_or_else(|_| other(bytes.clone()))),
        "TEXT[]" | "VARCHAR[]" | "BPCHAR[]" | "NAME[]" => row
            .try_get::<Vec<Option<String>>, _>(i)
            .map(|v| array(v, Cell::Text)),
        "INT2[]" => row
            .try_get::<Vec<Option<i16>>, _>(i)
            .map(|v| array(v, |n| Cell::Integer(n.into()))),
        "INT4[]" => row
            .try_get::<Vec<Option<i32>>, _>(i)
            .map(|v| array(v, |n| Cell::Integer(n.into()))),
        "INT8[]" => row
            .try_get::<Vec<Option<i64>>, _>(i)
            .map(|v| array(v, Cell::Integer)),
        "FLOAT8[]" => row
            .try_get::<Vec<Option<f64>>, _>(i)
            .map(|v| array(v, Cell::Real)),
        "BOOL[]" => row
            .try_get::<Vec<Option<bool>>, _>(i)
            .map(|v| array(v, Cell::Bool)),
        _ => Ok(other(bytes.clone())),
    };
    // A decoder that refuses the value (multi-dimensional arrays, infinite dates, text
    // that is not UTF-8 in an array): the exact wire bytes under the type's name.
    got.unwrap_or_else(|_| other(bytes))
}

/// Postgres's epoch for dates and timestamps on the wire.
fn pg_epoch() -> NaiveDate {
    NaiveDate::from_ymd_opt(2000, 1, 1).expect("a valid date")
}

/// A DATE from its wire format (days since 2000-01-01); `infinity` and `-infinity` as
/// Postgres spells them. `None` beyond chrono's range.
fn date_cell(bytes: &[u8]) -> Option<Cell> {
    let days = i32::from_be_bytes(bytes.try_into().ok()?);
    match days {
        i32::MAX => return Some(Cell::Date("infinity".into())),
        i32::MIN => return Some(Cell::Date("-infinity".into())),
        _ => {}
    }
    let date = pg_epoch().checked_add_signed(chrono::TimeDelta::try_days(days.into())?)?;
    Some(Cell::Date(crate::model::time::day_text(date)))
}

/// A TIMESTAMP(TZ) from its wire format (microseconds since 2000-01-01 00:00, UTC for
/// TIMESTAMPTZ); `infinity` and `-infinity` as Postgres spells them. `None` beyond
/// chrono's range.
fn timestamp_cell(bytes: &[u8], zoned: bool) -> Option<Cell> {
    let us = i64::from_be_bytes(bytes.try_into().ok()?);
    let wrap = |s: String| {
        if zoned {
            Cell::Timestamp(s)
        } else {
            Cell::DateTime(s)
        }
    };
    match us {
        i64::MAX => return Some(wrap("infinity".into())),
        i64::MIN => return Some(wrap("-infinity".into())),
        _ => {}
    }
    let at: NaiveDateTime = pg_epoch()
        .and_hms_opt(0, 0, 0)?
        .checked_add_signed(chrono::TimeDelta::microseconds(us))?;
    Some(if zoned {
        Cell::Timestamp(at.and_utc().to_rfc3339_opts(SecondsFormat::AutoSi, true))
    } else {
        // No time zone: ISO 8601 without an offset (not pretending it is UTC).
        Cell::DateTime(at.format("%Y-%m-%dT%H:%M:%S%.f").to_string())
    })
}

#[async_trait]
impl Warehouse for PostgresWarehouse {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn location(&self) -> String {
        self.url.to_string()
    }

    async fn execute(&self, statements: &[Statement], params: &Params) -> WarehouseResult<u64> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| WarehouseError::driver(sqlx_message(&e, self.connect_timeout), e))?;
        let mut cancel = self.cancel_on_drop(&mut tx).await?;
        let result = async {
            let mut affected = 0;
            for (n, statement) in statements.iter().enumerate() {
                let at = in_statement(n, statements.len());
                let args = self
                    .arguments(&mut tx, statement, params)
                    .await
                    .map_err(&at)?;
                let done = sqlx::query_with(&statement.sql, args)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| at(WarehouseError::from(e)))?;
                affected = done.rows_affected();
            }
            tx.commit().await?;
            Ok(affected)
        }
        .await;
        cancel.disarm();
        result
    }

    async fn query_rows(&self, statement: &Statement, params: &Params) -> WarehouseResult<Rows> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| WarehouseError::driver(sqlx_message(&e, self.connect_timeout), e))?;
        let mut cancel = self.cancel_on_drop(&mut conn).await?;
        let result = async {
            let args = self.arguments(&mut conn, statement, params).await?;
            let fetched = sqlx::query_with(&statement.sql, args)
                .fetch_all(&mut *conn)
                .await?;
            Ok(Rows::from_sqlx(&fetched, cell))
        }
        .await;
        cancel.disarm();
        result
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::warehouse::{prepare, Dialect, Params, Warehouse};

    /// A warehouse whose server takes connections and never answers gives up on a
    /// statement after the URL's `connect_timeout`, not the default 5 s, and says so (as
    /// the store does: `store::postgres`'s test). On tokio's paused clock.
    #[tokio::test(start_paused = true)]
    async fn a_warehouse_that_does_not_answer_is_given_up_on_after_connect_timeout() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        let url = format!("postgres://idem@127.0.0.1:{port}/idem?connect_timeout=1");
        let warehouse = super::PostgresWarehouse::connect(&url).await.unwrap();
        let statements = prepare("SELECT 1", Dialect::Postgres).unwrap();
        let started = tokio::time::Instant::now();
        let e = warehouse
            .execute(&statements, &Params::new())
            .await
            .unwrap_err()
            .to_string();
        let waited = started.elapsed();
        assert!(e.contains("no connection within 1 s"), "{e}");
        // At most the timeout (and tokio's rounding up to the millisecond), not 5 s. No
        // lower bound: sqlx counts its deadline on the wall clock, which moves on while
        // tokio's is paused, so on a busy machine its wait is a little under 1 s here.
        assert!(waited < Duration::from_secs(2), "{waited:?}: {e}");
        drop(silent);
    }

    #[tokio::test]
    async fn debug_never_shows_the_password() {
        for url in [
            "postgres://idem:s3cret@127.0.0.1:1/idem",
            "postgres://idem@127.0.0.1:1/idem?password=s3cret",
        ] {
            let warehouse = super::PostgresWarehouse::connect(url).await.unwrap();
            let shown = format!("{warehouse:?}");
            assert!(
                !shown.contains("s3cret") && shown.contains("***"),
                "{shown}"
            );
        }
    }
}
