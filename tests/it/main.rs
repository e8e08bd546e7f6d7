//! Every integration test but the BigQuery file (tests/bigquery.rs, which CI runs beside
//! this one on its own emulator) and the docs' commands (tests/docs.rs, which clears the
//! process's `IDEM_*` settings), in one binary: one compile and one link of the shared
//! helpers instead of one per file (issue 36: 25 s of build instead of about 95 s of CPU
//! for the 23 binaries these files were). Each file is a module: `cargo test --test it
//! gate::` runs one file's tests.

#[path = "../common/mod.rs"]
mod common;

#[path = "../common/bq_limits.rs"]
mod bq_limits;

mod cleanup;
mod cli;
mod command;
mod conformance;
mod deploy;
mod events;
mod gate;
mod guard_orders;
mod hardening;
mod layout;
#[cfg(feature = "sqlite")]
mod one_store;
#[cfg(feature = "postgres")]
mod postgres;
mod properties;
mod purge;
mod report;
mod runner;
mod scenarios;
mod schedule;
mod scheduler;
mod secrets;
mod soak;
mod two_processes;
mod warehouse;
