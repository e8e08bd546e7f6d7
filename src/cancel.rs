//! [`Cancel`]: a cancellation token that says why. Below every module that stops on one
//! (the runner, the event gate's stream, command jobs, the CLI), so none of them names
//! another for it.

use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

/// A [`CancellationToken`] with the reason it was cancelled (`SIGTERM`), handed to the
/// runner ([`Runner::cancel_on`](crate::Runner::cancel_on)) and whatever else should stop
/// with it. Clones share the token.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    token: CancellationToken,
    reason: Arc<OnceLock<&'static str>>,
}

impl Cancel {
    /// A token not cancelled yet.
    pub fn new() -> Self {
        Cancel::default()
    }

    /// Cancels, for `reason` (the first reason given stays).
    pub fn cancel(&self, reason: &'static str) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    /// True once cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The underlying token.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// The reason, once cancelled (`None` before).
    pub fn reason(&self) -> Option<&'static str> {
        self.is_cancelled()
            .then(|| self.reason.get().copied().unwrap_or("cancellation"))
    }

    /// Resolves when cancelled, to the reason.
    pub async fn cancelled(&self) -> &'static str {
        self.token.cancelled().await;
        self.reason.get().copied().unwrap_or("cancellation")
    }
}
