//! `idem scheduler --listen ADDR`: the scheduler's health and metrics over HTTP/1.1, for a
//! Kubernetes Deployment's probes and a Prometheus scrape.
//!
//! * `GET /healthz`: 200 `ok` while the scheduler loop ticks (its last tick is within
//!   [`Beat::stale_after`]; the loop ticks at least every
//!   [`MAX_TICK`](crate::schedule::scheduler::MAX_TICK)), and while it starts; 503 with the
//!   reason once it has stalled.
//! * `GET /readyz`: 200 once the jobs are planned and the store answers a real call (the
//!   newest run of one job) within [`PROBE_TIMEOUT`]; asked at each request, never cached.
//!   503 with the reason (the store's error) otherwise.
//! * `GET /metrics`: the Prometheus text format (version 0.0.4) of [`Metrics`], which the
//!   fires feed with their outcomes as the runner reports them (not read back from the
//!   ledger).
//!
//! The HTTP is hyper's (HTTP/1.1 only); the server stops when the scheduler is signalled.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;

use super::super::metrics::Exposition;
use crate::error::{Error, Result};
use crate::job::Connections;
use crate::runner::Cancel;
use crate::schedule::scheduler::{Beat, Heartbeat};
use crate::store::RunFilter;

/// How long `/readyz` waits for the store.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a fire's run came to, as the scheduler counts it.
#[derive(Debug, Clone)]
pub(super) enum FireOutcome {
    /// Completed at this instant.
    Completed(chrono::DateTime<chrono::Utc>),
    /// Skipped by a guard, for this reason (`in_progress`, `time_window`, …).
    Skipped(String),
    /// Failed, or could not run (its plan or the store failed).
    Failed,
    /// Stopped at the end of the grace period.
    Interrupted,
}

#[derive(Debug, Default)]
struct JobMetrics {
    fires: u64,
    completed: u64,
    skipped: BTreeMap<String, u64>,
    failed: u64,
    interrupted: u64,
    last_completed: Option<chrono::DateTime<chrono::Utc>>,
    last_lag: Option<Duration>,
}

/// The last readiness probe of the store.
#[derive(Debug, Clone, Copy)]
struct Probe {
    took: Duration,
    ok: bool,
}

/// The scheduler's counters, fed by its fires; one per process.
#[derive(Debug, Default)]
pub(super) struct Metrics {
    jobs: Mutex<BTreeMap<String, JobMetrics>>,
    probe: Mutex<Option<Probe>>,
}

impl Metrics {
    /// Counters at zero for `jobs` (so every job has its series from the start).
    pub(super) fn new<'a>(jobs: impl IntoIterator<Item = &'a str>) -> Metrics {
        let jobs = jobs
            .into_iter()
            .map(|j| (j.to_string(), JobMetrics::default()))
            .collect();
        Metrics {
            jobs: Mutex::new(jobs),
            probe: Mutex::default(),
        }
    }

    fn with_job(&self, job: &str, f: impl FnOnce(&mut JobMetrics)) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        f(jobs.entry(job.to_string()).or_default());
    }

    /// A fire of `job` started `lag` after its slot.
    pub(super) fn fired(&self, job: &str, lag: Duration) {
        self.with_job(job, |m| {
            m.fires += 1;
            m.last_lag = Some(lag);
        });
    }

    /// One run of a fire of `job` ended so.
    pub(super) fn outcome(&self, job: &str, outcome: FireOutcome) {
        self.with_job(job, |m| match outcome {
            FireOutcome::Completed(at) => {
                m.completed += 1;
                m.last_completed = Some(at);
            }
            FireOutcome::Skipped(reason) => *m.skipped.entry(reason).or_default() += 1,
            FireOutcome::Failed => m.failed += 1,
            FireOutcome::Interrupted => m.interrupted += 1,
        });
    }

    fn probed(&self, probe: Probe) {
        *self.probe.lock().unwrap_or_else(|e| e.into_inner()) = Some(probe);
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub(super) fn render(&self) -> String {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Exposition::default();
        let per_job = |out: &mut Exposition,
                       name: &str,
                       kind: &str,
                       help: &str,
                       value: &dyn Fn(&JobMetrics) -> Option<f64>| {
            out.metric(name, kind, help);
            for (job, m) in jobs.iter() {
                if let Some(v) = value(m) {
                    out.sample(name, &[("job", job)], v);
                }
            }
        };
        per_job(
            &mut out,
            "idem_scheduler_fires_total",
            "counter",
            "Fires the scheduler started (one per slot, catch-up slots included).",
            &|m| Some(m.fires as f64),
        );
        per_job(
            &mut out,
            "idem_scheduler_completed_total",
            "counter",
            "Runs of scheduler fires that completed.",
            &|m| Some(m.completed as f64),
        );
        out.metric(
            "idem_scheduler_skipped_total",
            "counter",
            "Runs of scheduler fires that a guard skipped, by reason (a fire that meets \
             another run's lease records in_progress and tries again).",
        );
        for (job, m) in jobs.iter() {
            for (reason, n) in &m.skipped {
                let labels = [("job", job.as_str()), ("reason", reason.as_str())];
                out.sample("idem_scheduler_skipped_total", &labels, *n as f64);
            }
        }
        per_job(
            &mut out,
            "idem_scheduler_failed_total",
            "counter",
            "Runs of scheduler fires that failed, or fires that could not run (plan or store).",
            &|m| Some(m.failed as f64),
        );
        per_job(
            &mut out,
            "idem_scheduler_interrupted_total",
            "counter",
            "Runs of scheduler fires stopped at the end of the shutdown grace period.",
            &|m| Some(m.interrupted as f64),
        );
        per_job(
            &mut out,
            "idem_scheduler_last_completed_timestamp_seconds",
            "gauge",
            "Unix time at which the job's last completed scheduler run finished.",
            &|m| m.last_completed.map(unix_seconds),
        );
        per_job(
            &mut out,
            "idem_scheduler_fire_lag_seconds",
            "gauge",
            "How late the job's last fire started after its slot.",
            &|m| m.last_lag.map(|d| d.as_secs_f64()),
        );
        drop(jobs);
        let probe = *self.probe.lock().unwrap_or_else(|e| e.into_inner());
        let probes: [(&str, &str, Option<f64>); 2] = [
            (
                "idem_scheduler_store_probe_seconds",
                "How long the last readiness probe of the store took (none before the first).",
                probe.map(|p| p.took.as_secs_f64()),
            ),
            (
                "idem_scheduler_store_probe_success",
                "Whether the last readiness probe of the store answered (1) or not (0).",
                probe.map(|p| if p.ok { 1.0 } else { 0.0 }),
            ),
        ];
        for (name, help, value) in probes {
            out.metric(name, "gauge", help);
            if let Some(v) = value {
                out.sample(name, &[], v);
            }
        }
        out.metric(
            "idem_build_info",
            "gauge",
            "The idem version that serves these metrics.",
        );
        out.sample(
            "idem_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
            1.0,
        );
        out.finish()
    }
}

fn unix_seconds(t: chrono::DateTime<chrono::Utc>) -> f64 {
    t.timestamp_millis() as f64 / 1000.0
}

/// What the endpoints read: the loop's heartbeat, whether the jobs are planned, the store
/// to probe, and the metrics.
pub(super) struct Health {
    pub(super) metrics: Arc<Metrics>,
    pub(super) heartbeat: Heartbeat,
    /// Set once every job is planned (or logged as not plannable, to retry at its fire).
    pub(super) started: std::sync::atomic::AtomicBool,
    /// The scheduler's shared connections: the probe opens the store through them.
    pub(super) connections: Connections,
    pub(super) store_url: String,
    /// A job whose newest run the probe asks for.
    pub(super) probe_job: String,
}

impl Health {
    fn healthz(&self) -> (StatusCode, String) {
        match self.heartbeat.last() {
            // Planning the jobs (their store connects): readiness says so.
            None => (StatusCode::OK, "ok\n".into()),
            Some(beat) => alive(beat, Instant::now()),
        }
    }

    async fn readyz(&self) -> (StatusCode, String) {
        if !self.started.load(std::sync::atomic::Ordering::Acquire) {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: the scheduler is still planning its jobs\n".into(),
            );
        }
        let started = Instant::now();
        let asked = tokio::time::timeout(PROBE_TIMEOUT, async {
            let store = self.connections.stores.open(&self.store_url).await?;
            store
                .runs(&RunFilter {
                    processor: Some(self.probe_job.clone()),
                    limit: 1,
                    ..RunFilter::default()
                })
                .await
        })
        .await;
        let took = started.elapsed();
        let store = crate::redact::redact_url(&self.store_url);
        let answer = match asked {
            Ok(Ok(_)) => Ok(()),
            // Store errors name the store already.
            Ok(Err(e)) if e.to_string().contains(&store) => Err(format!("not ready: {e}")),
            Ok(Err(e)) => Err(format!("not ready: store {store}: {e}")),
            Err(_) => Err(format!(
                "not ready: store {store} did not answer within {}s",
                PROBE_TIMEOUT.as_secs()
            )),
        };
        self.metrics.probed(Probe {
            took,
            ok: answer.is_ok(),
        });
        match answer {
            Ok(()) => (StatusCode::OK, "ready\n".into()),
            Err(reason) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{}\n", reason.replace('\n', " ")),
            ),
        }
    }

    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = request.uri().path();
        if !matches!(path, "/healthz" | "/readyz" | "/metrics") {
            return text(
                StatusCode::NOT_FOUND,
                "not found: GET /healthz, /readyz or /metrics\n".into(),
            );
        }
        if request.method() != Method::GET {
            let mut r = text(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("method {} not allowed: GET only\n", request.method()),
            );
            r.headers_mut().insert(
                hyper::header::ALLOW,
                hyper::header::HeaderValue::from_static("GET"),
            );
            return r;
        }
        match path {
            "/healthz" => {
                let (status, body) = self.healthz();
                text(status, body)
            }
            "/readyz" => {
                let (status, body) = self.readyz().await;
                text(status, body)
            }
            _ => {
                let mut r = text(StatusCode::OK, self.metrics.render());
                r.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static(
                        "text/plain; version=0.0.4; charset=utf-8",
                    ),
                );
                r
            }
        }
    }
}

/// `/healthz` after the loop's last tick `beat`, at `now`.
fn alive(beat: Beat, now: Instant) -> (StatusCode, String) {
    let since = now.saturating_duration_since(beat.at);
    if since <= beat.stale_after() {
        (StatusCode::OK, "ok\n".into())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "stalled: the scheduler loop last ticked {}s ago (expected within {}s)\n",
                since.as_secs(),
                beat.stale_after().as_secs()
            ),
        )
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Binds `addr` (before anything fires) and logs the address bound (port 0 picks one).
pub(super) async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::config(format!("--listen: cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::config(format!("--listen {addr}: {e}")))?;
    tracing::info!(target: "idem::scheduler", "listening on {bound} (GET /healthz, /readyz, /metrics)");
    Ok(listener)
}

/// Serves `health` on `listener` until `stop` is cancelled; then the listener closes and
/// open connections are dropped.
pub(super) fn serve(
    listener: TcpListener,
    health: Arc<Health>,
    stop: Cancel,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.cancelled() => break,
            };
            while connections.try_join_next().is_some() {}
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: try again shortly, do not spin.
                    tracing::warn!(target: "idem::scheduler", "--listen: cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let health = health.clone();
            connections.spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let health = health.clone();
                    async move { Ok::<_, Infallible>(health.answer(request).await) }
                });
                let served = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                if let Err(e) = served {
                    tracing::debug!(target: "idem::scheduler", "--listen: connection ended: {e}");
                }
            });
        }
        drop(listener);
        connections.shutdown().await;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_has_help_and_type_before_its_samples() {
        let m = Metrics::new(["tick", "we\"ird"]);
        m.fired("tick", Duration::from_millis(1500));
        m.outcome("tick", FireOutcome::Completed(chrono::Utc::now()));
        m.outcome("tick", FireOutcome::Skipped("in_progress".into()));
        m.probed(Probe {
            took: Duration::from_millis(3),
            ok: true,
        });
        let text = m.render();
        // Each family's samples follow its own TYPE line, and no family appears twice.
        let mut typed = std::collections::HashSet::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                current = rest.split(' ').next().unwrap().to_string();
                assert!(typed.insert(current.clone()), "{line}: a second TYPE");
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert_eq!(name, current, "{line}: not after its own TYPE line");
            }
        }
        assert!(
            text.contains("idem_scheduler_fires_total{job=\"tick\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("idem_scheduler_fires_total{job=\"we\\\"ird\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("idem_scheduler_fire_lag_seconds{job=\"tick\"} 1.5\n"),
            "{text}"
        );
        assert!(
            text.contains("idem_scheduler_skipped_total{job=\"tick\",reason=\"in_progress\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("idem_scheduler_store_probe_success 1\n"),
            "{text}"
        );
        assert!(text.contains("idem_build_info{version=\""), "{text}");
    }

    #[test]
    fn a_loop_that_stopped_ticking_is_unhealthy() {
        let now = Instant::now();
        let beat = Beat {
            at: now,
            sleep: Duration::from_secs(10),
        };
        assert_eq!(alive(beat, now + Duration::from_secs(29)).0, StatusCode::OK);
        let (status, body) = alive(beat, now + Duration::from_secs(31));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.starts_with("stalled: the scheduler loop last ticked 31s ago"),
            "{body}"
        );
    }
}
