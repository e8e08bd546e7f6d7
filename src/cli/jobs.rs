//! `idem migrate` and `idem jobs`.

use super::output;
use super::{GlobalOptions, EXIT_OK, EXIT_USAGE};
use crate::error::Result;
use crate::job::{scan_jobs, JobProblem};
use crate::processor::Registry;
use crate::store;

/// `idem migrate`: creates or upgrades the store's tables.
pub(super) async fn migrate(g: &GlobalOptions) -> Result<u8> {
    let store = store::open(&g.store).await?;
    store.migrate().await?;
    output::print_migrated(&store.location(), g.format);
    Ok(EXIT_OK)
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
