//! `idem purge`: forgets the processing keys of a job's scopes, and records it.

use clap::Args;

use super::output;
use super::{GlobalOptions, EXIT_OK, EXIT_RUN_FAILED};
use crate::error::Result;
use crate::model::{RunRequest, Trigger};
use crate::{schedule, store};

/// `idem purge JOB (--date D | --scope S | --from D1 --to D2 | --all) [--yes]`: deletes the
/// job's processing keys for those scopes, after asking on a terminal, and records the purge
/// in the ledger as one run of the job: trigger `manual`, status `skipped`, skip reason
/// `purged`, mode `off`, scope the purged scope (`D1..D2` for a range, `*` for `--all`),
/// `output.purge` = what was purged and how many keys.
pub(super) async fn purge(args: PurgeArgs, g: &GlobalOptions) -> Result<u8> {
    super::check_range(&args.from, &args.to)?;
    let job = super::release::managed_job(&args.job, g).await?;
    let tz = job.tz;
    let now = chrono::Utc::now();
    let today = schedule::DateExpr::DaysAgo(0).resolve(tz, now)?;
    // (the ledger scope, its date, the key scopes to purge: None = all)
    let (label, scope_date, scopes): (String, chrono::NaiveDate, Option<Vec<String>>) =
        match (&args.date, &args.scope, &args.from, &args.to) {
            (Some(d), _, _, _) => {
                let date = schedule::DateExpr::resolve_flag("--date", d, tz, now)?;
                let scope = crate::model::time::day_text(date);
                (scope.clone(), date, Some(vec![scope]))
            }
            (None, Some(scope), _, _) => (scope.clone(), today, Some(vec![scope.clone()])),
            (None, None, Some(from), Some(to)) => {
                let dates = schedule::backfill_dates(from, to, tz, now)?;
                let (first, last) = (dates[0], dates[dates.len() - 1]);
                (
                    format!("{first}..{last}"),
                    first,
                    Some(
                        dates
                            .iter()
                            .map(|d| crate::model::time::day_text(*d))
                            .collect(),
                    ),
                )
            }
            _ => ("*".to_string(), today, None),
        };
    // The ledger row is validated before anything is deleted (a control character in
    // --scope is refused here).
    let request = RunRequest::new(job.name.clone(), scope_date)
        .with_trigger(Trigger::Manual)
        .with_scope(label.clone());
    request.validate()?;
    let what = match &scopes {
        None => format!("every scope of {}", job.name),
        Some(s) if s.len() == 1 => format!("{} for {}", job.name, s[0]),
        Some(s) => format!("{} for {} date(s) {label}", job.name, s.len()),
    };
    let question = format!(
        "purge the processing keys of {what} in {}? The next runs of those scopes will not be \
         skipped and will redo the work. [y/N] ",
        crate::backend::redact_url(&g.store)
    );
    let action = format!("purge deletes the processing keys of {what}");
    if !super::release::confirm(&question, &action, "purge", args.yes)? {
        output::note("purge cancelled: nothing deleted");
        return Ok(EXIT_RUN_FAILED);
    }
    let store = store::open(&g.store).await?;
    let started_at = chrono::Utc::now();
    let mut deleted = 0;
    match &scopes {
        None => deleted += store.purge(&job.name, None).await?,
        Some(list) => {
            for scope in list {
                deleted += store.purge(&job.name, Some(scope)).await?;
            }
        }
    }
    let output = serde_json::json!({"purge": {
        "scope": label,
        "scopes": scopes.as_ref().map_or(0, Vec::len),
        "all": scopes.is_none(),
        "keys_deleted": deleted,
    }});
    super::release::record_manual(&*store, &request, "purged", None, output, started_at).await?;
    output::print_purged(
        &output::Purged {
            job: &job.name,
            label: &label,
            scopes: &scopes,
            what: &what,
            deleted,
            run_id: &request.run_id,
        },
        g.format,
    );
    Ok(EXIT_OK)
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["date", "scope", "from", "all"])))]
pub(crate) struct PurgeArgs {
    /// Job name (in --jobs-dir) or path to a job .toml file; it must exist.
    pub(super) job: String,
    /// Only this date's scope (YYYY-MM-DD, today, yesterday, today-N in the job's zone).
    #[arg(long, allow_hyphen_values = true, conflicts_with_all = ["scope", "all", "from"])]
    pub(super) date: Option<String>,
    /// Only this scope.
    #[arg(long, conflicts_with_all = ["all", "from"])]
    pub(super) scope: Option<String>,
    /// Every date's scope from this one ...
    #[arg(
        long,
        requires = "to",
        allow_hyphen_values = true,
        conflicts_with = "all"
    )]
    pub(super) from: Option<String>,
    /// ... to this one, inclusive.
    #[arg(long, requires = "from", allow_hyphen_values = true)]
    pub(super) to: Option<String>,
    /// Every scope of the job.
    #[arg(long)]
    pub(super) all: bool,
    /// Do not ask (required when stdin is not a terminal).
    #[arg(long)]
    pub(super) yes: bool,
}
