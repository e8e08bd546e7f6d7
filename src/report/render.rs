//! Text, JSON and Markdown renderings of a [`Report`].

use std::fmt::Write as _;

use super::{num, Day, ProcessorReport, Report, Verdict};

/// Output formats of `idem report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// Lines for people.
    Human,
    /// One JSON document.
    Json,
    /// Markdown (a summary table, then the reasons per processor).
    Markdown,
    /// One self-contained HTML page: a summary table and a daily chart per processor
    /// (inline SVG, no network fetches).
    Html,
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
        OutputFormat::Html => html(report),
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
        (Some(a), Some(b)) => format!(
            ", {} to {}",
            crate::model::time::day_text(a.date_naive()),
            crate::model::time::day_text(b.date_naive())
        ),
        _ => String::new(),
    };
    let since = match s.keys_since {
        Some(t) => format!(
            " written since {}",
            crate::model::time::day_text(t.date_naive())
        ),
        None => String::new(),
    };
    format!(
        "{} key(s){since}, {} distinct, {} processor(s){range}, about {}{}",
        s.total_keys,
        s.unique_keys,
        s.processors,
        size(s.estimated_bytes),
        s.table_bytes
            .map(|b| format!(" (table size {} per the tables API)", size(b)))
            .unwrap_or_default()
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
        let whose = match &report.job {
            Some(job) => format!("of job {job:?} "),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "no runs {whose}recorded in the period: nothing to judge (not_enough_data)"
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
        if p.runs.running_runs + p.runs.abandoned_runs > 0 {
            let _ = writeln!(
                out,
                "  not recorded yet: {} running, {} abandoned (their lease expired without a result; idem runs --status abandoned)",
                p.runs.running_runs, p.runs.abandoned_runs
            );
        }
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

/// Text for a Markdown table cell or line: Markdown's punctuation escaped with a
/// backslash, HTML's `<`/`>`/`&` as entities, line breaks as spaces, so a job name such
/// as `a|b*c_<x>` reads as written and cannot break the table or inject markup.
fn cell(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let chars: Vec<char> = s.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        // An underscore inside a word (`daily_sales`) is never emphasis in CommonMark/GFM:
        // left as it is, so names read and search as written.
        let inside_word = |j: Option<usize>| {
            j.and_then(|j| chars.get(j))
                .is_some_and(|c| c.is_alphanumeric())
        };
        if c == '_' && inside_word(i.checked_sub(1)) && inside_word(Some(i + 1)) {
            out.push(c);
            continue;
        }
        match c {
            '|' | '\\' | '`' | '*' | '_' | '[' | ']' | '#' | '!' | '~' => {
                out.push('\\');
                out.push(c);
            }
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\n' | '\r' => out.push(' '),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
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

pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn verdict_color(v: Verdict) -> &'static str {
    match v {
        Verdict::Enable => "#b45309",
        Verdict::Consider => "#ca8a04",
        Verdict::NotNeeded => "#15803d",
        Verdict::Keep => "#1d4ed8",
        Verdict::Remove => "#b91c1c",
        Verdict::NotEnoughData => "#6b7280",
    }
}

/// A series of a daily chart: label, colour, value of a day.
type Series = (&'static str, &'static str, fn(&Day) -> i64);

/// The series of a daily chart, stacked in this order.
const SERIES: [Series; 5] = [
    ("completed", "#16a34a", |d| d.completed),
    ("failed", "#dc2626", |d| d.failed),
    ("skipped: content hash", "#2563eb", |d| {
        d.skipped_content_hash
    }),
    ("skipped: time window", "#7c3aed", |d| d.skipped_time_window),
    ("skipped: other", "#9ca3af", |d| {
        d.skipped - d.skipped_content_hash - d.skipped_time_window
    }),
];
const WOULD_SKIP: &str = "#f97316";

fn chart(p: &ProcessorReport) -> String {
    let (w, h) = (760.0_f64, 220.0_f64);
    let (left, right, top, bottom) = (40.0, 10.0, 10.0, 40.0);
    let plot_w = w - left - right;
    let plot_h = h - top - bottom;
    let n = p.daily.len().max(1) as f64;
    let max = p
        .daily
        .iter()
        .map(|d| (d.completed + d.failed + d.skipped).max(d.would_skip))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let slot = plot_w / n;
    let bar = (slot * 0.7).max(1.0);
    let y = |v: f64| top + plot_h - v / max * plot_h;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="daily runs of {job}">"##,
        job = esc(&p.job)
    );
    // Grid: 0, half and max.
    for v in [0.0, (max / 2.0).round(), max] {
        let yy = y(v);
        let _ = write!(
            svg,
            r##"<line x1="{left}" y1="{yy:.1}" x2="{x2}" y2="{yy:.1}" stroke="#e5e7eb"/><text x="{tx}" y="{ty:.1}" font-size="10" text-anchor="end" fill="#6b7280">{v}</text>"##,
            x2 = w - right,
            tx = left - 4.0,
            ty = yy + 3.0,
        );
    }
    let label_every = ((n / 10.0).ceil() as usize).max(1);
    for (i, d) in p.daily.iter().enumerate() {
        let x = left + slot * i as f64 + (slot - bar) / 2.0;
        let mut acc = 0.0;
        for (label, color, value) in SERIES {
            let v = value(d) as f64;
            if v <= 0.0 {
                continue;
            }
            let (y1, y0) = (y(acc + v), y(acc));
            let _ = write!(
                svg,
                r##"<rect x="{x:.1}" y="{y1:.1}" width="{bar:.1}" height="{hh:.1}" fill="{color}"><title>{day}: {v} {label}</title></rect>"##,
                hh = y0 - y1,
                day = d.day,
            );
            acc += v;
        }
        if d.would_skip > 0 {
            let cy = y(d.would_skip as f64);
            let _ = write!(
                svg,
                r##"<line x1="{x:.1}" y1="{cy:.1}" x2="{x2:.1}" y2="{cy:.1}" stroke="{WOULD_SKIP}" stroke-width="3"><title>{day}: {v} would have been skipped (shadow)</title></line>"##,
                x2 = x + bar,
                day = d.day,
                v = d.would_skip,
            );
        }
        if i % label_every == 0 {
            let _ = write!(
                svg,
                r##"<text x="{tx:.1}" y="{ty}" font-size="10" text-anchor="middle" fill="#374151">{label}</text>"##,
                tx = x + bar / 2.0,
                ty = h - bottom + 14.0,
                label = d.day.get(5..).unwrap_or(&d.day),
            );
        }
    }
    // Legend.
    let mut lx = left;
    let ly = h - 12.0;
    let legend: Vec<(&str, &str)> = SERIES
        .iter()
        .map(|(l, c, _)| (*l, *c))
        .chain([("would skip (shadow)", WOULD_SKIP)])
        .collect();
    for (label, color) in legend {
        let _ = write!(
            svg,
            r##"<rect x="{lx:.1}" y="{ry:.1}" width="10" height="10" fill="{color}"/><text x="{tx:.1}" y="{ly:.1}" font-size="10" fill="#374151">{label}</text>"##,
            ry = ly - 9.0,
            tx = lx + 14.0,
        );
        lx += 14.0 + 6.0 * label.len() as f64 + 10.0;
    }
    svg.push_str("</svg>");
    svg
}

fn html(report: &Report) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        r##"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>idem report</title>
<style>
body {{ font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px; color: #111827; }}
h1 {{ font-size: 22px; margin: 0 0 4px; }}
h2 {{ font-size: 17px; margin: 28px 0 6px; }}
.meta {{ color: #4b5563; font-size: 13px; }}
table {{ border-collapse: collapse; font-size: 13px; margin-top: 12px; }}
th, td {{ border-bottom: 1px solid #e5e7eb; padding: 5px 10px; text-align: left; }}
td.n, th.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
.badge {{ color: #fff; border-radius: 4px; padding: 1px 7px; font-size: 12px; font-weight: 600; }}
ul {{ font-size: 13px; margin: 6px 0; }}
</style></head><body>
<h1>idem report</h1>
<div class="meta">{period} &middot; store {store}</div>
"##,
        period = esc(&period(report)),
        store = esc(&report.store)
    );
    if report.processors.is_empty() {
        out.push_str(
            "<p>No runs recorded in the period: nothing to judge (not_enough_data).</p>\n",
        );
    } else {
        out.push_str("<table><thead><tr><th>job</th><th>verdict</th><th>content hash</th><th>source</th><th class=\"n\">invocations</th><th class=\"n\">duplicate runs</th><th class=\"n\">minutes wasted</th><th class=\"n\">high-confidence prevents</th><th class=\"n\">hash prevented</th><th class=\"n\">would skip (shadow)</th></tr></thead><tbody>\n");
        for p in &report.processors {
            let would: i64 = p.shadow.would_skip.values().map(|w| w.runs).sum();
            let _ = writeln!(
                out,
                "<tr><td><a href=\"#job-{id}\">{job}</a></td><td><span class=\"badge\" style=\"background:{color}\">{verdict}</span></td><td>{hash}</td><td>{source}</td><td class=\"n\">{inv}</td><td class=\"n\">{dup}</td><td class=\"n\">{min}</td><td class=\"n\">{hc}</td><td class=\"n\">{hp}</td><td class=\"n\">{would}</td></tr>",
                id = esc(&p.job),
                job = esc(&p.job),
                color = verdict_color(p.verdict),
                verdict = p.verdict.as_str(),
                hash = p.content_hash,
                source = source(p),
                inv = p.runs.total_invocations,
                dup = p.duplicates.duplicate_runs,
                min = num(p.wasted.minutes_wasted),
                hc = p.savings.high_confidence_prevents,
                hp = p.effectiveness.hash_prevented,
            );
        }
        out.push_str("</tbody></table>\n");
        for p in &report.processors {
            let _ = writeln!(
                out,
                "<h2 id=\"job-{id}\">{job} <span class=\"badge\" style=\"background:{color}\">{verdict}</span></h2>",
                id = esc(&p.job),
                job = esc(&p.job),
                color = verdict_color(p.verdict),
                verdict = p.verdict.as_str(),
            );
            out.push_str("<ul>");
            for r in &p.reasons {
                let _ = write!(out, "<li>{}</li>", esc(r));
            }
            out.push_str("</ul>\n");
            out.push_str(&chart(p));
            out.push('\n');
        }
    }
    let _ = writeln!(
        out,
        "<p class=\"meta\">processing_keys: {}</p>\n</body></html>",
        esc(&storage_line(report))
    );
    out
}
