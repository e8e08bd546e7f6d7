//! `idem release JOB (--scope S | --date D) [--yes]`: frees a lease whose holder is gone,
//! and records it; and how the commands that manage a job find one that has no job file.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use clap::Args;

use super::output;
use super::{GlobalOptions, EXIT_OK, EXIT_RUN_FAILED};
use crate::error::{Error, Result};
use crate::job::find_job;
use crate::model::{Mode, RunRecord, RunRequest, RunStatus, SkipReason, Trigger};
use crate::store::{self, DynStore, Lease, RunFilter};

/// A job `purge` and `release` manage: from its job file, or, for a job that has none (an
/// `idem exec` job), from the ledger: its name and the zone its dates are in.
pub(super) struct ManagedJob {
    pub name: String,
    pub tz: Tz,
}

/// The job `name` names: its job file, else a job the ledger has runs of (its zone: the
/// one its latest run's dates were in, UTC when unsaid). The store is opened only for the
/// latter, and never created: a SQLite ledger that does not exist knows no job.
pub(super) async fn managed_job(name: &str, g: &GlobalOptions) -> Result<ManagedJob> {
    let missing = match find_job(name, &g.jobs_dir, &g.store) {
        Ok(job) => {
            return Ok(ManagedJob {
                tz: job.scheduled()?.tz()?,
                name: job.name,
            })
        }
        Err(e) => e,
    };
    let plain = !name.ends_with(".toml") && !name.contains('/');
    let latest = match plain && super::missing_ledger(&g.store)?.is_none() {
        true => store::open(&g.store)
            .await?
            .runs(&RunFilter {
                processor: Some(name.to_string()),
                limit: 1,
                ..RunFilter::default()
            })
            .await?
            .pop(),
        false => None,
    };
    let Some(run) = latest else {
        return Err(match plain {
            true => Error::config(format!("{missing}; nor has the ledger any run of {name:?}")),
            false => missing,
        });
    };
    let tz = run
        .output
        .as_ref()
        .and_then(|o| o.get("date_zone"))
        .and_then(|z| z.as_str())
        .and_then(|z| z.parse::<Tz>().ok())
        .unwrap_or(Tz::UTC);
    Ok(ManagedJob {
        name: run.processor,
        tz,
    })
}

/// `idem explain NAME` for a job without a job file (an `idem exec` job): its guards are
/// given on each command line, so what the ledger and the lease say of the scope, not a
/// decision. `unknown`: the error to give when the ledger does not know the name either.
pub(super) async fn explain_ledger_job(
    args: &super::ExplainArgs,
    g: &GlobalOptions,
    unknown: Error,
) -> Result<u8> {
    let Ok(job) = managed_job(&args.job, g).await else {
        return Err(unknown);
    };
    let now = Utc::now();
    let date = match &args.date {
        Some(d) => crate::schedule::DateExpr::resolve_flag("--date", d, job.tz, now)?,
        None => crate::schedule::DateExpr::DaysAgo(0).resolve(job.tz, now)?,
    };
    let scope = args
        .scope
        .clone()
        .unwrap_or_else(|| crate::model::time::day_text(date));
    let store = store::open(&g.store).await?;
    let holder = store.lease_holder(&job.name, &scope, now).await?;
    let completed = store
        .runs(&RunFilter {
            processor: Some(job.name.clone()),
            scope: Some(scope.clone()),
            status: Some(RunStatus::Completed),
            limit: 1,
            ..RunFilter::default()
        })
        .await?
        .pop();
    output::print_ledger_explanation(
        &job.name,
        &scope,
        holder.as_ref(),
        completed.as_ref(),
        now,
        g.format,
    );
    Ok(EXIT_OK)
}

/// Asks `question` on the terminal before the `action`, unless `--yes`; refuses without a
/// terminal.
/// `Ok(false)`: the user said no.
pub(super) fn confirm(question: &str, action: &str, verb: &str, yes: bool) -> Result<bool> {
    use std::io::IsTerminal;
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        return Err(Error::input(format!(
            "{action}, and stdin is not a terminal to ask on: add --yes to {verb} without asking"
        )));
    }
    output::note(question);
    let mut answer = String::new();
    let _ = std::io::stdin().read_line(&mut answer);
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["date", "scope"])))]
pub(crate) struct ReleaseArgs {
    /// Job name (in --jobs-dir, or a job known only from the ledger, such as an `idem
    /// exec` job) or path to a job .toml file.
    pub(super) job: String,
    /// The scope whose lease to free.
    #[arg(long)]
    pub(super) scope: Option<String>,
    /// The scope of this date (YYYY-MM-DD, today, yesterday, today-N in the job's zone).
    #[arg(long, allow_hyphen_values = true, conflicts_with = "scope")]
    pub(super) date: Option<String>,
    /// Do not ask (required when stdin is not a terminal).
    #[arg(long)]
    pub(super) yes: bool,
}

/// `idem release`: frees the lease on (JOB, scope) that a run holds, when that run is
/// gone (killed, its machine lost) and its lease would otherwise keep the scope for the
/// rest of its duration. Fenced: only the lease the holder shown had (its token) is
/// freed, never one taken over meanwhile. Recorded in the ledger as one run of the job:
/// status `skipped`, reason `released`, mode `off`, `output.release` the freed holder.
pub(super) async fn release(args: &ReleaseArgs, g: &GlobalOptions) -> Result<u8> {
    if let Some(path) = super::missing_ledger(&g.store)? {
        return Err(Error::config(format!(
            "no lease to release: {}",
            super::no_ledger_message(&path)
        )));
    }
    let store = store::open(&g.store).await?;
    // A run killed before it recorded anything leaves only its lease: a job without a job
    // file or a run is still looked for there (in UTC dates), and unknown only if it holds
    // none.
    let (job, unknown) = match managed_job(&args.job, g).await {
        Ok(job) => (job, None),
        Err(e) if !args.job.ends_with(".toml") && !args.job.contains('/') => (
            ManagedJob {
                name: args.job.clone(),
                tz: Tz::UTC,
            },
            Some(e),
        ),
        Err(e) => return Err(e),
    };
    let now = Utc::now();
    let (scope, date) = match (&args.scope, &args.date) {
        (Some(scope), _) => (
            scope.clone(),
            crate::schedule::DateExpr::DaysAgo(0).resolve(job.tz, now)?,
        ),
        (None, Some(d)) => {
            let date = crate::schedule::DateExpr::resolve_flag("--date", d, job.tz, now)?;
            (crate::model::time::day_text(date), date)
        }
        (None, None) => unreachable!("clap requires --scope or --date"),
    };
    let request = RunRequest::new(job.name.clone(), date)
        .with_trigger(Trigger::Manual)
        .with_scope(scope.clone());
    request.validate()?;
    let Some(holder) = store.lease_holder(&job.name, &scope, now).await? else {
        if let Some(e) = unknown {
            return Err(e);
        }
        output::print_released(&job.name, &scope, None, None, g.format);
        return Ok(EXIT_OK);
    };
    let what = format!(
        "the lease on {} for {scope}, held by run {} since {} (until {})",
        job.name,
        holder.run_id,
        holder.acquired_at.format("%Y-%m-%d %H:%M:%S UTC"),
        holder.expires_at.format("%Y-%m-%d %H:%M:%S UTC"),
    );
    let question = format!(
        "release {what} in {}? If that run is still working, another run of {scope} can start \
         beside it. [y/N] ",
        store.location()
    );
    let action = format!("release frees {what}");
    if !confirm(&question, &action, "release", args.yes)? {
        output::note("release cancelled: nothing changed");
        return Ok(EXIT_RUN_FAILED);
    }
    let lease = Lease {
        processor: job.name.clone(),
        scope: scope.clone(),
        run_id: holder.run_id.clone(),
        token: holder.token,
        acquired_at: holder.acquired_at,
        expires_at: holder.expires_at,
    };
    if !store.release(&lease, Utc::now()).await? {
        return Err(Error::config(format!(
            "{what} changed hands or expired meanwhile: nothing released"
        )));
    }
    let freed = serde_json::json!({"release": {
        "run_id": holder.run_id,
        "token": holder.token,
        "acquired_at": holder.acquired_at,
        "expires_at": holder.expires_at,
    }});
    let previous = Some(holder.run_id.clone());
    record_manual(&*store, &request, "released", previous, freed, now).await?;
    output::print_released(
        &job.name,
        &scope,
        Some(&holder),
        Some(&request.run_id),
        g.format,
    );
    Ok(EXIT_OK)
}

/// Records what `purge` or `release` did as one run of the job: trigger `manual`, mode
/// `off`, status `skipped` with the custom reason `reason`, `output` saying what was done.
pub(super) async fn record_manual(
    store: &DynStore,
    request: &RunRequest,
    reason: &str,
    previous_run_id: Option<String>,
    output: serde_json::Value,
    started_at: DateTime<Utc>,
) -> Result<()> {
    let finished_at = Utc::now();
    let run = RunRecord {
        run_id: request.run_id.clone(),
        processor: request.processor.clone(),
        scope: request.scope.clone(),
        scope_date: request.scope_date,
        trigger: Trigger::Manual,
        mode: Mode::Off,
        started_at,
        finished_at,
        duration_ms: (finished_at - started_at).num_milliseconds(),
        status: RunStatus::Skipped,
        skip_reason: Some(SkipReason::Custom(reason.into())),
        would_skip_reason: None,
        previous_run_id,
        records_processed: None,
        processing_key: None,
        error: None,
        output: Some(output),
    };
    store
        .finish(&store::Finish {
            run,
            keys: Vec::new(),
            lease: None,
        })
        .await
}
