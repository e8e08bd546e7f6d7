//! Reading a statement's answer: [`QueryOutput`], rows by column name, cell formats.

use chrono::{DateTime, NaiveDate, Utc};
use gcp_bigquery_client::model::field_type::FieldType;
use gcp_bigquery_client::model::table_field_schema::TableFieldSchema;
use gcp_bigquery_client::model::table_row::TableRow;
use serde_json::Value;

use super::{ApiError, ErrorShape};

/// The complete answer to one statement.
#[derive(Debug, Clone, Default)]
pub struct QueryOutput {
    /// Result columns.
    pub fields: Vec<TableFieldSchema>,
    /// Every row (all pages), cells as the API returns them (`{"v": …}` unwrapped).
    pub rows: Vec<Vec<Value>>,
    /// `numDmlAffectedRows`, for DML.
    pub affected: Option<u64>,
}

impl QueryOutput {
    /// Rows affected by a DML statement; an error when BigQuery did not say (never a
    /// silent 0).
    pub fn affected(&self, operation: &str) -> std::result::Result<u64, ApiError> {
        self.affected.ok_or_else(|| {
            ApiError::new(
                operation,
                ErrorShape::BadResponse,
                None,
                "a DML statement's answer has no numDmlAffectedRows",
            )
        })
    }

    /// The index of a result column.
    pub fn column(&self, name: &str) -> std::result::Result<usize, String> {
        self.fields
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| format!("result has no column {name:?}"))
    }

    /// Rows as cell lookups by column name.
    pub fn records(&self) -> impl Iterator<Item = Record<'_>> {
        self.rows
            .iter()
            .map(move |cells| Record { out: self, cells })
    }
}

/// One result row, read by column name.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    out: &'a QueryOutput,
    cells: &'a [Value],
}

impl Record<'_> {
    fn cell(&self, name: &str) -> std::result::Result<&Value, String> {
        let i = self.out.column(name)?;
        self.cells
            .get(i)
            .ok_or_else(|| format!("row has no cell for column {name:?}"))
    }

    /// A nullable STRING (or any scalar, as its text).
    pub fn opt_str(&self, name: &str) -> std::result::Result<Option<String>, String> {
        match self.cell(name)? {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            other => Err(format!("column {name:?}: expected a scalar, got {other}")),
        }
    }

    /// A STRING that must not be NULL.
    pub fn str(&self, name: &str) -> std::result::Result<String, String> {
        self.opt_str(name)?
            .ok_or_else(|| format!("column {name:?} is NULL"))
    }

    /// A nullable INT64.
    pub fn opt_i64(&self, name: &str) -> std::result::Result<Option<i64>, String> {
        self.opt_str(name)?
            .map(|s| {
                s.parse()
                    .map_err(|_| format!("column {name:?}: {s:?} is not an INT64"))
            })
            .transpose()
    }

    /// An INT64 that must not be NULL.
    pub fn i64(&self, name: &str) -> std::result::Result<i64, String> {
        self.opt_i64(name)?
            .ok_or_else(|| format!("column {name:?} is NULL"))
    }

    /// A TIMESTAMP that must not be NULL.
    pub fn timestamp(&self, name: &str) -> std::result::Result<DateTime<Utc>, String> {
        self.opt_timestamp(name)?
            .ok_or_else(|| format!("column {name:?} is NULL"))
    }

    /// A nullable TIMESTAMP.
    pub fn opt_timestamp(&self, name: &str) -> std::result::Result<Option<DateTime<Utc>>, String> {
        self.opt_str(name)?
            .map(|s| {
                parse_timestamp_cell(&s)
                    .ok_or_else(|| format!("column {name:?}: {s:?} is not a TIMESTAMP"))
            })
            .transpose()
    }

    /// A DATE that must not be NULL.
    pub fn date(&self, name: &str) -> std::result::Result<NaiveDate, String> {
        let s = self.str(name)?;
        crate::model::time::parse_day(&s)
            .map_err(|_| format!("column {name:?}: {s:?} is not a DATE"))
    }

    /// A nullable JSON column, parsed.
    pub fn opt_json(&self, name: &str) -> std::result::Result<Option<Value>, String> {
        self.opt_str(name)?
            .map(|s| {
                serde_json::from_str(&s).map_err(|e| format!("column {name:?}: bad JSON: {e}"))
            })
            .transpose()
    }
}

/// A TIMESTAMP cell: integer microseconds (what `useInt64Timestamp` asks for, and what the
/// emulator always sends), or float seconds (BigQuery's default format).
pub fn parse_timestamp_cell(s: &str) -> Option<DateTime<Utc>> {
    if let Ok(micros) = s.parse::<i64>() {
        return DateTime::from_timestamp_micros(micros);
    }
    if let Some(micros) = exact_micros(s) {
        return DateTime::from_timestamp_micros(micros);
    }
    let secs: f64 = s.parse().ok()?;
    DateTime::from_timestamp_micros((secs * 1e6).round() as i64)
}

/// Seconds in decimal or scientific notation (`1.714979289123456E9`, BigQuery's answer
/// without `useInt64Timestamp`) as whole microseconds, exactly (an f64 can be a
/// microsecond off at today's magnitudes); `None` for anything else or sub-microsecond
/// digits that are not zero.
fn exact_micros(s: &str) -> Option<i64> {
    let (negative, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (mantissa, exp) = match s.split_once(['E', 'e']) {
        Some((m, e)) => (m, e.parse::<i32>().ok()?),
        None => (s, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits = format!("{int}{frac}");
    // The decimal point of `digits`, counted from the left, in microseconds.
    let point = int.len() as i32 + exp + 6;
    if point < 0 {
        return digits.bytes().all(|b| b == b'0').then_some(0);
    }
    let point = point as usize;
    let (whole, rest) = if point >= digits.len() {
        (format!("{digits}{}", "0".repeat(point - digits.len())), "")
    } else {
        (digits[..point].to_string(), &digits[point..])
    };
    if !rest.bytes().all(|b| b == b'0') {
        return None;
    }
    let micros: i64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    Some(if negative { -micros } else { micros })
}

/// Whether a schema field is a given type (BigQuery answers with legacy names: INTEGER,
/// FLOAT, BOOLEAN, RECORD).
pub fn field_kind(field: &TableFieldSchema) -> &'static str {
    match field.r#type {
        FieldType::String => "STRING",
        FieldType::Bytes => "BYTES",
        FieldType::Integer | FieldType::Int64 => "INT64",
        FieldType::Float | FieldType::Float64 => "FLOAT64",
        FieldType::Numeric => "NUMERIC",
        FieldType::Bignumeric => "BIGNUMERIC",
        FieldType::Boolean | FieldType::Bool => "BOOL",
        FieldType::Timestamp => "TIMESTAMP",
        FieldType::Date => "DATE",
        FieldType::Time => "TIME",
        FieldType::Datetime => "DATETIME",
        FieldType::Record | FieldType::Struct => "STRUCT",
        FieldType::Geography => "GEOGRAPHY",
        FieldType::Json => "JSON",
        FieldType::Interval => "INTERVAL",
    }
}

pub(super) fn unwrap_cells(row: TableRow) -> Vec<Value> {
    row.columns
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.value.unwrap_or(Value::Null))
        .collect()
}
