//! Postgres-specific scenarios: claims over many pools and processes, lease takeover and
//! fencing through the CLI, the store dying mid-run (through a TCP proxy the test kills),
//! migrations, and the Postgres warehouse's binding and decoding. The scenarios every
//! store shares (odd strings, SQL jobs, the content key) are in `tests/it/scenarios.rs`.
//!
//! They need a database they may fill: `IDEM_TEST_POSTGRES_URL=postgres://USER@HOST:PORT/DB`.
//! Without it every test prints why it skipped and passes (under
//! `IDEM_REQUIRE_SERVICES=1`, as in CI, it fails instead). Each test uses its own job,
//! processor and table names (random suffix), so they share one database and run in
//! parallel.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::Utc;
use idem::store::postgres::PostgresStore;
use idem::store::prelude::*;
use idem::store::{Claim, ClaimRequest};
use idem::warehouse::postgres::PostgresWarehouse;
use idem::warehouse::{prepare, Dialect, Params, Warehouse};
use serde_json::{json, Value};
use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::common;

use common::{toml_str, wait, Sandbox};

/// The test database, or `None` (with a message) when it is not configured; under
/// `IDEM_REQUIRE_SERVICES=1` (CI) a missing URL fails the test instead.
fn pg_url(test: &str) -> Option<String> {
    common::postgres_url(&format!("postgres::{test}"))
}

/// 8 lowercase hex characters: safe inside SQL identifiers and job names.
fn suffix() -> String {
    idem::new_run_id().replace('-', "")[..8].to_string()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

async fn db(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .expect("connect to IDEM_TEST_POSTGRES_URL")
}

/// A runtime, a pool on the server at `url`, and a schema of the test's own,
/// `PREFIX_<suffix>`, created through that pool: its name, and `url` with that schema as
/// its search path (the test's store lives there alone). Dropped by [`drop_schema`].
fn own_schema(url: &str, prefix: &str) -> (tokio::runtime::Runtime, PgPool, String, String) {
    let rt = runtime();
    let admin = rt.block_on(db(url));
    let schema = format!("{prefix}_{}", suffix());
    rt.block_on(sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin))
        .unwrap();
    let sep = if url.contains('?') { '&' } else { '?' };
    let scoped = format!("{url}{sep}options[search_path]={schema}");
    (rt, admin, schema, scoped)
}

/// Drops a schema [`own_schema`] made, with everything in it.
fn drop_schema(rt: &tokio::runtime::Runtime, admin: &PgPool, schema: &str) {
    rt.block_on(sqlx::query(&format!("DROP SCHEMA {schema} CASCADE")).execute(admin))
        .unwrap();
}

/// A key for `pg_advisory_lock` no other test run uses at the same time.
fn rand_key() -> i64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    nanos ^ ((std::process::id() as i64) << 40)
}

fn sql_job(name: &str, guards: &str, sql: &str) -> String {
    format!(
        "name = {}\nprocessor = \"sql\"\n[guards]\n{guards}\n[sql]\n{sql}\n",
        toml_str(name)
    )
}

/// 32 stores, each with its own pool (so 32 connections), claim one scope at the same
/// instant, 20 times over: exactly one wins each time and every loser names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_from_32_pools_have_exactly_one_winner() {
    let Some(url) = pg_url("claims_from_32_pools_have_exactly_one_winner") else {
        return;
    };
    let mut stores = Vec::new();
    for _ in 0..32 {
        stores.push(Arc::new(
            PostgresStore::connect(&url).await.expect("open store"),
        ));
    }
    let processor = format!("pg-claims-{}", suffix());
    let mut double_wins = 0;
    for round in 0..20 {
        let scope = format!("2025-02-{:02}", round + 1);
        let barrier = Arc::new(tokio::sync::Barrier::new(stores.len()));
        let mut tasks = Vec::new();
        for store in &stores {
            let (store, barrier) = (store.clone(), barrier.clone());
            let (processor, scope) = (processor.clone(), scope.clone());
            tasks.push(tokio::spawn(async move {
                let run_id = idem::new_run_id();
                barrier.wait().await;
                let claim = store
                    .claim(&ClaimRequest {
                        processor: &processor,
                        scope: &scope,
                        run_id: &run_id,
                        ttl: Duration::from_secs(60),
                        now: Utc::now(),
                    })
                    .await
                    .expect("claim");
                (run_id, claim)
            }));
        }
        let mut winners = Vec::new();
        let mut named = std::collections::HashSet::new();
        for task in tasks {
            match task.await.expect("claim task") {
                (run_id, Claim::Acquired(lease)) => {
                    assert_eq!(lease.run_id, run_id);
                    winners.push(run_id);
                }
                (_, Claim::Held(holder)) => {
                    named.insert(holder.run_id);
                }
            }
        }
        if winners.len() != 1 {
            double_wins += 1;
        }
        assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
        assert!(
            named.len() == 1 && named.contains(&winners[0]),
            "round {round}: losers name {named:?}, the winner is {}",
            winners[0]
        );
    }
    assert_eq!(double_wins, 0);
    for store in &stores {
        assert!(
            store.pool().size() >= 1,
            "each store has its own connection"
        );
        store.pool().close().await;
    }
}

/// 8 `idem run` processes started at once for one scope, 20 times over: one completes,
/// 7 skip (`in_progress` while it runs; `time_window` for one that reaches the scope after
/// it finished, as a slow start on a busy machine does), and the work ran exactly once
/// per scope.
#[test]
fn eight_processes_one_scope_run_once() {
    let Some(url) = pg_url("eight_processes_one_scope_run_once") else {
        return;
    };
    let rt = runtime();
    let sfx = suffix();
    let effects = format!("pg_race_effects_{sfx}");
    let pool = rt.block_on(db(&url));
    rt.block_on(
        sqlx::query(&format!(
            "CREATE TABLE {effects} (scope TEXT NOT NULL, run_id TEXT NOT NULL)"
        ))
        .execute(&pool),
    )
    .expect("create effects table");
    let dir = Sandbox::with_store("idem-pg", &url);
    let name = format!("pg_race_{sfx}");
    let job = dir.write_job(
        "race",
        &sql_job(
            &name,
            "lease = \"1m\"\ntime_window = \"1h\"",
            &format!(
                "process = '''\nINSERT INTO {effects} (scope, run_id) VALUES (@scope, @run_id);\n\
                 SELECT pg_sleep(0.5)\n'''"
            ),
        ),
    );
    let job = job.to_str().unwrap();
    let started = Instant::now();
    for round in 0..20 {
        let date = format!("2025-01-{:02}", round + 1);
        let children: Vec<Child> = (0..8)
            .map(|_| {
                dir.json_command(&["run", job, "--date", &date])
                    .spawn()
                    .expect("spawn idem")
            })
            .collect();
        let mut winners = Vec::new();
        let mut late = Vec::new();
        let mut skipped = 0;
        for child in children {
            let (code, report, stderr) = wait(child);
            assert_eq!(code, 0, "round {round}: {report}\n{stderr}");
            match (report["status"].as_str(), report["skip_reason"].as_str()) {
                (Some("completed"), _) => winners.push(report["run_id"].clone()),
                (Some("skipped"), Some("in_progress")) => skipped += 1,
                // A process that reached the scope after the winner finished (a slow start
                // on a busy machine) is skipped by the time window, naming the winner.
                (Some("skipped"), Some("time_window")) => {
                    late.push(report["previous_run"]["run_id"].clone());
                    skipped += 1;
                }
                _ => panic!("round {round}: unexpected report {report}\n{stderr}"),
            }
        }
        assert_eq!(
            (winners.len(), skipped),
            (1, 7),
            "round {round}: one run, seven skips"
        );
        assert!(
            late.iter().all(|r| *r == winners[0]),
            "round {round}: a late skip names another run than the one that completed: {late:?} vs {winners:?}"
        );
    }
    let elapsed = started.elapsed();
    // The work itself ran once per scope, and the ledger agrees.
    let per_scope: Vec<(String, i64)> = rt
        .block_on(
            sqlx::query_as(&format!(
                "SELECT scope, count(*) FROM {effects} GROUP BY scope ORDER BY scope"
            ))
            .fetch_all(&pool),
        )
        .unwrap();
    assert_eq!(per_scope.len(), 20);
    assert!(per_scope.iter().all(|(_, n)| *n == 1), "{per_scope:?}");
    let ledger: Vec<(String, i64)> = rt
        .block_on(
            sqlx::query_as(
                "SELECT status, count(*) FROM processing_runs WHERE processor_name = $1 \
                 GROUP BY status ORDER BY status",
            )
            .bind(&name)
            .fetch_all(&pool),
        )
        .unwrap();
    assert_eq!(
        ledger,
        vec![("completed".to_string(), 20), ("skipped".to_string(), 140)]
    );
    eprintln!("8 processes x 20 scopes in {elapsed:?}");
    rt.block_on(sqlx::query(&format!("DROP TABLE {effects}")).execute(&pool))
        .unwrap();
}

/// A slow run whose lease (1 s, no heartbeat) expires is taken over by the next run; the
/// slow run's late completion is rejected, reported, and not recorded over the newer run.
/// Synchronised by states, not sleeps: the slow run's SQL waits on an advisory lock the
/// test holds, the next run starts once the lease row has expired, and the lock is let go
/// once it completed.
#[test]
fn expired_lease_is_taken_over_and_the_late_run_is_fenced() {
    let Some(url) = pg_url("expired_lease_is_taken_over_and_the_late_run_is_fenced") else {
        return;
    };
    let rt = runtime();
    let pool = rt.block_on(db(&url));
    let dir = Sandbox::with_store("idem-pg", &url);
    let name = format!("pg_takeover_{}", suffix());
    // A's work blocks on this advisory lock until the test lets it go.
    let lock_key: i64 = rand_key();
    // The pooled connection returns to the pool on drop, which needs the runtime.
    let _context = rt.enter();
    let mut locker = rt.block_on(pool.acquire()).unwrap();
    rt.block_on(
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(lock_key)
            .execute(&mut *locker),
    )
    .unwrap();
    let slow = dir.write_job(
        "slow",
        &sql_job(
            &name,
            "lease = \"1s\"\nheartbeat = false",
            &format!("process = \"SELECT pg_advisory_xact_lock({lock_key})\""),
        ),
    );
    let quick = dir.write_job(
        "quick",
        &sql_job(&name, "lease = \"1m\"", "process = \"SELECT 1\""),
    );
    let a = dir
        .json_command(&["run", slow.to_str().unwrap(), "--date", "2025-04-01"])
        .spawn()
        .expect("spawn run A");
    // A is processing (it holds the lease and waits on the lock), and its lease expired.
    let waiting = format!("%pg_advisory_xact_lock({lock_key})%");
    let start = std::time::Instant::now();
    loop {
        let (blocked, expired): (bool, bool) = rt
            .block_on(
                sqlx::query_as(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = \
                     'Lock' AND query LIKE $2), COALESCE((SELECT expires_at < now() \
                     FROM processing_leases WHERE processor_name = $1), false)",
                )
                .bind(&name)
                .bind(&waiting)
                .fetch_one(&pool),
            )
            .unwrap();
        if blocked && expired {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "A never processed with an expired lease (blocked {blocked}, expired {expired})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (b_code, b, b_err) = dir.run(&quick, "2025-04-01");
    assert_eq!(b_code, 0, "{b}\n{b_err}");
    assert_eq!(
        b["status"], "completed",
        "B takes the expired lease over: {b}"
    );
    rt.block_on(
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(lock_key)
            .execute(&mut *locker),
    )
    .unwrap();
    drop(locker);
    let (a_code, a, a_err) = wait(a);
    assert_eq!(a_code, 1, "{a}\n{a_err}");
    assert_eq!(a["status"], "failed", "{a}");
    assert_eq!(a["lease_lost"], true, "{a}");
    assert!(
        a["error"].as_str().unwrap_or("").contains("lease"),
        "the error says the lease was lost: {a}"
    );
    assert!(a_err.contains("lost"), "stderr says so too: {a_err}");

    // The ledger: B completed, A failed; only B's keys exist.
    let (code, runs, _) = dir.json(&["runs", "--job", &name, "--limit", "10"]);
    assert_eq!(code, 0);
    let runs = runs.as_array().expect("runs array");
    assert_eq!(runs.len(), 2, "{runs:?}");
    let find = |id: &Value| runs.iter().find(|r| r["run_id"] == *id).cloned();
    let b_row = find(&b["run_id"]).expect("B in the ledger");
    let a_row = find(&a["run_id"]).expect("A in the ledger");
    assert_eq!(b_row["status"], "completed");
    assert_eq!(a_row["status"], "failed");
    assert!(a_row["error"].as_str().unwrap_or("").contains("lease"));
    let key_runs: Vec<String> = rt
        .block_on(
            sqlx::query_scalar("SELECT run_id FROM processing_keys WHERE processor_name = $1")
                .bind(&name)
                .fetch_all(&pool),
        )
        .unwrap();
    assert!(!key_runs.is_empty(), "B wrote its key");
    assert!(
        key_runs.iter().all(|r| b["run_id"] == *r),
        "no key of A: {key_runs:?}"
    );
    let holder: Option<String> = rt
        .block_on(
            sqlx::query_scalar(
                "SELECT holder_run_id FROM processing_leases WHERE processor_name = $1",
            )
            .bind(&name)
            .fetch_one(&pool),
        )
        .unwrap();
    assert_eq!(holder, None, "B released the lease; A did not touch it");
}

/// A TCP proxy to the test server that the test can kill: stop listening (connections
/// are refused from then on) and cut every open connection.
struct Proxy {
    port: u16,
    stop: Arc<AtomicBool>,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let sockets: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (stop2, sockets2) = (stop.clone(), sockets.clone());
        let acceptor = std::thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((inbound, _)) => {
                        inbound.set_nonblocking(false).ok();
                        let Ok(outbound) = TcpStream::connect(target) else {
                            continue;
                        };
                        let mut all = sockets2.lock().unwrap();
                        all.push(inbound.try_clone().unwrap());
                        all.push(outbound.try_clone().unwrap());
                        pipe(inbound.try_clone().unwrap(), outbound.try_clone().unwrap());
                        pipe(outbound, inbound);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            // The listener is dropped here: the port refuses connections from now on.
        });
        Proxy {
            port,
            stop,
            sockets,
            acceptor: Some(acceptor),
        }
    }

    fn kill(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(a) = self.acceptor.take() {
            a.join().unwrap();
        }
        for s in self.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill();
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

/// The server address of a `postgres://user@host:port/db` URL, and the same URL through
/// `127.0.0.1:port`.
fn split_url(url: &str) -> (SocketAddr, Box<dyn Fn(u16) -> String>) {
    let (scheme, rest) = url.split_once("://").expect("url scheme");
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (format!("{u}@"), r.to_string()),
        None => (String::new(), rest.to_string()),
    };
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (hostport, tail) = rest.split_at(split);
    let hostport = if hostport.is_empty() {
        "localhost:5432".to_string()
    } else if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:5432")
    };
    let target = hostport
        .to_socket_addrs()
        .expect("resolve the test server")
        .next()
        .expect("an address");
    let (scheme, tail) = (scheme.to_string(), tail.to_string());
    (
        target,
        Box::new(move |port| format!("{scheme}://{userinfo}127.0.0.1:{port}{tail}")),
    )
}

/// A job whose work is visible: it inserts its run id into `effects`, then sleeps.
fn effect_job(dir: &Sandbox, name: &str, warehouse: &str, effects: &str, sleep: f64) -> PathBuf {
    dir.write_job(
        "job",
        &sql_job(
            name,
            "lease = \"30s\"\ntime_window = \"1h\"",
            &format!(
                "warehouse = {}\nprocess = '''\nINSERT INTO {effects} (run_id) VALUES (@run_id);\n\
                 SELECT pg_sleep({sleep}) AS {effects}\n'''",
                toml_str(warehouse)
            ),
        ),
    )
}

fn effects_table(rt: &tokio::runtime::Runtime, pool: &PgPool, name: &str) {
    rt.block_on(sqlx::query(&format!("CREATE TABLE {name} (run_id TEXT NOT NULL)")).execute(pool))
        .expect("create effects table");
}

fn count(rt: &tokio::runtime::Runtime, pool: &PgPool, sql: &str, bind: &str) -> i64 {
    rt.block_on(sqlx::query_scalar(sql).bind(bind).fetch_one(pool))
        .expect("count")
}

/// Strict policy, store lost while the work runs: the work is done but its result cannot
/// be recorded: exit 3, a warning, `recorded: false`; nothing is half-written (no key
/// without a run row) and the lease is left to expire.
#[test]
fn store_lost_mid_run_records_nothing_half_way() {
    let Some(url) = pg_url("store_lost_mid_run_records_nothing_half_way") else {
        return;
    };
    let rt = runtime();
    let pool = rt.block_on(db(&url));
    let sfx = suffix();
    let (name, effects) = (
        format!("pg_midrun_{sfx}"),
        format!("pg_midrun_effects_{sfx}"),
    );
    effects_table(&rt, &pool, &effects);
    let (target, via) = split_url(&url);
    let mut proxy = Proxy::start(target);
    let store = via(proxy.port);
    let dir = Sandbox::with_store("idem-pg", &store);
    // The warehouse is the real server: only the store goes through the proxy.
    let job = effect_job(&dir, &name, &url, &effects, 2.0);
    let child = dir
        .json_command(&[
            "run",
            job.to_str().unwrap(),
            "--date",
            "2025-05-01",
            "--on-store-failure",
            "strict",
        ])
        .spawn()
        .expect("spawn idem");
    // Wait until the work is running in the warehouse (past every guard: the lease guard
    // re-reads the keys after claiming), then kill the store.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let active: i64 = rt
            .block_on(
                sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
                     AND pid <> pg_backend_pid() AND query LIKE '%pg_sleep%' \
                     AND query LIKE '%' || $1 || '%'",
                )
                .bind(&effects)
                .fetch_one(&pool),
            )
            .unwrap();
        if active > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the work never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let run_id: String = rt
        .block_on(
            sqlx::query_scalar(
                "SELECT holder_run_id FROM processing_leases WHERE processor_name = $1",
            )
            .bind(&name)
            .fetch_one(&pool),
        )
        .expect("the run holds its lease");
    proxy.kill();
    let (code, report, stderr) = wait(child);
    assert_eq!(code, 3, "{report}\n{stderr}");
    assert_eq!(report["run_id"], run_id.as_str());
    assert_eq!(report["status"], "failed", "{report}");
    assert_eq!(report["recorded"], false, "{report}");
    assert_eq!(report["recording_failed"], true, "{report}");
    assert!(
        !report["store_errors"].as_array().unwrap().is_empty(),
        "{report}"
    );
    assert!(
        stderr.contains("could not record run"),
        "a clear warning: {stderr}"
    );
    // The work ran once; with a fresh connection: no run row, no key, the lease is still
    // held by the run and will expire.
    assert_eq!(
        count(
            &rt,
            &pool,
            &format!("SELECT count(*) FROM {effects} WHERE run_id = $1"),
            &run_id
        ),
        1
    );
    assert_eq!(
        count(
            &rt,
            &pool,
            "SELECT count(*) FROM processing_runs WHERE run_id = $1",
            &run_id
        ),
        0
    );
    assert_eq!(
        count(
            &rt,
            &pool,
            "SELECT count(*) FROM processing_keys WHERE processor_name = $1",
            &name
        ),
        0
    );
    let expires_in: f64 = rt
        .block_on(
            sqlx::query_scalar(
                "SELECT EXTRACT(EPOCH FROM expires_at - now())::float8 FROM processing_leases \
                 WHERE processor_name = $1 AND holder_run_id = $2",
            )
            .bind(&name)
            .bind(&run_id)
            .fetch_one(&pool),
        )
        .expect("the lease is still held by the run");
    assert!(
        expires_in > 0.0 && expires_in <= 30.0,
        "expires in {expires_in}s"
    );
    rt.block_on(sqlx::query(&format!("DROP TABLE {effects}")).execute(&pool))
        .unwrap();
}

/// A job whose store is unreachable from the start (a proxy that was killed), with an
/// effects table in the real database that shows whether the work ran.
struct DeadStore {
    rt: tokio::runtime::Runtime,
    pool: PgPool,
    name: String,
    effects: String,
    port: u16,
    dir: Sandbox,
    job: PathBuf,
}

impl DeadStore {
    fn new(url: &str, prefix: &str) -> Self {
        let rt = runtime();
        let pool = rt.block_on(db(url));
        let sfx = suffix();
        let (name, effects) = (format!("{prefix}_{sfx}"), format!("{prefix}_effects_{sfx}"));
        effects_table(&rt, &pool, &effects);
        let (target, via) = split_url(url);
        let mut proxy = Proxy::start(target);
        let store = via(proxy.port);
        proxy.kill();
        let dir = Sandbox::with_store("idem-pg", &store);
        let job = effect_job(&dir, &name, url, &effects, 0.0);
        DeadStore {
            rt,
            pool,
            name,
            effects,
            port: proxy.port,
            dir,
            job,
        }
    }

    /// `idem run JOB --date DATE --on-store-failure POLICY --format json`.
    fn run(&self, date: &str, policy: &str) -> (i32, Value, String) {
        self.dir.json(&[
            "run",
            self.job.to_str().unwrap(),
            "--date",
            date,
            "--on-store-failure",
            policy,
        ])
    }

    fn count(&self, sql: &str, bind: &str) -> i64 {
        count(&self.rt, &self.pool, sql, bind)
    }
}

impl Drop for DeadStore {
    fn drop(&mut self) {
        let _ = self.rt.block_on(
            sqlx::query(&format!("DROP TABLE IF EXISTS {}", self.effects)).execute(&self.pool),
        );
    }
}

/// Strict policy, store unreachable before the run: exit 3, a clear `error: store …
/// unavailable`, and nothing ran.
#[test]
fn store_down_before_the_run_strict_runs_nothing() {
    let Some(url) = pg_url("store_down_before_the_run_strict_runs_nothing") else {
        return;
    };
    let t = DeadStore::new(&url, "pg_down");
    let (code, doc, stderr) = t.run("2025-05-02", "strict");
    assert_eq!(code, 3, "{doc}\n{stderr}");
    assert_eq!(doc["exit_code"], 3);
    assert!(
        stderr.contains("error: store postgres://") && stderr.contains("unavailable"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("127.0.0.1:{}", t.port)),
        "names the store: {stderr}"
    );
    assert!(
        stderr.contains("cannot connect: ") && stderr.contains("refused"),
        "says it could not connect, and why: {stderr}"
    );
    assert_eq!(
        t.count(
            &format!("SELECT count(*) FROM {} WHERE run_id <> $1", t.effects),
            ""
        ),
        0,
        "nothing ran"
    );
    assert_eq!(
        t.count(
            "SELECT count(*) FROM processing_runs WHERE processor_name = $1",
            &t.name
        ),
        0
    );
}

/// Best-effort policy, store unreachable from the start: the run proceeds unguarded,
/// warns, and lists the store errors.
#[test]
fn store_down_best_effort_runs_and_reports_store_errors() {
    let Some(url) = pg_url("store_down_best_effort_runs_and_reports_store_errors") else {
        return;
    };
    let t = DeadStore::new(&url, "pg_best");
    let (code, report, stderr) = t.run("2025-05-03", "best_effort");
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["status"], "completed", "{report}");
    assert_eq!(report["recorded"], false, "{report}");
    let errors = report["store_errors"].as_array().expect("store_errors");
    assert!(!errors.is_empty(), "{report}");
    assert!(stderr.contains("best_effort"), "a warning: {stderr}");
    let run_id = report["run_id"].as_str().unwrap();
    assert_eq!(
        t.count(
            &format!("SELECT count(*) FROM {} WHERE run_id = $1", t.effects),
            run_id
        ),
        1,
        "the work ran"
    );
}

/// The warehouse's parameters behave like untyped literals whatever type Postgres infers,
/// values never become SQL, and rows come back as JSON for the common types.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warehouse_binds_like_literals_and_decodes_common_types() {
    let Some(url) = pg_url("warehouse_binds_like_literals_and_decodes_common_types") else {
        return;
    };
    let wh = PostgresWarehouse::connect(&url).await.unwrap();
    let params: Params = [
        ("d", "2025-11-18"),
        ("n", "41"),
        ("amount", "12.50"),
        ("flag", "yes"),
        ("stamp", "2025-11-18 10:00:00+02"),
        ("doc", "{\"k\": [1, 2]}"),
        ("evil", "x'); DROP TABLE processing_runs; --"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let one = |sql: &str| prepare(sql, Dialect::Postgres).unwrap().remove(0);

    let rows = wh
        .query(
            &one(
                "SELECT 1::int2 AS i2, 2::int4 AS i4, 3::int8 AS i8, 1.5::float4 AS f4, \
                 0.1::float8 AS f8, 12.340::numeric AS num, -0.05::numeric AS neg, \
                 123456789012345678901234567890.000000001::numeric AS big, 10000::numeric AS ten_k, \
                 'x'::text AS t, 'y'::varchar AS v, true AS b, DATE '2025-11-18' AS d, \
                 TIMESTAMPTZ '2025-11-18 10:00:00.5+00' AS tz, TIMESTAMP '2025-11-18 10:00:00' AS ts, \
                 '{\"a\": 1}'::json AS j, '{\"b\": [2]}'::jsonb AS jb, \
                 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid AS u, NULL::int AS nothing, \
                 ARRAY['p', 'q'] AS arr",
            ),
            &params,
        )
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![json!({
            "i2": 1, "i4": 2, "i8": 3, "f4": 1.5, "f8": 0.1, "num": "12.340", "neg": "-0.05",
            "big": "123456789012345678901234567890.000000001", "ten_k": "10000",
            "t": "x", "v": "y", "b": true, "d": "2025-11-18",
            "tz": "2025-11-18T10:00:00.500Z", "ts": "2025-11-18T10:00:00",
            "j": {"a": 1}, "jb": {"b": [2]}, "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "nothing": null, "arr": ["p", "q"],
        })]
    );

    // Parameters take the type Postgres infers from their context.
    let rows = wh
        .query(
            &one(
                "SELECT @d::date + 1 AS next_day, @n + 1 AS n_plus, @amount * 2.0 AS twice, \
                 (DATE '2025-11-18' = @d) AS same_day, (true = @flag) AS flag, \
                 (TIMESTAMPTZ '2025-11-18 08:00:00+00' = @stamp) AS same_instant, \
                 (@doc)::jsonb -> 'k' AS k, @evil AS evil, @d AS d_text",
            ),
            &params,
        )
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![json!({
            "next_day": "2025-11-19", "n_plus": 42, "twice": "25.000", "same_day": true,
            "flag": true, "same_instant": true, "k": [1, 2],
            "evil": "x'); DROP TABLE processing_runs; --", "d_text": "2025-11-18",
        })]
    );

    // A value the inferred type rejects fails with Postgres's own message.
    let bad: Params = [("d".to_string(), "not-a-date".to_string())].into();
    let err = wh
        .query(&one("SELECT @d::date AS d"), &bad)
        .await
        .unwrap_err();
    assert!(err.contains("invalid input syntax for type date"), "{err}");
    let missing = wh
        .query(&one("SELECT @nope AS x"), &params)
        .await
        .unwrap_err();
    assert!(missing.contains("@nope"), "{missing}");
}

/// Eight `idem migrate` processes on a fresh schema at once: all succeed, the schema is
/// created once (advisory lock), and a later open costs one query.
#[test]
fn concurrent_first_use_migrates_once() {
    let Some(url) = pg_url("concurrent_first_use_migrates_once") else {
        return;
    };
    let (rt, pool, schema, scoped) = own_schema(&url, "idem_mig");
    let dir = Sandbox::with_store("idem-pg", &scoped);
    let children: Vec<Child> = (0..8)
        .map(|_| dir.json_command(&["migrate"]).spawn().expect("spawn"))
        .collect();
    for child in children {
        let (code, doc, stderr) = wait(child);
        assert_eq!(code, 0, "{doc}\n{stderr}");
        assert_eq!(doc["migrated"], true);
    }
    let (versions, tables): (i64, i64) = rt
        .block_on(
            sqlx::query_as(&format!(
                "SELECT (SELECT count(*) FROM {schema}.idem_schema_migrations), \
                 (SELECT count(*) FROM information_schema.tables WHERE table_schema = $1)"
            ))
            .bind(&schema)
            .fetch_one(&pool),
        )
        .unwrap();
    assert_eq!(
        versions,
        idem::store::migrations::POSTGRES.len() as i64,
        "each migration applied once"
    );
    assert_eq!(
        tables, 8,
        "seven idem tables (event_cursors, event_pending and event_turns too) and the migrations table"
    );
    drop_schema(&rt, &pool, &schema);
}

/// Issue 36 (a gate's replay slowing round by round): the reads of stored event keys look up
/// the unconfirmed batches their rows name once per statement, whatever `event_pending`'s
/// statistics say. Counted while a few batches were pending (70 here; `VACUUM` and
/// `ANALYZE` between gates count them so), they made the per-key join a hash join built
/// again for every key: 1,000 scans of `event_pending` for one read of 1,000 keys, about
/// twice the time of the whole read.
#[test]
fn key_reads_scan_pending_batches_once_whatever_their_statistics() {
    let Some(url) = pg_url("key_reads_scan_pending_batches_once_whatever_their_statistics") else {
        return;
    };
    // A schema of its own: the statistics planted below are nobody else's.
    let (rt, admin, schema, scoped) = own_schema(&url, "idem_plan");
    rt.block_on(async {
        PostgresStore::connect(&scoped).await.unwrap();
        let pool = db(&scoped).await;
        for sql in [
            // 1,000 stored keys of a batch confirmed since (its row gone), as a replay
            // finds them.
            "INSERT INTO event_keys (namespace, event_key, first_seen, fingerprint, pending) \
             SELECT 'ns', 'k' || lpad(g::text, 6, '0'), now(), 'f', 1 \
             FROM generate_series(1, 1000) g",
            // Statistics counted while 70 batches were pending, then the batches confirmed.
            "INSERT INTO event_pending (namespace, marker, first_seen, deadline) \
             SELECT 'other', 'm' || g, now(), now() + interval '1 hour' \
             FROM generate_series(1, 70) g",
            "ANALYZE event_pending",
            "ANALYZE event_keys",
            "DELETE FROM event_pending",
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        let keys: Vec<String> = (1..=1000).map(|g| format!("k{g:06}")).collect();
        for (name, sql) in idem::store::postgres::EVENT_KEY_READS {
            let (plan,): (sqlx::types::Json<Value>,) =
                sqlx::query_as(&format!("EXPLAIN (ANALYZE, FORMAT JSON) {sql}"))
                    .bind("ns")
                    .bind(&keys)
                    .bind(Utc::now())
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            let root = &plan.0[0]["Plan"];
            assert_eq!(root["Actual Rows"], 1000, "{name}: every key read: {}", plan.0);
            // Every plan node that reads event_pending, with how many times it ran.
            fn scans(node: &Value, out: &mut Vec<(String, u64)>) {
                if node["Relation Name"] == "event_pending" {
                    let kind = node["Node Type"].as_str().unwrap_or("?").to_string();
                    out.push((kind, node["Actual Loops"].as_u64().unwrap_or(0)));
                }
                for child in node["Plans"].as_array().into_iter().flatten() {
                    scans(child, out);
                }
            }
            let mut found = Vec::new();
            scans(root, &mut found);
            assert!(!found.is_empty(), "{name}: event_pending is read: {}", plan.0);
            assert!(
                found.iter().all(|(_, loops)| *loops <= 1),
                "{name}: event_pending is to be read once per statement, not once per key: {found:?}"
            );
        }
    });
    drop_schema(&rt, &admin, &schema);
}

/// `EXPLAIN (ANALYZE, FORMAT JSON)` of the prepared statement `idem_mark_plan` run with
/// the values given (a marking statement's eight parameters).
const EXPLAIN_MARK_PLAN: &str = "\
CREATE FUNCTION pg_temp.explain_mark_plan(text, text[], text[], text[], timestamptz[],
                                          timestamptz, text, timestamptz) RETURNS json
LANGUAGE plpgsql AS $$
DECLARE plan json;
BEGIN
  EXECUTE format('EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE idem_mark_plan(%L, %L, %L, %L, %L, %L, %L, %L)',
                 $1, $2, $3, $4, $5, $6, $7, $8) INTO plan;
  RETURN plan;
END $$";

/// Issue 36 (a Postgres replay below its `COPY` floor): a batch's marking statement, with
/// a pending marker, asks whether it will insert a key before it registers the batch. That
/// question was `EXISTS (… input WHERE NOT EXISTS (… stored keys …))`, which the planner
/// runs as a nested loop to find a first row fast: when every key is stored (a replay)
/// there is none, and it compared each key with half the others, 499,500 comparisons for
/// 1,000 keys (about 20 ms, four times the whole lookup). Counted here as the rows every
/// plan node handled, which must stay under 50 per key (16–18 now; 1,015 per key on the
/// old statement), in the plan made for the values and in the generic one the server may
/// switch a prepared statement to after five runs.
#[test]
fn marking_a_batch_of_stored_keys_does_work_linear_in_its_keys() {
    let Some(url) = pg_url("marking_a_batch_of_stored_keys_does_work_linear_in_its_keys") else {
        return;
    };
    let (rt, admin, schema, scoped) = own_schema(&url, "idem_mark_plan");
    const KEYS: usize = 1000;
    rt.block_on(async {
        PostgresStore::connect(&scoped).await.unwrap();
        let pool = db(&scoped).await;
        // 1,000 stored keys, confirmed, as a replay finds them.
        sqlx::query(
            "INSERT INTO event_keys (namespace, event_key, first_seen, fingerprint) \
             SELECT 'ns', 'k' || lpad(g::text, 6, '0'), now(), 'f' \
             FROM generate_series(1, $1) g",
        )
        .bind(KEYS as i64)
        .execute(&pool)
        .await
        .unwrap();
        /// Rows every node of the plan produced or filtered out, over all its loops.
        fn rows_handled(node: &Value) -> f64 {
            let num = |k: &str| node[k].as_f64().unwrap_or(0.0);
            num("Actual Rows") * num("Actual Loops").max(1.0)
                + num("Rows Removed by Filter")
                + num("Rows Removed by Join Filter")
                + node["Plans"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(rows_handled)
                    .sum::<f64>()
        }
        // Every key stored (a replay: no batch row), then one key more that is not (the
        // batch registered, the key inserted).
        for absent in [0, 1] {
            let n = KEYS + absent;
            let keys: Vec<String> = (1..=n).map(|g| format!("k{g:06}")).collect();
            let fingerprints = vec![Some("f"); n];
            let decisions: Vec<Option<&str>> = vec![None; n];
            let expiries: Vec<Option<chrono::DateTime<Utc>>> = vec![None; n];
            for ((name, sql), mode) in idem::store::postgres::EVENT_KEY_MARKS
                .into_iter()
                .flat_map(|s| [(s, "force_custom_plan"), (s, "force_generic_plan")])
            {
                // EXPLAIN ANALYZE runs the statement: in a transaction rolled back after.
                // Prepared, as sqlx prepares it, and planned for these values or (after
                // five runs, when its cost says so) for any: both plans are checked.
                let mut tx = pool.begin().await.unwrap();
                sqlx::raw_sql(&format!(
                    "SET LOCAL plan_cache_mode = {mode}; PREPARE idem_mark_plan AS {sql}"
                ))
                .execute(&mut *tx)
                .await
                .unwrap();
                // EXPLAIN EXECUTE takes no parameters of its own: the values go to a
                // function that quotes them into it (`%L`).
                sqlx::raw_sql(EXPLAIN_MARK_PLAN)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let (plan,): (sqlx::types::Json<Value>,) = sqlx::query_as(
                    "SELECT pg_temp.explain_mark_plan($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind("ns")
                .bind(&keys)
                .bind(&fingerprints)
                .bind(&decisions)
                .bind(&expiries)
                .bind(Utc::now())
                .bind(Some(r#"{"idem_pending":"plan-test"}"#))
                .bind(Some(Utc::now() + chrono::Duration::hours(1)))
                .fetch_one(&mut *tx)
                .await
                .unwrap();
                sqlx::raw_sql("DEALLOCATE idem_mark_plan")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let (batches, pending_keys): (i64, i64) = sqlx::query_as(
                    "SELECT (SELECT count(*) FROM event_pending), \
                            (SELECT count(*) FROM event_keys WHERE pending IS NOT NULL)",
                )
                .fetch_one(&mut *tx)
                .await
                .unwrap();
                tx.rollback().await.unwrap();
                assert_eq!(
                    (batches, pending_keys),
                    (absent as i64, absent as i64),
                    "{name} ({mode}), {absent} key(s) not stored: a batch row only with a key \
                     to insert, and only that key pending for it"
                );
                let handled = rows_handled(&plan.0[0]["Plan"]);
                assert!(
                    handled < (50 * KEYS) as f64,
                    "{name} ({mode}): {handled} rows handled for {n} keys ({absent} not \
                     stored), not linear in them: {}",
                    plan.0
                );
            }
        }
    });
    drop_schema(&rt, &admin, &schema);
}

/// `idem migrate --check` on Postgres, as a Kubernetes init container runs it: exit 1
/// while the schema is behind (creating nothing), 0 once `idem migrate` has run; with
/// `--wait`, a check started before the migration ends 0 when the migration is done; an
/// unreachable server is exit 3, not "behind".
#[test]
fn migrate_check_says_whether_the_schema_is_current() {
    let Some(url) = pg_url("migrate_check_says_whether_the_schema_is_current") else {
        return;
    };
    let (rt, pool, schema, scoped) = own_schema(&url, "idem_chk");
    let dir = Sandbox::with_store("idem-pg", &scoped);
    let tables = || -> i64 {
        rt.block_on(
            sqlx::query_scalar(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1",
            )
            .bind(&schema)
            .fetch_one(&pool),
        )
        .unwrap()
    };
    let latest = idem::store::migrations::POSTGRES.last().unwrap().version;

    let (code, doc, stderr) =
        common::parse(dir.json_command(&["migrate", "--check"]).output().unwrap());
    assert_eq!(code, 1, "behind: {doc}\n{stderr}");
    assert_eq!(
        (doc["current"].clone(), doc["version"].clone()),
        (json!(false), json!(0))
    );
    assert_eq!(doc["latest"], latest);
    assert_eq!(tables(), 0, "a check creates nothing");

    // A waiting check (an init container) started before the migrate Job: it ends 0.
    let waiting = dir
        .json_command(&["migrate", "--check", "--wait", "2m"])
        .spawn()
        .unwrap();
    let (code, doc, stderr) = common::parse(dir.json_command(&["migrate"]).output().unwrap());
    assert_eq!(code, 0, "{doc}\n{stderr}");
    let (code, doc, stderr) = wait(waiting);
    assert_eq!(code, 0, "{doc}\n{stderr}");
    assert_eq!(
        (doc["current"].clone(), doc["version"].clone()),
        (json!(true), json!(latest))
    );

    let down = Sandbox::with_store(
        "idem-pg",
        "postgres://postgres@127.0.0.1:1/idem?connect_timeout=1",
    );
    let (code, doc, _) =
        common::parse(down.json_command(&["migrate", "--check"]).output().unwrap());
    assert_eq!(
        code, 3,
        "an unreachable store is not a schema behind: {doc}"
    );
    drop_schema(&rt, &pool, &schema);
}

/// A run interrupted by SIGTERM while its SQL runs on a Postgres warehouse cancels the
/// statement on the server before it exits: nothing of it is left running (beside the
/// next run of the scope), and the run is recorded as interrupted, its lease released.
#[test]
fn an_interrupted_run_cancels_its_statement_on_the_warehouse() {
    let Some(url) = pg_url("an_interrupted_run_cancels_its_statement_on_the_warehouse") else {
        return;
    };
    // While processing (`process`), and while deciding (the content query of a content
    // guard, after the lease was claimed).
    interrupt_sleeping_sql(&url, "lease = \"1h\"", "process", "interrupted by SIGTERM");
    interrupt_sleeping_sql(
        &url,
        "lease = \"1h\"\ncontent_hash = \"1h\"\norder = [\"lease\", \"content_hash\"]",
        "content",
        "interrupted by SIGTERM, before processing: after ",
    );
}

/// Runs a job whose `field` (`process` or `content`) is a 30 s `pg_sleep`, SIGTERMs it
/// once the statement is active, and checks the statement is gone soon after idem exits,
/// the run recorded as failed with an error starting `error`, and the lease free.
fn interrupt_sleeping_sql(url: &str, guards: &str, field: &str, error: &str) {
    let rt = runtime();
    let pool = rt.block_on(db(url));
    let dir = Sandbox::with_store("idem-pg", url);
    let sfx = suffix();
    let name = format!("pg_cancel_{sfx}");
    let marker = format!("idem_cancel_{sfx}");
    let sleep = format!("SELECT pg_sleep(30) AS {marker}");
    let sql = match field {
        "process" => format!("process = \"{sleep}\""),
        _ => format!("{field} = \"{sleep}\"\nprocess = \"SELECT 1\""),
    };
    let job = dir.write_job(
        "sleepy",
        &sql_job(
            &name,
            guards,
            &format!("warehouse = {}\n{sql}", toml_str(url)),
        ),
    );
    let active = |marker: &str| {
        count(
            &rt,
            &pool,
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
             AND pid <> pg_backend_pid() AND strpos(query, $1) > 0",
            marker,
        )
    };
    let child = dir
        .json_command(&["run", job.to_str().unwrap(), "--date", "2025-04-01"])
        .spawn()
        .expect("spawn the run");
    let started = Instant::now();
    while active(&marker) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the statement never showed in pg_stat_activity"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let held = || {
        count(
            &rt,
            &pool,
            "SELECT count(*) FROM processing_leases WHERE processor_name = $1 \
             AND holder_run_id IS NOT NULL AND expires_at > now()",
            &name,
        )
    };
    assert_eq!(held(), 1, "{field}: the run holds its lease");
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let signalled = Instant::now();
    let (code, v, err) = wait(child);
    assert!(
        // Well before the 30 s statement would have ended by itself (a loose bound: a busy
        // machine must not fail it).
        signalled.elapsed() < Duration::from_secs(12),
        "the run stops promptly: {:?}",
        signalled.elapsed()
    );
    assert_eq!(code, 1, "{v}\n{err}");
    assert_eq!(v["status"], "failed", "{v}");
    assert!(
        v["error"].as_str().unwrap().starts_with(error),
        "{field}: {v}"
    );
    assert_eq!(v["recorded"], true, "{v}");
    // The cancel was sent before idem exited; wait for the server to act on it (uncancelled,
    // the statement would still run for more than the 10 s waited here).
    let exited = Instant::now();
    let mut left = active(&marker);
    while left > 0 && exited.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        left = active(&marker);
    }
    assert_eq!(
        left, 0,
        "the interrupted run's pg_sleep ({field}) is still running on the warehouse after idem exited\n{err}"
    );
    // The lease is released: the next run may start at once (`explain` would run the
    // content query, so the lease table is read directly).
    assert_eq!(held(), 0, "{field}: the lease is released");
    let (_, runs, _) = dir.json(&["runs", "--job", &name, "--limit", "10"]);
    assert_eq!(runs[0]["status"], "failed", "{runs}");
    assert_eq!(runs[0]["error"], v["error"], "{runs}");
}

/// A store left by the build before this one (schema version 6: migrations 0001–0006 run and
/// recorded as its runner did, holding a completed run, its keys and a gate key) upgrades
/// with this build: `idem migrate` applies only what is new, the old run still makes the
/// same date skip and the old gate key is a replay. The rows are written by this build in
/// another schema and copied over in the old build's columns (0007 changes storage only;
/// 0008 adds a column the old rows lack), so they are what the older build wrote.
#[test]
fn a_store_at_schema_version_6_upgrades_and_keeps_its_runs_and_keys() {
    let Some(url) = pg_url("a_store_at_schema_version_6_upgrades_and_keeps_its_runs_and_keys")
    else {
        return;
    };
    let rt = runtime();
    let pool = rt.block_on(db(&url));
    let tag = suffix();
    let (old, donor) = (format!("idem_v6_{tag}"), format!("idem_v6_donor_{tag}"));
    let sep = if url.contains('?') { '&' } else { '?' };
    let scoped = |schema: &str| format!("{url}{sep}options[search_path]={schema}");
    for schema in [&old, &donor] {
        rt.block_on(sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&pool))
            .unwrap();
    }
    // The older build's schema: 0001–0006, each recorded in idem_schema_migrations.
    rt.block_on(async {
        use sqlx::Executor as _;
        let mut conn = pool.acquire().await.unwrap();
        (&mut *conn)
            .execute(format!("SET search_path TO {old}").as_str())
            .await
            .unwrap();
        (&mut *conn)
            .execute(
                "CREATE TABLE idem_schema_migrations (version INTEGER PRIMARY KEY, \
                 name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            )
            .await
            .unwrap();
        for m in idem::store::migrations::POSTGRES
            .iter()
            .filter(|m| m.version <= 6)
        {
            (&mut *conn).execute(m.sql).await.unwrap();
            sqlx::query("INSERT INTO idem_schema_migrations (version, name) VALUES ($1, $2)")
                .bind(m.version as i32)
                .bind(m.name)
                .execute(&mut *conn)
                .await
                .unwrap();
        }
        (&mut *conn).execute("RESET search_path").await.unwrap();
    });
    // What the older build wrote: a completed command job run and a gate key.
    let donor_dir = Sandbox::with_store("idem-pg-v6-donor", &scoped(&donor));
    let name = format!("old_{tag}");
    let job = format!(
        "name = \"{name}\"\nprocessor = \"command\"\n[guards]\ntime_window = \"1h\"\n\
         [command]\nrun = [\"true\"]\n"
    );
    donor_dir.write_job("old", &job);
    let (code, v, err) = donor_dir.json(&["run", &name, "--date", "2025-11-18"]);
    assert_eq!(
        (code, v["status"].as_str()),
        (0, Some("completed")),
        "{err}"
    );
    let gate = |dir: &Sandbox| {
        let mut child = dir
            .command(&["gate", "--key", "id", "--format", "ndjson"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"{\"id\":\"e1\",\"amount\":1}\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert!(gate(&donor_dir).contains("\"verdict\":\"new\""));
    // The columns the old build had (0008 added `pending` to event keys: a confirmed mark
    // is the same row without it).
    for (table, columns) in [
        ("processing_runs", "*"),
        // 0011 added `keep_until`: the old rows have none.
        (
            "processing_keys",
            "processing_key, kind, processor_name, scope, scope_date, processed_at, \
             entity_count, metadata, run_id",
        ),
        (
            "event_keys",
            "namespace, event_key, first_seen, fingerprint, decision, expires_at",
        ),
    ] {
        let into = if columns == "*" {
            String::new()
        } else {
            format!("({columns})")
        };
        rt.block_on(
            sqlx::query(&format!(
                "INSERT INTO {old}.{table} {into} SELECT {columns} FROM {donor}.{table}"
            ))
            .execute(&pool),
        )
        .unwrap();
    }
    // This build on the old store.
    let dir = Sandbox::with_store("idem-pg-v6", &scoped(&old));
    dir.write_job("old", &job);
    let (code, doc, err) = dir.json(&["migrate"]);
    assert_eq!(code, 0, "{doc} {err}");
    let versions: Vec<i32> = rt
        .block_on(
            sqlx::query_scalar(&format!(
                "SELECT version FROM {old}.idem_schema_migrations ORDER BY version"
            ))
            .fetch_all(&pool),
        )
        .unwrap();
    let expected: Vec<i32> = idem::store::migrations::POSTGRES
        .iter()
        .map(|m| m.version as i32)
        .collect();
    assert_eq!(
        versions, expected,
        "the old versions kept, the new ones added once"
    );
    let (code, v, err) = dir.json(&["run", &name, "--date", "2025-11-18"]);
    assert_eq!(
        (code, v["status"].as_str(), v["skip_reason"].as_str()),
        (0, Some("skipped"), Some("time_window")),
        "{v} {err}"
    );
    assert!(gate(&dir).contains("\"verdict\":\"replay\""));
    // The old key has no retention of its own (cleanup treats it as before); a key written
    // after the upgrade carries its job's 1 h window.
    let (code, v, err) = dir.json(&["run", &name, "--date", "2025-11-19"]);
    assert_eq!(
        (code, v["status"].as_str()),
        (0, Some("completed")),
        "{v} {err}"
    );
    let windows: Vec<(String, Option<f64>)> = rt
        .block_on(
            sqlx::query_as(&format!(
                "SELECT scope, EXTRACT(EPOCH FROM keep_until - processed_at)::float8 \
                 FROM {old}.processing_keys ORDER BY scope"
            ))
            .fetch_all(&pool),
        )
        .unwrap();
    assert_eq!(
        windows,
        [
            ("2025-11-18".to_string(), None),
            ("2025-11-19".to_string(), Some(3600.0))
        ]
    );
    for schema in [&old, &donor] {
        rt.block_on(sqlx::query(&format!("DROP SCHEMA {schema} CASCADE")).execute(&pool))
            .unwrap();
    }
}

/// A certificate authority and a server certificate for `localhost` (not 127.0.0.1) it signed,
/// made with `openssl` in a folder the server's user can read; and a second authority that
/// signed nothing of the server's.
struct TestCertificates {
    dir: PathBuf,
}

impl TestCertificates {
    fn make(test: &str) -> Option<TestCertificates> {
        let dir = std::env::temp_dir().join(format!("idem-tls-{}", suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let openssl = |args: &[&str]| {
            std::process::Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
        };
        let ca = |name: &str| {
            openssl(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
                "-subj",
                &format!("/CN=idem test {name}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ])
        };
        match ca("ca") {
            Ok(o) if o.status.success() => {}
            other => {
                common::skip(format!(
                    "skipped {test}: openssl could not make a certificate ({other:?})"
                ));
                let _ = std::fs::remove_dir_all(&dir);
                return None;
            }
        }
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        for args in [
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ][..],
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                "server.pem",
                "-extfile",
                "server.ext",
            ][..],
        ] {
            let out = openssl(args).unwrap();
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        }
        assert!(ca("other").unwrap().status.success());
        // The server refuses a key others may read; as root it runs as `postgres`.
        let _ = std::process::Command::new("chown")
            .args(["-R", "postgres"])
            .arg(&dir)
            .status();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            dir.join("server.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        Some(TestCertificates { dir })
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

impl Drop for TestCertificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// TLS to Postgres: a private server with a certificate this test made. Over
/// `sslmode=verify-full` the connection is encrypted (pg_stat_ssl says so), the store's
/// conformance checks pass and `idem exec` runs and records; with a root certificate that
/// did not sign the server's, or `verify-full` against a name the certificate does not
/// hold, the store is unavailable with an error naming the certificate (exit 3) and the
/// program never starts.
#[test]
fn the_store_works_over_verify_full_tls_and_refuses_a_server_it_cannot_verify() {
    let test = "the_store_works_over_verify_full_tls_and_refuses_a_server_it_cannot_verify";
    let Some(certs) = TestCertificates::make(test) else {
        return;
    };
    let (cert, key) = (certs.path("server.pem"), certs.path("server.key"));
    let settings = [
        "ssl=on".to_string(),
        format!("ssl_cert_file={cert}"),
        format!("ssl_key_file={key}"),
    ];
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let Some(server) = common::private_pg::PrivatePostgres::start(test, &settings) else {
        return;
    };
    let at = |host: &str, root: &str, mode: &str| {
        format!(
            "postgres://postgres@{host}:{}/postgres?sslmode={mode}&sslrootcert={}",
            server.port,
            certs.path(root)
        )
    };
    let tls = at("localhost", "ca.pem", "verify-full");
    let rt = runtime();
    rt.block_on(async {
        let pool = db(&tls).await;
        let ssl: bool =
            sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert!(ssl, "the connection is encrypted");
        let store = idem::store::open(&tls)
            .await
            .expect("open over verify-full");
        use idem::store::conformance as c;
        c::claim_excludes_and_release_frees(&*store).await;
        c::expired_lease_is_taken_over_and_fenced(&*store).await;
        c::concurrent_claims_have_one_winner(store.clone()).await;
        c::keys_only_on_success(&*store).await;
        c::key_windows_and_latest_row(&*store).await;
        c::ledger_queries(&*store).await;
        c::strings_round_trip(&*store).await;
        c::renew_extends_lease(&*store).await;
        c::taken_run_id_is_refused_and_changes_nothing(&*store).await;
        let events = idem::store::open_event_keys(&tls).await.unwrap();
        c::event_keys_batch(&*events).await;
        c::event_dedup_replay_and_conflict(&*events).await;
        c::event_pending_batches(&*events).await;
    });
    let sb = Sandbox::with_store("idem-pg-tls", &tls);
    let exec = |store: &str, marker: &str| {
        std::process::Command::new(common::IDEM)
            .args([
                "--store",
                store,
                "exec",
                "tls",
                "--date",
                "2026-01-01",
                "--",
                "touch",
            ])
            .arg(sb.dir.join(marker))
            .current_dir(&sb.dir)
            .env_remove("IDEM_STORE")
            .output()
            .unwrap()
    };
    let out = exec(&tls, "ran");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(sb.dir.join("ran").exists());
    for (store, why) in [
        (
            at("localhost", "other.pem", "verify-full"),
            "another root certificate",
        ),
        (
            at("localhost", "other.pem", "verify-ca"),
            "verify-ca, another root",
        ),
        (
            at("127.0.0.1", "ca.pem", "verify-full"),
            "an address not in the certificate",
        ),
    ] {
        let marker = format!("never-{}", suffix());
        let out = exec(&store, &marker);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{why}: {err}");
        assert!(
            err.contains("certificate"),
            "{why}: the error names the certificate: {err}"
        );
        assert!(
            !sb.dir.join(&marker).exists(),
            "{why}: the program never started"
        );
    }
    // A root certificate file that is not there is a configuration error naming it.
    let out = exec(&at("localhost", "missing.pem", "verify-full"), "never");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("sslrootcert") && err.contains("missing.pem"),
        "{err}"
    );
}
