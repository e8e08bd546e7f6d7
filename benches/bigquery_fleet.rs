//! A fleet on BigQuery: 1,000 runs fired within the same minute (900 scopes in a scrambled
//! order over 60 s; 100 more runs of 40 of them, 2 to 5 claimers of one scope at the same
//! instant), each its own store instance, claiming, working briefly and finishing, against
//! the emulator behind the limits simulator (tests/common/bq_limits.rs: 2 running + 20
//! queued mutating DML per table, INSERT limits, concurrent-update conflicts, a latency
//! per statement). Prints quota failures, completions per scope, `in_progress` skips,
//! p50/p99 time to the lease decision, statements and (modelled) bytes billed per run.
//!
//! `IDEM_TEST_BIGQUERY_URL="bigquery://idem-test/fleet_bench_$RANDOM?endpoint=$(.ci/bqemulator.sh start)" cargo bench --bench bigquery_fleet`
//! (prints a skip message without it). `IDEM_BENCH_RUNS` (1000), `IDEM_BENCH_DML_MS`
//! (100: the simulated time of one DML statement; BigQuery's is about 1 s),
//! `IDEM_BENCH_WORK_MS` (200), `IDEM_BENCH_SPREAD_S` (60: the fires are spread over this
//! long; 0 fires all at once), `IDEM_BENCH_FREE_INSERTS` (1500: INSERTs per table before
//! the INSERT limits apply) and `IDEM_BENCH_MODEL=1` (the model's rules on top: each
//! statement of a script its own job, snapshot and commit, float TIMESTAMP cells on polls,
//! as the tests "at the model" run it; docs/bigquery.md) and `IDEM_BENCH_SHARDS=n` (only
//! the runs whose lease lives in the first n lease tables, fired when they would be in the
//! whole fleet: those tables take the whole fleet's load, the emulator a fraction) change it. The emulator behind the simulator serves about 30
//! idem statements a second on a 2-core machine; a fleet that needs more waits for it, and
//! a statement waiting over a minute times out on the client.

#[path = "../tests/common/bq_limits.rs"]
mod bq_limits;
#[path = "../tests/common/fleet.rs"]
mod fleet;

use std::time::Duration;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let Some(url) = std::env::var("IDEM_TEST_BIGQUERY_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    else {
        println!("skipped bigquery_fleet: IDEM_TEST_BIGQUERY_URL is not set (bigquery://idem-test/DATASET?endpoint=http://HOST:PORT of the emulator)");
        return;
    };
    let runs = env_u64("IDEM_BENCH_RUNS", 1000) as usize;
    let dml = Duration::from_millis(env_u64("IDEM_BENCH_DML_MS", 100));
    let work = Duration::from_millis(env_u64("IDEM_BENCH_WORK_MS", 200));
    let mut limits = bq_limits::Limits::bigquery(dml);
    limits.insert_free_per_day = env_u64("IDEM_BENCH_FREE_INSERTS", 1500);
    limits.statements = env_u64("IDEM_BENCH_MODEL", 0) == 1;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let upstream = bq_limits::endpoint_of(&url).expect("the URL has an endpoint=");
        idem::store::bigquery::BigQueryStore::connect(&url)
            .await
            .expect("migrate");
        let sim = bq_limits::Simulator::start(&upstream, limits.clone()).await;
        let fleet = fleet::Fleet {
            runs,
            duplicates: runs / 10,
            jobs: 50,
            work,
            lease: Duration::from_secs(3600),
            prefix: format!("bench_{}", &idem::new_run_id()[..8]),
            spread: Duration::from_secs(env_u64("IDEM_BENCH_SPREAD_S", 60)),
            one_shard: None,
            only_shards: std::env::var("IDEM_BENCH_SHARDS")
                .ok()
                .and_then(|v| v.parse().ok()),
        };
        println!(
            "bigquery fleet: {runs} runs fired over {:?}, {} duplicates (2-5 claimers of a duplicated scope), {}, DML {dml:?}, reads {:?}, work {work:?}, free INSERTs/table {}, {}",
            fleet.spread,
            fleet.duplicates,
            match fleet.only_shards {
                Some(n) => format!("only the runs whose lease is in the first {n} of {} lease tables", idem::store::bigquery::LEASE_TABLES.len()),
                None => "every run".to_string(),
            },
            limits.read_latency,
            limits.insert_free_per_day,
            if limits.statements { "at the model (a job per statement)" } else { "scripts whole" }
        );
        let report = fleet::fire(&fleet, &url, &sim).await;
        println!("{}", report.summary());
        for f in report.failures.iter().take(5) {
            println!("  failure: {f}");
        }
    });
}
