//! `bigquery://PROJECT/DATASET[?…]` URLs: parsing and validation.

use std::time::Duration;

use percent_encoding::percent_decode_str;
use url::{Position, Url};

use crate::error::{Error, Result};

/// Environment variable naming an emulator endpoint (`http://127.0.0.1:PORT`), used when
/// the URL has no `endpoint` parameter.
pub const ENDPOINT_ENV: &str = "IDEM_BIGQUERY_ENDPOINT";

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

/// `s` with its percent-escapes decoded (for messages and ids; never fails).
fn decoded(s: &str) -> String {
    percent_decode_str(s).decode_utf8_lossy().into_owned()
}

impl BigQueryUrl {
    /// Parses and validates a store or warehouse URL. The endpoint falls back to
    /// [`ENDPOINT_ENV`].
    pub fn parse(raw_url: &str) -> Result<Self> {
        let usage = "expected bigquery://PROJECT/DATASET[?endpoint=http://HOST:PORT&location=US&partition_expiration_days=N&timeout=5m]";
        // Messages show the URL without its secrets (a password, a token parameter).
        let shown = crate::backend::RedactedUrl::new(raw_url);
        let url = &shown;
        let bad = || Error::config(format!("bad bigquery url {url:?}: {usage}"));
        let parsed_url = Url::parse(raw_url).map_err(|_| bad())?;
        if parsed_url.scheme() != "bigquery" || !raw_url.starts_with("bigquery://") {
            return Err(bad());
        }
        // The authority as written (user, password and port included, so that anything
        // but a plain project id is reported as one) and the path without its slashes.
        let raw_project = &parsed_url[Position::BeforeUsername..Position::AfterPort];
        let project = decoded(raw_project);
        // Shown in a message: a password written where the project id goes is not.
        let shown_project = crate::backend::redact_url(&format!("bigquery://{project}"))
            ["bigquery://".len()..]
            .to_string();
        let (_, dataset) = parsed_url
            .path()
            .trim_end_matches('/')
            .split_once('/')
            .filter(|(root, dataset)| root.is_empty() && !dataset.is_empty())
            .ok_or_else(bad)?;
        let raw_dataset = dataset;
        let dataset = decoded(dataset);
        // Ids are validated as sent (an escape is never part of one) and reported decoded.
        if !valid_id(raw_project, true) {
            return Err(Error::config(format!(
                "bad bigquery url {url:?}: project id {shown_project:?} may only contain letters, digits, '-' and '_'"
            )));
        }
        if !valid_id(raw_dataset, false) {
            return Err(Error::config(format!(
                "bad bigquery url {url:?}: dataset id {dataset:?} may only contain letters, digits and '_'"
            )));
        }
        let mut parsed = BigQueryUrl {
            project,
            dataset,
            endpoint: None,
            location: None,
            partition_expiration_days: None,
            timeout: None,
        };
        for (key, value) in parsed_url.query_pairs() {
            let value = value.into_owned();
            match key.as_ref() {
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
