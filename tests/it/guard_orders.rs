//! Every guard order a job file accepts is safe: for each permutation of the three
//! built-in guards and both `on_in_progress` values, four `idem run` processes started at
//! once on one scope do the work exactly once, on SQLite and on Postgres.
//!
//! The work is visible: the job's `process` appends a row to an `effects` table in its
//! (SQLite) warehouse, so a scope processed twice shows as two rows even if the ledger
//! said otherwise.

use std::process::Child;

use crate::common;

use common::{toml_str, wait, Sandbox};

const GUARDS: [&str; 3] = ["time_window", "content_hash", "lease"];

fn permutations() -> Vec<[&'static str; 3]> {
    let mut out = Vec::new();
    for a in GUARDS {
        for b in GUARDS {
            for c in GUARDS {
                if a != b && b != c && a != c {
                    out.push([a, b, c]);
                }
            }
        }
    }
    out
}

/// A job with all three guards in `order`; its process takes about half a second (a
/// recursive count; SQLite at -O1, Cargo.toml) and records one effect row per execution.
fn job(name: &str, order: &[&str; 3], on_in_progress: &str, warehouse: &str) -> String {
    let order = order
        .iter()
        .map(|g| toml_str(g))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"name = {name}
processor = "sql"
[guards]
lease = "1m"
time_window = "1h"
content_hash = "24h"
on_in_progress = "{on_in_progress}"
order = [{order}]
[sql]
warehouse = {warehouse}
content = "SELECT item FROM src WHERE day = @scope"
process = """
INSERT INTO effects (job, day, run_id) VALUES (@job_name, @scope, @run_id);
SELECT count(*) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2500000) SELECT x FROM c)
"""
[sql.params]
job_name = {name}
"#,
        name = toml_str(name),
        warehouse = toml_str(warehouse),
    )
}

fn warehouse_setup(s: &Sandbox) -> String {
    let path = s.dir.join("warehouse.db");
    let url = format!("sqlite://{}", path.display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let w = idem::warehouse::open_warehouse(&url).await.unwrap();
        let st = idem::backend::prepare(
            "CREATE TABLE src (day TEXT, item TEXT); \
             INSERT INTO src VALUES ('2025-11-18', 'a'), ('2025-11-18', 'b'); \
             CREATE TABLE effects (job TEXT, day TEXT, run_id TEXT)",
            idem::backend::Dialect::Sqlite,
        )
        .unwrap();
        w.execute(&st, &Default::default()).await.unwrap();
    });
    url
}

fn effects(warehouse: &str, job: &str) -> i64 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let pool = sqlx::SqlitePool::connect(warehouse).await.unwrap();
        sqlx::query_scalar("SELECT count(*) FROM effects WHERE job = ?1")
            .bind(job)
            .fetch_one(&pool)
            .await
            .unwrap()
    })
}

fn every_order_runs_each_scope_once(s: &Sandbox, prefix: &str, processes: usize, waits: &[&str]) {
    let warehouse = warehouse_setup(s);
    let (code, _, err) = s.json(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    let mut cases = 0;
    for &on_in_progress in waits {
        for (i, order) in permutations().iter().enumerate() {
            let name = format!("{prefix}_{on_in_progress}_{i}");
            let path = s.write_job(&name, &job(&name, order, on_in_progress, &warehouse));
            let path = path.to_str().unwrap();
            let children: Vec<Child> = (0..processes)
                .map(|_| {
                    s.json_command(&["run", path, "--date", "2025-11-18"])
                        .spawn()
                        .unwrap()
                })
                .collect();
            let mut outcomes = Vec::new();
            for child in children {
                let (code, report, stderr) = wait(child);
                assert_eq!(code, 0, "{name} {order:?}: {report}\n{stderr}");
                outcomes.push(format!(
                    "{}:{}",
                    report["status"].as_str().unwrap_or("?"),
                    report["skip_reason"].as_str().unwrap_or("")
                ));
            }
            let completed = outcomes
                .iter()
                .filter(|o| o.starts_with("completed"))
                .count();
            assert_eq!(
                completed, 1,
                "{order:?} with on_in_progress = {on_in_progress}: {outcomes:?}"
            );
            assert!(
                outcomes.iter().all(|o| [
                    "completed:",
                    "skipped:in_progress",
                    "skipped:time_window",
                    "skipped:duplicate_content_hash"
                ]
                .contains(&o.as_str())),
                "{order:?}/{on_in_progress}: {outcomes:?}"
            );
            assert_eq!(
                effects(&warehouse, &name),
                1,
                "{order:?} with on_in_progress = {on_in_progress}: the work ran once ({outcomes:?})"
            );
            let (_, runs, _) = s.json(&["runs", "--job", &name, "--status", "completed"]);
            assert_eq!(runs.as_array().unwrap().len(), 1, "{order:?}: {runs}");
            cases += 1;
        }
    }
    assert_eq!(cases, 6 * waits.len());
}

#[test]
fn every_guard_order_runs_a_scope_once_on_sqlite() {
    let s = Sandbox::new("idem-orders");
    every_order_runs_each_scope_once(&s, "orders", 4, &["skip", "wait"]);
}

#[test]
fn every_guard_order_runs_a_scope_once_on_postgres() {
    let Some(url) = common::service_url(
        "IDEM_TEST_POSTGRES_URL",
        "guard_orders::every_guard_order_runs_a_scope_once_on_postgres",
        common::POSTGRES_HOW,
    ) else {
        return;
    };
    let s = Sandbox::with_store("idem-orders-pg", &url);
    let prefix = format!("orders_{}", &idem::new_run_id()[..8]);
    every_order_runs_each_scope_once(&s, &prefix, 4, &["skip", "wait"]);
}

/// On the BigQuery emulator (which serialises DML, so this shows the ordering of the
/// claim, the fresh reads and the recording, not BigQuery's own concurrency): two
/// processes per scope, every order, waiting for the lease (the case where stale reads
/// after the claim let the waiter run the scope again).
#[cfg(feature = "bigquery")]
#[test]
fn every_guard_order_runs_a_scope_once_on_bigquery() {
    let Some(url) = common::service_url(
        "IDEM_TEST_BIGQUERY_URL",
        "guard_orders::every_guard_order_runs_a_scope_once_on_bigquery",
        common::BIGQUERY_HOW,
    ) else {
        return;
    };
    let s = Sandbox::with_store("idem-orders-bq", &url);
    let prefix = format!("orders_{}", &idem::new_run_id()[..8]);
    every_order_runs_each_scope_once(&s, &prefix, 2, &["wait"]);
}
