//! `idem cleanup`: deletes old keys, ledger rows and expired leases.

use clap::Args;

use super::output;
use super::{input, GlobalOptions, EXIT_OK};
use crate::backend::redact_url;
use crate::error::{Error, Result};
use crate::job::guard_needs;
use crate::maintenance::cleanup::{cleanup_keeping, short_duration};
use crate::model::duration::parse_duration_field;
use crate::store::{self, CleanupPolicy, CleanupProgressFn, Store};

/// `--set-partition-expiration`: whole days from 1 to the maximum, or `none`.
fn expiration_days(text: &str) -> Result<Option<u32>> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let bad = || {
        Error::input(format!(
            "--set-partition-expiration must be whole days from 1d to {}d, or none; got {text:?}",
            store::MAX_PARTITION_EXPIRATION_DAYS
        ))
    };
    let d = parse_duration_field("--set-partition-expiration", text).map_err(|_| bad())?;
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 || secs % 86_400 != 0 {
        return Err(bad());
    }
    u32::try_from(secs / 86_400)
        .ok()
        .filter(|days| (1..=store::MAX_PARTITION_EXPIRATION_DAYS).contains(days))
        .map(Some)
        .ok_or_else(bad)
}

/// On a terminal (human output), a real cleanup draws a bar over the rows a count taken
/// first expects; a dry run (itself a count) and every other output draw nothing.
async fn progress_bar(
    store: &dyn Store,
    policy: &CleanupPolicy,
    g: &GlobalOptions,
) -> Result<Option<indicatif::ProgressBar>> {
    if policy.dry_run || !output::progress_on_terminal(g.format) {
        return Ok(None);
    }
    let expected = store
        .cleanup(&CleanupPolicy {
            dry_run: true,
            ..policy.clone()
        })
        .await?;
    Ok(output::cleanup_bar(expected.total(), g.format))
}

/// Moves the bar to the rows deleted so far, naming the table being walked.
fn advance(bar: indicatif::ProgressBar) -> CleanupProgressFn {
    CleanupProgressFn::new(move |p| {
        if bar.length().is_some_and(|len| p.total > len) {
            bar.set_length(p.total);
        }
        bar.set_position(p.total);
        bar.set_message(p.table);
    })
}

/// `idem cleanup`: keys, leases and event keys older than `before` (`--keep`), ledger rows
/// older than `--keep-runs` that no kept key points at, in batches; counts per table.
pub(super) async fn cleanup(args: &CleanupArgs, g: &GlobalOptions) -> Result<u8> {
    let (needs, unreadable) = guard_needs(&g.jobs_dir);
    if let Some(text) = &args.set_partition_expiration {
        let days = expiration_days(text)?;
        if let Some(d) = days {
            let expiry = std::time::Duration::from_secs(u64::from(d) * 86_400);
            if let Some(n) = needs
                .iter()
                .filter(|n| n.keep > expiry)
                .max_by_key(|n| n.keep)
            {
                return Err(Error::input(format!(
                    "--set-partition-expiration {text}: job {} has {} = {}, so its keys must \
                     live that long; BigQuery would drop them sooner. Use at least {}d",
                    n.processor,
                    n.field,
                    short_duration(n.keep),
                    n.keep.as_secs().div_ceil(86_400)
                )));
            }
        }
        let store = store::open(&g.store).await?;
        store.set_partition_expiration(days).await?;
        let tables = store.partition_expiration().await?.unwrap_or_default();
        output::print_partition_expiration(&store.location(), &tables, g.format);
        return Ok(EXIT_OK);
    }
    // Bounded by MAX_DURATION, so the cutoff is always a valid time.
    let keep = parse_duration_field("--keep", &args.keep).map_err(input)?;
    let now = chrono::Utc::now();
    let before = chrono::Duration::from_std(keep)
        .ok()
        .and_then(|keep| now.checked_sub_signed(keep))
        .ok_or_else(|| Error::input(format!("--keep {:?} is too long", args.keep)))?;
    // Bounded by MAX_DURATION, so the cutoff is always a valid time.
    let keep_runs = parse_duration_field("--keep-runs", &args.keep_runs).map_err(input)?;
    let runs_before = chrono::Duration::from_std(keep_runs)
        .ok()
        .and_then(|keep| now.checked_sub_signed(keep))
        .ok_or_else(|| Error::input(format!("--keep-runs {:?} is too long", args.keep_runs)))?;
    let policy = store::CleanupPolicy {
        runs_before,
        batch: args.batch as usize,
        dry_run: args.dry_run,
        now,
        ..store::CleanupPolicy::before(before)
    };
    // A SQLite ledger not made yet holds nothing to clean: say so, and create nothing.
    if let Some(path) = super::missing_ledger(&g.store)? {
        output::note(format_args!(
            "warning: {}: nothing to clean",
            super::no_ledger_message(&path)
        ));
        let report = store::CleanupReport::default();
        output::print_cleanup(&redact_url(&g.store), &policy, &report, None, g.format);
        return Ok(EXIT_OK);
    }
    let store = store::open(&g.store).await?;
    if let Some(why) = &unreadable {
        output::note(format_args!(
            "warning: no job files read ({why}): keys are kept for --keep only, not for any \
             job's guard window; run from the jobs' folder or pass --jobs-dir"
        ));
    }
    let longer = needs.iter().any(|n| {
        chrono::Duration::from_std(n.keep)
            .ok()
            .and_then(|d| now.checked_sub_signed(d))
            .is_none_or(|c| c < policy.keys_before)
    });
    let report = if longer {
        // Several passes (one per job kept longer): no single count to draw a bar over.
        let (report, kept) = cleanup_keeping(&*store, &policy, &needs, now).await?;
        for n in &kept.jobs {
            output::note(format_args!(
                "kept keys of {} for {} ({} is longer than --keep {})",
                n.processor,
                short_duration(n.keep),
                n.field,
                args.keep
            ));
        }
        if let Some(n) = &kept.others_as {
            output::note(format_args!(
                "kept keys of processors no job file names for {} as well (the longest guard \
                 window, {}'s {}): idem cannot tell what their guards need",
                short_duration(n.keep),
                n.processor,
                n.field
            ));
        }
        report
    } else {
        match progress_bar(&*store, &policy, g).await? {
            Some(bar) => {
                let report = store
                    .cleanup(&store::CleanupPolicy {
                        progress: Some(advance(bar.clone())),
                        ..policy.clone()
                    })
                    .await;
                bar.finish_and_clear();
                report?
            }
            None => store.cleanup(&policy).await?,
        }
    };
    let partitions = store.partition_expiration().await?;
    output::print_cleanup(
        &store.location(),
        &policy,
        &report,
        partitions.as_deref(),
        g.format,
    );
    Ok(EXIT_OK)
}

#[derive(Debug, Args)]
pub(crate) struct CleanupArgs {
    /// Keep this much history (e.g. 30d; at most 36525d, 100 years).
    #[arg(long, default_value = "30d")]
    pub(super) keep: String,
    /// Keep this much of the ledger; older rows go, except those a kept key points at.
    #[arg(long, default_value = "90d")]
    pub(super) keep_runs: String,
    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    pub(super) dry_run: bool,
    /// At most this many rows per delete statement (each its own transaction).
    #[arg(long, default_value_t = store::DEFAULT_CLEANUP_BATCH as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(super) batch: u64,
    /// BigQuery only: instead of deleting, let BigQuery drop partitions older than this
    /// (whole days, e.g. 30d; `none` to stop expiring) on the partitioned tables, then
    /// report each table's expiration (a plain `idem cleanup` reports it too).
    #[arg(long, value_name = "DAYS", conflicts_with = "dry_run")]
    pub(super) set_partition_expiration: Option<String>,
}
