//! `--metrics-file`: Prometheus text exposition format for node_exporter's textfile
//! collector, written atomically (a temporary file in the same folder, then a rename), so
//! the collector never reads half a file.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use crate::error::{Error, Result};
use crate::events::strategy::EventGate;
use crate::events::stream::StreamSummary;
use crate::model::RunStatus;
use crate::runner::RunReport;
use crate::store::breaker::BreakerPhase;

/// Metrics text being built: `# HELP`, `# TYPE`, then the samples of each metric (the
/// metrics files here, and `idem scheduler --listen`'s `/metrics`).
#[derive(Default)]
pub(in crate::cli) struct Exposition {
    text: String,
}

/// A label value, escaped as the format says (backslash, double quote, line feed).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn number(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else if v.is_nan() {
        "NaN".to_string()
    } else {
        format!("{v}")
    }
}

impl Exposition {
    /// A metric's `# HELP` (backslashes and line feeds escaped) and `# TYPE` lines.
    pub(in crate::cli) fn metric(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    /// One sample of the metric named last.
    pub(in crate::cli) fn sample(&mut self, name: &str, labels_: &[(&str, &str)], value: f64) {
        let _ = writeln!(self.text, "{name}{} {}", labels(labels_), number(value));
    }

    /// The text built.
    pub(in crate::cli) fn finish(self) -> String {
        self.text
    }

    /// One metric with one sample.
    fn one(&mut self, name: &str, kind: &str, help: &str, l: &[(&str, &str)], value: f64) {
        self.metric(name, kind, help);
        self.sample(name, l, value);
    }
}

/// The breaker's state as a number: 0 closed, 1 half-open, 2 open.
fn breaker_state(phase: BreakerPhase) -> f64 {
    match phase {
        BreakerPhase::Closed => 0.0,
        BreakerPhase::HalfOpen => 1.0,
        BreakerPhase::Open => 2.0,
    }
}

/// The gate's metrics: lines by verdict, the gate's counters and rates, the batch latency
/// histogram, the breaker's state. `finished`: whether the stream ran to its end.
pub(super) fn gate_metrics(s: &StreamSummary, gate: &EventGate, finished: bool) -> String {
    let stats = gate.stats();
    let namespace = gate.deduplicator().namespace().to_string();
    let ns: &[(&str, &str)] = &[("namespace", &namespace)];
    let mut m = Exposition::default();
    m.metric(
        "idem_gate_lines_total",
        "counter",
        "Input lines by verdict (blank lines: verdict=\"blank\").",
    );
    for (verdict, n) in [
        ("new", s.new),
        ("replay", s.replay),
        ("conflict", s.conflict),
        ("invalid", s.invalid),
        ("before_cursor", s.before_cursor),
        ("blank", s.blank),
    ] {
        m.sample(
            "idem_gate_lines_total",
            &[("namespace", &namespace), ("verdict", verdict)],
            n as f64,
        );
    }
    for (name, help, value) in [
        (
            "idem_gate_checked_total",
            "Events given to the store check.",
            stats.checked,
        ),
        (
            "idem_gate_unique_total",
            "Events the store found new.",
            stats.unique,
        ),
        (
            "idem_gate_duplicates_total",
            "Replays and conflicts.",
            stats.duplicates,
        ),
        (
            "idem_gate_replays_total",
            "Same key, same payload.",
            stats.replays,
        ),
        (
            "idem_gate_conflicts_total",
            "Same key, other payload.",
            stats.conflicts,
        ),
        (
            "idem_gate_extraction_failures_total",
            "Events whose key or fingerprint could not be taken.",
            stats.extraction_failures,
        ),
        (
            "idem_gate_store_errors_total",
            "Batches whose store call failed (breaker refusals included).",
            stats.store_errors,
        ),
        (
            "idem_gate_fallbacks_total",
            "Events let through unverified because the store failed.",
            stats.fallbacks,
        ),
        (
            "idem_gate_unconfirmed_total",
            "New events written after their pending marks expired (new again next run).",
            stats.unconfirmed,
        ),
        (
            "idem_gate_confirm_failures_total",
            "New events whose batch's confirmation the store failed (new again after the pending timeout).",
            stats.confirm_failures,
        ),
        (
            "idem_gate_batches_total",
            "Batches checked against the store.",
            stats.batches,
        ),
    ] {
        m.one(name, "counter", help, ns, value as f64);
    }
    for (name, help, value) in [
        (
            "idem_gate_duplicate_ratio",
            "Duplicates per event checked.",
            stats.duplicate_rate(),
        ),
        (
            "idem_gate_store_error_ratio",
            "Store errors per batch.",
            stats.error_rate(),
        ),
        (
            "idem_gate_fallback_ratio",
            "Events let through unverified per event checked.",
            stats.fallback_rate(),
        ),
        (
            "idem_gate_extraction_failure_ratio",
            "Events that could not be keyed per event checked.",
            stats.extraction_failure_rate(),
        ),
        (
            "idem_gate_lines_per_second",
            "Input lines per second over the run.",
            s.lines_per_second(),
        ),
        (
            "idem_gate_duration_seconds",
            "How long the gate ran.",
            s.elapsed.as_secs_f64(),
        ),
        (
            "idem_gate_circuit_breaker_state",
            "The store's circuit breaker: 0 closed, 1 half-open, 2 open.",
            breaker_state(gate.breaker_phase()),
        ),
        (
            "idem_gate_finished",
            "1 when the input was read to its end, 0 when the gate stopped early (an error, a signal, a closed output).",
            if finished { 1.0 } else { 0.0 },
        ),
        (
            "idem_gate_last_update_timestamp_seconds",
            "When this file was written (Unix time).",
            chrono::Utc::now().timestamp_micros() as f64 / 1e6,
        ),
    ] {
        m.one(name, "gauge", help, ns, value);
    }
    let h = gate.batch_latency_histogram();
    let name = "idem_gate_batch_duration_seconds";
    m.metric(name, "histogram", "Duration of a batch's store call.");
    for (bound, n) in &h.buckets {
        let le = number(*bound);
        m.sample(
            &format!("{name}_bucket"),
            &[("namespace", &namespace), ("le", &le)],
            *n as f64,
        );
    }
    m.sample(
        &format!("{name}_bucket"),
        &[("namespace", &namespace), ("le", "+Inf")],
        h.count as f64,
    );
    m.sample(&format!("{name}_sum"), ns, h.sum_seconds);
    m.sample(&format!("{name}_count"), ns, h.count as f64);
    m.text
}

/// `idem status --metrics-file`: per job, the scopes missing, failed and abandoned in the
/// period, whether one is running, and the last success.
pub(super) fn status_metrics(jobs: &[super::status::JobStatus]) -> String {
    let mut m = Exposition::default();
    type Value = fn(&super::status::JobStatus) -> Option<f64>;
    let metrics: [(&str, &str, Value); 5] = [
        (
            "idem_job_last_success_timestamp_seconds",
            "When the job last completed a run (Unix seconds), in the period looked at",
            |j| j.last_success.map(|t| t.timestamp() as f64),
        ),
        (
            "idem_job_missing_scopes",
            "Scopes the schedule expected in the period that nothing ran",
            |j| (j.kind == "scheduled").then_some(j.missing.len() as f64),
        ),
        (
            "idem_job_failed_scopes",
            "Scopes expected in the period whose latest run failed, none completed",
            |j| (j.kind == "scheduled").then_some(j.failed.len() as f64),
        ),
        (
            "idem_job_abandoned_scopes",
            "Scopes whose run's lease expired without a result (killed or host lost), none completed since",
            |j| Some(j.abandoned.len() as f64),
        ),
        (
            "idem_job_running",
            "Scopes expected in the period whose lease is held now",
            |j| (j.kind == "scheduled").then_some(j.running.len() as f64),
        ),
    ];
    for (name, help, value) in metrics {
        m.metric(name, "gauge", help);
        for job in jobs {
            if let Some(v) = value(job) {
                m.sample(name, &[("job", &job.job)], v);
            }
        }
    }
    m.text
}

/// One run's metrics: its status, skip reason and trigger as labels, its duration and
/// the records it processed.
pub(super) fn run_metrics(r: &RunReport, exit_code: u8) -> String {
    let status = r.status.to_string();
    let skip = r
        .skip_reason
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    let trigger = r.trigger.to_string();
    let mut m = Exposition::default();
    let job: &[(&str, &str)] = &[("job", &r.job), ("scope", &r.scope)];
    m.one(
        "idem_run_info",
        "gauge",
        "The last run of a job and scope; status, skip reason and trigger as labels.",
        &[
            ("job", &r.job),
            ("scope", &r.scope),
            ("run_id", &r.run_id),
            ("status", &status),
            ("skip_reason", &skip),
            ("trigger", &trigger),
        ],
        1.0,
    );
    m.one(
        "idem_run_success",
        "gauge",
        "1 when the run succeeded or was skipped as already done, 0 otherwise.",
        job,
        if matches!(r.status, RunStatus::Completed | RunStatus::Skipped) {
            1.0
        } else {
            0.0
        },
    );
    m.one(
        "idem_run_duration_seconds",
        "gauge",
        "How long the run took.",
        job,
        r.duration_ms as f64 / 1000.0,
    );
    m.one(
        "idem_run_records_processed",
        "gauge",
        "Records the processor reported (0 when it reported none).",
        job,
        r.records_processed.unwrap_or(0) as f64,
    );
    m.one(
        "idem_run_exit_code",
        "gauge",
        "The exit code of idem run.",
        job,
        f64::from(exit_code),
    );
    m.one(
        "idem_run_finished_timestamp_seconds",
        "gauge",
        "When the run finished (Unix time).",
        job,
        r.finished_at.timestamp_micros() as f64 / 1e6,
    );
    m.text
}

/// Writes `text` to `path` atomically: a temporary file in the same folder (so the rename
/// stays on one file system), flushed to disk, then renamed over `path`.
pub(super) fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        Error::input(format!(
            "--metrics-file {}: not a file name",
            path.display()
        ))
    })?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::write(path, e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Label values and help texts as the text format writes them: `\`, `"` (labels) and
    /// line feeds escaped; numbers with +Inf, -Inf and NaN spelled as Prometheus reads them.
    #[test]
    fn labels_help_and_numbers_are_written_as_the_format_says() {
        assert_eq!(escape(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape("one\ntwo"), "one\\ntwo");
        let mut m = Exposition::default();
        m.metric("x", "gauge", "two\nlines \\ here");
        m.sample("x", &[("job", "we\"ird")], f64::INFINITY);
        m.sample("x", &[], f64::NAN);
        m.sample("x", &[], 1.0);
        assert_eq!(
            m.finish(),
            "# HELP x two\\nlines \\\\ here\n# TYPE x gauge\nx{job=\"we\\\"ird\"} +Inf\nx NaN\nx 1\n"
        );
    }
}
