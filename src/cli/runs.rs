//! `idem runs`: recent runs from the ledger, and the runs not in it yet — those holding
//! their scope now (`running`) and those whose lease expired without a result
//! (`abandoned`), read from the leases not released.

use chrono::{DateTime, Utc};
use clap::{Args, ValueEnum};
use serde::Serialize;

use super::output::{self, Format};
use super::{GlobalOptions, EXIT_OK};
use crate::error::Result;
use crate::job::replay_spool;
use crate::model::{RunRecord, RunStatus};
use crate::store::{self, spool::Spool, OpenLease, RunFilter};

/// `idem runs`: replays the spool first, so the list includes the runs it held.
pub(super) async fn runs(args: RunsArgs, g: &GlobalOptions) -> Result<u8> {
    let filter = RunFilter {
        processor: args.job.clone(),
        scope: args.scope.clone(),
        status: args.status.and_then(RunsStatus::recorded),
        since: None,
        limit: args.limit as usize,
        ..RunFilter::default()
    };
    let location;
    let (recorded, open) = if let Some(path) = super::missing_ledger(&g.store)? {
        // Nothing recorded there: an empty list, and a warning in case it is a typo.
        output::note(format_args!("warning: {}", super::no_ledger_message(&path)));
        location = crate::backend::redact_url(&g.store);
        (Vec::new(), Vec::new())
    } else {
        let store = store::open(&g.store).await?;
        replay_spool(&Spool::from_env(&g.store), &*store).await;
        location = store.location();
        let recorded = match args.status {
            Some(s) if s.recorded().is_none() => Vec::new(),
            _ => store.runs(&filter).await?,
        };
        let open = match args.status {
            Some(s) if s.recorded().is_some() => Vec::new(),
            _ => store.open_leases(args.job.as_deref()).await?,
        };
        (recorded, open)
    };
    let now = Utc::now();
    let open: Vec<OpenRun> = open
        .into_iter()
        .filter(|l| args.scope.as_ref().is_none_or(|s| *s == l.scope))
        .map(|l| OpenRun::of(l, now))
        .filter(|r| args.status.is_none_or(|s| s.as_str() == r.status))
        .collect();
    let rows = merge(recorded, open, args.limit as usize);
    print(&rows, &location, &args, g.format, now);
    Ok(EXIT_OK)
}

/// A status `idem runs --status` takes: a ledger row's, or an open lease's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum RunsStatus {
    /// Recorded completed.
    Completed,
    /// Recorded failed (interrupted runs too).
    Failed,
    /// Recorded skipped.
    Skipped,
    /// Holding its scope now, not recorded yet.
    Running,
    /// Its lease expired without a result (killed, or its host lost).
    Abandoned,
}

impl RunsStatus {
    /// The ledger status it selects (`None`: an open lease's).
    fn recorded(self) -> Option<RunStatus> {
        match self {
            RunsStatus::Completed => Some(RunStatus::Completed),
            RunsStatus::Failed => Some(RunStatus::Failed),
            RunsStatus::Skipped => Some(RunStatus::Skipped),
            RunsStatus::Running | RunsStatus::Abandoned => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self.recorded() {
            Some(s) => s.as_str(),
            None if self == RunsStatus::Running => "running",
            None => "abandoned",
        }
    }
}

/// A run known from its lease only: `running` while the lease lasts, `abandoned` after.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OpenRun {
    pub run_id: String,
    pub processor: String,
    pub scope: String,
    pub status: &'static str,
    /// When it claimed its scope.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat (claim or renewal), when the store recorded one.
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// When its lease expires (or expired).
    pub lease_expires_at: DateTime<Utc>,
    pub host: Option<String>,
    pub pid: Option<i64>,
    pub token: i64,
}

impl OpenRun {
    pub(crate) fn of(l: OpenLease, now: DateTime<Utc>) -> Self {
        OpenRun {
            status: if l.running_at(now) {
                "running"
            } else {
                "abandoned"
            },
            run_id: l.run_id,
            processor: l.processor,
            scope: l.scope,
            started_at: l.acquired_at,
            heartbeat_at: l.heartbeat_at,
            lease_expires_at: l.expires_at,
            host: l.host,
            pid: l.pid,
            token: l.token,
        }
    }

    /// `host:pid`, or what of it is known.
    fn holder(&self) -> String {
        match (&self.host, self.pid) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.clone(),
            (None, Some(p)) => format!("pid {p}"),
            (None, None) => "holder unknown".to_string(),
        }
    }
}

/// A row of `idem runs`: recorded, or open.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Row {
    Recorded(RunRecord),
    Open(OpenRun),
}

impl Row {
    fn started_at(&self) -> DateTime<Utc> {
        match self {
            Row::Recorded(r) => r.started_at,
            Row::Open(o) => o.started_at,
        }
    }
}

/// Recorded and open runs, newest first, at most `limit` (0: all). The ledger's own order
/// is kept among its rows.
fn merge(recorded: Vec<RunRecord>, open: Vec<OpenRun>, limit: usize) -> Vec<Row> {
    let mut rows: Vec<Row> = open.into_iter().map(Row::Open).collect();
    rows.extend(recorded.into_iter().map(Row::Recorded));
    // Stable: the ledger's rows keep their order among equal start times.
    rows.sort_by_key(|r| std::cmp::Reverse(r.started_at()));
    if limit > 0 {
        rows.truncate(limit);
    }
    rows
}

fn print(rows: &[Row], store: &str, args: &RunsArgs, format: Format, now: DateTime<Utc>) {
    if format == Format::Json {
        output::print_json(&rows);
        return;
    }
    if rows.is_empty() {
        let mut which = Vec::new();
        if let Some(job) = &args.job {
            which.push(format!("of job {job:?}"));
        }
        if let Some(scope) = &args.scope {
            which.push(format!("for {scope:?}"));
        }
        if let Some(status) = args.status {
            which.push(format!("with status {}", status.as_str()));
        }
        let which: String = which.iter().map(|w| format!(" {w}")).collect();
        output::print_text(&format!("no runs{which} recorded in {store}\n"));
        return;
    }
    let mut text = String::new();
    for row in rows {
        match row {
            Row::Recorded(r) => text.push_str(&output::run_line(r)),
            Row::Open(o) => {
                let ago = |t: DateTime<Utc>| {
                    let secs = (now - t).num_seconds().max(0) as u64;
                    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
                };
                let beat = o
                    .heartbeat_at
                    .map(|t| format!("last heartbeat {} ago", ago(t)))
                    .unwrap_or_else(|| "no heartbeat recorded".to_string());
                let lease = if o.status == "running" {
                    format!("lease until {}", o.lease_expires_at.format("%H:%M:%S"))
                } else {
                    format!("lease expired {} ago, no result", ago(o.lease_expires_at))
                };
                text.push_str(&format!(
                    "{}  {:<9} {} {}  run {}  {}  {beat}, {lease}\n",
                    o.started_at.format("%Y-%m-%d %H:%M:%S"),
                    o.status,
                    o.processor,
                    o.scope,
                    o.run_id,
                    o.holder(),
                ));
            }
        }
    }
    output::print_text(&text);
}

#[derive(Debug, Args)]
pub(crate) struct RunsArgs {
    /// Only this job.
    #[arg(long)]
    pub(super) job: Option<String>,
    /// Only this scope.
    #[arg(long)]
    pub(super) scope: Option<String>,
    /// Only this status (running and abandoned: runs not recorded yet, from their leases).
    #[arg(long, value_enum)]
    pub(super) status: Option<RunsStatus>,
    /// At most this many rows (0 = all).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub(super) limit: u32,
}
