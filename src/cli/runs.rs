//! `idem runs`: recent runs from the ledger.

use super::output;
use super::{GlobalOptions, RunsArgs, EXIT_OK};
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
