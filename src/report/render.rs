//! Text, JSON and Markdown renderings of a [`Report`].

use std::fmt::Write as _;

use super::{num, ProcessorReport, Report};

/// Output formats of `idem report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// Lines for people.
    Human,
    /// One JSON document.
    Json,
    /// Markdown (a summary table, then the reasons per processor).
    Markdown,
}

/// The report as text in `format` (ends with a newline).
pub fn render(report: &Report, format: OutputFormat) -> String {
    match format {
        OutputFormat::Json => {
            let mut s = serde_json::to_string_pretty(report).unwrap_or_default();
            s.push('\n');
            s
        }
        OutputFormat::Human => human(report),
        OutputFormat::Markdown => markdown(report),
    }
}

fn period(report: &Report) -> String {
    format!(
        "{} to {} ({} days)",
        report.period.since.format("%Y-%m-%d %H:%M UTC"),
        report.period.until.format("%Y-%m-%d %H:%M UTC"),
        report.period.days
    )
}

fn seconds(v: Option<f64>) -> String {
    v.map(|v| format!("{} s", num(v)))
        .unwrap_or_else(|| "-".into())
}

fn storage_line(report: &Report) -> String {
    let s = &report.storage;
    let range = match (s.oldest_key, s.newest_key) {
        (Some(a), Some(b)) => format!(", {} to {}", a.format("%Y-%m-%d"), b.format("%Y-%m-%d")),
        _ => String::new(),
    };
    format!(
        "{} key(s), {} distinct, {} processor(s){range}, about {}",
        s.total_keys,
        s.unique_keys,
        s.processors,
        size(s.estimated_bytes)
    )
}

fn size(bytes: i64) -> String {
    let b = bytes as f64;
    if b >= 1024.0 * 1024.0 {
        format!("{:.1} MB", b / (1024.0 * 1024.0))
    } else if b >= 1024.0 {
        format!("{:.1} KB", b / 1024.0)
    } else {
        format!("{bytes} bytes")
    }
}

fn human(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "idem report: {}", report.store);
    let _ = writeln!(out, "period: {}", period(report));
    if report.processors.is_empty() {
        let _ = writeln!(
            out,
            "no runs recorded in the period: nothing to judge (not_enough_data)"
        );
    }
    for p in &report.processors {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{}: {} (content hash {}, {})",
            p.job,
            p.verdict.as_str(),
            p.content_hash,
            source(p)
        );
        let _ = writeln!(
            out,
            "  runs: {} invocations, {} completed, {} failed, {} skipped, {} in shadow mode; average completed {}",
            p.runs.total_invocations,
            p.runs.completed_runs,
            p.runs.failed_runs,
            p.runs.skipped_runs,
            p.runs.shadow_runs,
            seconds(p.runs.avg_completed_seconds)
        );
        let e = &p.effectiveness;
        let _ = writeln!(
            out,
            "  prevented: content hash {} ({} %, {} s saved), time window {} ({} %, {} s saved)",
            e.hash_prevented,
            num(e.hash_prevention_pct),
            num(e.hash_seconds_saved),
            e.window_prevented,
            num(e.window_prevention_pct),
            num(e.window_seconds_saved)
        );
        if !p.shadow.would_skip.is_empty() {
            let parts: Vec<String> = p
                .shadow
                .would_skip
                .iter()
                .map(|(reason, w)| format!("{reason} {} ({} s)", w.runs, num(w.seconds)))
                .collect();
            let _ = writeln!(out, "  would skip (shadow): {}", parts.join(", "));
        }
        for reason in &p.reasons {
            let _ = writeln!(out, "  - {reason}");
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "processing_keys: {}", storage_line(report));
    out
}

fn source(p: &ProcessorReport) -> &'static str {
    match p.source {
        super::Source::Measured => "measured",
        super::Source::Estimated => "estimated",
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn markdown(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# idem report");
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Period: {}. Store: `{}`.",
        period(report),
        report.store
    );
    let _ = writeln!(out);
    if report.processors.is_empty() {
        let _ = writeln!(
            out,
            "No runs recorded in the period: nothing to judge (`not_enough_data`)."
        );
    } else {
        let _ = writeln!(
            out,
            "| job | verdict | content hash | source | invocations | duplicate runs | minutes wasted | high-confidence prevents | hash prevented |"
        );
        let _ = writeln!(out, "|---|---|---|---|--:|--:|--:|--:|--:|");
        for p in &report.processors {
            let _ = writeln!(
                out,
                "| {} | `{}` | {} | {} | {} | {} | {} | {} | {} |",
                cell(&p.job),
                p.verdict.as_str(),
                p.content_hash,
                source(p),
                p.runs.total_invocations,
                p.duplicates.duplicate_runs,
                num(p.wasted.minutes_wasted),
                p.savings.high_confidence_prevents,
                p.effectiveness.hash_prevented
            );
        }
        for p in &report.processors {
            let _ = writeln!(out);
            let _ = writeln!(out, "## {}: `{}`", cell(&p.job), p.verdict.as_str());
            let _ = writeln!(out);
            for reason in &p.reasons {
                let _ = writeln!(out, "- {}", cell(reason));
            }
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "processing_keys: {}.", storage_line(report));
    out
}
