//! The processor trait users implement, and the registry the CLI looks them up in.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::BoxError;
use crate::key::Content;
use crate::model::{Outcome, RunRequest};

/// A unit of batch work for one scope.
///
/// ```
/// use idem::{async_trait, BoxError, Content, Outcome, Processor, RunRequest};
///
/// struct PlayerGameSummary;
///
/// #[async_trait]
/// impl Processor for PlayerGameSummary {
///     fn name(&self) -> &str {
///         "player_game_summary"
///     }
///     async fn describe(&self, req: &RunRequest) -> Result<Option<Content>, BoxError> {
///         // What the run would consume: here, the players of the day.
///         Ok(Some(Content::new().entities(["p1", "p2"])))
///     }
///     async fn process(&self, req: &RunRequest) -> Result<Outcome, BoxError> {
///         Ok(Outcome::records(2))
///     }
/// }
/// ```
#[async_trait]
pub trait Processor: Send + Sync {
    /// A stable name: jobs refer to it, and it must not change between releases.
    fn name(&self) -> &str;

    /// Idempotent preparation that [`describe`](Processor::describe) and
    /// [`process`](Processor::process) rely on (the SQL processor's `setup`: creating
    /// tables, say). The runner calls it only once a run needs the processor: before the
    /// content is described or the work done, never for a run a cheaper guard skips, and
    /// `explain` calls it only when asked (`--with-setup`). Default: nothing.
    async fn prepare(&self, _request: &RunRequest) -> Result<(), BoxError> {
        Ok(())
    }

    /// What the run would consume (entity ids, counts, a source checksum), used by the
    /// content hash guard. `None` when the processor cannot tell. Should not change
    /// anything: `explain` calls it.
    async fn describe(&self, _request: &RunRequest) -> Result<Option<Content>, BoxError> {
        Ok(None)
    }

    /// The version of the processor's code, part of the content key: change it when
    /// the same content must be processed again because the code changed (a fixed bug).
    /// Empty by default, and an empty version leaves the content key what it was before
    /// versions existed. The built-in SQL processor returns a digest of the job's
    /// prepared SQL and `[sql.params]`.
    fn version(&self) -> String {
        String::new()
    }

    /// Does the work.
    async fn process(&self, request: &RunRequest) -> Result<Outcome, BoxError>;
}

/// A processor's failure that names the exit status the command line ends with: a
/// command job's program's own (its exit code, 128+N when signal N ended it, 124 when it
/// ran past its timeout, 126/127 when it could not start), passed through as `timeout(1)`
/// does. The runner keeps the status in
/// [`RunReport::exit_status`](crate::runner::RunReport::exit_status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitStatusError {
    /// The exit status (1 to 255).
    pub status: u8,
    /// What happened, for the ledger's error.
    pub message: String,
}

impl std::fmt::Display for ExitStatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ExitStatusError {}

impl ExitStatusError {
    /// The exit status `error` names, if it is (or wraps) an [`ExitStatusError`].
    pub fn status_of(error: &(dyn std::error::Error + 'static)) -> Option<u8> {
        let mut at = Some(error);
        while let Some(e) = at {
            if let Some(x) = e.downcast_ref::<ExitStatusError>() {
                return Some(x.status);
            }
            at = e.source();
        }
        None
    }
}

/// Processors by name.
#[derive(Clone, Default)]
pub struct Registry {
    processors: BTreeMap<String, Arc<dyn Processor>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("processors", &self.processors.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Registry {
    /// An empty registry (the built-in `sql` processor is always available to jobs).
    pub fn new() -> Self {
        Registry::default()
    }

    /// Registers a processor under its name; a later one with the same name replaces it.
    pub fn register(&mut self, processor: impl Processor + 'static) -> &mut Self {
        let p: Arc<dyn Processor> = Arc::new(processor);
        self.processors.insert(p.name().to_string(), p);
        self
    }

    /// Chainable [`Registry::register`].
    pub fn with(mut self, processor: impl Processor + 'static) -> Self {
        self.register(processor);
        self
    }

    /// The processor of that name.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Processor>> {
        self.processors.get(name).cloned()
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.processors.keys().map(|s| s.as_str()).collect()
    }
}
