//! The report queries: their SQL per dialect (also for pasting into a console), their
//! parameters, and running them on the ledger's connection.

#[cfg(feature = "bigquery")]
use std::time::Duration;

use super::options::ReportOptions;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use super::rows::cells;
#[cfg(feature = "bigquery")]
use super::rows::Cell;
use super::rows::Row;
use super::{dialect_of_url, Dialect};
use crate::backend::redact_url;
use crate::error::{Error, Result};

/// The names of the report queries, in report order.
pub const QUERY_NAMES: [&str; 7] = [
    "duplicates",
    "wasted",
    "savings",
    "effectiveness",
    "storage",
    "shadow",
    "daily",
];

/// The SQL text of report query `name` in `dialect`, with its parameters explained in the
/// comment at its top.
pub fn sql(name: &str, dialect: Dialect) -> Result<&'static str> {
    /// The report queries of one dialect, in [`QUERY_NAMES`] order, from `sql/reports/<dir>/`.
    macro_rules! queries {
        ($dir:literal) => {
            [
                include_str!(concat!("../../sql/reports/", $dir, "/duplicates.sql")),
                include_str!(concat!("../../sql/reports/", $dir, "/wasted.sql")),
                include_str!(concat!("../../sql/reports/", $dir, "/savings.sql")),
                include_str!(concat!("../../sql/reports/", $dir, "/effectiveness.sql")),
                include_str!(concat!("../../sql/reports/", $dir, "/storage.sql")),
                include_str!(concat!("../../sql/reports/", $dir, "/shadow.sql")),
                include_str!(concat!("../../sql/reports/", $dir, "/daily.sql")),
            ]
        };
    }
    const SQLITE: [&str; 7] = queries!("sqlite");
    const POSTGRES: [&str; 7] = queries!("postgres");
    const BIGQUERY: [&str; 7] = queries!("bigquery");
    let index = QUERY_NAMES.iter().position(|n| *n == name).ok_or_else(|| {
        Error::config(format!(
            "unknown report query {name:?}: expected one of {}",
            QUERY_NAMES.join(", ")
        ))
    })?;
    Ok(match dialect {
        Dialect::Sqlite => SQLITE[index],
        Dialect::Postgres => POSTGRES[index],
        Dialect::BigQuery => BIGQUERY[index],
    })
}

/// Query `name` in `dialect` with this report's values bound, ready to paste into a
/// console: for SQLite, `.parameter set` lines for the `sqlite3` shell before the query;
/// for Postgres, `PREPARE` / `EXECUTE` / `DEALLOCATE` for `psql`. The values stay
/// parameters either way.
pub fn sql_for_console(name: &str, dialect: Dialect, options: &ReportOptions) -> Result<String> {
    let text = sql(name, dialect)?.trim_end().trim_end_matches(';');
    let mut out = format!(
        "-- idem report --sql {name} --dialect {}: the {} days from {} to {}\n",
        dialect.as_str(),
        options.days,
        options.since().to_rfc3339(),
        options.until.to_rfc3339()
    );
    let extra = extra(name, options);
    match dialect {
        Dialect::Sqlite => {
            let job = match &options.job {
                // The shell evaluates the value as SQL: a quoted literal is text.
                Some(j) => format!("\"'{}'\"", j.replace('\'', "''").replace('"', "\\\"")),
                None => "NULL".to_string(),
            };
            out.push_str(".parameter init\n");
            out.push_str(&format!(
                ".parameter set ?1 {}\n",
                options.since().timestamp_micros()
            ));
            out.push_str(&format!(
                ".parameter set ?2 {}\n",
                options.until.timestamp_micros()
            ));
            out.push_str(&format!(".parameter set ?3 {job}\n"));
            match extra {
                Some(Extra::Window(v)) => {
                    out.push_str(&format!(".parameter set ?4 {}\n", (v * 1e6) as i64))
                }
                Some(Extra::MaxStddev(v)) => out.push_str(&format!(".parameter set ?4 {v:?}\n")),
                Some(Extra::KeysSince(t)) => {
                    out.push_str(&format!(".parameter set ?4 {}\n", t.timestamp_micros()))
                }
                None => {}
            }
            out.push_str(text);
            out.push_str(";\n");
        }
        Dialect::BigQuery => {
            let job = match &options.job {
                Some(j) => format!("'{}'", j.replace('\\', "\\\\").replace('\'', "\\'")),
                None => "NULL".to_string(),
            };
            out.push_str(&format!(
                "-- parameters: @since = TIMESTAMP '{}', @until = TIMESTAMP '{}', @job = {job}",
                options.since().to_rfc3339(),
                options.until.to_rfc3339()
            ));
            match extra {
                Some(Extra::Window(v)) => out.push_str(&format!(", @window_seconds = {v:?}")),
                Some(Extra::MaxStddev(v)) => out.push_str(&format!(", @max_stddev = {v:?}")),
                Some(Extra::KeysSince(t)) => {
                    out.push_str(&format!(", @keys_since = TIMESTAMP '{}'", t.to_rfc3339()))
                }
                None => {}
            }
            out.push_str("\n-- (bq query --nouse_legacy_sql --parameter=NAME:TYPE:VALUE ...; replace {project}.{dataset})\n");
            out.push_str(text);
            out.push_str(";\n");
        }
        Dialect::Postgres => {
            let statement = format!("idem_report_{name}");
            let job = match &options.job {
                Some(j) => format!("'{}'", j.replace('\'', "''")),
                None => "NULL".to_string(),
            };
            let (types, extra_value) = match extra {
                Some(Extra::Window(v) | Extra::MaxStddev(v)) => {
                    ("timestamptz, timestamptz, text, float8", format!(", {v:?}"))
                }
                Some(Extra::KeysSince(t)) => (
                    "timestamptz, timestamptz, text, timestamptz",
                    format!(", '{}'", t.to_rfc3339()),
                ),
                None => ("timestamptz, timestamptz, text", String::new()),
            };
            out.push_str(&format!("PREPARE {statement} ({types}) AS\n{text};\n"));
            out.push_str(&format!(
                "EXECUTE {statement} ('{}', '{}', {job}{extra_value});\n",
                options.since().to_rfc3339(),
                options.until.to_rfc3339()
            ));
            out.push_str(&format!("DEALLOCATE {statement};\n"));
        }
    }
    Ok(out)
}

/// The extra parameter (after start, end, processor) of a query, if any.
enum Extra {
    /// `duplicates`: the time window, in seconds.
    Window(f64),
    /// `savings`: the standard deviation below which repeats count as identical.
    MaxStddev(f64),
    /// `storage`: the oldest keys counted ([`ReportOptions::keys_since`]).
    KeysSince(chrono::DateTime<chrono::Utc>),
}

fn extra(name: &str, options: &ReportOptions) -> Option<Extra> {
    match name {
        "duplicates" => Some(Extra::Window(options.window.as_secs_f64())),
        "savings" => Some(Extra::MaxStddev(options.thresholds.max_stddev)),
        "storage" => Some(Extra::KeysSince(options.keys_since_bound())),
        _ => None,
    }
}

pub(super) enum Conn {
    #[cfg(feature = "sqlite")]
    // The store, not a clone of its pool: dropping the store closes the pool.
    Sqlite(crate::store::sqlite::SqliteStore),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "bigquery")]
    Bigquery(
        Box<crate::backend::bigquery::Connection>,
        crate::backend::bigquery::BigQueryUrl,
    ),
}

/// Connections of the report's pool when the store URL does not say (`max_connections`):
/// its seven queries run side by side, on a few readers.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
const READERS: u32 = 4;

pub(super) async fn connect(url: &str) -> Result<Conn> {
    match dialect_of_url(url)? {
        #[cfg(feature = "sqlite")]
        Dialect::Sqlite => {
            // The store's own connect creates and migrates an empty ledger, so a report on a
            // fresh store says "no runs" rather than "no such table".
            // The report's queries run side by side: a reader connection each (WAL).
            let store = crate::store::sqlite::SqliteStore::connect_sized(url, READERS).await?;
            Ok(Conn::Sqlite(store))
        }
        #[cfg(feature = "postgres")]
        Dialect::Postgres => {
            let store = crate::store::postgres::PostgresStore::connect_sized(url, READERS).await?;
            Ok(Conn::Postgres(store.pool().clone()))
        }
        #[cfg(feature = "bigquery")]
        Dialect::BigQuery => {
            use crate::backend::bigquery::{BigQueryUrl, Connection};
            use crate::store::bigquery::BigQueryStore;
            // Connecting migrates, so a fresh dataset has the tables (and no runs).
            BigQueryStore::connect(url).await?;
            let config = BigQueryUrl::parse(url)?;
            let conn = Connection::open(&config, Duration::from_secs(120))
                .await
                .map_err(|e| Error::store(redact_url(url), e))?;
            Ok(Conn::Bigquery(Box::new(conn), config))
        }
        #[allow(unreachable_patterns)]
        other => Err(Error::config(format!(
            "this build of idem has no {} support",
            other.as_str()
        ))),
    }
}

pub(super) async fn query(
    conn: &Conn,
    url: &str,
    name: &str,
    options: &ReportOptions,
) -> Result<Vec<Row>> {
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    let fail = |e: sqlx::Error| {
        let message = e.to_string();
        Error::from_sqlx(
            &redact_url(url),
            &format!("the report query {name}"),
            e,
            message,
        )
    };
    match conn {
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(store) => {
            let pool = store.pool();
            let mut q = sqlx::query(sql(name, Dialect::Sqlite)?)
                .bind(options.since().timestamp_micros())
                .bind(options.until.timestamp_micros())
                .bind(options.job.clone());
            match extra(name, options) {
                // The SQLite window is in microseconds, like its timestamps.
                Some(Extra::Window(v)) => q = q.bind((v * 1e6) as i64),
                Some(Extra::MaxStddev(v)) => q = q.bind(v),
                Some(Extra::KeysSince(t)) => q = q.bind(t.timestamp_micros()),
                None => {}
            }
            let mut conn = pool.acquire().await.map_err(fail)?;
            // The report reads most of the ledger, on several connections at once: map the
            // file rather than copy it page by page into each one's small cache (most of the
            // time went to the kernel without this: 4.8 s of 9.4 over 1 M runs).
            sqlx::query("PRAGMA mmap_size = 1073741824")
                .execute(&mut *conn)
                .await
                .map_err(fail)?;
            let rows = q.fetch_all(&mut *conn).await.map_err(fail)?;
            Ok(rows.iter().map(cells).collect())
        }
        #[cfg(feature = "postgres")]
        Conn::Postgres(pool) => {
            let mut q = sqlx::query(sql(name, Dialect::Postgres)?)
                .bind(options.since())
                .bind(options.until)
                .bind(options.job.clone());
            match extra(name, options) {
                Some(Extra::Window(v) | Extra::MaxStddev(v)) => q = q.bind(v),
                Some(Extra::KeysSince(t)) => q = q.bind(t),
                None => {}
            }
            let rows = q.fetch_all(pool).await.map_err(fail)?;
            Ok(rows.iter().map(cells).collect())
        }
        #[cfg(feature = "bigquery")]
        Conn::Bigquery(bq, config) => bigquery_query(bq, config, url, name, options).await,
        // A build without any SQL backend has no `Conn` to match: `connect` never makes one.
        #[allow(unreachable_patterns)]
        _ => unreachable!("no SQL backend in this build"),
    }
}

#[cfg(feature = "bigquery")]
async fn bigquery_query(
    bq: &crate::backend::bigquery::Connection,
    config: &crate::backend::bigquery::BigQueryUrl,
    url: &str,
    name: &str,
    options: &ReportOptions,
) -> Result<Vec<Row>> {
    use crate::backend::bigquery::{field_kind, opt_string, timestamp, Param};
    use gcp_bigquery_client::model::{
        query_parameter_type::QueryParameterType, query_parameter_value::QueryParameterValue,
    };
    let float = |name: &str, v: f64| Param {
        name: Some(name.to_string()),
        parameter_type: Some(QueryParameterType {
            array_type: None,
            struct_types: None,
            r#type: "FLOAT64".to_string(),
        }),
        parameter_value: Some(QueryParameterValue {
            array_values: None,
            struct_values: None,
            value: Some(format!("{v:?}")),
        }),
    };
    // Full-line comments are dropped: the emulator counts `@name` in comments as parameters.
    let text_sql = sql(name, Dialect::BigQuery)?
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("{project}", &config.project)
        .replace("{dataset}", &config.dataset);
    let mut params = vec![
        timestamp("since", options.since()),
        timestamp("until", options.until),
        opt_string("job", options.job.as_deref()),
    ];
    match extra(name, options) {
        Some(Extra::Window(v)) => params.push(float("window_seconds", v)),
        Some(Extra::MaxStddev(v)) => params.push(float("max_stddev", v)),
        Some(Extra::KeysSince(t)) => params.push(timestamp("keys_since", t)),
        None => {}
    }
    let out = bq
        .query(&format!("the report query {name}"), &text_sql, params)
        .await
        .map_err(|e| Error::store(redact_url(url), e))?;
    let mut rows = Vec::new();
    for cells in &out.rows {
        let mut row = Row::new();
        for (field, value) in out.fields.iter().zip(cells) {
            let raw = match value {
                serde_json::Value::Null => None,
                serde_json::Value::String(s) => Some(s.clone()),
                other => Some(other.to_string()),
            };
            let cell = match (raw, field_kind(field)) {
                (None, _) => Cell::Null,
                (Some(s), "INT64") => s.parse().map(Cell::Int).unwrap_or(Cell::Text(s)),
                (Some(s), "FLOAT64" | "NUMERIC" | "BIGNUMERIC") => {
                    s.parse().map(Cell::Float).unwrap_or(Cell::Text(s))
                }
                (Some(s), _) => Cell::Text(s),
            };
            row.insert(field.name.clone(), cell);
        }
        rows.push(row);
    }
    Ok(rows)
}
