//! The store conformance suite (`idem::store::conformance`) against every backend.
//!
//! Memory and SQLite always run. Backends behind a service run when their URL is set and
//! skip with a message otherwise: `IDEM_TEST_POSTGRES_URL` (a database the tests may fill),
//! `IDEM_TEST_BIGQUERY_URL` (see README).

use std::sync::Arc;

use idem::store::{conformance, DynStore};

mod common;

/// One `#[tokio::test]` per conformance check for a backend; `$make` is an async
/// expression giving `Option<Arc<DynStore>>` (None = skip).
macro_rules! conformance_tests {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;

            async fn run(check: &str) {
                let store: Option<Arc<DynStore>> = $make;
                match store {
                    Some(store) => conformance::run_check(check, store).await,
                    // The store expression already said why it skipped.
                    None => {}
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn claim_excludes_and_release_frees() {
                run("claim_excludes_and_release_frees").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn expired_lease_is_taken_over_and_fenced() {
                run("expired_lease_is_taken_over_and_fenced").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_claims_have_one_winner() {
                run("concurrent_claims_have_one_winner").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn keys_only_on_success() {
                run("keys_only_on_success").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn key_windows_and_latest_row() {
                run("key_windows_and_latest_row").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ledger_queries() {
                run("ledger_queries").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn strings_round_trip() {
                run("strings_round_trip").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn purge_and_cleanup() {
                run("purge_and_cleanup").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn event_keys_batch() {
                run("event_keys_batch").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn renew_extends_lease() {
                run("renew_extends_lease").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn taken_run_id_is_refused_and_changes_nothing() {
                run("taken_run_id_is_refused_and_changes_nothing").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cleanup_deletes_exactly_what_is_past_retention() {
                run("cleanup_deletes_exactly_what_is_past_retention").await
            }

            #[test]
            fn every_check_has_a_test() {
                let source = include_str!("conformance.rs");
                for check in conformance::CHECKS {
                    assert!(
                        source.contains(&format!("async fn {check}()")),
                        "conformance check {check} has no test"
                    );
                }
            }
        }
    };
}

conformance_tests!(
    memory,
    Some(Arc::new(idem::store::MemoryStore::new()) as Arc<DynStore>)
);

conformance_tests!(sqlite, {
    // A fresh file per test: the tests of one backend run in parallel.
    let dir = std::env::temp_dir().join(format!("idem-conformance-{}", idem::new_run_id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let url = format!("sqlite://{}", dir.join("store.db").display());
    Some(idem::store::open(&url).await.expect("open sqlite store"))
});

conformance_tests!(postgres, {
    // A database the tests may fill; every check uses its own processor names, so the
    // checks share it.
    match common::service_url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres conformance check",
        common::POSTGRES_HOW,
    ) {
        Some(url) => Some(
            idem::store::open(&url)
                .await
                .expect("open the postgres store at IDEM_TEST_POSTGRES_URL"),
        ),
        None => None,
    }
});

#[cfg(feature = "bigquery")]
conformance_tests!(bigquery, {
    // The emulator (see docs/bigquery.md). The dataset and tables are created on first
    // use; every check uses its own processor names, so the checks share them.
    match common::service_url(
        "IDEM_TEST_BIGQUERY_URL",
        "bigquery conformance check",
        common::BIGQUERY_HOW,
    ) {
        Some(url) => Some(
            idem::store::open(&url)
                .await
                .expect("open the bigquery store at IDEM_TEST_BIGQUERY_URL"),
        ),
        None => None,
    }
});
