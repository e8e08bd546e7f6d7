//! [`Connection`]: a client bound to one project, and [`Connection::query`], the one
//! function every statement goes through.

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

/// How long BigQuery may hold one `jobs.query` / `getQueryResults` call before answering
/// "not complete yet" (we then poll again).
const SERVER_WAIT_MS: i32 = 10_000;
/// Client-side limit for one HTTP call (the server answers within `SERVER_WAIT_MS`).
const HTTP_CALL_LIMIT: Duration = Duration::from_secs(60);

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

/// Cancels a query job (`jobs.cancel`) when dropped while `client` is set: the query
/// future of an interrupted run was dropped before its job completed. The cancel is sent
/// in the background ([`crate::backend::send_cancel`]); the runner waits for it. A future
/// dropped during the first `jobs.query` call cannot cancel: the job id is not known yet.
struct CancelJobOnDrop {
    client: Option<Client>,
    project: String,
    job_id: String,
    location: Option<String>,
}

impl Drop for CancelJobOnDrop {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let (project, job_id, location) = (
            std::mem::take(&mut self.project),
            std::mem::take(&mut self.job_id),
            self.location.take(),
        );
        crate::backend::send_cancel(async move {
            let cancel = client
                .job()
                .cancel_job(&project, &job_id, location.as_deref());
            match tokio::time::timeout(Duration::from_secs(5), cancel).await {
                Ok(Ok(_)) => tracing::info!("cancelled the interrupted BigQuery job {job_id}"),
                Ok(Err(e)) => {
                    tracing::warn!("could not cancel the interrupted BigQuery job {job_id}: {e}")
                }
                Err(_) => tracing::warn!(
                    "could not cancel the interrupted BigQuery job {job_id}: no answer within 5s"
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
        let mut request = QueryRequest::new(sql);
        request.use_legacy_sql = false;
        request.location = self.location.clone();
        request.timeout_ms = Some(SERVER_WAIT_MS);
        request.format_options = Some(DataFormatOptions {
            use_int64_timestamp: Some(true),
        });
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
            });
        let polled = self
            .poll(operation, deadline, job, complete, page_token, out)
            .await;
        if let Some(cancel) = &mut cancel {
            cancel.client = None;
        }
        polled
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
