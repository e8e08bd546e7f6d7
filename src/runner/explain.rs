//! `explain`: every guard's verdict for a scope, nothing run or claimed; and how a run
//! describes its content to the guards ([`Describe`]).

use super::*;

/// The decision `explain` shows: every guard's verdict, nothing run or claimed.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// Processor (job) name.
    pub job: String,
    /// Scope.
    pub scope: String,
    /// Mode in force.
    pub mode: Mode,
    /// `run` or `skip` (in shadow mode a skip is reported as `run`, with the would-skip).
    pub decision: &'static str,
    /// The first skip reason in guard order.
    pub skip_reason: Option<SkipReason>,
    /// Its explanation.
    pub detail: Option<String>,
    /// The earlier run it points at.
    pub previous_run: Option<PreviousRun>,
    /// The content key, when computed.
    pub processing_key: Option<String>,
    /// Every guard's verdict.
    pub guards: Vec<GuardVerdict>,
}

/// The runner's [`ContentSource`]: prepares the processor (once) and describes the
/// content when the first guard that needs a content key asks.
pub(super) struct Describe<'a> {
    processor: &'a dyn Processor,
    request: &'a RunRequest,
    with_prepare: bool,
    prepared: tokio::sync::OnceCell<()>,
    /// The exit status a failed description named ([`ExitStatusError`]).
    pub(super) failed_status: std::sync::OnceLock<u8>,
}

impl<'a> Describe<'a> {
    pub(super) fn new(
        processor: &'a dyn Processor,
        request: &'a RunRequest,
        with_prepare: bool,
    ) -> Self {
        Describe {
            processor,
            request,
            with_prepare,
            prepared: tokio::sync::OnceCell::new(),
            failed_status: std::sync::OnceLock::new(),
        }
    }

    pub(super) async fn prepare(&self) -> std::result::Result<(), BoxError> {
        if !self.with_prepare {
            return Ok(());
        }
        self.prepared
            .get_or_try_init(|| self.processor.prepare(self.request))
            .await
            .map(|_| ())
    }
}

#[async_trait::async_trait]
impl ContentSource for Describe<'_> {
    fn version(&self) -> String {
        self.processor.version()
    }

    async fn content_key(
        &self,
        algorithm: HashAlgorithm,
    ) -> std::result::Result<Option<ContentKey>, ContentError> {
        let described = async {
            self.prepare().await?;
            self.processor.describe(self.request).await
        };
        let described = described.await;
        if let Err(e) = &described {
            if let Some(status) = ExitStatusError::status_of(&**e) {
                let _ = self.failed_status.set(status);
            }
        }
        match described {
            Ok(content) => Ok(content.map(|content| ContentKey {
                key: content.key_with_version(
                    &self.request.processor,
                    &self.request.scope,
                    &self.processor.version(),
                    algorithm,
                ),
                entity_count: content.entity_count(),
            })),
            Err(e) if self.with_prepare => Err(ContentError::Unavailable(e.to_string())),
            Err(e) => Err(ContentError::Unavailable(format!(
                "the content could not be described: {e} (explain does not run the job's setup; add --with-setup to run it first)"
            ))),
        }
    }
}

impl Runner {
    /// Explains what a run would do now, without running the processor, preparing it (a
    /// SQL job's `setup`) or claiming the lease: nothing changes anywhere. A content query
    /// that needs the setup's tables shows the content guard as unknown instead of
    /// failing.
    pub async fn explain(
        &self,
        processor: &dyn Processor,
        request: &RunRequest,
    ) -> Result<Explanation> {
        self.explain_with(processor, request, false).await
    }

    /// [`Runner::explain`], running the processor's [`prepare`](Processor::prepare) first
    /// when `with_setup` is true.
    pub async fn explain_with(
        &self,
        processor: &dyn Processor,
        request: &RunRequest,
        with_setup: bool,
    ) -> Result<Explanation> {
        let decision = if self.mode == Mode::Off {
            Decision::default()
        } else {
            let content = Describe::new(processor, request, with_setup);
            self.guards
                .decide(
                    request,
                    &*self.store,
                    now(),
                    &content,
                    DecideOptions {
                        stop_at_first_skip: false,
                        dry_run: true,
                        shadow: self.mode == Mode::Shadow,
                    },
                    &mut None,
                )
                .await?
        };
        let skip = decision.skip;
        Ok(Explanation {
            job: request.processor.clone(),
            scope: request.scope.clone(),
            mode: self.mode,
            decision: if skip.is_some() && self.mode == Mode::Enforce {
                "skip"
            } else {
                "run"
            },
            skip_reason: skip.as_ref().map(|s| s.reason.clone()),
            detail: skip.as_ref().map(|s| s.detail.clone()),
            previous_run: skip.and_then(|s| s.previous_run),
            processing_key: decision.content.map(|c| c.key),
            guards: decision.verdicts,
        })
    }
}
