//! `idem status [JOB…] [--since 7d]`: which expected scopes completed, which are running,
//! abandoned, failed or missing (see [`crate::schedule::status`]); exit 1 when any is
//! abandoned, failed or missing. `run JOB --missing` runs exactly those.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use std::io::Write as _;

use chrono::{DateTime, Utc};
use clap::Args;
use serde::Serialize;

use super::output::{self, Format};
use super::{GlobalOptions, EXIT_OK, EXIT_RUN_FAILED};
use crate::error::{Error, Result};
use crate::job::{find_job, load_jobs, replay_spool, Job};
use crate::model::duration::parse_duration_field;
use crate::model::{RunRecord, RunStatus};
use crate::schedule::status::{expected_states, ExpectedScope, ScopeState};
use crate::store::{self, spool::Spool, DynStore, OpenLease, RunFilter};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Only these jobs (a job file's name, or a job known only from the ledger such as an
    /// `idem exec` job); default: every job with a schedule, and the ledger's other jobs.
    pub(super) jobs: Vec<String>,
    /// The period to look back over (e.g. 7d, 36h; at most 3660d).
    #[arg(long, default_value = "7d", value_name = "DURATION")]
    pub(super) since: String,
    /// How long after its slot a scope may still be unstarted before it is missing.
    #[arg(long, default_value = "1h", value_name = "DURATION")]
    pub(super) tolerance: String,
    /// Also write the Prometheus text format here (idem_job_missing_scopes, …), atomically.
    #[arg(long, value_name = "FILE")]
    pub(super) metrics_file: Option<PathBuf>,
}

/// The longest `--since`: ten years of slots.
const MAX_SINCE: std::time::Duration = std::time::Duration::from_secs(3660 * 86400);

/// One job's line of `idem status`.
#[derive(Debug, Serialize)]
pub(super) struct JobStatus {
    pub job: String,
    /// `scheduled` (its scopes are expected) or `ledger` (known from its runs only).
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    pub scopes: Vec<ExpectedScope>,
    pub missing: Vec<String>,
    pub failed: Vec<String>,
    pub running: Vec<String>,
    pub abandoned: Vec<String>,
    pub last_success: Option<DateTime<Utc>>,
    pub last_run: Option<LastRun>,
}

#[derive(Debug, Serialize)]
pub(super) struct LastRun {
    pub run_id: String,
    pub scope: String,
    pub status: RunStatus,
    pub started_at: DateTime<Utc>,
}

impl JobStatus {
    fn needs_attention(&self) -> bool {
        !self.missing.is_empty() || !self.failed.is_empty() || !self.abandoned.is_empty()
    }
}

/// The statuses of the jobs `names` (or every one), over `[now - since, now]`.
pub(super) async fn statuses(
    names: &[String],
    since: &str,
    tolerance: &str,
    g: &GlobalOptions,
) -> Result<(Vec<JobStatus>, DateTime<Utc>)> {
    let since = parse_duration_field("--since", since).map_err(Error::input)?;
    if since > MAX_SINCE {
        return Err(Error::input(format!(
            "--since: at most 3660d (ten years), not {}",
            humantime::format_duration(since)
        )));
    }
    let tolerance = parse_duration_field("--tolerance", tolerance).map_err(Error::input)?;
    let now = Utc::now();
    let from = now - chrono::Duration::from_std(since).unwrap_or(chrono::Duration::zero());
    // The jobs: those named (a job file, or only a name the ledger may know), or all.
    let (scheduled, mut ledger_only, all_named) = if names.is_empty() {
        // No jobs folder (`idem exec` jobs only): the ledger's jobs, said.
        let jobs = if g.jobs_dir.exists() {
            load_jobs(&g.jobs_dir, &g.store)?
        } else {
            output::note(format_args!(
                "note: no jobs folder {}: the ledger's jobs only (set --jobs-dir)",
                g.jobs_dir.display()
            ));
            Vec::new()
        };
        let known: BTreeSet<String> = jobs.iter().map(|j| j.name.clone()).collect();
        let scheduled: Vec<Job> = jobs.into_iter().filter(|j| j.schedule.is_some()).collect();
        (scheduled, BTreeSet::new(), Some(known))
    } else {
        let mut scheduled = Vec::new();
        let mut others = BTreeSet::new();
        for name in names {
            match find_job(name, &g.jobs_dir, &g.store) {
                Ok(job) if job.schedule.is_some() => scheduled.push(job),
                Ok(job) => {
                    others.insert(job.name);
                }
                // Not a job file: perhaps a job the ledger knows (an `idem exec` job).
                Err(_) if !name.ends_with(".toml") && !name.contains('/') => {
                    others.insert(name.clone());
                }
                Err(e) => return Err(e),
            }
        }
        (scheduled, others, None)
    };
    let store = open(g).await?;
    // Runs of a scope start at its slot or after; a day before the period catches a hand
    // run started just before it.
    let runs = store
        .runs(&RunFilter {
            since: Some(from - chrono::Duration::days(1)),
            limit: 0,
            ..RunFilter::default()
        })
        .await?;
    let mut by_job: BTreeMap<&str, Vec<&RunRecord>> = BTreeMap::new();
    for run in &runs {
        by_job.entry(run.processor.as_str()).or_default().push(run);
    }
    // The leases not released, all jobs in one read: a scope held now is running, one whose
    // lease expired without a result abandoned (what comes before all but completion).
    let mut open: BTreeMap<(String, String), OpenLease> = BTreeMap::new();
    for lease in store.open_leases(None).await? {
        open.insert((lease.processor.clone(), lease.scope.clone()), lease);
    }
    let open_of = |job: &str, state: bool| -> Vec<String> {
        open.values()
            .filter(|l| l.processor == job && l.running_at(now) == state)
            .map(|l| l.scope.clone())
            .collect()
    };
    if let Some(known) = &all_named {
        // Every job of the ledger without a job file (an `idem exec` job).
        ledger_only.extend(
            by_job
                .keys()
                .copied()
                .chain(open.keys().map(|(job, _)| job.as_str()))
                .filter(|name| !known.contains(*name))
                .map(str::to_string),
        );
    }
    let mut out = Vec::new();
    for job in &scheduled {
        let sj = job.scheduled()?;
        let theirs = by_job.get(job.name.as_str()).cloned().unwrap_or_default();
        let mut scopes = Vec::new();
        for (mut s, _) in expected_states(&sj, from, now, &theirs, tolerance)? {
            // An open lease: a run of the scope is under way (a retry of a failed one too),
            // or was abandoned.
            if s.state != ScopeState::Completed {
                if let Some(lease) = open.get(&(job.name.clone(), s.scope.clone())) {
                    s.state = if lease.running_at(now) {
                        ScopeState::Running
                    } else {
                        ScopeState::Abandoned
                    };
                    s.run_id = Some(lease.run_id.clone());
                }
            }
            scopes.push(s);
        }
        let of = |state: ScopeState| -> Vec<String> {
            scopes
                .iter()
                .filter(|s| s.state == state)
                .map(|s| s.scope.clone())
                .collect()
        };
        let (missing, failed, running, abandoned) = (
            of(ScopeState::Missing),
            of(ScopeState::Failed),
            of(ScopeState::Running),
            of(ScopeState::Abandoned),
        );
        out.push(JobStatus {
            job: job.name.clone(),
            kind: "scheduled",
            schedule: Some(sj.schedule.clone()),
            timezone: Some(sj.tz()?.name().to_string()),
            scopes,
            missing,
            failed,
            running,
            abandoned,
            last_success: last_success(&theirs),
            last_run: last_run(&theirs),
        });
    }
    for name in ledger_only {
        let theirs = by_job.get(name.as_str()).cloned().unwrap_or_default();
        // A name asked for that no job file has and the ledger never saw: a typo, said.
        let leased = open.keys().any(|(job, _)| *job == name);
        if theirs.is_empty() && !leased && all_named.is_none() {
            let ever = store
                .runs(&RunFilter {
                    processor: Some(name.clone()),
                    limit: 1,
                    ..RunFilter::default()
                })
                .await?;
            if ever.is_empty() && find_job(&name, &g.jobs_dir, &g.store).is_err() {
                return Err(Error::config(format!(
                    "unknown job {name:?}: no job file in {} has it, and the ledger has no run \
                     of it",
                    g.jobs_dir.display()
                )));
            }
        }
        let (running, abandoned) = (open_of(&name, true), open_of(&name, false));
        // No schedule says what was expected: failed are the scopes of the period whose
        // last run failed (a later run of the scope that completed clears it), so an
        // `idem exec` job that fails needs attention as a scheduled job's scope does.
        let mut last_of_scope: BTreeMap<&str, &RunRecord> = BTreeMap::new();
        for run in theirs.iter().filter(|r| r.started_at >= from) {
            let last = last_of_scope.entry(run.scope.as_str()).or_insert(run);
            if run.started_at > last.started_at {
                *last = run;
            }
        }
        let failed = last_of_scope
            .into_iter()
            .filter(|(scope, r)| {
                r.status == RunStatus::Failed && !running.iter().any(|s| s == scope)
            })
            .map(|(scope, _)| scope.to_string())
            .collect();
        out.push(JobStatus {
            job: name,
            kind: "ledger",
            schedule: None,
            timezone: None,
            scopes: Vec::new(),
            missing: Vec::new(),
            failed,
            running,
            abandoned,
            last_success: last_success(&theirs),
            last_run: last_run(&theirs),
        });
    }
    Ok((out, now))
}

fn last_success(runs: &[&RunRecord]) -> Option<DateTime<Utc>> {
    runs.iter()
        .filter(|r| r.status == RunStatus::Completed)
        .map(|r| r.finished_at)
        .max()
}

fn last_run(runs: &[&RunRecord]) -> Option<LastRun> {
    runs.iter().max_by_key(|r| r.started_at).map(|r| LastRun {
        run_id: r.run_id.clone(),
        scope: r.scope.clone(),
        status: r.status,
        started_at: r.started_at,
    })
}

/// The store, its spool replayed; an empty one when the SQLite ledger does not exist (every
/// expected scope is then missing), with a warning.
async fn open(g: &GlobalOptions) -> Result<std::sync::Arc<DynStore>> {
    if let Some(path) = super::missing_ledger(&g.store)? {
        output::note(format_args!("warning: {}", super::no_ledger_message(&path)));
        return store::open("memory://").await;
    }
    let store = store::open(&g.store).await?;
    replay_spool(&Spool::from_env(&g.store), &*store).await;
    Ok(store)
}

/// `idem status`.
pub(super) async fn status(args: &StatusArgs, g: &GlobalOptions) -> Result<u8> {
    let (jobs, now) = statuses(&args.jobs, &args.since, &args.tolerance, g).await?;
    if let Some(path) = &args.metrics_file {
        super::metrics::write_atomically(path, &super::metrics::status_metrics(&jobs))?;
    }
    let attention = jobs.iter().any(JobStatus::needs_attention);
    if g.format_arg == super::FormatArg::Html {
        let store = crate::backend::redact_url(&g.store);
        output::print_text(&super::status_html::page(&jobs, &store, &args.since, now));
        return Ok(if attention { EXIT_RUN_FAILED } else { EXIT_OK });
    }
    match g.format {
        Format::Json => output::print_json(&serde_json::json!({
            "now": now,
            "since": args.since,
            "ok": !attention,
            "jobs": jobs,
        })),
        Format::Human => print_human(&jobs),
    }
    Ok(if attention { EXIT_RUN_FAILED } else { EXIT_OK })
}

/// The most cells of a job's grid: the newest scopes, older ones counted.
const GRID: usize = 31;

fn cell(state: ScopeState) -> char {
    match state {
        ScopeState::Completed => '✓',
        ScopeState::Running => '▸',
        ScopeState::Abandoned => '†',
        ScopeState::Failed => '✗',
        ScopeState::Missing => '!',
        ScopeState::NotYetDue => '·',
    }
}

fn print_human(jobs: &[JobStatus]) {
    if jobs.is_empty() {
        outln!("no job with a schedule, and no run in the ledger for the period");
        return;
    }
    let width = jobs
        .iter()
        .map(|j| j.job.chars().count())
        .max()
        .unwrap_or(0);
    let cells = jobs
        .iter()
        .map(|j| j.scopes.len().min(GRID))
        .max()
        .unwrap_or(0)
        .max(1);
    for j in jobs {
        let grid: String = if j.kind == "ledger" {
            "-".to_string()
        } else {
            j.scopes
                .iter()
                .skip(j.scopes.len().saturating_sub(GRID))
                .map(|s| cell(s.state))
                .collect()
        };
        let pad = cells + 1 - grid.chars().count().min(cells);
        let mut said = Vec::new();
        let list = |what: &str, scopes: &[String]| match scopes {
            [] => None,
            [one] => Some(format!("{what} {one}")),
            [first, second, .., last] if scopes.len() > 4 => Some(format!(
                "{} {what}: {first}, {second}, … {last}",
                scopes.len()
            )),
            _ => Some(format!("{} {what}: {}", scopes.len(), scopes.join(", "))),
        };
        said.extend(list("failed", &j.failed));
        said.extend(list("missing", &j.missing));
        said.extend(list("abandoned", &j.abandoned));
        said.extend(list("running", &j.running));
        if j.kind == "ledger" {
            said.push(match &j.last_run {
                Some(r) => format!(
                    "no schedule; last run: {} {} (started {})",
                    r.scope,
                    r.status.as_str(),
                    r.started_at.format("%Y-%m-%d %H:%M UTC")
                ),
                None => "no schedule; no run in the period".to_string(),
            });
        } else if said.is_empty() {
            let done = j
                .scopes
                .iter()
                .filter(|s| s.state == ScopeState::Completed)
                .count();
            said.push(match j.scopes.len() {
                0 => "nothing expected in the period".to_string(),
                n => format!("ok ({done} of {n} completed)"),
            });
        }
        // (A ledger job whose last run completed said when already.)
        let said_already = j.kind == "ledger"
            && j.last_run
                .as_ref()
                .is_some_and(|r| r.status == RunStatus::Completed);
        if let Some(at) = j.last_success.filter(|_| !said_already) {
            said.push(format!("last success {}", at.format("%Y-%m-%d %H:%M UTC")));
        }
        outln!(
            "{:<width$}  {grid}{}{}",
            j.job,
            " ".repeat(pad),
            said.join("; ")
        );
    }
    outln!(
        "(✓ completed  ▸ running  † abandoned  ✗ failed  ! missing  · not yet due; oldest first)"
    );
}
