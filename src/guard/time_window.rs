//! Skip when the same (processor, scope) completed within a window.

use std::time::Duration;

use async_trait::async_trait;

use super::{ago, human_duration, Guard, GuardContext, Verdict};
use crate::error::Result;
use crate::key::scope_key;
use crate::model::{KeyKind, PreviousRun, Skip, SkipReason};
use crate::store::KeyLookup;

/// Skips a run when the same processor and scope completed within `window` (default 1 h).
///
/// The run that completed recorded its processor's version in its key (a command job's
/// command, a SQL job's SQL, [`Processor::version`](crate::processor::Processor::version)):
/// when this run's version differs, the skip says so (and warns), or with
/// [`OnChange::Rerun`] the changed job runs.
#[derive(Debug, Clone)]
pub struct TimeWindowGuard {
    window: Duration,
    on_change: OnChange,
}

/// What the time window does when the run that completed within it had another version
/// of the job (its command or code changed since).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnChange {
    /// Skip, saying the job changed (a warning on standard error).
    #[default]
    Skip,
    /// Run the changed job.
    Rerun,
}

impl OnChange {
    /// The name in job files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            OnChange::Skip => "skip",
            OnChange::Rerun => "rerun",
        }
    }
}

#[cfg(feature = "cli")]
crate::model::value_enum!(OnChange: OnChange::Skip, OnChange::Rerun);

impl TimeWindowGuard {
    /// A guard with the given window.
    pub fn new(window: Duration) -> Self {
        TimeWindowGuard {
            window,
            on_change: OnChange::Skip,
        }
    }

    /// What to do when the run within the window had another version of the job.
    pub fn on_change(mut self, on_change: OnChange) -> Self {
        self.on_change = on_change;
        self
    }
}

impl Default for TimeWindowGuard {
    fn default() -> Self {
        TimeWindowGuard::new(Duration::from_secs(3600))
    }
}

fn since(ctx: &GuardContext<'_>, window: Duration) -> chrono::DateTime<chrono::Utc> {
    ctx.now - chrono::Duration::from_std(window).unwrap_or(chrono::Duration::days(36500))
}

#[async_trait]
impl Guard for TimeWindowGuard {
    fn name(&self) -> &str {
        "time_window"
    }

    fn reads_keys(&self) -> Option<(KeyKind, Duration)> {
        Some((KeyKind::Scope, self.window))
    }

    fn lookups(&self, ctx: &GuardContext<'_>) -> Vec<KeyLookup> {
        vec![KeyLookup {
            key: scope_key(&ctx.request.processor, &ctx.request.scope),
            kind: KeyKind::Scope,
            since: since(ctx, self.window),
        }]
    }

    async fn check(&self, ctx: &mut GuardContext<'_>) -> Result<Verdict> {
        let key = scope_key(&ctx.request.processor, &ctx.request.scope);
        let window = human_duration(self.window);
        let Some(k) = ctx.found(KeyKind::Scope, &key) else {
            return Ok(Verdict::proceed(format!(
                "no completed run within {window}"
            )));
        };
        let completed = format!(
            "{} for {} completed at {} ({})",
            ctx.request.processor,
            ctx.request.scope,
            crate::model::time::utc_text(k.processed_at),
            ago(ctx.now, k.processed_at),
        );
        // The version that run recorded, when it differs from this run's.
        let changed = k
            .metadata
            .get("version")
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty() && !ctx.version.is_empty() && *v != ctx.version);
        let mut detail = format!("{completed}, within the {window} time window");
        if let Some(before) = changed {
            let change = format!(
                "the job changed since that run (its command or code: version {before}, now {})",
                ctx.version
            );
            if self.on_change == OnChange::Rerun {
                return Ok(Verdict::proceed(format!(
                    "{completed}, within the {window} time window, but {change}: on_change = rerun runs it again"
                )));
            }
            detail = format!(
                "{detail}; but {change}, and the changed job did not run (on_change = \"rerun\" in [guards], or idem exec --on-change rerun, runs it)"
            );
            tracing::warn!(
                target: "idem::changed",
                "{}: skipped for {} by the time window, though {change}; on_change = \"rerun\" (idem exec --on-change rerun) runs the changed job",
                ctx.request.processor,
                ctx.request.scope,
            );
        }
        Ok(Verdict::Skip(Skip {
            reason: SkipReason::TimeWindow,
            previous_run: Some(PreviousRun {
                run_id: k.run_id.clone(),
                at: k.processed_at,
            }),
            detail,
        }))
    }
}
