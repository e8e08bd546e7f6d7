//! A test double of BigQuery's DML *limits*, in front of the emulator.
//!
//! The emulator (`.ci/bqemulator.sh`) serialises DML and enforces no quota, so on its own
//! it cannot show what a fleet of runs does to real BigQuery. [`Simulator::start`] opens a
//! local HTTP proxy: point a store's `endpoint=` at [`Simulator::endpoint`] and every API
//! call goes through it to the emulator. `jobs.query` calls (every idem statement) are
//! classified by their SQL and held to BigQuery's documented per-table DML limits
//! (<https://cloud.google.com/bigquery/docs/data-manipulation-language#limitations>):
//!
//! * **Mutating DML** (UPDATE, DELETE, MERGE) on one table: at most
//!   [`Limits::mutating_running`] (2) run at once, up to [`Limits::mutating_queue`] (20)
//!   more wait in a FIFO queue; one more fails at once with BigQuery's error: HTTP 400,
//!   "Resources exceeded during query execution: Too many DML statements outstanding
//!   against table PROJECT:DATASET.TABLE, limit is 20."
//! * **INSERT** on one table: the first [`Limits::insert_free_per_day`] (1,500) of the
//!   simulator's "day" run at once; after that at most 10 run and 100 wait, the excess
//!   fails with the same error ("limit is 100"). The day never ends in a simulation, so a
//!   test scales the free allowance down to reach the limited regime.
//! * **Snapshot isolation conflicts**: a mutating statement reads the table at its start;
//!   if another mutating statement changed rows of the same table before it commits, it
//!   is re-run (BigQuery retries up to 3 times by itself) and then fails with HTTP 400
//!   `invalidQuery` "Could not serialize access to table PROJECT:DATASET.TABLE due to
//!   concurrent update". The table is one partition (idem's lease tables are not
//!   partitioned), so any two overlapping mutating statements on it conflict.
//! * **Latency**: every DML statement takes [`Limits::dml_latency`] while it holds its slot
//!   (real DML takes about a second; tests scale it down), reads [`Limits::read_latency`],
//!   so concurrent statements really overlap.
//!
//! A statement refused or failed by the simulator never reaches the emulator, so it has no
//! effect, as in BigQuery. What it counts ([`Stats`]): statements by kind, failures by
//! kind, internal conflict re-runs, the most statements outstanding on one table, and
//! *modelled* bytes billed: BigQuery's on-demand minimum of 10 MB per table a statement
//! that ran reads (an INSERT's target table is written, not read), which is what idem's small
//! statements bill; the emulator reports `totalBytesProcessed` 0 for everything.
//!
//! What it cannot model: the project-wide limits (concurrent interactive queries, API
//! requests per second, the 6 h queue time), partition-level conflicts on partitioned
//! tables (it treats a table as one partition, which is right for the lease tables and
//! stricter than BigQuery for the partitioned ones, whose DML is INSERT only), real
//! latencies and their variance, and a statement's job continuing after the client gave
//! up. The conflict rule is conservative: any commit that changed rows of the table
//! between a statement's start and its commit fails it, even if it would have affected no
//! row.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

#[path = "bq_model.rs"]
pub mod model;

/// The limits and latencies the simulator applies.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Mutating DML statements running at once per table (BigQuery: 2).
    pub mutating_running: usize,
    /// Mutating DML statements queued per table (BigQuery: 20).
    pub mutating_queue: usize,
    /// INSERTs per table that run without the INSERT limits (BigQuery: 1,500 a day).
    pub insert_free_per_day: u64,
    /// INSERTs running at once per table once the free ones are used (BigQuery: 10).
    pub insert_running: usize,
    /// INSERTs queued per table once the free ones are used (BigQuery: 100).
    pub insert_queue: usize,
    /// Conflict re-runs BigQuery does itself before failing a statement (3).
    pub conflict_retries: u32,
    /// Time one DML statement runs (holding its slot).
    pub dml_latency: Duration,
    /// Time one query (SELECT) runs.
    pub read_latency: Duration,
    /// Keep the text of every statement in [`Stats::sql`] (off: a fleet runs many).
    pub record_sql: bool,
    /// Run scripts as BigQuery does, statement by statement, each its own snapshot and
    /// commit ([`model`]); off: a script is one atomic step, as on the emulator.
    pub statements: bool,
    /// Failures to inject (none by default); shared with the clone a test keeps.
    pub faults: Faults,
}

impl Limits {
    /// BigQuery's documented limits, with `dml_latency` per DML statement and a third of
    /// it per read.
    pub fn bigquery(dml_latency: Duration) -> Self {
        Limits {
            mutating_running: 2,
            mutating_queue: 20,
            insert_free_per_day: 1500,
            insert_running: 10,
            insert_queue: 100,
            conflict_retries: 3,
            dml_latency,
            read_latency: dml_latency / 3,
            record_sql: false,
            statements: false,
            faults: Faults::default(),
        }
    }
}

/// What the simulator saw.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// `jobs.query` calls (statements), by kind: `select`, `insert`, `mutating`, `other`.
    pub statements: BTreeMap<&'static str, u64>,
    /// Statements by target table and kind (`table kind`).
    pub by_table: BTreeMap<String, u64>,
    /// Statements failed for a full queue ("too many DML statements outstanding").
    pub quota_failures: u64,
    /// Statements failed with a concurrent-update conflict (after BigQuery's own re-runs).
    pub conflict_failures: u64,
    /// Conflicts BigQuery resolved itself by re-running the statement.
    pub conflict_reruns: u64,
    /// The most statements outstanding (running + queued) on one table at once, by kind.
    pub max_outstanding_mutating: usize,
    pub max_outstanding_insert: usize,
    /// Statements that ran (were not refused or failed by the simulator; a statement the
    /// emulator itself failed counts too).
    pub ran: u64,
    /// Modelled bytes billed: 10 MB per table read, per statement that ran (a statement
    /// refused for a full queue or failed on a conflict is not billed).
    pub bytes_billed: u64,
    /// Sum of the emulator's `totalBytesProcessed` (0 with the emulator).
    pub bytes_processed_reported: u64,
    /// Every statement's text, in arrival order, when [`Limits::record_sql`] is on.
    pub sql: Vec<String>,
    /// Child statements (and `IF` conditions) the model ran for scripts, each a job of
    /// its own in BigQuery.
    pub child_statements: u64,
    /// Transactions cancelled on a conflict (BigQuery does not re-run a transaction).
    pub transactions_cancelled: u64,
    /// Jobs stopped by a `jobs.cancel` before they finished.
    pub jobs_cancelled: u64,
}

impl Stats {
    /// All statements.
    pub fn total(&self) -> u64 {
        self.statements.values().sum()
    }

    /// Statements of one kind.
    pub fn kind(&self, kind: &str) -> u64 {
        self.statements.get(kind).copied().unwrap_or(0)
    }
}

/// Failures the simulator injects, and BigQuery's `requestId` deduplication. Counters
/// are shared between clones, so a test keeps one and arms it while the simulator runs
/// (`faults.lost_answers.store(1, SeqCst)`). Each armed failure is used once.
///
/// * REST calls (tables, datasets: anything but `jobs.query` and `getQueryResults`) and
///   polls answer HTTP 429 `rateLimitExceeded`, as BigQuery does beyond 100 API requests
///   per second per method and user
///   (<https://cloud.google.com/bigquery/quotas#api_request_quotas>); nothing is done.
/// * A `jobs.query` runs and its answer is lost: HTTP 503 `backendError` instead
///   (<https://cloud.google.com/bigquery/docs/error-messages>: retry `backendError`).
/// * A `jobs.query` is answered `jobComplete: false` at once (the statement runs on), so
///   the client polls, as it does for any statement not done within `timeoutMs`.
///
/// Deduplication, always on: a `jobs.query` whose `requestId` was seen before gets the
/// first one's job (its answer, or "not complete" and its job id) and runs nothing, as
/// BigQuery does within minutes of the first
/// (<https://cloud.google.com/bigquery/docs/reference/rest/v2/jobs/query#QueryRequest>,
/// `requestId`).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// REST calls to answer with HTTP 429 `rateLimitExceeded`.
    pub rest_rate_limits: Arc<AtomicU64>,
    /// `getQueryResults` polls to answer with HTTP 429 `rateLimitExceeded` (the job runs
    /// on).
    pub poll_rate_limits: Arc<AtomicU64>,
    /// `jobs.query` calls to run and then answer HTTP 503 `backendError`.
    pub lost_answers: Arc<AtomicU64>,
    /// `jobs.query` calls to answer `jobComplete: false` at once.
    pub unfinished: Arc<AtomicU64>,
    /// The `requestId` of every `jobs.query` call, in arrival order ("" without one).
    pub request_ids: Arc<Mutex<Vec<String>>>,
    /// Jobs by `requestId`.
    by_request: Arc<Mutex<HashMap<String, Job>>>,
    /// Injected failures answered so far.
    pub injected: Arc<AtomicU64>,
}

impl Faults {
    /// The `requestId`s seen more than once (re-sends).
    pub fn resent_ids(&self) -> Vec<String> {
        let ids = self.request_ids.lock().unwrap();
        let mut seen = std::collections::BTreeSet::new();
        let mut again: Vec<String> = ids
            .iter()
            .filter(|id| !id.is_empty() && !seen.insert(id.as_str()))
            .cloned()
            .collect();
        again.dedup();
        again
    }
}

/// Takes one armed failure from `counter`, if any.
fn take(counter: &AtomicU64) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn error_answer(status: u16, reason: &str, message: &str) -> Answer {
    let body = serde_json::json!({
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    });
    (
        status,
        "application/json; charset=UTF-8".into(),
        body.to_string().into_bytes(),
    )
}

/// Applies [`Faults`] to a request: `Ok(answer)` when they answered it, else the request
/// back for the simulator's normal path.
async fn apply_faults(shared: &Arc<Shared>, request: Request) -> Result<Answer, Request> {
    let faults = &shared.limits.faults;
    let path = request.path.split('?').next().unwrap_or("").to_string();
    let rate_limited = || {
        faults.injected.fetch_add(1, Ordering::SeqCst);
        error_answer(
            429,
            "rateLimitExceeded",
            "Exceeded rate limits: too many api requests per user per method for this user_method.",
        )
    };
    if request.method == "GET" && path.contains("/queries/") {
        return match take(&faults.poll_rate_limits) {
            true => Ok(rate_limited()),
            false => Err(request),
        };
    }
    if !(request.method == "POST" && path.ends_with("/queries")) {
        return match take(&faults.rest_rate_limits) {
            true => Ok(rate_limited()),
            false => Err(request),
        };
    }
    let body = serde_json::from_slice::<serde_json::Value>(&request.body).unwrap_or_default();
    let id = body
        .get("requestId")
        .and_then(|r| r.as_str())
        .map(str::to_string);
    faults
        .request_ids
        .lock()
        .unwrap()
        .push(id.clone().unwrap_or_default());
    let lose = take(&faults.lost_answers);
    let unfinished = take(&faults.unfinished);
    if id.is_none() && !lose && !unfinished {
        return Err(request);
    }
    let known = id
        .as_ref()
        .and_then(|id| faults.by_request.lock().unwrap().get(id).cloned());
    let mut job = match known {
        Some(job) => job,
        None => {
            let job = spawn_statement(shared, request);
            if let Some(id) = &id {
                faults
                    .by_request
                    .lock()
                    .unwrap()
                    .insert(id.clone(), job.clone());
            }
            job
        }
    };
    let wait = if unfinished {
        Duration::ZERO
    } else {
        server_wait(&body)
    };
    let answer = match wait_for(&mut job, wait).await {
        Some(answer) if !unfinished => answer,
        _ => {
            let job_id = format!("sim_{}", shared.job_ids.fetch_add(1, Ordering::SeqCst));
            shared.jobs.lock().unwrap().insert(job_id.clone(), job);
            let project = path.split('/').nth(4).unwrap_or("").to_string();
            not_complete("bigquery#queryResponse", &project, &job_id)
        }
    };
    if lose {
        // The statement runs on (or ran); only its answer is lost.
        faults.injected.fetch_add(1, Ordering::SeqCst);
        return Ok(error_answer(
            503,
            "backendError",
            "Error encountered during execution. Retrying may solve the problem.",
        ));
    }
    Ok(answer)
}

/// The on-demand minimum billed per table a query references.
pub const MIN_BILLED_PER_TABLE: u64 = 10 * 1024 * 1024;

/// A queue of one kind of DML on one table: `running` slots, `queue` waiting places.
struct Gate {
    slots: Semaphore,
    outstanding: AtomicUsize,
    limit: usize,
    queue: usize,
}

impl Gate {
    fn new(running: usize, queue: usize) -> Self {
        Gate {
            slots: Semaphore::new(running),
            outstanding: AtomicUsize::new(0),
            limit: running + queue,
            queue,
        }
    }
}

struct Table {
    mutating: Gate,
    insert: Gate,
    inserts: AtomicU64,
    /// Bumped by every committed mutating statement that changed rows.
    version: AtomicU64,
    /// Held while a statement checks for conflicts and commits (forwards to the emulator).
    commit: tokio::sync::Mutex<()>,
}

struct Shared {
    limits: Limits,
    upstream: String,
    http: reqwest::Client,
    /// Calls in flight to the emulator: it is one Python process and stalls under
    /// hundreds of connections at once, so the proxy sends it a few at a time (a
    /// statement's simulated latency is spent before, outside this limit).
    upstream_slots: Semaphore,
    tables: Mutex<HashMap<String, Arc<Table>>>,
    stats: Mutex<Stats>,
    /// Statements still queued or running when their `jobs.query` call answered "not
    /// complete yet", by the job id given to the client (which polls `getQueryResults`).
    jobs: Mutex<HashMap<String, Job>>,
    job_ids: AtomicU64,
}

/// A statement running in a task of its own: its answer once done, and the task, which a
/// `jobs.cancel` aborts.
#[derive(Debug, Clone)]
struct Job {
    answer: tokio::sync::watch::Receiver<Option<Answer>>,
    task: tokio::task::AbortHandle,
}

/// Runs `request`'s statement in a task of its own.
fn spawn_statement(shared: &Arc<Shared>, request: Request) -> Job {
    let (tx, answer) = tokio::sync::watch::channel(None);
    let shared = shared.clone();
    let task = tokio::spawn(async move {
        let answer = statement(&shared, request).await;
        let _ = tx.send(Some(answer));
    });
    Job {
        answer,
        task: task.abort_handle(),
    }
}

/// How long a `jobs.query` or `getQueryResults` call waits for the statement at most
/// before answering `jobComplete: false` (the request's `timeoutMs`, BigQuery's default
/// 10 s when absent).
fn server_wait(body: &serde_json::Value) -> Duration {
    Duration::from_millis(
        body.get("timeoutMs")
            .and_then(|t| t.as_u64())
            .unwrap_or(10_000),
    )
}

/// The running proxy; stops when dropped (its task is aborted).
pub struct Simulator {
    endpoint: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Simulator {
    /// Starts a proxy to the emulator at `upstream` (`http://HOST:PORT`) on a free local
    /// port, on the current tokio runtime.
    pub async fn start(upstream: &str, limits: Limits) -> Simulator {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let shared = Arc::new(Shared {
            limits,
            upstream: upstream.trim_end_matches('/').to_string(),
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                // Below the emulator's (uvicorn's) 5 s keep-alive: a pooled connection it
                // has just closed is never reused (the request would fail unsent).
                .pool_idle_timeout(Duration::from_secs(2))
                .build()
                .expect("http client"),
            upstream_slots: Semaphore::new(UPSTREAM_CALLS),
            tables: Mutex::new(HashMap::new()),
            stats: Mutex::new(Stats::default()),
            jobs: Mutex::new(HashMap::new()),
            job_ids: AtomicU64::new(0),
        });
        let task = {
            let shared = shared.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        let _ = serve(stream, shared).await;
                    });
                }
            })
        };
        Simulator {
            endpoint,
            shared,
            task,
        }
    }

    /// The proxy's base URL, for a store URL's `endpoint=`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// `url` (a `bigquery://…?endpoint=…` URL) with its endpoint pointed at the proxy.
    pub fn url(&self, url: &str) -> String {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut params: Vec<String> = query
            .split('&')
            .filter(|p| !p.is_empty() && !p.starts_with("endpoint="))
            .map(str::to_string)
            .collect();
        params.insert(0, format!("endpoint={}", self.endpoint));
        format!("{base}?{}", params.join("&"))
    }

    /// A copy of the counters.
    pub fn stats(&self) -> Stats {
        self.shared.stats.lock().unwrap().clone()
    }

    /// Zeroes the counters (the tables' queues and versions stay).
    pub fn reset_stats(&self) {
        *self.shared.stats.lock().unwrap() = Stats::default();
    }
}

/// The emulator URL inside a `bigquery://…?endpoint=URL…` URL.
pub fn endpoint_of(url: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    query
        .split('&')
        .find_map(|p| p.strip_prefix("endpoint="))
        .map(percent_decode)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Request {
    method: String,
    path: String,
    content_type: Option<String>,
    body: Vec<u8>,
}

async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Request> {
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = buf[head_end..head_end + length].to_vec();
    buf.drain(..head_end + length);
    let mut first = head.lines().next().unwrap_or("").split_whitespace();
    Some(Request {
        method: first.next().unwrap_or("GET").to_string(),
        path: first.next().unwrap_or("/").to_string(),
        content_type: header("content-type"),
        body,
    })
}

async fn serve(mut stream: TcpStream, shared: Arc<Shared>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    while let Some(request) = read_request(&mut stream, &mut buf).await {
        let (status, content_type, body) = handle(&shared, request).await;
        let head = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&body).await?;
    }
    Ok(())
}

type Answer = (u16, String, Vec<u8>);

/// Calls in flight to the emulator at most.
const UPSTREAM_CALLS: usize = 8;

async fn forward(shared: &Shared, request: &Request) -> Answer {
    let _slot = shared
        .upstream_slots
        .acquire()
        .await
        .expect("semaphore open");
    let url = format!("{}{}", shared.upstream, request.path);
    let method = reqwest::Method::from_bytes(request.method.as_bytes()).unwrap_or_default();
    let mut call = shared.http.request(method, url).body(request.body.clone());
    if let Some(ct) = &request.content_type {
        call = call.header("content-type", ct);
    }
    match call.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let ct = response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("application/json")
                .to_string();
            let body = response
                .bytes()
                .await
                .map(|b| b.to_vec())
                .unwrap_or_default();
            (status, ct, body)
        }
        Err(e) => (502, "text/plain".into(), format!("proxy: {e}").into_bytes()),
    }
}

fn google_error(reason: &str, message: &str) -> Answer {
    let body = serde_json::json!({
        "error": {
            "code": 400,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
            "status": "INVALID_ARGUMENT",
        }
    });
    (
        400,
        "application/json; charset=UTF-8".into(),
        body.to_string().into_bytes(),
    )
}

/// Whether `sql` is a multi-statement script (one job): a statement after a `;`, or a
/// procedural first keyword.
fn is_script(sql: &str) -> bool {
    let first = sql
        .trim_start()
        .split(|c: char| c.is_whitespace())
        .next()
        .unwrap_or("")
        .to_ascii_uppercase();
    matches!(first.as_str(), "IF" | "BEGIN" | "DECLARE")
        || sql
            .trim_end()
            .trim_end_matches(';')
            .split(';')
            .filter(|s| !s.trim().is_empty())
            .count()
            > 1
}

/// The tables a script's statements write: `(mutated, inserted into)`, each the
/// backquoted name after `UPDATE`, `DELETE FROM` or `MERGE [INTO]`, or `INSERT INTO`.
fn script_targets(sql: &str) -> (Vec<String>, Vec<String>) {
    let (mut mutated, mut inserted) = (Vec::new(), Vec::new());
    let parts: Vec<&str> = sql.split('`').collect();
    for (i, name) in parts.iter().enumerate().skip(1).step_by(2) {
        let before: Vec<String> = parts[i - 1]
            .split_whitespace()
            .rev()
            .take(2)
            .map(|w| w.to_ascii_uppercase())
            .collect();
        let last = before.first().map(String::as_str).unwrap_or("");
        let prev = before.get(1).map(String::as_str).unwrap_or("");
        let list = match (prev, last) {
            ("INSERT", "INTO") => &mut inserted,
            (_, "UPDATE") | ("DELETE", "FROM") | (_, "MERGE") | ("MERGE", "INTO") => &mut mutated,
            _ => continue,
        };
        if !list.contains(&name.to_string()) {
            list.push(name.to_string());
        }
    }
    (mutated, inserted)
}

/// The kind of a statement and the tables it names (backquoted), target first. A
/// multi-statement script is `script`.
fn classify(sql: &str) -> (&'static str, Vec<String>) {
    if is_script(sql) {
        let tables = sql
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        return ("script", tables);
    }
    let first = sql
        .trim_start()
        .split(|c: char| c.is_whitespace())
        .next()
        .unwrap_or("")
        .to_ascii_uppercase();
    let kind = match first.as_str() {
        "SELECT" | "WITH" => "select",
        "INSERT" => "insert",
        "UPDATE" | "DELETE" | "MERGE" => "mutating",
        _ => "other",
    };
    let tables = sql
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    (kind, tables)
}

/// `project.dataset.table` as BigQuery names it in errors: `project:dataset.table`.
fn error_name(table: &str) -> String {
    table.replacen('.', ":", 1)
}

fn billed(kind: &str, tables: &[String]) -> u64 {
    if kind == "script" {
        // A script bills each of its statements: modelled as the minimum per table
        // reference (every reference is read by some statement, or is an INSERT's target:
        // those are counted by the caller and taken off).
        return tables.len() as u64 * MIN_BILLED_PER_TABLE;
    }
    let mut read: Vec<&String> = match kind {
        // The target of an INSERT is written, not read; it is read when it appears again.
        "insert" => tables.iter().skip(1).collect(),
        _ => tables.iter().collect(),
    };
    read.sort();
    read.dedup();
    read.len() as u64 * MIN_BILLED_PER_TABLE
}

/// Waits up to `wait` for a job's answer; `None` when it is not complete yet.
async fn wait_for(job: &mut Job, wait: Duration) -> Option<Answer> {
    let done = tokio::time::timeout(wait, job.answer.wait_for(|a| a.is_some())).await;
    match done {
        Ok(Ok(answer)) => answer.clone(),
        _ => None,
    }
}

fn not_complete(kind: &str, project: &str, job_id: &str) -> Answer {
    let body = serde_json::json!({
        "kind": kind,
        "jobReference": {"projectId": project, "jobId": job_id},
        "jobComplete": false,
    });
    (
        200,
        "application/json".into(),
        body.to_string().into_bytes(),
    )
}

/// `jobs.query`: the statement runs in a task of its own; the call answers when it is
/// done, or after the request's `timeoutMs` with `jobComplete: false` and a job id the
/// client polls with `getQueryResults` (as BigQuery does while a DML statement waits in
/// its table's queue). `getQueryResults` of such a job waits the same way.
async fn handle(shared: &Arc<Shared>, request: Request) -> Answer {
    let request = match apply_faults(shared, request).await {
        Ok(answer) => return answer,
        Err(request) => request,
    };
    let path = request.path.split('?').next().unwrap_or("").to_string();
    if request.method == "POST" && path.contains("/jobs/") && path.ends_with("/cancel") {
        return cancel(shared, &path);
    }
    if request.method == "GET" && path.contains("/queries/") {
        let job_id = path.rsplit('/').next().unwrap_or("").to_string();
        let job = shared.jobs.lock().unwrap().get(&job_id).cloned();
        let Some(mut job) = job else {
            return forward(shared, &request).await;
        };
        let project = path.split('/').nth(4).unwrap_or("").to_string();
        return match wait_for(&mut job, Duration::from_secs(10)).await {
            Some(answer) => {
                shared.jobs.lock().unwrap().remove(&job_id);
                answer
            }
            None => not_complete("bigquery#getQueryResultsResponse", &project, &job_id),
        };
    }
    let is_query = request.method == "POST" && path.ends_with("/queries");
    if !is_query {
        return forward(shared, &request).await;
    }
    let body = serde_json::from_slice::<serde_json::Value>(&request.body).unwrap_or_default();
    let wait = server_wait(&body);
    let mut job = spawn_statement(shared, request);
    if let Some(answer) = wait_for(&mut job, wait).await {
        return answer;
    }
    let job_id = format!("sim_{}", shared.job_ids.fetch_add(1, Ordering::SeqCst));
    shared.jobs.lock().unwrap().insert(job_id.clone(), job);
    let project = path.split('/').nth(4).unwrap_or("").to_string();
    not_complete("bigquery#queryResponse", &project, &job_id)
}

/// `jobs.cancel` (`POST …/jobs/JOB_ID/cancel`): a job still queued or running is stopped
/// where it is, so what it had not committed is never committed ("BigQuery attempts to
/// cancel the job … the job might still complete", jobs.cancel reference:
/// <https://cloud.google.com/bigquery/docs/reference/rest/v2/jobs/cancel>; a script's
/// child statements committed before stay committed). Counted in
/// [`Stats::jobs_cancelled`]. A job that had finished, or is unknown, is left as it is.
fn cancel(shared: &Arc<Shared>, path: &str) -> Answer {
    let mut parts = path.rsplit('/');
    let (_, job_id) = (parts.next(), parts.next().unwrap_or("").to_string());
    let project = path.split('/').nth(4).unwrap_or("").to_string();
    if let Some(job) = shared.jobs.lock().unwrap().remove(&job_id) {
        if job.answer.borrow().is_none() {
            job.task.abort();
            shared.stats.lock().unwrap().jobs_cancelled += 1;
        }
    }
    let body = serde_json::json!({
        "kind": "bigquery#jobCancelResponse",
        "job": {
            "jobReference": {"projectId": project, "jobId": job_id},
            "status": {"state": "DONE"},
        },
    });
    (
        200,
        "application/json".into(),
        body.to_string().into_bytes(),
    )
}

/// Runs one `jobs.query` statement under the limits.
async fn statement(shared: &Shared, request: Request) -> Answer {
    let sql = serde_json::from_slice::<serde_json::Value>(&request.body)
        .ok()
        .and_then(|v| v.get("query").and_then(|q| q.as_str()).map(str::to_string))
        .unwrap_or_default();
    let (kind, tables) = classify(&sql);
    {
        let mut stats = shared.stats.lock().unwrap();
        if shared.limits.record_sql {
            stats.sql.push(sql.clone());
        }
        *stats.statements.entry(kind).or_default() += 1;
        if let Some(target) = tables.first() {
            let name = target.rsplit('.').next().unwrap_or(target);
            *stats.by_table.entry(format!("{name} {kind}")).or_default() += 1;
        }
    }
    let answer = match (kind, tables.first()) {
        ("script", _) if shared.limits.statements && model::splittable(&sql) => {
            model::run_script(shared, &request, &sql).await
        }
        ("script", _) => script(shared, &request, &sql).await,
        ("mutating", Some(target)) => mutating(shared, &request, target).await,
        ("insert", Some(target)) => insert(shared, &request, target).await,
        ("select", _) => {
            tokio::time::sleep(shared.limits.read_latency).await;
            forward(shared, &request).await
        }
        _ => forward(shared, &request).await,
    };
    let modelled = kind == "script" && shared.limits.statements && model::splittable(&sql);
    if answer.0 == 200 && !modelled {
        let mut stats = shared.stats.lock().unwrap();
        let inserted = if kind == "script" {
            script_targets(&sql).1.len() as u64 * MIN_BILLED_PER_TABLE
        } else {
            0
        };
        stats.bytes_billed += billed(kind, &tables) - inserted;
        stats.ran += 1;
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&answer.2) {
        if let Some(n) = v
            .get("totalBytesProcessed")
            .and_then(|n| n.as_str())
            .and_then(|n| n.parse::<u64>().ok())
        {
            shared.stats.lock().unwrap().bytes_processed_reported += n;
        }
    }
    answer
}

fn table(shared: &Shared, name: &str) -> Arc<Table> {
    let limits = &shared.limits;
    shared
        .tables
        .lock()
        .unwrap()
        .entry(name.to_string())
        .or_insert_with(|| {
            Arc::new(Table {
                mutating: Gate::new(limits.mutating_running, limits.mutating_queue),
                insert: Gate::new(limits.insert_running, limits.insert_queue),
                inserts: AtomicU64::new(0),
                version: AtomicU64::new(0),
                commit: tokio::sync::Mutex::new(()),
            })
        })
        .clone()
}

/// Admits a statement to `gate` (running or queued) or refuses it: BigQuery's error.
/// A statement counted outstanding on a table's queue until dropped, also when its task
/// is aborted (a cancelled job leaves the queue).
struct Outstanding<'a>(&'a Gate);

impl<'a> Outstanding<'a> {
    /// Counts one more statement outstanding on `gate`: how many are now.
    fn count(gate: &'a Gate) -> (Self, usize) {
        let now = gate.outstanding.fetch_add(1, Ordering::SeqCst) + 1;
        (Outstanding(gate), now)
    }
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A statement admitted to a table's queue and running: out of it when dropped.
type Admitted<'a> = (Outstanding<'a>, tokio::sync::SemaphorePermit<'a>);

async fn admit<'a>(
    shared: &Shared,
    gate: &'a Gate,
    target: &str,
    insert: bool,
) -> Result<Admitted<'a>, Answer> {
    let (counted, outstanding) = Outstanding::count(gate);
    if outstanding > gate.limit {
        drop(counted);
        shared.stats.lock().unwrap().quota_failures += 1;
        return Err(google_error(
            "resourcesExceeded",
            &format!(
                "Resources exceeded during query execution: Too many DML statements outstanding against table {}, limit is {}.",
                error_name(target),
                gate.queue
            ),
        ));
    }
    {
        let mut stats = shared.stats.lock().unwrap();
        let max = if insert {
            &mut stats.max_outstanding_insert
        } else {
            &mut stats.max_outstanding_mutating
        };
        *max = (*max).max(outstanding);
    }
    let permit = gate.slots.acquire().await.expect("semaphore open");
    Ok((counted, permit))
}

/// HTTP 200 without an `errors` array (the emulator answers SQL errors with 200).
fn succeeded(answer: &Answer) -> bool {
    answer.0 == 200
        && serde_json::from_slice::<serde_json::Value>(&answer.2)
            .ok()
            .is_some_and(|v| v.get("errors").is_none())
}

fn affected_rows(answer: &Answer) -> u64 {
    serde_json::from_slice::<serde_json::Value>(&answer.2)
        .ok()
        .and_then(|v| {
            v.get("numDmlAffectedRows")
                .and_then(|n| n.as_str())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// A multi-statement script, one job: its INSERTs count against their tables' INSERT
/// limits (a slot held for the whole script once the free ones are used up); when it
/// mutates a table it runs as a mutating statement on the first one (queue, latency,
/// conflicts). A script that commits is taken to have changed rows (its answer carries
/// no row counts), so concurrent mutating statements on that table conflict with it. A
/// transaction (`BEGIN TRANSACTION`) that conflicts is not re-run: BigQuery cancels a
/// conflicting transaction, and the whole of it is rolled back.
async fn script(shared: &Shared, request: &Request, sql: &str) -> Answer {
    let (mutated, inserted) = script_targets(sql);
    let mut held = Vec::new();
    for target in &inserted {
        let t = table(shared, target);
        if t.inserts.fetch_add(1, Ordering::SeqCst) >= shared.limits.insert_free_per_day {
            let outstanding = t.insert.outstanding.fetch_add(1, Ordering::SeqCst) + 1;
            t.insert.outstanding.fetch_sub(1, Ordering::SeqCst);
            if outstanding > t.insert.limit {
                shared.stats.lock().unwrap().quota_failures += 1;
                return google_error(
                    "resourcesExceeded",
                    &format!(
                        "Resources exceeded during query execution: Too many DML statements outstanding against table {}, limit is {}.",
                        error_name(target),
                        t.insert.queue
                    ),
                );
            }
            held.push(t);
        }
    }
    let mut permits = Vec::new();
    for t in &held {
        let (counted, _) = Outstanding::count(&t.insert);
        permits.push((
            counted,
            t.insert.slots.acquire().await.expect("semaphore open"),
        ));
    }
    let transaction = sql.to_ascii_uppercase().contains("BEGIN TRANSACTION");
    // The model: a transaction holds its snapshot for all of its DML statements.
    let latency = if shared.limits.statements {
        shared.limits.dml_latency * model::dml_statements(sql).max(1)
    } else {
        shared.limits.dml_latency
    };
    let answer = match mutated.first() {
        Some(target) => mutating_as(shared, request, target, true, !transaction, latency).await,
        None => {
            tokio::time::sleep(shared.limits.dml_latency).await;
            forward(shared, request).await
        }
    };
    drop(permits);
    answer
}

async fn mutating(shared: &Shared, request: &Request, target: &str) -> Answer {
    mutating_as(
        shared,
        request,
        target,
        false,
        true,
        shared.limits.dml_latency,
    )
    .await
}

/// A mutating job on `target`; `script`: it changed rows when it succeeded (no row
/// count); `rerun`: a conflict is re-run as BigQuery re-runs a DML statement.
async fn mutating_as(
    shared: &Shared,
    request: &Request,
    target: &str,
    script: bool,
    rerun: bool,
    latency: Duration,
) -> Answer {
    let t = table(shared, target);
    let permit = match admit(shared, &t.mutating, target, false).await {
        Ok(p) => p,
        Err(answer) => return answer,
    };
    let mut attempt = 0;
    let answer = loop {
        let snapshot = t.version.load(Ordering::SeqCst);
        tokio::time::sleep(latency).await;
        let commit = t.commit.lock().await;
        if t.version.load(Ordering::SeqCst) != snapshot {
            drop(commit);
            if rerun && attempt < shared.limits.conflict_retries {
                attempt += 1;
                shared.stats.lock().unwrap().conflict_reruns += 1;
                continue;
            }
            {
                let mut stats = shared.stats.lock().unwrap();
                stats.conflict_failures += 1;
                if !rerun {
                    stats.transactions_cancelled += 1;
                }
            }
            let message = if rerun {
                format!(
                    "Could not serialize access to table {} due to concurrent update",
                    error_name(target)
                )
            } else {
                format!(
                    "Transaction is aborted due to concurrent update against table {}.",
                    error_name(target)
                )
            };
            break google_error("invalidQuery", &message);
        }
        let answer = forward(shared, request).await;
        if affected_rows(&answer) > 0 || (script && succeeded(&answer)) {
            t.version.fetch_add(1, Ordering::SeqCst);
        }
        break answer;
    };
    drop(permit);
    answer
}

async fn insert(shared: &Shared, request: &Request, target: &str) -> Answer {
    let t = table(shared, target);
    let n = t.inserts.fetch_add(1, Ordering::SeqCst);
    if n < shared.limits.insert_free_per_day {
        tokio::time::sleep(shared.limits.dml_latency).await;
        return forward(shared, request).await;
    }
    let permit = match admit(shared, &t.insert, target, true).await {
        Ok(p) => p,
        Err(answer) => return answer,
    };
    tokio::time::sleep(shared.limits.dml_latency).await;
    let answer = forward(shared, request).await;
    drop(permit);
    answer
}
