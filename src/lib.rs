//! # idem — idempotent scheduled batch jobs on SQL warehouses
//!
//! Processors (Rust code or SQL) run per scope, usually a partition date, from cron or
//! Cloud Scheduler. idem puts guards in front of them:
//!
//! * a **lease** so a scope never runs twice at once (with a fencing token, so a run whose
//!   lease expired and was taken over cannot record over the newer run);
//! * a **time window**: the same scope completed within 1 h ⇒ skip;
//! * a **content hash**: identical content processed within 24 h ⇒ skip;
//!
//! and records every invocation in a run ledger, writing processing keys **only on
//! success**, so a failed run never blocks its retry. Every skip says which guard, which
//! earlier run and when. `shadow` mode records what would have been skipped without
//! skipping.
//!
//! The pieces: [`Processor`] (what users implement), [`guard`] (composable checks),
//! [`Runner`] (guards + processor + ledger), [`store`] (SQLite, Postgres, BigQuery,
//! in-memory behind one trait; Redis for event keys only), [`job`] (declarative `jobs/*.toml`, and [`job::plan()`], which
//! turns a job into a ready runner), [`warehouse`] (the built-in SQL processor), [`events`]
//! (event-level identities: the event fingerprint) and `cli` (the `idem` command, reusable
//! from your own binary; the `cli` feature, on by default).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use idem::guard::{GuardStack, LeaseGuard, TimeWindowGuard};
//! use idem::store::MemoryStore;
//! use idem::{async_trait, BoxError, Outcome, Processor, RunRequest, RunStatus, Runner};
//!
//! struct Hello;
//! #[async_trait]
//! impl Processor for Hello {
//!     fn name(&self) -> &str { "hello" }
//!     async fn process(&self, _: &RunRequest) -> Result<Outcome, BoxError> {
//!         Ok(Outcome::records(1))
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let guards = GuardStack::builder()
//!     .guard(TimeWindowGuard::new(Duration::from_secs(3600)))
//!     .guard(LeaseGuard::new(Duration::from_secs(600)))
//!     .build();
//! let runner = Runner::new(Arc::new(MemoryStore::new()), guards);
//! let date = idem::parse_date("2025-11-18").unwrap();
//! let first = runner.run(&Hello, RunRequest::new("hello", date)).await.unwrap();
//! assert_eq!(first.status, RunStatus::Completed);
//! let second = runner.run(&Hello, RunRequest::new("hello", date)).await.unwrap();
//! assert_eq!(second.status, RunStatus::Skipped);
//! assert_eq!(second.skip_reason.unwrap().as_str(), "time_window");
//! # });
//! ```
//!
//! The other two ways in are job files, no Rust needed: `processor = "sql"` runs SQL on a
//! warehouse, `processor = "command"` runs any program ([`command`]; `idem exec` does the
//! same from a crontab line). [`job::plan()`] turns either into a ready run:
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use idem::job::{plan, Job, Overrides};
//! use idem::{Registry, RunStatus};
//!
//! let job = Job::parse(
//!     r#"
//!     name = "export_orders"
//!     processor = "command"
//!     [guards]
//!     time_window = "20h"
//!     [command]
//!     run = ["sh", "-c", "echo exporting {date} >&2"]
//!     "#,
//!     &std::env::temp_dir().join("export_orders.toml"),
//! )
//! .unwrap();
//! let ready = plan(&job, &Registry::default(), "memory://", Overrides::default())
//!     .await
//!     .unwrap();
//! let date = idem::parse_date("2025-11-18").unwrap();
//! let first = ready.runner.run(&*ready.processor, ready.request(date).unwrap()).await.unwrap();
//! assert_eq!(first.status, RunStatus::Completed);
//! let again = ready.runner.run(&*ready.processor, ready.request(date).unwrap()).await.unwrap();
//! assert_eq!(again.skip_reason.unwrap().as_str(), "time_window");
//! # });
//! ```
//!
//! And a SQL job: its scripts run in the warehouse (here a SQLite file beside the job file)
//! with the scope bound as `@scope`, never formatted into the SQL:
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use idem::job::{plan, Job, Overrides};
//! use idem::{Registry, RunStatus};
//!
//! let dir = std::env::temp_dir().join(format!("idem-doc-{}", idem::new_run_id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let job = Job::parse(
//!     r#"
//!     name = "daily_totals"
//!     processor = "sql"
//!     [guards]
//!     time_window = "1h"
//!     [sql]
//!     warehouse = "sqlite://wh.db"
//!     setup = "CREATE TABLE IF NOT EXISTS totals (day TEXT PRIMARY KEY, runs INTEGER)"
//!     process = "INSERT OR REPLACE INTO totals VALUES (@scope, 1)"
//!     "#,
//!     &dir.join("daily_totals.toml"),
//! )
//! .unwrap();
//! let ready = plan(&job, &Registry::default(), "memory://", Overrides::default())
//!     .await
//!     .unwrap();
//! let date = idem::parse_date("2025-11-18").unwrap();
//! let first = ready.runner.run(&*ready.processor, ready.request(date).unwrap()).await.unwrap();
//! assert_eq!(first.status, RunStatus::Completed);
//! assert!(dir.join("wh.db").exists());
//! let again = ready.runner.run(&*ready.processor, ready.request(date).unwrap()).await.unwrap();
//! assert_eq!(again.skip_reason.unwrap().as_str(), "time_window");
//! # std::fs::remove_dir_all(&dir).ok();
//! # });
//! ```

#![warn(missing_docs)]

pub mod backend;
mod cancel;
#[cfg(feature = "cli")]
pub mod cli;
pub mod command;
mod error;
pub mod events;
pub mod guard;
pub mod job;
mod key;
pub mod maintenance;
pub mod model;
pub mod per_process;
mod processor;
mod redact;
pub mod report;
mod runner;
pub mod schedule;
pub mod store;
pub mod warehouse;

pub use async_trait::async_trait;

/// What [`forward_event_key_store!`]'s expansion names, whatever the caller depends on.
#[doc(hidden)]
pub mod __private {
    pub use async_trait;
    pub use chrono;
    pub use serde_json;
}
pub use error::{BoxError, Error, Result};
pub use key::{canonical_json, digest_value, scope_key, Content, HashAlgorithm};
pub use model::{
    new_run_id, parse_date, validate_name, KeyKind, KeyRecord, Mode, Outcome, PreviousRun,
    RunRecord, RunRequest, RunStatus, Skip, SkipReason, Trigger,
};
pub use processor::{ExitStatusError, Processor, Registry};
pub use runner::{Cancel, Explanation, Recording, RunReport, Runner, StoreFailurePolicy};
