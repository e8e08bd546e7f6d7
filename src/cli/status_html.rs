//! `idem status --format html`: the same grid as a page, jobs × dates, one cell per
//! expected date coloured by its state, the run behind it on hover (the cell's title).
//! Self-contained (inline CSS, no script), so it can be mailed or served as a file.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use chrono::{DateTime, NaiveDate, Utc};

use super::status::JobStatus;
use crate::report::html_escape as esc;
use crate::schedule::status::ScopeState;

const STATES: [ScopeState; 6] = [
    ScopeState::Completed,
    ScopeState::Running,
    ScopeState::Abandoned,
    ScopeState::Failed,
    ScopeState::Missing,
    ScopeState::NotYetDue,
];

const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#1f2328}\
h1{font-size:20px;margin:0 0 4px}p{margin:4px 0 12px;color:#57606a;font-size:13px}\
table{border-collapse:separate;border-spacing:2px}\
th,td{font-size:12px;padding:0 4px;text-align:left;white-space:nowrap}\
th.date{writing-mode:vertical-rl;transform:rotate(180deg);font-weight:normal;color:#57606a;padding:4px 0}\
th.job{font-weight:600;padding-right:12px}\
td.cell{width:16px;height:16px;padding:0;border-radius:3px}\
td.note{color:#57606a;padding-left:12px}\
.completed{background:#2da44e}.running{background:#0969da}.failed{background:#cf222e}\
.abandoned{background:#8250df}\
.missing{background:#d4a72c}.not_yet_due{background:#d0d7de}.none{background:#f6f8fa}\
.legend span{display:inline-block;width:12px;height:12px;border-radius:2px;margin:0 4px 0 12px;vertical-align:-1px}\
.attention{color:#cf222e;font-weight:600}";

/// The page for `jobs`, looked at `now` over the period `since` of `store`.
pub(super) fn page(jobs: &[JobStatus], store: &str, since: &str, now: DateTime<Utc>) -> String {
    let dates: BTreeSet<NaiveDate> = jobs
        .iter()
        .flat_map(|j| j.scopes.iter().map(|s| s.date))
        .collect();
    let attention = jobs
        .iter()
        .filter(|j| !j.missing.is_empty() || !j.failed.is_empty())
        .count();
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>idem status</title><style>{STYLE}</style></head><body>\n\
         <h1>idem status</h1>\n<p>{} · the last {} to {} · {} job(s), ",
        esc(store),
        esc(since),
        now.format("%Y-%m-%d %H:%M UTC"),
        jobs.len()
    );
    match attention {
        0 => out.push_str("nothing missing or failed</p>\n"),
        n => {
            let _ = writeln!(
                out,
                "<span class=\"attention\">{n} with dates missing or failed</span></p>"
            );
        }
    }
    out.push_str("<p class=\"legend\">");
    for state in STATES {
        let _ = write!(
            out,
            "<span class=\"{0}\"></span>{1}",
            state.as_str(),
            state.as_str().replace('_', " ")
        );
    }
    out.push_str("</p>\n<table>\n<thead><tr><th></th>");
    for date in &dates {
        let _ = write!(out, "<th class=\"date\">{date}</th>");
    }
    out.push_str("<th></th></tr></thead>\n<tbody>\n");
    for job in jobs {
        let _ = write!(out, "<tr><th class=\"job\">{}</th>", esc(&job.job));
        for date in &dates {
            match job.scopes.iter().find(|s| s.date == *date) {
                Some(s) => {
                    let mut title = format!(
                        "{} {}: {}, due {}",
                        job.job,
                        s.scope,
                        s.state.as_str().replace('_', " "),
                        s.due.format("%Y-%m-%d %H:%M UTC")
                    );
                    if let Some(run) = &s.run_id {
                        let _ = write!(title, ", run {run}");
                    }
                    let _ = write!(
                        out,
                        "<td class=\"cell {}\" data-state=\"{}\" title=\"{}\"></td>",
                        s.state.as_str(),
                        s.state.as_str(),
                        esc(&title)
                    );
                }
                None => out.push_str("<td class=\"cell none\"></td>"),
            }
        }
        let _ = writeln!(out, "<td class=\"note\">{}</td></tr>", esc(&note(job)));
    }
    out.push_str("</tbody>\n</table>\n</body></html>\n");
    out
}

/// What the row says after its cells.
fn note(job: &JobStatus) -> String {
    let mut said = Vec::new();
    if !job.failed.is_empty() {
        said.push(format!("{} failed", job.failed.len()));
    }
    if !job.missing.is_empty() {
        said.push(format!("{} missing", job.missing.len()));
    }
    if !job.abandoned.is_empty() {
        said.push(format!("{} abandoned", job.abandoned.len()));
    }
    if !job.running.is_empty() {
        said.push(format!("{} running", job.running.len()));
    }
    match (&job.schedule, &job.last_run) {
        (Some(schedule), _) => said.push(format!(
            "schedule \"{schedule}\" {}",
            job.timezone.as_deref().unwrap_or("UTC")
        )),
        (None, Some(run)) => said.push(format!(
            "no schedule; last run {} {} at {}",
            run.scope,
            run.status.as_str(),
            run.started_at.format("%Y-%m-%d %H:%M UTC")
        )),
        (None, None) => said.push("no schedule".to_string()),
    }
    if let Some(at) = job.last_success {
        said.push(format!("last success {}", at.format("%Y-%m-%d %H:%M UTC")));
    }
    said.join(" · ")
}
