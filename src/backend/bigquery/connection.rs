//! [`Connection`]: a client bound to one project, and [`Connection::query`], the one
//! function every statement goes through, and [`Connection::rest`], the one every REST
//! resource call (tables, datasets) goes through.
//!
//! Both retry what BigQuery says may be tried again, so every caller (the store's
//! statements and startup checks, a warehouse's job SQL, reports) gets the same rules:
//!
//! * **A quota or rate-limit answer** ([`ApiError::is_quota`]: a table's DML queue is full,
//!   `rateLimitExceeded`, `quotaExceeded`, HTTP 429): the call did nothing; it is made
//!   again as [`QUOTA_RETRIES`] says. A statement is re-sent with a new `requestId`.
//! * **No usable answer** ([`ApiError::is_transient`]: no answer, HTTP 5xx,
//!   `backendError`): the call is made again as [`OUTAGE_RETRIES`] says. A statement may
//!   have run, so it is re-sent with the same `requestId`: BigQuery answers a re-sent
//!   request with the first one's job instead of running it twice.
//! * **Once BigQuery has given a statement a job id**, it is never sent again: a failed
//!   poll (`getQueryResults`: a rate limit, 5xx, no answer) is made again with the same
//!   job id until the statement's deadline; the job's own failure is its answer.
//!
//! Whether to send a statement again after a concurrent-update conflict (a new statement
//! then, not a re-send) depends on the statement, and is the store's decision.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gcp_bigquery_client::auth::Authenticator;
use gcp_bigquery_client::error::BQError;
use gcp_bigquery_client::model::data_format_options::DataFormatOptions;
use gcp_bigquery_client::model::get_query_results_parameters::GetQueryResultsParameters;
use gcp_bigquery_client::model::query_request::QueryRequest;
use gcp_bigquery_client::Client;

use super::decode::unwrap_cells;
use super::{ApiError, BigQueryUrl, ErrorShape, Param, QueryOutput};
use crate::backend::retry::Backoff;

/// How long BigQuery may hold one `jobs.query` / `getQueryResults` call before answering
/// "not complete yet" (we then poll again).
const SERVER_WAIT_MS: i32 = 10_000;
/// How long BigQuery may hold a call when idem waits `left` more for the statement: three
/// quarters of it, at most [`SERVER_WAIT_MS`]. The answer then comes before idem gives up,
/// with the job's id when the statement is not done (so idem can cancel it).
fn server_wait(left: Duration) -> i32 {
    i32::try_from(left.as_millis() * 3 / 4)
        .unwrap_or(SERVER_WAIT_MS)
        .min(SERVER_WAIT_MS)
}
/// Client-side limit for one HTTP call (the server answers within `SERVER_WAIT_MS`).
const HTTP_CALL_LIMIT: Duration = Duration::from_secs(60);

/// A call BigQuery refused for a quota (a statement's table has its DML queue full: "Too
/// many DML statements outstanding against table …"; a rate limit on API requests) did
/// nothing, so it is made again after a random pause that doubles from 0.2 s up to 6.4 s
/// (plus up to 1 s): 40 times in all, about 4 minutes, then reported as a quota error
/// (never as BigQuery being unavailable). A full queue holds 20 statements of about a
/// second each, so trying much more often only spends API calls.
pub const QUOTA_RETRIES: Backoff = Backoff {
    attempts: 40,
    base: Duration::from_millis(200),
    jitter: Duration::from_secs(1),
};

/// A call that got no usable answer (no answer at all, HTTP 5xx, `backendError`,
/// `internalError`) is made again after a random pause that doubles from 0.5 s (plus up
/// to 0.5 s): 5 times in all, about 10 s, then reported as BigQuery unavailable. A
/// statement is re-sent with the same `requestId`, so one that ran is not run again.
pub const OUTAGE_RETRIES: Backoff = Backoff {
    attempts: 5,
    base: Duration::from_millis(500),
    jitter: Duration::from_millis(500),
};

/// A poll (`getQueryResults`) that failed (a rate limit, HTTP 5xx, no answer) is made
/// again for the same job after a random pause that doubles from 0.2 s up to 6.4 s (plus
/// up to 0.5 s), until the statement's deadline; one that gets no usable answer
/// [`POLL_OUTAGES`] times in a row is reported as BigQuery unavailable.
const POLL_RETRY: Backoff = Backoff {
    attempts: u32::MAX,
    base: Duration::from_millis(200),
    jitter: Duration::from_millis(500),
};

/// Polls in a row that got no usable answer before the statement is reported as BigQuery
/// unavailable (about 2 minutes of [`POLL_RETRY`] pauses).
const POLL_OUTAGES: u32 = 20;

/// A future a fault hook returns: `Some(error)` replaces the call's answer.
pub type FaultFuture = Pin<Box<dyn Future<Output = Option<ApiError>> + Send>>;

/// A test seam: called with the operation name before every send of a statement (a
/// re-send too); it may do anything (for example make a competing claim) and may return
/// an error to report instead of running the statement (retried as that error would be). The emulator cannot produce real concurrent-update conflicts,
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

/// Cancels a query job (`jobs.cancel`) when dropped while `client` is set: the query
/// future of an interrupted run was dropped before its job completed, or idem gave up
/// waiting for the job (no answer within the store's timeout, polls failing for good).
/// Left running, such a job still commits: a claim would take the lease for a run that
/// has given up, holding its scope for the lease's whole TTL. The cancel is sent in the
/// background ([`crate::backend::send_cancel`]); the runner waits for it. BigQuery
/// cancels on a best-effort basis (a job about to commit may still commit), so this only
/// narrows the window. A future dropped during the first `jobs.query` call cannot
/// cancel: the job id is not known yet.
struct CancelJobOnDrop {
    client: Option<Client>,
    project: String,
    job_id: String,
    location: Option<String>,
    /// What the log lines call the job: "interrupted", or "abandoned" once idem gave up.
    why: &'static str,
}

impl Drop for CancelJobOnDrop {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let (project, job_id, location, why) = (
            std::mem::take(&mut self.project),
            std::mem::take(&mut self.job_id),
            self.location.take(),
            self.why,
        );
        crate::backend::send_cancel(async move {
            let cancel = client
                .job()
                .cancel_job(&project, &job_id, location.as_deref());
            match tokio::time::timeout(Duration::from_secs(5), cancel).await {
                Ok(Ok(_)) => tracing::info!("cancelled the {why} BigQuery job {job_id}"),
                Ok(Err(e)) => {
                    tracing::warn!("could not cancel the {why} BigQuery job {job_id}: {e}")
                }
                Err(_) => tracing::warn!(
                    "could not cancel the {why} BigQuery job {job_id}: no answer within 5s"
                ),
            }
        });
    }
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

    /// Statements sent so far (`jobs.query` calls: a re-send counts again; pages and polls
    /// do not).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Runs a REST call (`call()` makes it; it is called again for each attempt) under
    /// the per-call limit, mapping its error; rate limits and calls without a usable
    /// answer are made again (see the module docs).
    pub async fn rest<T, F, Fut>(
        &self,
        operation: &str,
        call: F,
    ) -> std::result::Result<T, ApiError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = std::result::Result<T, BQError>>,
    {
        let mut tries = Tries::new();
        loop {
            let limit = HTTP_CALL_LIMIT.min(self.timeout);
            let e = match tokio::time::timeout(limit, call()).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) => ApiError::from_bq(operation, e),
                Err(_) => ApiError::new(
                    operation,
                    ErrorShape::Timeout,
                    None,
                    format!("no answer within {limit:?}"),
                ),
            };
            match tries.again(&e) {
                Some(pause) => {
                    tracing::debug!("{e}; calling again in {pause:?}");
                    tokio::time::sleep(pause).await;
                }
                None => return Err(tries.report(e)),
            }
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
    /// or an [`ApiError`] for every kind of failure (see the module docs). A quota answer
    /// and a send without a usable answer are sent again; the `requestId` is made once and
    /// kept across re-sends after no usable answer (so BigQuery runs the statement once),
    /// and made anew after a quota answer (the statement did not run).
    pub async fn query(
        &self,
        operation: &str,
        sql: &str,
        params: Vec<Param>,
    ) -> std::result::Result<QueryOutput, ApiError> {
        self.query_until(operation, sql, params, None).await
    }

    /// [`query`](Self::query), with quota answers waited out only while the pause before
    /// the next send ends before `quota_deadline` (tokio's clock): a caller that waits out
    /// quota answers for a budget of its own, across several calls, gives each call what
    /// is left of it, so that the budget holds whatever the pauses' jitter was.
    pub async fn query_until(
        &self,
        operation: &str,
        sql: &str,
        params: Vec<Param>,
        quota_deadline: Option<tokio::time::Instant>,
    ) -> std::result::Result<QueryOutput, ApiError> {
        let mut request = QueryRequest::new(sql);
        request.use_legacy_sql = false;
        request.location = self.location.clone();
        request.format_options = Some(DataFormatOptions {
            use_int64_timestamp: Some(true),
        });
        if !params.is_empty() {
            request.parameter_mode = Some("NAMED".into());
            request.query_parameters = Some(params);
        }
        request.request_id = Some(uuid::Uuid::new_v4().to_string());
        let mut tries = Tries::new();
        tries.quota_deadline = quota_deadline;
        loop {
            let e = match self.send(operation, &request).await {
                Ok(out) => return Ok(out),
                Err(Sent::Before(e)) => e,
                // BigQuery gave it a job id: never sent again.
                Err(Sent::After(e)) => {
                    let unknown = job_state_unknown(&e);
                    let mut e = tries.report(e);
                    e.outcome_unknown = unknown;
                    return Err(e);
                }
            };
            match tries.again(&e) {
                Some(pause) => {
                    if e.is_quota() {
                        // Refused, so not run: a new request (BigQuery could answer a
                        // re-sent one with the refusal).
                        request.request_id = Some(uuid::Uuid::new_v4().to_string());
                    }
                    tracing::debug!("{e}; sending it again in {pause:?}");
                    tokio::time::sleep(pause).await;
                }
                None => return Err(tries.report(e)),
            }
        }
    }

    /// Sends the statement once (`jobs.query`) and polls its job to completion.
    async fn send(
        &self,
        operation: &str,
        request: &QueryRequest,
    ) -> std::result::Result<QueryOutput, Sent> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Some(hook) = &self.fault {
            if let Some(err) = hook(operation).await {
                return Err(Sent::Before(err));
            }
        }
        let deadline = Instant::now() + self.timeout;
        // BigQuery answers "not complete" with the job's id before idem stops waiting, so a
        // statement it gives up on can be cancelled.
        let mut request = request.clone();
        request.timeout_ms = Some(server_wait(self.timeout));
        let response = self
            .bounded(
                operation,
                deadline,
                self.client.job().query(&self.project, request),
            )
            .await
            .map_err(Sent::Before)?;
        if let Some(errors) = response.errors.as_deref().filter(|e| !e.is_empty()) {
            return Err(Sent::Before(ApiError::from_protos(operation, errors)));
        }
        let out = QueryOutput {
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
        let complete = response.job_complete.unwrap_or(false);
        let page_token = response.page_token;
        let job = response.job_reference;
        // From here the job has an id: if this future is dropped before the job completes
        // (an interrupted run), the job is cancelled in BigQuery rather than left running.
        let mut cancel = job
            .as_ref()
            .and_then(|j| j.job_id.clone())
            .filter(|_| !complete)
            .map(|job_id| CancelJobOnDrop {
                client: Some(self.client.clone()),
                project: self.project.clone(),
                location: job
                    .as_ref()
                    .and_then(|j| j.location.clone())
                    .or_else(|| self.location.clone()),
                job_id,
                why: "interrupted",
            });
        let polled = self
            .poll(operation, deadline, job, complete, page_token, out)
            .await;
        if let Some(cancel) = &mut cancel {
            match &polled {
                // Given up on, its state unknown: cancelled as this returns (issue 35).
                Err(e) if job_state_unknown(e) => cancel.why = "abandoned",
                // Done, or failed by itself: nothing to cancel.
                _ => cancel.client = None,
            }
        }
        polled.map_err(Sent::After)
    }

    /// Polls an unfinished query job until it completes, and reads the pages after the
    /// first.
    #[allow(clippy::too_many_arguments)]
    async fn poll(
        &self,
        operation: &str,
        deadline: Instant,
        job: Option<gcp_bigquery_client::model::job_reference::JobReference>,
        mut complete: bool,
        mut page_token: Option<String>,
        mut out: QueryOutput,
    ) -> std::result::Result<QueryOutput, ApiError> {
        // Failed polls in a row, and those of them without a usable answer.
        let (mut polls_failed, mut outages) = (0u32, 0u32);
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
            // No `formatOptions` here: the client sends these parameters as a URL query
            // string, which cannot hold that nested object (the request fails to build:
            // "builder error: unsupported value"). Timestamps then come as seconds in
            // scientific notation, which `parse_timestamp_cell` reads exactly.
            let parameters = GetQueryResultsParameters {
                format_options: None,
                location,
                max_results: None,
                page_token: if complete { page_token.clone() } else { None },
                start_index: None,
                timeout_ms: Some(server_wait(
                    deadline.saturating_duration_since(Instant::now()),
                )),
            };
            let page = match self
                .bounded(
                    operation,
                    deadline,
                    self.client
                        .job()
                        .get_query_results(&self.project, &job_id, parameters),
                )
                .await
            {
                Ok(page) => {
                    outages = 0;
                    page
                }
                // The poll failed, not the job: poll again, never send the statement again.
                Err(e)
                    if (e.is_rate_limit()
                        || (outages + 1 < POLL_OUTAGES
                            && (e.is_transient() || e.shape == ErrorShape::Timeout)))
                        && Instant::now() < deadline =>
                {
                    if !e.is_rate_limit() {
                        outages += 1;
                    }
                    let pause = POLL_RETRY
                        .pause(polls_failed)
                        .min(deadline.saturating_duration_since(Instant::now()));
                    polls_failed += 1;
                    tracing::debug!("{e}; polling job {job_id} again in {pause:?}");
                    tokio::time::sleep(pause).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            polls_failed = 0;
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
                                "job {job_id} not complete within {:?} (idem asks BigQuery to cancel it)",
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

/// Whether a poll that ended in `e` left its job's state unknown (no answer in time, or
/// none usable: [`ApiError::is_transient`]; polls refused for a rate limit), rather than
/// reporting the job's own failure: such a job may still be queued or running.
fn job_state_unknown(e: &ApiError) -> bool {
    e.shape == ErrorShape::Timeout || e.is_transient() || e.is_rate_limit()
}

/// How one send of a statement failed.
enum Sent {
    /// Before BigQuery gave it a job id: the `jobs.query` call failed or answered with
    /// errors (it may be sent again).
    Before(ApiError),
    /// Afterwards: a poll failed for good, or the job failed (never sent again).
    After(ApiError),
}

/// The attempts of one call so far: whether, and after what pause, a failed one is made
/// again, and its error once no attempt is left.
struct Tries {
    quota: u32,
    outage: u32,
    started: Instant,
    /// No quota answer is waited out past this (`None`: only [`QUOTA_RETRIES`]' count).
    quota_deadline: Option<tokio::time::Instant>,
}

impl Tries {
    fn new() -> Self {
        Tries {
            quota: 0,
            outage: 0,
            started: Instant::now(),
            quota_deadline: None,
        }
    }

    /// The pause before making the call again after `e`, or `None` when it is not made
    /// again.
    fn again(&mut self, e: &ApiError) -> Option<Duration> {
        if e.is_quota() && !e.is_concurrent_update() {
            if self.quota + 1 >= QUOTA_RETRIES.attempts {
                return None;
            }
            let pause = QUOTA_RETRIES.pause(self.quota);
            if self
                .quota_deadline
                .is_some_and(|d| tokio::time::Instant::now() + pause >= d)
            {
                return None;
            }
            self.quota += 1;
            return Some(pause);
        }
        if e.is_transient() && !e.is_concurrent_update() {
            if self.outage + 1 >= OUTAGE_RETRIES.attempts {
                return None;
            }
            self.outage += 1;
            return Some(OUTAGE_RETRIES.pause(self.outage - 1));
        }
        None
    }

    /// The error to report: a quota error says it is one and how long it was retried; any
    /// other says how often the call was made, when more than once.
    fn report(&self, e: ApiError) -> ApiError {
        let sent = self.quota + self.outage + 1;
        if e.is_quota() {
            e.after_retries("BigQuery quota exceeded", sent, self.started.elapsed())
        } else {
            e.sent(sent, self.started.elapsed())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Quota answers are waited out (40 sends), sends without a usable answer tried a few
    /// times (5), and nothing else is sent again here: a conflict is the store's decision,
    /// a refusal or a timeout is the answer.
    #[test]
    fn what_is_sent_again_and_how_often() {
        let quota = ApiError::dml_queue_full("x", "p:d.t", 20);
        let mut tries = Tries::new();
        for _ in 1..QUOTA_RETRIES.attempts {
            assert!(tries.again(&quota).is_some());
        }
        assert_eq!(tries.again(&quota), None);
        assert!(tries.report(quota).to_string().contains("sent 40 time(s)"));

        let down = ApiError::new("x", ErrorShape::Http(503), Some("backendError"), "down");
        let lost = ApiError::new("x", ErrorShape::Transport, None, "connection reset");
        let mut tries = Tries::new();
        assert!(tries.again(&down).is_some());
        for _ in 2..OUTAGE_RETRIES.attempts {
            assert!(tries.again(&lost).is_some());
        }
        assert_eq!(tries.again(&down), None);
        let e = tries.report(down);
        assert!(e.is_outage() && e.to_string().ends_with("s)"), "{e}");

        for e in [
            ApiError::concurrent_update("x", "p:d.t"),
            ApiError::new("x", ErrorShape::Http(400), Some("invalidQuery"), "syntax"),
            ApiError::new("x", ErrorShape::Timeout, None, "late"),
            ApiError::new("x", ErrorShape::BadResponse, None, "<html>"),
            ApiError::new("x", ErrorShape::Auth, None, "no token"),
        ] {
            assert_eq!(Tries::new().again(&e), None, "{e}");
            assert_eq!(Tries::new().report(e.clone()), e, "sent once: unchanged");
        }
        let limited = ApiError::new("x", ErrorShape::Http(403), Some("rateLimitExceeded"), "");
        assert!(limited.is_rate_limit() && !limited.is_transient());
        // A full DML queue is the statement's answer, not a refused call: a poll never
        // waits it out.
        assert!(!ApiError::dml_queue_full("x", "p:d.t", 20).is_rate_limit());
    }
}
