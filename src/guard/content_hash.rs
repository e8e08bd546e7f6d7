//! Skip when identical content was processed successfully within a window.

use std::time::Duration;

use async_trait::async_trait;

use super::{ago, human_duration, Guard, GuardContext, Verdict};
use crate::error::{Error, Result};
use crate::key::HashAlgorithm;
use crate::model::{KeyKind, PreviousRun, Skip, SkipReason};
use crate::store::KeyLookup;

/// Skips a run whose content key (digest of {processor, scope, content}) was recorded by
/// a successful run within `window` (default 24 h).
#[derive(Debug, Clone)]
pub struct ContentHashGuard {
    window: Duration,
    algorithm: HashAlgorithm,
}

impl ContentHashGuard {
    /// A guard with the given window and digest.
    pub fn new(window: Duration, algorithm: HashAlgorithm) -> Self {
        ContentHashGuard { window, algorithm }
    }
}

impl Default for ContentHashGuard {
    fn default() -> Self {
        ContentHashGuard::new(Duration::from_secs(86_400), HashAlgorithm::Sha256)
    }
}

#[async_trait]
impl Guard for ContentHashGuard {
    fn name(&self) -> &str {
        "content_hash"
    }

    fn content_hash(&self) -> Option<HashAlgorithm> {
        Some(self.algorithm)
    }

    fn reads_keys(&self) -> Option<(KeyKind, Duration)> {
        Some((KeyKind::Content, self.window))
    }

    fn lookups(&self, ctx: &GuardContext<'_>) -> Vec<KeyLookup> {
        ctx.content_key
            .as_ref()
            .map(|key| KeyLookup {
                key: key.to_string(),
                kind: KeyKind::Content,
                since: ctx.now
                    - chrono::Duration::from_std(self.window)
                        .unwrap_or(chrono::Duration::days(36500)),
            })
            .into_iter()
            .collect()
    }

    /// The content key's hit alone decides: found, the run skips.
    fn skips_on_hit(&self, ctx: &GuardContext<'_>) -> Option<(KeyLookup, SkipReason)> {
        let lookup = self.lookups(ctx).into_iter().next()?;
        Some((lookup, SkipReason::DuplicateContentHash))
    }

    async fn check(&self, ctx: &mut GuardContext<'_>) -> Result<Verdict> {
        let key = ctx.content_key.as_deref().ok_or_else(|| {
            Error::config(format!(
                "content_hash guard on {}: the processor describes no content (implement Processor::describe or set [sql].content)",
                ctx.request.processor
            ))
        })?;
        let window = human_duration(self.window);
        Ok(match ctx.found(KeyKind::Content, key) {
            Some(k) => Verdict::Skip(Skip {
                reason: SkipReason::DuplicateContentHash,
                previous_run: Some(PreviousRun {
                    run_id: k.run_id.clone(),
                    at: k.processed_at,
                }),
                detail: format!(
                    "identical content (key {}) was processed at {} ({}), within the {window} content window",
                    &key[..key.len().min(12)],
                    crate::model::time::utc_text(k.processed_at),
                    ago(ctx.now, k.processed_at),
                ),
            }),
            None => Verdict::proceed(format!(
                "content key {} not processed within {window}",
                &key[..key.len().min(12)]
            )),
        })
    }
}
