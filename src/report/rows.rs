//! A query result row as named cells, and reading figures from it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

/// A cell of a query result.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Cell {
    Null,
    Int(i64),
    Float(f64),
    Text(String),
}

pub(super) type Row = BTreeMap<String, Cell>;

pub(super) fn int(row: &Row, name: &str) -> i64 {
    match row.get(name) {
        Some(Cell::Int(v)) => *v,
        Some(Cell::Float(v)) => *v as i64,
        _ => 0,
    }
}

pub(super) fn float(row: &Row, name: &str) -> Option<f64> {
    match row.get(name) {
        Some(Cell::Int(v)) => Some(*v as f64),
        Some(Cell::Float(v)) => Some(*v),
        _ => None,
    }
}

pub(super) fn text(row: &Row, name: &str) -> Option<String> {
    match row.get(name) {
        Some(Cell::Text(s)) => Some(s.clone()),
        _ => None,
    }
}

pub(super) fn time(row: &Row, name: &str) -> Option<DateTime<Utc>> {
    match row.get(name) {
        Some(Cell::Int(v)) => DateTime::from_timestamp_micros(*v),
        _ => None,
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(super) fn cells<R>(row: &R) -> Row
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> f64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    use sqlx::Column;
    let mut out = Row::new();
    for (i, column) in row.columns().iter().enumerate() {
        let cell = if let Ok(v) = row.try_get::<Option<i64>, _>(i) {
            v.map_or(Cell::Null, Cell::Int)
        } else if let Ok(v) = row.try_get::<Option<f64>, _>(i) {
            v.map_or(Cell::Null, Cell::Float)
        } else if let Ok(v) = row.try_get::<Option<String>, _>(i) {
            v.map_or(Cell::Null, Cell::Text)
        } else {
            Cell::Null
        };
        out.insert(column.name().to_string(), cell);
    }
    out
}

pub(super) fn by_processor(rows: &[Row]) -> BTreeMap<String, &Row> {
    rows.iter()
        .filter_map(|r| text(r, "processor_name").map(|p| (p, r)))
        .collect()
}
