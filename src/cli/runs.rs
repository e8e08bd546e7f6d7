//! `idem runs`: recent runs from the ledger.

use crate::model::RunStatus;
use clap::Args;

use super::output;
use super::{GlobalOptions, EXIT_OK};
use crate::error::Result;
use crate::job::replay_spool;
use crate::store::{self, spool::Spool, RunFilter};

/// `idem runs`: replays the spool first, so the list includes the runs it held.
pub(super) async fn runs(args: RunsArgs, g: &GlobalOptions) -> Result<u8> {
    let filter = RunFilter {
        processor: args.job,
        scope: args.scope,
        status: args.status,
        since: None,
        limit: args.limit as usize,
        ..RunFilter::default()
    };
    if let Some(path) = super::missing_ledger(&g.store)? {
        // Nothing recorded there: an empty list, and a warning in case it is a typo.
        output::note(format_args!("warning: {}", super::no_ledger_message(&path)));
        output::print_runs(
            &[],
            &crate::backend::redact_url(&g.store),
            &filter,
            g.format,
        );
        return Ok(EXIT_OK);
    }
    let store = store::open(&g.store).await?;
    replay_spool(&Spool::from_env(&g.store), &*store).await;
    let runs = store.runs(&filter).await?;
    output::print_runs(&runs, &store.location(), &filter, g.format);
    Ok(EXIT_OK)
}

#[derive(Debug, Args)]
pub(crate) struct RunsArgs {
    /// Only this job.
    #[arg(long)]
    pub(super) job: Option<String>,
    /// Only this scope.
    #[arg(long)]
    pub(super) scope: Option<String>,
    /// Only this status.
    #[arg(long, value_enum)]
    pub(super) status: Option<RunStatus>,
    /// At most this many rows (0 = all).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub(super) limit: u32,
}
