//! [`ApiError`]: how a BigQuery call failed, from every shape the API (or the emulator)
//! reports a failure in.

use std::fmt;

use gcp_bigquery_client::error::BQError;
use gcp_bigquery_client::model::error_proto::ErrorProto;

use super::ENDPOINT_ENV;

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
    /// How often the statement was sent, and over how long, when more than once (said
    /// after the message).
    pub sent: Option<(u32, std::time::Duration)>,
    /// The statement's job existed, and the error left its outcome unknown (a poll that
    /// got no usable answer, or was refused for a rate limit): it may have committed.
    pub outcome_unknown: bool,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let with_sends;
        let message = match self.sent {
            Some((sends, took)) => {
                with_sends = format!(
                    "{} (sent {sends} time(s) over {:.1}s)",
                    self.message,
                    took.as_secs_f64()
                );
                &with_sends
            }
            None => &self.message,
        };
        let reason = self
            .reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        match &self.shape {
            ErrorShape::Http(status) => write!(
                f,
                "bigquery {} failed: HTTP {status}{reason}: {}",
                self.operation, message
            ),
            ErrorShape::QueryErrors => write!(
                f,
                "bigquery {} failed: the query returned errors{reason}: {}",
                self.operation, message
            ),
            ErrorShape::Transport => write!(
                f,
                "bigquery {} failed: no answer from the API: {}",
                self.operation, message
            ),
            ErrorShape::Timeout => write!(f, "bigquery {} timed out: {}", self.operation, message),
            ErrorShape::Auth => write!(
                f,
                "bigquery {} failed: no usable Google credentials: {} (use Application Default Credentials: set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, run `gcloud auth application-default login`, or run on GCP; for an emulator add ?endpoint=http://HOST:PORT or set {ENDPOINT_ENV})",
                self.operation, message
            ),
            ErrorShape::BadResponse => write!(
                f,
                "bigquery {} failed: unexpected answer from the API: {}",
                self.operation, message
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
            sent: None,
            outcome_unknown: false,
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

    /// The error real BigQuery returns when a table already has as many DML statements
    /// outstanding as it queues (HTTP 400, "Resources exceeded during query execution: Too
    /// many DML statements outstanding against table PROJECT:DATASET.TABLE, limit is 20.";
    /// 100 for INSERTs once a table has taken its 1,500 a day). For tests.
    pub fn dml_queue_full(operation: impl Into<String>, table: &str, limit: u32) -> Self {
        ApiError::new(
            operation,
            ErrorShape::Http(400),
            Some("resourcesExceeded"),
            format!(
                "Resources exceeded during query execution: Too many DML statements outstanding against table {table}, limit is {limit}."
            ),
        )
    }

    /// True for BigQuery's quota and rate-limit answers: a table's DML queue is full ("Too
    /// many DML statements outstanding against table …"), or the `quotaExceeded` /
    /// `rateLimitExceeded` reasons, or HTTP 429. BigQuery answered and is working; the statement did not
    /// run, so it may be sent again later.
    pub fn is_quota(&self) -> bool {
        self.shape == ErrorShape::Http(429)
            || matches!(
                self.reason.as_deref(),
                Some("quotaExceeded" | "rateLimitExceeded")
            )
            || self
                .message
                .to_ascii_lowercase()
                .contains("too many dml statements outstanding")
    }

    /// True for a rate limit on the call itself (HTTP 429, or the `rateLimitExceeded` /
    /// `quotaExceeded` reasons): the request was turned away before doing anything, so the
    /// same call may be made again later. Narrower than [`ApiError::is_quota`]: a full
    /// DML queue is a statement's answer, not a refused call.
    pub fn is_rate_limit(&self) -> bool {
        self.shape == ErrorShape::Http(429)
            || matches!(
                self.reason.as_deref(),
                Some("quotaExceeded" | "rateLimitExceeded")
            )
    }

    /// True when the call got no usable answer and may be made again: no answer at all
    /// (transport), HTTP 5xx, or the `backendError` / `internalError` reasons. Whether
    /// the statement ran is unknown, so a `jobs.query` is sent again only with the same
    /// `requestId` (BigQuery then answers with the first job instead of running it twice).
    /// Timeouts, credentials and answers that are not BigQuery's are not transient.
    pub fn is_transient(&self) -> bool {
        match self.shape {
            ErrorShape::Transport => true,
            ErrorShape::Http(status) if status >= 500 => true,
            ErrorShape::Http(_) | ErrorShape::QueryErrors => matches!(
                self.reason.as_deref(),
                Some("backendError" | "internalError")
            ),
            ErrorShape::Timeout | ErrorShape::Auth | ErrorShape::BadResponse => false,
        }
    }

    /// The error of a statement sent `attempts` times over `took` that failed every time
    /// with this error: the message says what it is (`what`) and, when it was sent more
    /// than once, how long it was retried.
    pub fn after_retries(mut self, what: &str, attempts: u32, took: std::time::Duration) -> Self {
        self.message = format!("{what}: {}", self.message);
        self.sent(attempts, took)
    }

    /// The error of a call made `attempts` times over `took`: the error says so (when
    /// it was made more than once), in place of what an earlier count said.
    pub fn sent(mut self, attempts: u32, took: std::time::Duration) -> Self {
        self.sent = (attempts > 1).then_some((attempts, took));
        self
    }

    /// How often the statement of this error was sent (1 unless [`ApiError::sent`] said).
    pub fn sends(&self) -> u32 {
        self.sent.map_or(1, |(n, _)| n)
    }

    /// True when BigQuery could not be reached or could not answer now (no answer, a
    /// timeout, credentials, an answer that is not BigQuery's, HTTP 5xx, or the
    /// `backendError`/`internalError` reasons); false when it answered and refused the
    /// statement — including quota and rate-limit answers ([`ApiError::is_quota`]) and
    /// concurrent-update conflicts, which say BigQuery is busy, not unreachable.
    pub fn is_outage(&self) -> bool {
        if self.is_quota() || self.is_concurrent_update() {
            return false;
        }
        match self.shape {
            ErrorShape::Transport
            | ErrorShape::Timeout
            | ErrorShape::Auth
            | ErrorShape::BadResponse => true,
            ErrorShape::Http(status) if status >= 500 => true,
            ErrorShape::Http(_) | ErrorShape::QueryErrors => matches!(
                self.reason.as_deref(),
                Some("backendError" | "internalError")
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

    pub(super) fn from_bq(operation: &str, e: BQError) -> Self {
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

    pub(super) fn from_protos(operation: &str, errors: &[ErrorProto]) -> Self {
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
