//! BigQuery REST plumbing shared by [`BigQueryStore`](super::BigQueryStore) and the SQL
//! processor's [`BigQueryWarehouse`](crate::warehouse::BigQueryWarehouse): the URL, credentials,
//! typed query parameters, and [`Connection::query`], the one function every statement goes
//! through.
//!
//! `query` is where "never a silent empty result" is enforced. BigQuery reports a failed
//! statement in two shapes: an HTTP error status with a Google error body (real BigQuery
//! for SQL errors; both for REST resource errors), or HTTP 200 with a top-level `errors`
//! array (what the local emulator does for SQL errors). Both become an [`ApiError`], as do
//! transport failures, timeouts, credential problems and bodies that are not BigQuery JSON.
//! A job that is still running when `jobs.query` returns is polled to completion, and
//! results longer than one page are fetched page by page, so a caller only ever sees all
//! rows or an error.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use gcp_bigquery_client::auth::Authenticator;
use gcp_bigquery_client::error::BQError;
use gcp_bigquery_client::model::data_format_options::DataFormatOptions;
use gcp_bigquery_client::model::error_proto::ErrorProto;
use gcp_bigquery_client::model::field_type::FieldType;
use gcp_bigquery_client::model::get_query_results_parameters::GetQueryResultsParameters;
use gcp_bigquery_client::model::query_parameter::QueryParameter;
use gcp_bigquery_client::model::query_parameter_type::QueryParameterType;
use gcp_bigquery_client::model::query_parameter_type_struct_types::QueryParameterTypeStructTypes;
use gcp_bigquery_client::model::query_parameter_value::QueryParameterValue;
use gcp_bigquery_client::model::query_request::QueryRequest;
use gcp_bigquery_client::model::table_field_schema::TableFieldSchema;
use gcp_bigquery_client::model::table_row::TableRow;
use gcp_bigquery_client::Client;
use serde_json::Value;

use crate::error::{Error, Result};

/// Environment variable naming an emulator endpoint (`http://127.0.0.1:PORT`), used when
/// the URL has no `endpoint` parameter.
pub const ENDPOINT_ENV: &str = "IDEM_BIGQUERY_ENDPOINT";

/// How long BigQuery may hold one `jobs.query` / `getQueryResults` call before answering
/// "not complete yet" (we then poll again).
const SERVER_WAIT_MS: i32 = 10_000;
/// Client-side limit for one HTTP call (the server answers within `SERVER_WAIT_MS`).
const HTTP_CALL_LIMIT: Duration = Duration::from_secs(60);

/// A parsed `bigquery://PROJECT/DATASET[?endpoint=…&location=…&partition_expiration_days=N&timeout=…]`.
#[derive(Debug, Clone, PartialEq)]
pub struct BigQueryUrl {
    /// The project: where jobs run and are billed, and the tables' project.
    pub project: String,
    /// The dataset holding idem's tables (the store) or the default dataset (warehouse).
    pub dataset: String,
    /// Emulator endpoint (`http://host:port`); `None` = Google's API with real credentials.
    pub endpoint: Option<String>,
    /// Location for the dataset and jobs (`US`, `EU`, `europe-west1`, …).
    pub location: Option<String>,
    /// Partition expiration applied to the partitioned tables by `migrate`.
    pub partition_expiration_days: Option<u32>,
    /// Longest wait for one statement, polling included.
    pub timeout: Option<Duration>,
}

fn valid_id(s: &str, allow_dash: bool) -> bool {
    !s.is_empty()
        && s.len() <= 1024
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || (allow_dash && b == b'-'))
}

fn percent_decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| Error::config(format!("bad percent-escape in {s:?}")))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| Error::config(format!("{s:?} is not UTF-8 once decoded")))
}

impl BigQueryUrl {
    /// Parses and validates a store or warehouse URL. The endpoint falls back to
    /// [`ENDPOINT_ENV`].
    pub fn parse(url: &str) -> Result<Self> {
        let usage = "expected bigquery://PROJECT/DATASET[?endpoint=http://HOST:PORT&location=US&partition_expiration_days=N&timeout=5m]";
        let rest = url
            .strip_prefix("bigquery://")
            .ok_or_else(|| Error::config(format!("bad bigquery url {url:?}: {usage}")))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (project, dataset) = path
            .trim_end_matches('/')
            .split_once('/')
            .ok_or_else(|| Error::config(format!("bad bigquery url {url:?}: {usage}")))?;
        if !valid_id(project, true) {
            return Err(Error::config(format!(
                "bad bigquery url {url:?}: project id {project:?} may only contain letters, digits, '-' and '_'"
            )));
        }
        if !valid_id(dataset, false) {
            return Err(Error::config(format!(
                "bad bigquery url {url:?}: dataset id {dataset:?} may only contain letters, digits and '_'"
            )));
        }
        let mut parsed = BigQueryUrl {
            project: project.to_string(),
            dataset: dataset.to_string(),
            endpoint: None,
            location: None,
            partition_expiration_days: None,
            timeout: None,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value)?;
            match key {
                "endpoint" => parsed.endpoint = Some(value),
                "location" => {
                    if !valid_id(&value, true) {
                        return Err(Error::config(format!(
                            "bad bigquery url {url:?}: location {value:?} may only contain letters, digits and '-'"
                        )));
                    }
                    parsed.location = Some(value);
                }
                "partition_expiration_days" => {
                    let days: u32 = value.parse().ok().filter(|d| (1..=36_500).contains(d)).ok_or_else(|| {
                        Error::config(format!(
                            "bad bigquery url {url:?}: partition_expiration_days must be a whole number of days from 1 to 36500, got {value:?}"
                        ))
                    })?;
                    parsed.partition_expiration_days = Some(days);
                }
                "timeout" => {
                    let t = crate::model::duration::parse_duration(&value).map_err(|e| {
                        Error::config(format!("bad bigquery url {url:?}: timeout: {e}"))
                    })?;
                    parsed.timeout = Some(t.max(Duration::from_secs(1)));
                }
                other => {
                    return Err(Error::config(format!(
                        "bad bigquery url {url:?}: unknown parameter {other:?} (known: endpoint, location, partition_expiration_days, timeout)"
                    )))
                }
            }
        }
        if parsed.endpoint.is_none() {
            parsed.endpoint = std::env::var(ENDPOINT_ENV)
                .ok()
                .filter(|e| !e.trim().is_empty());
        }
        if let Some(e) = &mut parsed.endpoint {
            let trimmed = e.trim().trim_end_matches('/').to_string();
            if !(trimmed.starts_with("http://") || trimmed.starts_with("https://")) {
                return Err(Error::config(format!(
                    "bad bigquery endpoint {trimmed:?} (from the url or {ENDPOINT_ENV}): expected http://HOST:PORT"
                )));
            }
            *e = trimmed;
        }
        Ok(parsed)
    }

    /// `` `project.dataset.table` `` (identifiers were validated by [`BigQueryUrl::parse`]).
    pub fn table(&self, table: &str) -> String {
        format!("`{}.{}.{table}`", self.project, self.dataset)
    }
}

/// How a BigQuery call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorShape {
    /// An HTTP error status with a Google error body.
    Http(u16),
    /// HTTP 200, but the response lists `errors` (the emulator's shape for SQL errors).
    QueryErrors,
    /// No answer: connection refused, reset, DNS.
    Transport,
    /// No answer in time.
    Timeout,
    /// Credentials could not be obtained.
    Auth,
    /// An answer that is not what the BigQuery API returns.
    BadResponse,
}

/// A failed BigQuery call, with what BigQuery said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// What idem was doing (`find_keys`, `claim.take`, `warehouse.execute`, …).
    pub operation: String,
    /// How it failed.
    pub shape: ErrorShape,
    /// BigQuery's reason code (`invalidQuery`, `notFound`, `accessDenied`, …).
    pub reason: Option<String>,
    /// BigQuery's message.
    pub message: String,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reason = self
            .reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        match &self.shape {
            ErrorShape::Http(status) => write!(
                f,
                "bigquery {} failed: HTTP {status}{reason}: {}",
                self.operation, self.message
            ),
            ErrorShape::QueryErrors => write!(
                f,
                "bigquery {} failed: the query returned errors{reason}: {}",
                self.operation, self.message
            ),
            ErrorShape::Transport => write!(
                f,
                "bigquery {} failed: no answer from the API: {}",
                self.operation, self.message
            ),
            ErrorShape::Timeout => write!(f, "bigquery {} timed out: {}", self.operation, self.message),
            ErrorShape::Auth => write!(
                f,
                "bigquery {} failed: no usable Google credentials: {} (use Application Default Credentials: set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, run `gcloud auth application-default login`, or run on GCP; for an emulator add ?endpoint=http://HOST:PORT or set {ENDPOINT_ENV})",
                self.operation, self.message
            ),
            ErrorShape::BadResponse => write!(
                f,
                "bigquery {} failed: unexpected answer from the API: {}",
                self.operation, self.message
            ),
        }
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    /// An error of `shape` for `operation`.
    pub fn new(
        operation: impl Into<String>,
        shape: ErrorShape,
        reason: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            operation: operation.into(),
            shape,
            reason: reason.map(str::to_string),
            message: message.into(),
        }
    }

    /// The error real BigQuery returns when a mutating DML statement loses to a concurrent
    /// one on the same table (HTTP 400, `invalidQuery`, "Could not serialize access to
    /// table … due to concurrent update"). For tests: the emulator serialises DML and never
    /// produces it.
    pub fn concurrent_update(operation: impl Into<String>, table: &str) -> Self {
        ApiError::new(
            operation,
            ErrorShape::Http(400),
            Some("invalidQuery"),
            format!("Could not serialize access to table {table} due to concurrent update"),
        )
    }

    /// True for BigQuery's concurrent-update conflicts ("Could not serialize access to table
    /// … due to concurrent update", "Transaction is aborted due to concurrent update against
    /// table …"): the statement did not commit; another one on the same table did.
    pub fn is_concurrent_update(&self) -> bool {
        let m = self.message.to_ascii_lowercase();
        m.contains("due to concurrent update") || m.contains("could not serialize access")
    }

    /// True when BigQuery could not be reached or could not answer now (no answer, a
    /// timeout, credentials, an answer that is not BigQuery's, HTTP 5xx or 429, or the
    /// `backendError`/`internalError`/`rateLimitExceeded` reasons); false when it answered
    /// and refused the statement.
    pub fn is_outage(&self) -> bool {
        match self.shape {
            ErrorShape::Transport
            | ErrorShape::Timeout
            | ErrorShape::Auth
            | ErrorShape::BadResponse => true,
            ErrorShape::Http(status) if status >= 500 || status == 429 => true,
            ErrorShape::Http(_) | ErrorShape::QueryErrors => matches!(
                self.reason.as_deref(),
                Some("backendError" | "internalError" | "rateLimitExceeded")
            ),
        }
    }

    /// True for `notFound` answers (HTTP 404 or the reason).
    pub fn is_not_found(&self) -> bool {
        self.shape == ErrorShape::Http(404) || self.reason.as_deref() == Some("notFound")
    }

    /// True when a created resource already exists (HTTP 409 `duplicate`).
    pub fn is_already_exists(&self) -> bool {
        self.shape == ErrorShape::Http(409)
            || self.reason.as_deref() == Some("duplicate")
            || self.message.contains("Already Exists")
    }

    fn from_bq(operation: &str, e: BQError) -> Self {
        match e {
            BQError::ResponseError { error } => {
                let reason = error
                    .error
                    .errors
                    .first()
                    .and_then(|e| e.get("reason"))
                    .map(String::as_str);
                let status = u16::try_from(error.error.code).unwrap_or(0);
                ApiError::new(
                    operation,
                    ErrorShape::Http(status),
                    reason,
                    error.error.message,
                )
            }
            BQError::RequestError(e) => {
                let shape = if e.is_timeout() {
                    ErrorShape::Timeout
                } else if e.is_decode() {
                    ErrorShape::BadResponse
                } else {
                    ErrorShape::Transport
                };
                let mut message = e.to_string();
                if e.is_decode() {
                    message = format!(
                        "the response body is not a BigQuery API answer{} ({message})",
                        e.status()
                            .map(|s| format!(" (HTTP {})", s.as_u16()))
                            .unwrap_or_default()
                    );
                }
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    message.push_str(&format!(": {s}"));
                    source = s.source();
                }
                ApiError::new(operation, shape, None, message)
            }
            BQError::SerializationError(e) => {
                ApiError::new(operation, ErrorShape::BadResponse, None, e.to_string())
            }
            e @ (BQError::AuthError(_)
            | BQError::YupAuthError(_)
            | BQError::NoToken
            | BQError::InvalidServiceAccountKey(_)
            | BQError::InvalidServiceAccountAuthenticator(_)
            | BQError::InvalidApplicationDefaultCredentialsAuthenticator(_)
            | BQError::InvalidAuthorizedUserAuthenticator(_)
            | BQError::InvalidInstalledFlowAuthenticator(_)) => {
                ApiError::new(operation, ErrorShape::Auth, None, e.to_string())
            }
            other => ApiError::new(operation, ErrorShape::Transport, None, other.to_string()),
        }
    }

    fn from_protos(operation: &str, errors: &[ErrorProto]) -> Self {
        let first = &errors[0];
        let mut message = first
            .message
            .clone()
            .unwrap_or_else(|| "(no message)".to_string());
        if let Some(location) = first.location.as_deref().filter(|l| !l.is_empty()) {
            message.push_str(&format!(" [at {location}]"));
        }
        if errors.len() > 1 {
            message.push_str(&format!(" (and {} more error(s))", errors.len() - 1));
        }
        ApiError::new(
            operation,
            ErrorShape::QueryErrors,
            first.reason.as_deref(),
            message,
        )
    }
}

/// A future a fault hook returns: `Some(error)` replaces the call's answer.
pub type FaultFuture = Pin<Box<dyn Future<Output = Option<ApiError>> + Send>>;

/// A test seam: called with the operation name before every query; it may do anything
/// (for example make a competing claim) and may return an error to report instead of
/// running the statement. The emulator cannot produce real concurrent-update conflicts,
/// so tests inject them through this hook.
pub type FaultHook = Arc<dyn Fn(&str) -> FaultFuture + Send + Sync>;

/// Credentials for an emulator: any token will do.
#[derive(Clone)]
struct EmulatorAuthenticator;

#[async_trait]
impl Authenticator for EmulatorAuthenticator {
    async fn access_token(&self) -> std::result::Result<String, BQError> {
        Ok("idem-emulator".to_string())
    }
}

/// A query parameter (re-exported so tests and callers need not name the crate's model).
pub type Param = QueryParameter;

fn scalar(name: &str, ty: &str, value: Option<String>) -> Param {
    QueryParameter {
        name: Some(name.to_string()),
        parameter_type: Some(QueryParameterType {
            array_type: None,
            struct_types: None,
            r#type: ty.to_string(),
        }),
        parameter_value: Some(QueryParameterValue {
            array_values: None,
            struct_values: None,
            value,
        }),
    }
}

/// A STRING parameter.
pub fn string(name: &str, value: &str) -> Param {
    scalar(name, "STRING", Some(value.to_string()))
}

/// A STRING parameter that may be NULL.
pub fn opt_string(name: &str, value: Option<&str>) -> Param {
    scalar(name, "STRING", value.map(str::to_string))
}

/// An INT64 parameter.
pub fn int64(name: &str, value: i64) -> Param {
    scalar(name, "INT64", Some(value.to_string()))
}

/// An INT64 parameter that may be NULL.
pub fn opt_int64(name: &str, value: Option<i64>) -> Param {
    scalar(name, "INT64", value.map(|v| v.to_string()))
}

/// RFC 3339 in UTC with microseconds and a `Z` (without an offset the emulator reads a
/// DATETIME).
pub fn timestamp_text(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// A TIMESTAMP parameter.
pub fn timestamp(name: &str, value: DateTime<Utc>) -> Param {
    scalar(name, "TIMESTAMP", Some(timestamp_text(value)))
}

/// A DATE parameter.
pub fn date(name: &str, value: NaiveDate) -> Param {
    scalar(name, "DATE", Some(value.format("%Y-%m-%d").to_string()))
}

/// An `ARRAY<STRING>` parameter.
pub fn string_array(name: &str, values: &[String]) -> Param {
    QueryParameter {
        name: Some(name.to_string()),
        parameter_type: Some(QueryParameterType {
            array_type: Some(Box::new(QueryParameterType {
                array_type: None,
                struct_types: None,
                r#type: "STRING".into(),
            })),
            struct_types: None,
            r#type: "ARRAY".into(),
        }),
        parameter_value: Some(QueryParameterValue {
            array_values: Some(
                values
                    .iter()
                    .map(|v| QueryParameterValue {
                        array_values: None,
                        struct_values: None,
                        value: Some(v.clone()),
                    })
                    .collect(),
            ),
            struct_values: None,
            value: None,
        }),
    }
}

/// An `ARRAY<STRUCT<…>>` parameter: `fields` are (name, scalar type); each row gives one
/// value per field (`None` = NULL). Read it with `FROM UNNEST(@name) AS r` and `r.field`.
pub fn struct_array(name: &str, fields: &[(&str, &str)], rows: Vec<Vec<Option<String>>>) -> Param {
    let struct_types = fields
        .iter()
        .map(|(field, ty)| QueryParameterTypeStructTypes {
            description: None,
            name: Some(field.to_string()),
            r#type: Some(QueryParameterType {
                array_type: None,
                struct_types: None,
                r#type: ty.to_string(),
            }),
        })
        .collect();
    let values = rows
        .into_iter()
        .map(|row| QueryParameterValue {
            array_values: None,
            struct_values: Some(
                fields
                    .iter()
                    .zip(row)
                    .map(|((field, _), value)| {
                        (
                            field.to_string(),
                            QueryParameterValue {
                                array_values: None,
                                struct_values: None,
                                value,
                            },
                        )
                    })
                    .collect(),
            ),
            value: None,
        })
        .collect();
    QueryParameter {
        name: Some(name.to_string()),
        parameter_type: Some(QueryParameterType {
            array_type: Some(Box::new(QueryParameterType {
                array_type: None,
                struct_types: Some(struct_types),
                r#type: "STRUCT".into(),
            })),
            struct_types: None,
            r#type: "ARRAY".into(),
        }),
        parameter_value: Some(QueryParameterValue {
            array_values: Some(values),
            struct_values: None,
            value: None,
        }),
    }
}

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
        let s = self.str(name)?;
        parse_timestamp_cell(&s).ok_or_else(|| format!("column {name:?}: {s:?} is not a TIMESTAMP"))
    }

    /// A DATE that must not be NULL.
    pub fn date(&self, name: &str) -> std::result::Result<NaiveDate, String> {
        let s = self.str(name)?;
        NaiveDate::parse_from_str(&s, "%Y-%m-%d")
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
    let secs: f64 = s.parse().ok()?;
    DateTime::from_timestamp_micros((secs * 1e6).round() as i64)
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

fn unwrap_cells(row: TableRow) -> Vec<Value> {
    row.columns
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.value.unwrap_or(Value::Null))
        .collect()
}

/// A client bound to one project (and location), with the query helper.
pub struct Connection {
    client: Client,
    project: String,
    location: Option<String>,
    timeout: Duration,
    endpoint: Option<String>,
    fault: Option<FaultHook>,
    calls: AtomicU64,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("project", &self.project)
            .field("location", &self.location)
            .field("endpoint", &self.endpoint)
            .field("timeout", &self.timeout)
            .field("fault_hook", &self.fault.is_some())
            .finish()
    }
}

impl Connection {
    /// A client for `url`: with an endpoint, no credentials (emulator); without one,
    /// Application Default Credentials (`GOOGLE_APPLICATION_CREDENTIALS` service-account
    /// or authorized-user file, gcloud's ADC file, or the GCP metadata server). Nothing is
    /// sent to the API here; credential problems show up on the first call.
    pub async fn open(
        url: &BigQueryUrl,
        default_timeout: Duration,
    ) -> std::result::Result<Self, ApiError> {
        let client = match &url.endpoint {
            Some(endpoint) => gcp_bigquery_client::client_builder::ClientBuilder::new()
                .with_v2_base_url(format!("{endpoint}/bigquery/v2"))
                .build_from_authenticator(Arc::new(EmulatorAuthenticator))
                .await
                .map_err(|e| ApiError::from_bq("connect", e))?,
            None => {
                let adc = tokio::time::timeout(
                    HTTP_CALL_LIMIT,
                    Client::from_application_default_credentials(),
                )
                .await
                .map_err(|_| {
                    ApiError::new(
                        "connect",
                        ErrorShape::Auth,
                        None,
                        "loading Application Default Credentials took too long",
                    )
                })?;
                adc.map_err(|e| {
                    let mut err = ApiError::from_bq("connect", e);
                    err.shape = ErrorShape::Auth;
                    err
                })?
            }
        };
        Ok(Connection {
            client,
            project: url.project.clone(),
            location: url.location.clone(),
            timeout: url.timeout.unwrap_or(default_timeout),
            endpoint: url.endpoint.clone(),
            fault: None,
            calls: AtomicU64::new(0),
        })
    }

    /// Installs a fault hook (tests).
    pub fn set_fault_hook(&mut self, hook: FaultHook) {
        self.fault = Some(hook);
    }

    /// The underlying client (REST resources: datasets, tables).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The project jobs run in.
    pub fn project(&self) -> &str {
        &self.project
    }

    /// The configured location.
    pub fn location(&self) -> Option<&str> {
        self.location.as_deref()
    }

    /// API calls made so far (each statement counts once, however many pages or polls).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Runs a REST call under the per-call limit, mapping its error.
    pub async fn rest<T>(
        &self,
        operation: &str,
        call: impl Future<Output = std::result::Result<T, BQError>>,
    ) -> std::result::Result<T, ApiError> {
        match tokio::time::timeout(HTTP_CALL_LIMIT.min(self.timeout), call).await {
            Ok(result) => result.map_err(|e| ApiError::from_bq(operation, e)),
            Err(_) => Err(ApiError::new(
                operation,
                ErrorShape::Timeout,
                None,
                format!("no answer within {:?}", HTTP_CALL_LIMIT.min(self.timeout)),
            )),
        }
    }

    async fn bounded<T>(
        &self,
        operation: &str,
        deadline: Instant,
        call: impl Future<Output = std::result::Result<T, BQError>>,
    ) -> std::result::Result<T, ApiError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let limit = left.min(HTTP_CALL_LIMIT);
        match tokio::time::timeout(limit, call).await {
            Ok(result) => result.map_err(|e| ApiError::from_bq(operation, e)),
            Err(_) => Err(ApiError::new(
                operation,
                ErrorShape::Timeout,
                None,
                format!(
                    "no complete answer within {:?} (the job may still be running in BigQuery)",
                    self.timeout
                ),
            )),
        }
    }

    /// Runs one GoogleSQL statement with named parameters and returns its complete answer,
    /// or an [`ApiError`] for every kind of failure (see the module docs).
    pub async fn query(
        &self,
        operation: &str,
        sql: &str,
        params: Vec<Param>,
    ) -> std::result::Result<QueryOutput, ApiError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Some(hook) = &self.fault {
            if let Some(err) = hook(operation).await {
                return Err(err);
            }
        }
        let deadline = Instant::now() + self.timeout;
        let format = DataFormatOptions {
            use_int64_timestamp: Some(true),
        };
        let mut request = QueryRequest::new(sql);
        request.use_legacy_sql = false;
        request.location = self.location.clone();
        request.timeout_ms = Some(SERVER_WAIT_MS);
        request.format_options = Some(format.clone());
        if !params.is_empty() {
            request.parameter_mode = Some("NAMED".into());
            request.query_parameters = Some(params);
        }
        let response = self
            .bounded(
                operation,
                deadline,
                self.client.job().query(&self.project, request),
            )
            .await?;
        if let Some(errors) = response.errors.as_deref().filter(|e| !e.is_empty()) {
            return Err(ApiError::from_protos(operation, errors));
        }
        let mut out = QueryOutput {
            fields: response.schema.and_then(|s| s.fields).unwrap_or_default(),
            rows: response
                .rows
                .unwrap_or_default()
                .into_iter()
                .map(unwrap_cells)
                .collect(),
            affected: response
                .num_dml_affected_rows
                .as_deref()
                .and_then(|n| n.parse().ok()),
        };
        let mut complete = response.job_complete.unwrap_or(false);
        let mut page_token = response.page_token;
        let job = response.job_reference;
        while !complete || page_token.is_some() {
            let job_id = job.as_ref().and_then(|j| j.job_id.clone()).ok_or_else(|| {
                ApiError::new(
                    operation,
                    ErrorShape::BadResponse,
                    None,
                    "an unfinished or paged query answer has no job id",
                )
            })?;
            let location = job
                .as_ref()
                .and_then(|j| j.location.clone())
                .or_else(|| self.location.clone());
            let parameters = GetQueryResultsParameters {
                format_options: Some(format.clone()),
                location,
                max_results: None,
                page_token: if complete { page_token.clone() } else { None },
                start_index: None,
                timeout_ms: Some(SERVER_WAIT_MS),
            };
            let page = self
                .bounded(
                    operation,
                    deadline,
                    self.client
                        .job()
                        .get_query_results(&self.project, &job_id, parameters),
                )
                .await?;
            if let Some(errors) = page.errors.as_deref().filter(|e| !e.is_empty()) {
                return Err(ApiError::from_protos(operation, errors));
            }
            if !complete {
                if !page.job_complete.unwrap_or(false) {
                    if Instant::now() >= deadline {
                        return Err(ApiError::new(
                            operation,
                            ErrorShape::Timeout,
                            None,
                            format!(
                                "job {job_id} not complete within {:?} (it may still be running in BigQuery)",
                                self.timeout
                            ),
                        ));
                    }
                    continue;
                }
                complete = true;
                out.fields = page.schema.and_then(|s| s.fields).unwrap_or_default();
                out.affected = page
                    .num_dml_affected_rows
                    .as_deref()
                    .and_then(|n| n.parse().ok());
                out.rows = Vec::new();
            }
            out.rows
                .extend(page.rows.unwrap_or_default().into_iter().map(unwrap_cells));
            page_token = page.page_token;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls_and_validates_identifiers() {
        let u = BigQueryUrl::parse(
            "bigquery://my-proj/my_ds?endpoint=http://127.0.0.1:9050/&location=EU&partition_expiration_days=30&timeout=2m",
        )
        .unwrap();
        assert_eq!(u.project, "my-proj");
        assert_eq!(u.dataset, "my_ds");
        assert_eq!(u.endpoint.as_deref(), Some("http://127.0.0.1:9050"));
        assert_eq!(u.location.as_deref(), Some("EU"));
        assert_eq!(u.partition_expiration_days, Some(30));
        assert_eq!(u.timeout, Some(Duration::from_secs(120)));
        assert_eq!(
            u.table("processing_keys"),
            "`my-proj.my_ds.processing_keys`"
        );
        let enc = BigQueryUrl::parse("bigquery://p/d?endpoint=http%3A%2F%2Fh%3A1").unwrap();
        assert_eq!(enc.endpoint.as_deref(), Some("http://h:1"));

        for (bad, needle) in [
            ("bigquery://p", "expected bigquery://PROJECT/DATASET"),
            ("bigquery://p`x/d", "project id"),
            ("bigquery://p/d-x", "dataset id"),
            ("bigquery://p/d`; DROP", "dataset id"),
            ("bigquery://p/d?locaton=EU", "unknown parameter \"locaton\""),
            (
                "bigquery://p/d?partition_expiration_days=0",
                "partition_expiration_days",
            ),
            (
                "bigquery://p/d?endpoint=ftp://x",
                "expected http://HOST:PORT",
            ),
            ("bigquery://p/d?location=us'", "location"),
            ("postgres://p/d", "expected bigquery://"),
        ] {
            let e = BigQueryUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn conflicts_are_recognised() {
        assert!(ApiError::concurrent_update("claim.take", "p:d.t").is_concurrent_update());
        let tx = ApiError::new(
            "x",
            ErrorShape::Http(400),
            Some("invalidQuery"),
            "Query error: Transaction is aborted due to concurrent update against table p:d.t",
        );
        assert!(tx.is_concurrent_update());
        let other = ApiError::new(
            "x",
            ErrorShape::QueryErrors,
            Some("invalidQuery"),
            "Syntax error",
        );
        assert!(!other.is_concurrent_update());
    }

    #[test]
    fn error_messages_say_what_failed() {
        let e = ApiError::new(
            "find_keys",
            ErrorShape::QueryErrors,
            Some("notFound"),
            "Not found: Table p.d.processing_keys",
        );
        assert_eq!(
            e.to_string(),
            "bigquery find_keys failed: the query returned errors (notFound): Not found: Table p.d.processing_keys"
        );
        let h = ApiError::new(
            "runs",
            ErrorShape::Http(403),
            Some("accessDenied"),
            "Access Denied",
        );
        assert_eq!(
            h.to_string(),
            "bigquery runs failed: HTTP 403 (accessDenied): Access Denied"
        );
        let a = ApiError::new("connect", ErrorShape::Auth, None, "no token");
        assert!(a.to_string().contains("GOOGLE_APPLICATION_CREDENTIALS"));
    }

    #[test]
    fn timestamps_are_rfc3339_with_z_and_cells_parse_both_formats() {
        let t = DateTime::from_timestamp_micros(1_714_979_289_123_456).unwrap();
        assert_eq!(timestamp_text(t), "2024-05-06T07:08:09.123456Z");
        assert_eq!(parse_timestamp_cell("1714979289123456"), Some(t));
        assert_eq!(parse_timestamp_cell("1.714979289123456E9"), Some(t));
        assert_eq!(parse_timestamp_cell("x"), None);
    }
}
