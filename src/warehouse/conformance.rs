//! The conformance suite every warehouse must pass.
//!
//! Plain `pub async fn`s taking a warehouse; each dialect's tests call every one of them
//! directly (see `tests/it/warehouse.rs`). They assert (panic) on a difference. The checks
//! that create a table take its name from the caller (BigQuery needs it fully qualified,
//! `` `project.dataset.table` ``) and drop it at the end.

use super::{prepare, Cell, Dialect, Params, Rows, Statement, Warehouse, WarehouseError};

/// Quotes, statement separators, comment markers, placeholders of every dialect and
/// unicode: a value that would break any SQL it was spliced into.
pub const ODD_TEXT: &str =
    "it's; \"q\" -- DROP TABLE processing_runs; /* ?1 $1 @scope */ — ünïcødé 🎉";

fn params(pairs: &[(&str, &str)]) -> Params {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn one(w: &dyn Warehouse, sql: &str) -> Statement {
    let mut statements = prepare(sql, w.dialect()).expect("the check's SQL scans");
    assert_eq!(statements.len(), 1, "{sql}");
    statements.remove(0)
}

fn script(w: &dyn Warehouse, sql: &str) -> Vec<Statement> {
    prepare(sql, w.dialect()).expect("the check's SQL scans")
}

async fn rows(w: &dyn Warehouse, sql: &str, params: &Params) -> Rows {
    w.query_rows(&one(w, sql), params)
        .await
        .unwrap_or_else(|e| panic!("{} {sql}: {e}", w.dialect()))
}

/// Parameter values are bound, never spliced: any text comes back byte for byte, a name
/// used twice is one value, and a value compares like an untyped literal (`@d` equals a
/// date where the dialect has dates; on BigQuery `@scope_date` is the DATE parameter).
pub async fn binds_values_like_untyped_literals(w: &dyn Warehouse) {
    let p = params(&[
        ("s", ODD_TEXT),
        ("d", "2025-11-18"),
        ("scope_date", "2025-11-18"),
    ]);
    let got = rows(w, "SELECT @s AS a, @s AS b", &p).await;
    assert_eq!(got.columns, ["a", "b"]);
    assert_eq!(
        got.rows,
        vec![vec![
            Cell::Text(ODD_TEXT.into()),
            Cell::Text(ODD_TEXT.into())
        ]],
        "{}: the text round-trips",
        w.dialect()
    );
    let (sql, same) = match w.dialect() {
        Dialect::Sqlite => ("SELECT ('2025-11-18' = @d) AS same", Cell::Integer(1)),
        Dialect::Postgres => ("SELECT (DATE '2025-11-18' = @d) AS same", Cell::Bool(true)),
        Dialect::BigQuery => (
            "SELECT (DATE '2025-11-18' = @scope_date) AS same",
            Cell::Bool(true),
        ),
    };
    let got = rows(w, sql, &p).await;
    assert_eq!(got.rows, vec![vec![same]], "{}: {sql}", w.dialect());
}

/// A statement using a parameter nobody gave fails before it runs, naming the parameter
/// and the known ones.
pub async fn an_unknown_parameter_is_named(w: &dyn Warehouse) {
    let err = w
        .query_rows(&one(w, "SELECT @nope AS x"), &params(&[("a", "1")]))
        .await
        .expect_err("an unknown parameter is an error");
    assert!(
        err.message.contains("@nope") && err.message.contains("known: @a"),
        "{}: {err}",
        w.dialect()
    );
}

/// Columns come back named and in order, and the common types decode to their cells:
/// integer, float, text, bytes, NULL (and a boolean where the dialect has one).
pub async fn decodes_common_types(w: &dyn Warehouse) {
    let (sql, flag) = match w.dialect() {
        Dialect::Sqlite => (
            "SELECT 1 AS i, 1.5 AS r, 'x' AS t, x'6162' AS b, NULL AS n, 1 AS flag",
            Cell::Integer(1),
        ),
        Dialect::Postgres => (
            "SELECT 1::int8 AS i, 1.5::float8 AS r, 'x'::text AS t, '\\x6162'::bytea AS b, \
             NULL::int AS n, true AS flag",
            Cell::Bool(true),
        ),
        Dialect::BigQuery => (
            "SELECT 1 AS i, CAST(1.5 AS FLOAT64) AS r, 'x' AS t, b'ab' AS b, \
             CAST(NULL AS INT64) AS n, true AS flag",
            Cell::Bool(true),
        ),
    };
    let got = rows(w, sql, &Params::new()).await;
    assert_eq!(got.columns, ["i", "r", "t", "b", "n", "flag"], "{sql}");
    assert_eq!(
        got.rows,
        vec![vec![
            Cell::Integer(1),
            Cell::Real(1.5),
            Cell::Text("x".into()),
            Cell::Blob(b"ab".to_vec()),
            Cell::Null,
            flag,
        ]],
        "{}: {sql}",
        w.dialect()
    );
    let none = rows(
        w,
        &format!("SELECT * FROM ({sql}) AS q WHERE 1 = 0"),
        &Params::new(),
    )
    .await;
    assert!(none.rows.is_empty(), "{}: no rows", w.dialect());
}

/// `execute` runs a script in order and returns the rows the last statement affected; a
/// failing statement is an error naming it (`statement 2 of 2`) that keeps the driver's
/// error as its source; where the dialect has transactions (SQLite, Postgres) the
/// statements before it are rolled back, on BigQuery (one call per statement) they stay.
/// `table` is a fresh table name the check creates and drops.
pub async fn execute_counts_the_last_statement_and_a_failure_rolls_back(
    w: &dyn Warehouse,
    table: &str,
) {
    let text = if w.dialect() == Dialect::BigQuery {
        "STRING"
    } else {
        "TEXT"
    };
    let none = Params::new();
    w.execute(
        &script(w, &format!("CREATE TABLE {table} (v {text})")),
        &none,
    )
    .await
    .unwrap_or_else(|e| panic!("create {table}: {e}"));
    let p = params(&[("s", ODD_TEXT)]);
    let affected = w
        .execute(
            &script(
                w,
                &format!(
                    "INSERT INTO {table} (v) VALUES ('a'), ('b'); INSERT INTO {table} (v) VALUES (@s)"
                ),
            ),
            &p,
        )
        .await
        .unwrap_or_else(|e| panic!("insert into {table}: {e}"));
    assert_eq!(affected, 1, "{}: the last statement's rows", w.dialect());

    let missing = format!("{}_missing", table.trim_end_matches('`'));
    let missing = if table.ends_with('`') {
        format!("{missing}`")
    } else {
        missing
    };
    let err: WarehouseError = w
        .execute(
            &script(
                w,
                &format!(
                    "INSERT INTO {table} (v) VALUES (@s); INSERT INTO {missing} (v) VALUES (@s)"
                ),
            ),
            &p,
        )
        .await
        .expect_err("a missing table fails the script");
    assert!(
        err.message.starts_with("statement 2 of 2: "),
        "{}: {err}",
        w.dialect()
    );
    assert!(
        err.source.is_some(),
        "{}: the driver's error is kept",
        w.dialect()
    );
    let kept = w.dialect() == Dialect::BigQuery;
    let got = rows(
        w,
        &format!("SELECT v FROM {table} WHERE v = @s"),
        &params(&[("s", ODD_TEXT)]),
    )
    .await;
    assert_eq!(
        got.rows.len(),
        if kept { 2 } else { 1 },
        "{}: the first statement of the failed script {}",
        w.dialect(),
        if kept { "stays" } else { "is rolled back" }
    );
    w.execute(&script(w, &format!("DROP TABLE {table}")), &none)
        .await
        .unwrap_or_else(|e| panic!("drop {table}: {e}"));
}

/// A query the database rejects is an error with the database's message and the
/// driver's error as its source.
pub async fn a_rejected_query_keeps_the_driver_error(w: &dyn Warehouse) {
    let err = w
        .query_rows(
            &one(w, "SELECT no_such_column FROM no_such_table_idem"),
            &Params::new(),
        )
        .await
        .expect_err("the query is rejected");
    assert!(!err.message.is_empty());
    let source = std::error::Error::source(&err).expect("the driver's error is the source");
    assert!(
        err.message.contains(&source.to_string()),
        "{}: the message carries the driver's: {err} / {source}",
        w.dialect()
    );
}
