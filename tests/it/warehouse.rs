//! The warehouse conformance suite (`idem::warehouse::conformance`) against every
//! dialect: SQLite always; Postgres and BigQuery when `IDEM_TEST_POSTGRES_URL` /
//! `IDEM_TEST_BIGQUERY_URL` are set (otherwise each test says why it skipped and passes;
//! under `IDEM_REQUIRE_SERVICES=1` it fails instead).

use std::sync::Arc;

use idem::warehouse::{conformance, open_warehouse, Warehouse};

use crate::common;

/// A fresh table name: lowercase hex, safe in every dialect.
fn fresh_table() -> String {
    format!("wh_conf_{}", &idem::new_run_id().replace('-', "")[..10])
}

/// A warehouse on a fresh SQLite file, and the folder that holds it.
async fn sqlite() -> (Arc<dyn Warehouse>, common::Sandbox) {
    let sandbox = common::Sandbox::new("idem-wh");
    let url = format!("sqlite://{}", sandbox.dir.join("warehouse.db").display());
    (open_warehouse(&url).await.unwrap(), sandbox)
}

async fn postgres(test: &str) -> Option<Arc<dyn Warehouse>> {
    let url = common::postgres_url(&format!("warehouse::{test}::postgres"))?;
    Some(open_warehouse(&url).await.unwrap())
}

/// The BigQuery warehouse and a fresh table name qualified with its dataset (the dataset
/// is created by opening the store on the same URL).
#[cfg(feature = "bigquery")]
async fn bigquery(test: &str) -> Option<(Arc<dyn Warehouse>, String)> {
    let url = common::bigquery_url(&format!("warehouse::{test}::bigquery"))?;
    idem::store::bigquery::BigQueryStore::connect(&url)
        .await
        .expect("open the store (creates the dataset)");
    let table = idem::backend::bigquery::BigQueryUrl::parse(&url)
        .unwrap()
        .table(&fresh_table());
    Some((open_warehouse(&url).await.unwrap(), table))
}

/// One test per check, each run on SQLite, Postgres and BigQuery.
macro_rules! every_dialect {
    ($check:ident) => {
        every_dialect!($check, |w, _table| conformance::$check(w));
    };
    ($check:ident, |$w:ident, $table:ident| $call:expr) => {
        mod $check {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let (w, _dir) = super::sqlite().await;
                let ($w, $table): (&dyn Warehouse, String) = (&*w, fresh_table());
                $call.await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let Some(w) = super::postgres(stringify!($check)).await else {
                    return;
                };
                let ($w, $table): (&dyn Warehouse, String) = (&*w, fresh_table());
                $call.await;
            }

            #[cfg(feature = "bigquery")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn bigquery() {
                let Some((w, table)) = super::bigquery(stringify!($check)).await else {
                    return;
                };
                let ($w, $table): (&dyn Warehouse, String) = (&*w, table);
                $call.await;
            }
        }
    };
}

every_dialect!(binds_values_like_untyped_literals);
every_dialect!(an_unknown_parameter_is_named);
every_dialect!(decodes_common_types);
every_dialect!(a_rejected_query_keeps_the_driver_error);
every_dialect!(
    execute_counts_the_last_statement_and_a_failure_rolls_back,
    |w, table| conformance::execute_counts_the_last_statement_and_a_failure_rolls_back(w, &table)
);
