//! Skip when the same (processor, scope) completed within a window.

use std::time::Duration;

use async_trait::async_trait;

use super::{ago, human_duration, Guard, GuardContext, Verdict};
use crate::error::Result;
use crate::key::scope_key;
use crate::model::{KeyKind, PreviousRun, Skip, SkipReason};
use crate::store::KeyLookup;

/// Skips a run when the same processor and scope completed within `window` (default 1 h).
#[derive(Debug, Clone)]
pub struct TimeWindowGuard {
    window: Duration,
}

impl TimeWindowGuard {
    /// A guard with the given window.
    pub fn new(window: Duration) -> Self {
        TimeWindowGuard { window }
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
        Ok(match ctx.found(KeyKind::Scope, &key) {
            Some(k) => Verdict::Skip(Skip {
                reason: SkipReason::TimeWindow,
                previous_run: Some(PreviousRun {
                    run_id: k.run_id.clone(),
                    at: k.processed_at,
                }),
                detail: format!(
                    "{} for {} completed at {} ({}), within the {window} time window",
                    ctx.request.processor,
                    ctx.request.scope,
                    crate::model::time::utc_text(k.processed_at),
                    ago(ctx.now, k.processed_at),
                ),
            }),
            None => Verdict::proceed(format!("no completed run within {window}")),
        })
    }
}
