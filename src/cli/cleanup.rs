//! `idem cleanup`: deletes old keys, ledger rows and expired leases.

use super::output;
use super::{input, CleanupArgs, GlobalOptions, EXIT_OK};
use crate::error::{Error, Result};
use crate::model::duration::parse_duration_field;
use crate::store;

/// `idem cleanup`: keys, leases and event keys older than `before` (`--keep`), ledger rows
/// older than `--keep-runs` that no kept key points at, in batches; counts per table.
pub(super) async fn cleanup(args: &CleanupArgs, g: &GlobalOptions) -> Result<u8> {
    // Bounded by MAX_DURATION, so the cutoff is always a valid time.
    let keep = parse_duration_field("--keep", &args.keep).map_err(input)?;
    let before = chrono::Duration::from_std(keep)
        .ok()
        .and_then(|keep| chrono::Utc::now().checked_sub_signed(keep))
        .ok_or_else(|| Error::input(format!("--keep {:?} is too long", args.keep)))?;
    let store = store::open(&g.store).await?;
    // Bounded by MAX_DURATION, so the cutoff is always a valid time.
    let keep_runs = parse_duration_field("--keep-runs", &args.keep_runs).map_err(input)?;
    let runs_before = chrono::Duration::from_std(keep_runs)
        .ok()
        .and_then(|keep| chrono::Utc::now().checked_sub_signed(keep))
        .ok_or_else(|| Error::input(format!("--keep-runs {:?} is too long", args.keep_runs)))?;
    let policy = store::CleanupPolicy {
        runs_before,
        batch: args.batch as usize,
        dry_run: args.dry_run,
        ..store::CleanupPolicy::before(before)
    };
    let report = store.cleanup(&policy).await?;
    output::print_cleanup(&store.location(), &policy, &report, g.format);
    Ok(EXIT_OK)
}
