//! `idem migrate` and `idem jobs`.

use super::output;
use super::{GlobalOptions, EXIT_OK, EXIT_USAGE};
use crate::error::Result;
use crate::job::scan_jobs;
use crate::store;

/// `idem migrate`: creates or upgrades the store's tables.
pub(super) async fn migrate(g: &GlobalOptions) -> Result<u8> {
    let store = store::open(&g.store).await?;
    store.migrate().await?;
    output::print_migrated(&store.location(), g.format);
    Ok(EXIT_OK)
}

/// `idem jobs`: every file is validated and every problem reported, not just the first.
pub(super) fn jobs(g: &GlobalOptions) -> Result<u8> {
    let scan = scan_jobs(&g.jobs_dir, &g.store)?;
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
