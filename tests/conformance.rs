//! The store conformance suite (`idem::store::conformance`) against every backend.
//!
//! Memory and SQLite always run. Backends behind a service run when their URL is set and
//! skip with a message otherwise: `IDEM_TEST_POSTGRES_URL` (a database the tests may fill),
//! `IDEM_TEST_BIGQUERY_URL` (see README).

use std::sync::Arc;

use idem::store::{conformance, DynStore};

mod common;

/// One `#[tokio::test]` per conformance check for a backend — the only list of the
/// checks. `$url` is an async expression giving the store's URL as `Option<String>`
/// (None = skip; the expression already said why).
macro_rules! conformance_tests {
    ($backend:ident, $url:expr) => {
        mod $backend {
            use super::*;

            async fn url() -> Option<String> {
                $url
            }

            async fn store() -> Option<Arc<DynStore>> {
                let url = url().await?;
                Some(idem::store::open(&url).await.expect("open the store"))
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn claim_excludes_and_release_frees() {
                if let Some(s) = store().await {
                    conformance::claim_excludes_and_release_frees(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn expired_lease_is_taken_over_and_fenced() {
                if let Some(s) = store().await {
                    conformance::expired_lease_is_taken_over_and_fenced(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_claims_have_one_winner() {
                if let Some(s) = store().await {
                    conformance::concurrent_claims_have_one_winner(s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn keys_only_on_success() {
                if let Some(s) = store().await {
                    conformance::keys_only_on_success(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn key_windows_and_latest_row() {
                if let Some(s) = store().await {
                    conformance::key_windows_and_latest_row(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ledger_queries() {
                if let Some(s) = store().await {
                    conformance::ledger_queries(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn strings_round_trip() {
                if let Some(s) = store().await {
                    conformance::strings_round_trip(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn purge_and_cleanup() {
                if let Some(s) = store().await {
                    conformance::purge_and_cleanup(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn event_keys_batch() {
                if let Some(s) = store().await {
                    conformance::event_keys_batch(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn event_dedup_replay_and_conflict() {
                if let Some(s) = store().await {
                    conformance::event_dedup_replay_and_conflict(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn event_dedup_ttl() {
                if let Some(s) = store().await {
                    conformance::event_dedup_ttl(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn event_dedup_in_batch() {
                if let Some(s) = store().await {
                    conformance::event_dedup_in_batch(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn event_dedup_large_batch() {
                if let Some(s) = store().await {
                    conformance::event_dedup_large_batch(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn renew_extends_lease() {
                if let Some(s) = store().await {
                    conformance::renew_extends_lease(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn taken_run_id_is_refused_and_changes_nothing() {
                if let Some(s) = store().await {
                    conformance::taken_run_id_is_refused_and_changes_nothing(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cleanup_deletes_exactly_what_is_past_retention() {
                if let Some(s) = store().await {
                    conformance::cleanup_deletes_exactly_what_is_past_retention(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn capabilities_hold_across_instances() {
                if let Some(url) = url().await {
                    conformance::capabilities_hold_across_instances(&url).await
                }
            }
        }
    };
}

conformance_tests!(memory, Some("memory://".to_string()));

conformance_tests!(sqlite, {
    // A fresh file per test: the tests of one backend run in parallel.
    let dir = std::env::temp_dir().join(format!("idem-conformance-{}", idem::new_run_id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    Some(format!("sqlite://{}", dir.join("store.db").display()))
});

// A database the tests may fill; every check uses its own processor names, so the checks
// share it.
conformance_tests!(
    postgres,
    common::service_url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres conformance check",
        common::POSTGRES_HOW,
    )
);

// The emulator (see docs/bigquery.md). The dataset and tables are created on first use;
// every check uses its own processor names, so the checks share them.
#[cfg(feature = "bigquery")]
conformance_tests!(
    bigquery,
    common::service_url(
        "IDEM_TEST_BIGQUERY_URL",
        "bigquery conformance check",
        common::BIGQUERY_HOW,
    )
);
