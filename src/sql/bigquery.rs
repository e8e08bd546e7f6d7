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
use serde_json::{Map, Value};

use super::{bind_values, Dialect, Params, Statement, Warehouse};
use crate::error::{Error, Result};
use crate::store::bigquery::{
    date, field_kind, parse_timestamp_cell, string, timestamp_text, BigQueryUrl, Connection, Param,
    QueryOutput,
};

/// Default limit for one job statement, polling included (BigQuery's own limit is 6 h).
const WAREHOUSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// A BigQuery project the SQL processor runs job SQL in.
#[derive(Debug)]
pub struct BigQueryWarehouse {
    conn: Connection,
    url: String,
}

impl BigQueryWarehouse {
    /// Opens `bigquery://PROJECT/DATASET[?endpoint=…&location=…&timeout=…]` (jobs run and
    /// are billed in PROJECT). Nothing is sent to the API until the first statement.
    pub async fn connect(url: &str) -> Result<Self> {
        let config = BigQueryUrl::parse(url)?;
        let conn = Connection::open(&config, WAREHOUSE_TIMEOUT)
            .await
            .map_err(|e| Error::config(format!("cannot open warehouse {url}: {e}")))?;
        Ok(BigQueryWarehouse {
            conn,
            url: url.to_string(),
        })
    }

    /// API calls made so far.
    pub fn api_calls(&self) -> u64 {
        self.conn.calls()
    }
}

/// Typed parameters for a statement: `scope_date` is a DATE, the rest STRING.
fn parameters(statement: &Statement, params: &Params) -> std::result::Result<Vec<Param>, String> {
    let values = bind_values(statement, params)?;
    statement
        .params
        .iter()
        .zip(values)
        .map(|(name, value)| {
            if name == "scope_date" {
                let d = chrono::NaiveDate::parse_from_str(value, "%Y-%m-%d")
                    .map_err(|_| format!("@scope_date {value:?} is not a date"))?;
                Ok(date(name, d))
            } else {
                Ok(string(name, value))
            }
        })
        .collect()
}

/// One cell as JSON, typed from its schema field.
fn cell_to_json(
    field: &gcp_bigquery_client::model::table_field_schema::TableFieldSchema,
    cell: &Value,
    repeated_done: bool,
) -> Value {
    if !repeated_done && field.mode.as_deref() == Some("REPEATED") {
        return match cell {
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|item| cell_to_json(field, item.get("v").unwrap_or(&Value::Null), true))
                    .collect(),
            ),
            Value::Null => Value::Array(Vec::new()),
            other => other.clone(),
        };
    }
    let text = match cell {
        Value::Null => return Value::Null,
        Value::String(s) => s.as_str(),
        Value::Object(record) => {
            // STRUCT: {"f": [{"v": …}, …]} in field order.
            let subfields = field.fields.as_deref().unwrap_or_default();
            let cells = record
                .get("f")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let mut map = Map::new();
            for (sub, c) in subfields.iter().zip(cells) {
                let v = c.get("v").cloned().unwrap_or(Value::Null);
                map.insert(sub.name.clone(), cell_to_json(sub, &v, false));
            }
            return Value::Object(map);
        }
        other => return other.clone(),
    };
    match field_kind(field) {
        "INT64" => text
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::from(text)),
        "FLOAT64" => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .unwrap_or_else(|| Value::from(text)),
        "BOOL" => match text {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            other => Value::from(other),
        },
        "TIMESTAMP" => parse_timestamp_cell(text)
            .map(|t| Value::from(timestamp_text(t)))
            .unwrap_or_else(|| Value::from(text)),
        "JSON" => serde_json::from_str(text).unwrap_or_else(|_| Value::from(text)),
        // NUMERIC and BIGNUMERIC stay text so no digit is lost; DATE, TIME, DATETIME,
        // BYTES (base64), GEOGRAPHY and INTERVAL are text in BigQuery's own format.
        _ => Value::from(text),
    }
}

fn rows_to_json(out: &QueryOutput) -> Vec<Value> {
    out.rows
        .iter()
        .map(|cells| {
            let mut map = Map::new();
            for (field, cell) in out.fields.iter().zip(cells) {
                map.insert(field.name.clone(), cell_to_json(field, cell, false));
            }
            Value::Object(map)
        })
        .collect()
}

#[async_trait]
impl Warehouse for BigQueryWarehouse {
    fn dialect(&self) -> Dialect {
        Dialect::BigQuery
    }

    fn describe(&self) -> String {
        self.url.clone()
    }

    async fn execute(&self, statements: &[Statement], params: &Params) -> Result<u64, String> {
        let mut affected = 0;
        for (n, statement) in statements.iter().enumerate() {
            let values = parameters(statement, params)?;
            let out = self
                .conn
                .query("warehouse.execute", &statement.sql, values)
                .await
                .map_err(|e| format!("statement {} of {}: {e}", n + 1, statements.len()))?;
            affected = out.affected.unwrap_or(0);
        }
        Ok(affected)
    }

    async fn query(&self, statement: &Statement, params: &Params) -> Result<Vec<Value>, String> {
        let values = parameters(statement, params)?;
        let out = self
            .conn
            .query("warehouse.query", &statement.sql, values)
            .await
            .map_err(|e| e.to_string())?;
        Ok(rows_to_json(&out))
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
            rows_to_json(&out),
            vec![json!({
                "n": 42, "f": 2.5, "b": true, "ts": "2024-05-06T07:08:09.123456Z",
                "j": {"q": [1, 2]}, "num": "1.500", "s": {"a": 1, "b": "x"},
                "tags": ["x", "y"], "d": "2025-11-18", "nul": null
            })]
        );
    }

    #[test]
    fn scope_date_is_a_date_parameter() {
        let s = &crate::sql::prepare("SELECT @scope, @scope_date", Dialect::BigQuery).unwrap()[0];
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
            .contains("unknown parameter @scope"));
    }
}
