//! A fleet of runs fired at once against a BigQuery store behind the limits simulator
//! (`bq_limits.rs`): `runs` runs over `runs - duplicates` scopes; the `duplicates` extra
//! runs go to the first scopes, 1 to 4 extra each in turn (2–5 claimers of one new scope,
//! fired at the same moment). Each run has its own store instance (its own
//! HTTP client and connections), claims its scope (time window 1 h + lease), works for
//! `work`, and finishes. Shared by `tests/bigquery.rs` (scaled for CI) and
//! `benches/bigquery_fleet.rs` (1,000 runs).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::guard::{GuardStack, LeaseGuard, TimeWindowGuard};
use idem::store::bigquery::BigQueryStore;
use idem::store::DynStore;
use idem::{async_trait, BoxError, Outcome, Processor, RunRequest, RunStatus, Runner, SkipReason};

use super::bq_limits::{Simulator, Stats};

/// The shape of a fleet.
#[derive(Debug, Clone)]
pub struct Fleet {
    /// Runs fired.
    pub runs: usize,
    /// Extra runs of scopes already in the fleet (concurrent duplicates): the first scopes
    /// get 1, 2, 3, 4, 1, 2, … of them, so a duplicated scope has 2 to 5 claimers at once.
    pub duplicates: usize,
    /// Jobs (processor names) the scopes are spread over; the rest of a scope is its date.
    pub jobs: usize,
    /// How long each run works.
    pub work: Duration,
    /// The lease duration.
    pub lease: Duration,
    /// Prefix of the processor names (unique per fleet).
    pub prefix: String,
    /// The fires are spread over this long (zero: all at the same instant); a scope's
    /// duplicate fires at the same instant as the scope's first run.
    pub spread: Duration,
    /// Only scopes whose lease lives in this lease table (`processing_leases_NN`): the
    /// worst case of one table's queue and conflicts. `None`: every table.
    pub one_shard: Option<usize>,
    /// Only the runs whose lease lives in the first `n` lease tables (`Some(n)`), each
    /// fired when it would be in the whole fleet: those tables get exactly the load the
    /// whole fleet puts on each of them, with a fraction of its statements. `None`: all.
    pub only_shards: Option<usize>,
}

/// What a fleet did.
#[derive(Debug, Default)]
pub struct FleetReport {
    pub runs: usize,
    pub scopes: usize,
    pub completed: usize,
    pub in_progress: usize,
    pub time_window: usize,
    /// Runs that failed or returned an error, with the message.
    pub failures: Vec<String>,
    /// Failures that mention a quota ("too many DML statements outstanding").
    pub quota_failures: usize,
    /// Failures that mention a concurrent-update conflict.
    pub conflict_failures: usize,
    /// Scopes with a number of completions other than one: scope → completions.
    pub wrong_completions: BTreeMap<String, usize>,
    /// Times the processor ran per scope above one (work done twice).
    pub double_work: usize,
    /// Duplicates (second run of a scope) that did not skip.
    pub duplicates_not_skipped: usize,
    /// Time from a run's fire to its lease decision: the work starting (winners) or the
    /// run ending (skipped runs), sorted.
    pub decision: Vec<Duration>,
    /// Time from the first fire to the last run ending.
    pub wall: Duration,
    pub sim: Stats,
}

impl FleetReport {
    fn pct(&self, p: f64) -> Duration {
        if self.decision.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.decision.len() as f64 - 1.0) * p).round() as usize;
        self.decision[i]
    }

    /// Median time to the lease decision.
    pub fn p50(&self) -> Duration {
        self.pct(0.50)
    }

    /// 99th percentile time to the lease decision.
    pub fn p99(&self) -> Duration {
        self.pct(0.99)
    }

    /// Statements per run (all kinds).
    pub fn statements_per_run(&self) -> f64 {
        self.sim.total() as f64 / self.runs as f64
    }

    /// Mutating statements per run.
    pub fn mutating_per_run(&self) -> f64 {
        self.sim.kind("mutating") as f64 / self.runs as f64
    }

    /// Modelled MB billed per run.
    pub fn mb_billed_per_run(&self) -> f64 {
        self.sim.bytes_billed as f64 / self.runs as f64 / (1024.0 * 1024.0)
    }

    /// A multi-line summary.
    pub fn summary(&self) -> String {
        let s = &self.sim;
        // The lease shards (`processing_leases_00` …) summed as `processing_leases_NN`.
        let mut tables: BTreeMap<String, u64> = BTreeMap::new();
        for (k, v) in &s.by_table {
            let (table, kind) = k.split_once(' ').unwrap_or((k, ""));
            let table = match table.rsplit_once('_') {
                Some((base, n)) if n.len() == 2 && n.chars().all(|c| c.is_ascii_digit()) => {
                    format!("{base}_NN")
                }
                _ => table.to_string(),
            };
            *tables.entry(format!("{table} {kind}")).or_default() += v;
        }
        let mut by_table = String::new();
        for (k, v) in &tables {
            by_table.push_str(&format!("\n    {k}: {v}"));
        }
        format!(
            "runs {} over {} scopes in {:.1?}: completed {}, skipped in_progress {}, skipped time_window {}, failed {} (quota {}, conflict {})\n\
             scopes not completed exactly once: {}; work done twice: {}; duplicates not skipped: {}\n\
             time to the lease decision: p50 {:.0?}, p99 {:.0?}\n\
             statements sent {} ({:.2}/run: select {}, insert {}, mutating {} = {:.2}/run), ran {} ({:.2}/run); bytes billed (modelled, 10 MB/table read) {:.1} MB/run; emulator totalBytesProcessed {}\n\
             simulator: refused for a full queue {}, failed on conflict {}, conflicts BigQuery re-ran {}, most outstanding on one table: mutating {}, insert {}\n\
             statements by table:{by_table}",
            self.runs,
            self.scopes,
            self.wall,
            self.completed,
            self.in_progress,
            self.time_window,
            self.failures.len(),
            self.quota_failures,
            self.conflict_failures,
            self.wrong_completions.len(),
            self.double_work,
            self.duplicates_not_skipped,
            self.p50(),
            self.p99(),
            s.total(),
            self.statements_per_run(),
            s.kind("select"),
            s.kind("insert"),
            s.kind("mutating"),
            self.mutating_per_run(),
            s.ran,
            s.ran as f64 / self.runs as f64,
            self.mb_billed_per_run(),
            s.bytes_processed_reported,
            s.quota_failures,
            s.conflict_failures,
            s.conflict_reruns,
            s.max_outstanding_mutating,
            s.max_outstanding_insert,
        )
    }
}

/// Works for a while; notes when the work started.
struct Work {
    fired: Instant,
    work: Duration,
    started: Mutex<Option<Duration>>,
    calls: Arc<Mutex<BTreeMap<String, usize>>>,
}

#[async_trait]
impl Processor for Work {
    fn name(&self) -> &str {
        "fleet"
    }
    async fn process(&self, request: &RunRequest) -> Result<Outcome, BoxError> {
        *self.started.lock().unwrap() = Some(self.fired.elapsed());
        *self
            .calls
            .lock()
            .unwrap()
            .entry(format!("{}/{}", request.processor, request.scope))
            .or_default() += 1;
        tokio::time::sleep(self.work).await;
        Ok(Outcome::records(1))
    }
}

/// The scope index of run `i`: runs `0..scopes` one each, then the duplicates, 1, 2, 3
/// and 4 extra runs of scopes 0, 1, 2, 3, then again for scopes 4 to 7, and so on.
fn scope_index(fleet: &Fleet, i: usize) -> usize {
    let scopes = fleet.runs - fleet.duplicates;
    if i < scopes {
        return i;
    }
    let d = i - scopes;
    // Each group of 4 scopes takes 1 + 2 + 3 + 4 = 10 duplicates.
    let (group, r) = (d / 10, d % 10);
    let within = match r {
        0 => 0,
        1..=2 => 1,
        3..=5 => 2,
        _ => 3,
    };
    (4 * group + within) % scopes.max(1)
}

/// When run `i` fires, after the fleet's start: scopes in a scrambled order over the
/// spread, a duplicate with its scope.
fn fire_delay(fleet: &Fleet, i: usize) -> Duration {
    let scopes = (fleet.runs - fleet.duplicates).max(1);
    let slot = (scope_index(fleet, i) * 7919) % scopes;
    fleet.spread.mul_f64(slot as f64 / scopes as f64)
}

/// The scopes of the fleet, in order: (processor, date).
fn scopes(fleet: &Fleet) -> Vec<(String, chrono::NaiveDate)> {
    let first = idem::parse_date("2025-01-01").unwrap();
    (0..)
        .map(|s| {
            let job = format!("{}_job{:03}", fleet.prefix, s % fleet.jobs);
            (job, first + chrono::Duration::days((s / fleet.jobs) as i64))
        })
        .filter(|(job, date)| {
            fleet.one_shard.is_none_or(|shard| {
                idem::store::bigquery::lease_shard(job, &date.to_string()) == shard
            })
        })
        .take(fleet.runs - fleet.duplicates)
        .collect()
}

/// Fires the fleet at `url` (already migrated) through `sim`, and waits for every run.
pub async fn fire(fleet: &Fleet, url: &str, sim: &Simulator) -> FleetReport {
    let url = sim.url(url);
    sim.reset_stats();
    let calls = Arc::new(Mutex::new(BTreeMap::new()));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(fleet.runs);
    let scopes = scopes(fleet);
    let fired: Vec<usize> = (0..fleet.runs)
        .filter(|&i| {
            fleet.only_shards.is_none_or(|n| {
                let (job, date) = &scopes[scope_index(fleet, i)];
                idem::store::bigquery::lease_shard(job, &date.to_string()) < n
            })
        })
        .collect();
    for &i in &fired {
        let (job, date) = scopes[scope_index(fleet, i)].clone();
        let (url, calls, fleet) = (url.clone(), calls.clone(), fleet.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(fire_delay(&fleet, i)).await;
            let fired = Instant::now();
            let store: Arc<DynStore> =
                Arc::new(BigQueryStore::connect_lazy(&url).await.expect("store"));
            let guards = GuardStack::builder()
                .guard(TimeWindowGuard::new(Duration::from_secs(3600)))
                .guard(LeaseGuard::new(fleet.lease))
                .build();
            let work = Work {
                fired,
                work: fleet.work,
                started: Mutex::new(None),
                calls,
            };
            let result = Runner::new(store, guards)
                .run(&work, RunRequest::new(job.clone(), date))
                .await;
            let started = *work.started.lock().unwrap();
            (i, format!("{job}/{date}"), result, started, fired.elapsed())
        }));
    }
    let mut report = FleetReport {
        runs: fired.len(),
        scopes: fired
            .iter()
            .map(|&i| scope_index(fleet, i))
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        ..Default::default()
    };
    let mut completions: BTreeMap<String, usize> = BTreeMap::new();
    for task in tasks {
        let (_, scope, result, started, ended) = task.await.expect("run task");
        let entry = completions.entry(scope.clone()).or_default();
        let fail = |m: String, report: &mut FleetReport| {
            let l = m.to_ascii_lowercase();
            if l.contains("quota") || l.contains("too many dml") {
                report.quota_failures += 1;
            }
            if l.contains("concurrent update") {
                report.conflict_failures += 1;
            }
            report.failures.push(format!("{scope}: {m}"));
        };
        match result {
            Err(e) => fail(e.to_string(), &mut report),
            Ok(r) if r.status == RunStatus::Completed => {
                *entry += 1;
                report.completed += 1;
                report.decision.push(started.unwrap_or(ended));
                if !r.store_errors.is_empty() {
                    fail(r.store_errors.join("; "), &mut report);
                }
            }
            Ok(r) if r.status == RunStatus::Skipped => {
                match r.skip_reason {
                    Some(SkipReason::InProgress) => report.in_progress += 1,
                    Some(SkipReason::TimeWindow) => report.time_window += 1,
                    _ => {}
                }
                report.decision.push(ended);
                if !r.store_errors.is_empty() {
                    fail(r.store_errors.join("; "), &mut report);
                }
            }
            Ok(r) => fail(
                format!("{:?}: {}", r.status, r.error.unwrap_or_default()),
                &mut report,
            ),
        }
    }
    report.wall = start.elapsed();
    report.decision.sort();
    for (scope, n) in completions {
        if n != 1 {
            report.wrong_completions.insert(scope, n);
        }
    }
    report.double_work = calls.lock().unwrap().values().map(|n| n - 1).sum();
    // The duplicates: of each duplicated scope, exactly one run may have completed.
    report.duplicates_not_skipped = report
        .wrong_completions
        .values()
        .filter(|n| **n > 1)
        .map(|n| n - 1)
        .sum();
    report.sim = sim.stats();
    report
}
