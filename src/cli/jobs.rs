//! `idem migrate` and `idem jobs`.

use super::output;
use super::{GlobalOptions, EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE};
use crate::error::Result;
use crate::job::{scan_jobs, JobProblem};
use crate::model::duration::parse_duration_field;
use crate::processor::Registry;
use crate::store;

#[derive(Debug, clap::Args)]
pub(crate) struct MigrateArgs {
    /// Change nothing: say whether the store's schema is current; exit 0 when it is, 1
    /// while it is behind this idem (`idem migrate` not yet run), 3 when the store cannot
    /// be read. For an init container or a deploy step.
    #[arg(long)]
    check: bool,
    /// With --check: wait up to this long (e.g. 5m) for the schema to become current (a
    /// migrate Job running beside, a database still starting), reading it every 2 s.
    #[arg(long, value_name = "DURATION", requires = "check")]
    wait: Option<String>,
}

/// How often `idem migrate --check --wait` reads the schema version again.
const CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// `idem migrate`: creates or upgrades the store's tables; `--check` only reads them.
pub(super) async fn migrate(g: &GlobalOptions, args: &MigrateArgs) -> Result<u8> {
    if args.check {
        return check(g, args).await;
    }
    let store = store::open(&g.store).await?;
    store.migrate().await?;
    output::print_migrated(&store.location(), g.format);
    Ok(EXIT_OK)
}

/// `idem migrate --check [--wait D]`: the schema's state, once or until it is current.
async fn check(g: &GlobalOptions, args: &MigrateArgs) -> Result<u8> {
    let wait = match &args.wait {
        Some(w) => parse_duration_field("--wait", w).map_err(crate::error::Error::input)?,
        None => std::time::Duration::ZERO,
    };
    let deadline = tokio::time::Instant::now() + wait;
    let location = crate::redact::redact_url(&g.store);
    let mut told = false;
    loop {
        let state = store::schema_state(&g.store).await;
        let done = matches!(&state, Ok(s) if !s.is_behind());
        let now = tokio::time::Instant::now();
        if done || now >= deadline {
            let state = state?;
            output::print_schema_state(&location, &state, g.format);
            return Ok(if state.is_behind() {
                EXIT_RUN_FAILED
            } else {
                EXIT_OK
            });
        }
        if !told {
            let why = match &state {
                Ok(s) => format!("at version {} of {}", s.current, s.latest),
                Err(e) => format!("not readable yet ({e})"),
            };
            eprintln!(
                "idem: the schema of {location} is {why}; waiting up to {} for it to be current",
                humantime::format_duration(wait)
            );
            told = true;
        }
        tokio::time::sleep(CHECK_EVERY.min(deadline - now)).await;
    }
}

/// `idem jobs`: every file is validated and every problem reported, not just the first.
pub(super) fn jobs(g: &GlobalOptions, registry: &Registry) -> Result<u8> {
    let mut scan = scan_jobs(&g.jobs_dir, &g.store)?;
    // A job naming a processor this binary does not have cannot run: a problem too.
    let (jobs, unknown): (Vec<_>, Vec<_>) = std::mem::take(&mut scan.jobs)
        .into_iter()
        .partition(|job| job.check_processor(registry).is_ok());
    scan.jobs = jobs;
    for job in unknown {
        if let Err(e) = job.check_processor(registry) {
            scan.problems.push(JobProblem {
                path: job.path.clone(),
                error: format!("job file {}: {e}", job.path.display()),
            });
        }
    }
    if scan.problems.is_empty() {
        output::print_jobs(&scan.jobs, g.format)?;
        return Ok(EXIT_OK);
    }
    let summary = format!(
        "{} of {} job file(s) in {} are invalid",
        scan.problems.len(),
        scan.problems.len() + scan.jobs.len(),
        g.jobs_dir.display()
    );
    output::print_job_problems(&scan.jobs, &scan.problems, &summary, EXIT_USAGE, g.format)?;
    Ok(EXIT_USAGE)
}
