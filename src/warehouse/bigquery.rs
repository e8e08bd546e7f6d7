//! BigQuery as a warehouse for the SQL processor.
//!
//! Job SQL uses BigQuery's own named parameters (`@scope`), sent as query parameters,
//! never spliced into the text. Types: `@scope_date` is a `DATE` (compare it with a DATE
//! partition column directly: `WHERE game_date = @scope_date`); every other parameter —
//! `@scope`, `@run_id`, `@trigger` and the job's `[sql.params]` — is a `STRING` (write
//! `DATE(@scope)` or `CAST(@n AS INT64)` where another type is needed).
//!
//! Each statement is one API call (`jobs.query`): the emulator ignores parameters inside
//! multi-statement scripts, so `process` statements run one after another, not in one
//! transaction — write them to be idempotent (`MERGE`, or `DELETE` then `INSERT` of the
//! scope's partition). Table names must be fully qualified (`` `project.dataset.table` ``):
//! the URL's dataset is not a default dataset for job SQL.

use async_trait::async_trait;
use base64::Engine as _;
use serde_json::Value;

use super::{
    bind_values, in_statement, Cell, Dialect, Params, Rows, Statement, Warehouse, WarehouseError,
    WarehouseResult,
};
use crate::backend::bigquery::{
    date, field_kind, parse_timestamp_cell, string, timestamp_text, BigQueryUrl, Connection, Param,
    QueryOutput,
};
use crate::error::{Error, Result};

/// Default limit for one job statement, polling included (BigQuery's own limit is 6 h).
const WAREHOUSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// A BigQuery project the SQL processor runs job SQL in.
#[derive(Debug)]
pub struct BigQueryWarehouse {
    conn: Connection,
    url: crate::backend::RedactedUrl,
}

impl BigQueryWarehouse {
    /// Opens `bigquery://PROJECT/DATASET[?endpoint=…&location=…&timeout=…]` (jobs run and
    /// are billed in PROJECT). Nothing is sent to the API until the first statement.
    pub async fn connect(url: &str) -> Result<Self> {
        let config = BigQueryUrl::parse(url)?;
        let conn = Connection::open(&config, WAREHOUSE_TIMEOUT)
            .await
            .map_err(|e| {
                Error::config(format!(
                    "cannot open warehouse {}: {e}",
                    crate::backend::RedactedUrl::new(url)
                ))
            })?;
        Ok(BigQueryWarehouse {
            conn,
            url: crate::backend::RedactedUrl::new(url),
        })
    }

    /// API calls made so far.
    pub fn api_calls(&self) -> u64 {
        self.conn.calls()
    }
}

/// Typed parameters for a statement: `scope_date` is a DATE, the rest STRING.
fn parameters(statement: &Statement, params: &Params) -> WarehouseResult<Vec<Param>> {
    let values = bind_values(statement, params)?;
    statement
        .params
        .iter()
        .zip(values)
        .map(|(name, value)| {
            if name == "scope_date" {
                let d = crate::model::time::parse_day(value).map_err(|_| {
                    WarehouseError::new(format!("@scope_date {value:?} is not a date"))
                })?;
                Ok(date(name, d))
            } else {
                Ok(string(name, value))
            }
        })
        .collect()
}

/// One cell, typed from its schema field (the API sends every scalar as text).
fn cell(
    field: &gcp_bigquery_client::model::table_field_schema::TableFieldSchema,
    value: &Value,
    repeated_done: bool,
) -> Cell {
    if !repeated_done && field.mode.as_deref() == Some("REPEATED") {
        return match value {
            Value::Array(items) => Cell::Array(
                items
                    .iter()
                    .map(|item| cell(field, item.get("v").unwrap_or(&Value::Null), true))
                    .collect(),
            ),
            // BigQuery has no NULL array: it reads as empty.
            Value::Null => Cell::Array(Vec::new()),
            other => other_cell("ARRAY", other.to_string()),
        };
    }
    let kind = field_kind(field);
    let text = match value {
        Value::Null => return Cell::Null,
        Value::String(s) => s.clone(),
        Value::Object(record) => {
            // STRUCT: {"f": [{"v": …}, …]} in field order.
            let subfields = field.fields.as_deref().unwrap_or_default();
            let cells = record
                .get("f")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            return Cell::Struct(
                subfields
                    .iter()
                    .zip(cells)
                    .map(|(sub, c)| {
                        (
                            sub.name.clone(),
                            cell(sub, c.get("v").unwrap_or(&Value::Null), false),
                        )
                    })
                    .collect(),
            );
        }
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Array(_) => return other_cell(kind, value.to_string()),
    };
    let typed = match kind {
        "INT64" => text.parse::<i64>().ok().map(Cell::Integer),
        "FLOAT64" => match text.as_str() {
            "NaN" => Some(Cell::Real(f64::NAN)),
            "Infinity" => Some(Cell::Real(f64::INFINITY)),
            "-Infinity" => Some(Cell::Real(f64::NEG_INFINITY)),
            t => t.parse::<f64>().ok().map(Cell::Real),
        },
        // Exact decimals stay text so no digit is lost.
        "NUMERIC" | "BIGNUMERIC" => Some(Cell::Numeric(text.clone())),
        "BOOL" => match text.as_str() {
            "true" => Some(Cell::Bool(true)),
            "false" => Some(Cell::Bool(false)),
            _ => None,
        },
        "STRING" => Some(Cell::Text(text.clone())),
        "BYTES" => base64::engine::general_purpose::STANDARD
            .decode(&text)
            .ok()
            .map(Cell::Blob),
        "DATE" => Some(Cell::Date(text.clone())),
        "TIME" => Some(Cell::Time(text.clone())),
        "DATETIME" => Some(Cell::DateTime(text.clone())),
        "TIMESTAMP" => parse_timestamp_cell(&text).map(|t| Cell::Timestamp(timestamp_text(t))),
        "JSON" => Some(Cell::Json(text.clone())),
        // GEOGRAPHY, INTERVAL, RANGE: BigQuery's own text under the type's name.
        _ => None,
    };
    typed.unwrap_or_else(|| other_cell(kind, text))
}

fn other_cell(kind: &str, text: String) -> Cell {
    Cell::Other {
        type_name: kind.to_lowercase(),
        bytes: text.into_bytes(),
    }
}

fn rows(out: &QueryOutput) -> Rows {
    Rows {
        columns: out.fields.iter().map(|f| f.name.clone()).collect(),
        rows: out
            .rows
            .iter()
            .map(|cells| {
                out.fields
                    .iter()
                    .zip(cells)
                    .map(|(field, value)| cell(field, value, false))
                    .collect()
            })
            .collect(),
    }
}

#[async_trait]
impl Warehouse for BigQueryWarehouse {
    fn dialect(&self) -> Dialect {
        Dialect::BigQuery
    }

    fn location(&self) -> String {
        self.url.to_string()
    }

    async fn execute(&self, statements: &[Statement], params: &Params) -> WarehouseResult<u64> {
        let mut affected = 0;
        for (n, statement) in statements.iter().enumerate() {
            let values = parameters(statement, params)?;
            let out = self
                .conn
                .query("warehouse.execute", &statement.sql, values)
                .await
                .map_err(|e| in_statement(n, statements.len())(WarehouseError::from(e)))?;
            affected = out.affected.unwrap_or(0);
        }
        Ok(affected)
    }

    async fn query_rows(&self, statement: &Statement, params: &Params) -> WarehouseResult<Rows> {
        let values = parameters(statement, params)?;
        let out = self
            .conn
            .query("warehouse.query", &statement.sql, values)
            .await?;
        Ok(rows(&out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gcp_bigquery_client::model::field_type::FieldType;
    use gcp_bigquery_client::model::table_field_schema::TableFieldSchema;
    use serde_json::json;

    #[test]
    fn cells_are_typed_from_the_schema() {
        let mut tags = TableFieldSchema::new("tags", FieldType::String);
        tags.mode = Some("REPEATED".into());
        let out = QueryOutput {
            fields: vec![
                TableFieldSchema::new("n", FieldType::Integer),
                TableFieldSchema::new("f", FieldType::Float),
                TableFieldSchema::new("b", FieldType::Boolean),
                TableFieldSchema::new("ts", FieldType::Timestamp),
                TableFieldSchema::new("j", FieldType::Json),
                TableFieldSchema::new("num", FieldType::Numeric),
                TableFieldSchema::record(
                    "s",
                    vec![
                        TableFieldSchema::new("a", FieldType::Integer),
                        TableFieldSchema::new("b", FieldType::String),
                    ],
                ),
                tags,
                TableFieldSchema::new("d", FieldType::Date),
                TableFieldSchema::new("nul", FieldType::String),
            ],
            rows: vec![vec![
                json!("42"),
                json!("2.5"),
                json!("true"),
                json!("1714979289123456"),
                json!("{\"q\":[1,2]}"),
                json!("1.500"),
                json!({"f": [{"v": "1"}, {"v": "x"}]}),
                json!([{"v": "x"}, {"v": "y"}]),
                json!("2025-11-18"),
                Value::Null,
            ]],
            affected: None,
        };
        assert_eq!(
            rows(&out).to_objects(),
            vec![json!({
                "n": 42, "f": 2.5, "b": true, "ts": "2024-05-06T07:08:09.123456Z",
                "j": {"q": [1, 2]}, "num": "1.500", "s": {"a": 1, "b": "x"},
                "tags": ["x", "y"], "d": "2025-11-18", "nul": null
            })]
        );
    }

    #[test]
    fn content_rows_keep_every_column_and_type() {
        let field = |name: &str, ty: FieldType| TableFieldSchema::new(name, ty);
        let out = QueryOutput {
            fields: vec![
                field("v", FieldType::Numeric),
                field("v", FieldType::String),
                field("f", FieldType::Float),
                field("by", FieldType::Bytes),
                field("g", FieldType::Geography),
            ],
            rows: vec![
                vec![
                    json!("1.5"),
                    json!("1.5"),
                    json!("NaN"),
                    json!("YWI="),
                    json!("POINT(1 2)"),
                ],
                vec![
                    json!("NaN"),
                    json!("NaN"),
                    json!("-Infinity"),
                    Value::Null,
                    Value::Null,
                ],
                vec![json!("1"), json!("ab"), json!("inf"), json!(""), json!("x")],
            ],
            affected: None,
        };
        let got = rows(&out);
        assert_eq!(got.columns, vec!["v", "v", "f", "by", "g"]);
        assert_eq!(
            got.canonical(),
            vec![
                json!([
                    ["numeric", "1.5"],
                    ["text", "1.5"],
                    ["real", "NaN"],
                    ["blob", "6162"],
                    ["other", "geography", "504f494e542831203229"]
                ]),
                json!([
                    ["numeric", "NaN"],
                    ["text", "NaN"],
                    ["real", "-Infinity"],
                    null,
                    null
                ]),
                json!([
                    ["numeric", "1"],
                    ["text", "ab"],
                    ["real", "Infinity"],
                    ["blob", ""],
                    ["other", "geography", "78"]
                ]),
            ]
        );
    }

    #[test]
    fn scope_date_is_a_date_parameter() {
        let s =
            &crate::backend::prepare("SELECT @scope, @scope_date", Dialect::BigQuery).unwrap()[0];
        let mut params = Params::new();
        params.insert("scope".into(), "2025-11-18".into());
        params.insert("scope_date".into(), "2025-11-18".into());
        let p = parameters(s, &params).unwrap();
        let types: Vec<_> = p
            .iter()
            .map(|p| p.parameter_type.as_ref().unwrap().r#type.clone())
            .collect();
        assert_eq!(types, vec!["STRING", "DATE"]);
        params.remove("scope");
        assert!(parameters(s, &params)
            .unwrap_err()
            .message
            .contains("unknown parameter @scope"));
    }
}
