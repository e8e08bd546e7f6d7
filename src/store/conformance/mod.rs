//! The conformance suite every store must pass.
//!
//! Plain `pub async fn`s, each taking the capability it tests (`&dyn LeaseStore`,
//! `&dyn LedgerStore`, `&dyn EventKeyStore`, or the whole `&dyn Store`); each backend's
//! tests call every one of them directly (see `tests/it/conformance.rs`). What a backend
//! guarantees beyond one instance ([`Capabilities`](super::Capabilities)) decides what
//! [`capabilities_hold_across_instances`] asserts. Each check uses its own processor names, so the checks can
//! share one database and run in any order. Times are passed explicitly (`now`), so
//! expiry is tested without sleeping.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use serde_json::json;

use super::{Claim, ClaimRequest, Finish, Lease, LedgerStore, RunFilter};
use crate::model::{
    micros, new_run_id, KeyKind, KeyRecord, Mode, RunRecord, RunStatus, SkipReason, Trigger,
};

// One file per capability, as the store traits are split: `lease` (claims, takeover,
// renewal), `ledger` (runs, keys and their queries), `maintenance` (purge and cleanup),
// `event_keys` (marks, cursors, pending marks, unmarking) and `event_dedup` (replays,
// conflicts and expiry of deduplicated events). The helpers they share, and the check that
// spans instances, are here.
mod event_dedup;
mod event_keys;
mod lease;
mod ledger;
mod maintenance;

pub use event_dedup::{
    event_dedup_after_fresh_batches, event_dedup_after_replayed_batches, event_dedup_in_batch,
    event_dedup_large_batch, event_dedup_real_ttl, event_dedup_replay_and_conflict,
    event_dedup_ttl,
};
pub use event_keys::{
    event_all_marked, event_cursor, event_keys_batch, event_marks_ahead, event_pending,
    event_pending_batches, event_pending_batches_are_whole, event_unmark,
};
pub use lease::{
    claim_excludes_and_release_frees, concurrent_claims_have_one_winner,
    expired_lease_is_taken_over_and_fenced, open_leases_are_the_runs_not_recorded_yet,
    renew_extends_lease,
};
pub use ledger::{
    key_windows_and_latest_row, keys_only_on_success, ledger_queries, strings_round_trip,
    taken_run_id_is_refused_and_changes_nothing,
};
pub use maintenance::{
    cleanup_deletes_exactly_what_is_past_retention, cleanup_keeps_a_key_until_its_own_retention,
    purge_and_cleanup,
};

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &new_run_id()[..8])
}

fn now() -> DateTime<Utc> {
    micros(Utc::now())
}

fn day() -> NaiveDate {
    NaiveDate::from_ymd_opt(2025, 11, 18).expect("valid date")
}

fn request<'a>(
    processor: &'a str,
    scope: &'a str,
    run_id: &'a str,
    ttl_secs: u64,
    now: DateTime<Utc>,
) -> ClaimRequest<'a> {
    ClaimRequest {
        processor,
        scope,
        run_id,
        ttl: Duration::from_secs(ttl_secs),
        now,
    }
}

/// A ledger row for tests.
pub fn run_record(
    processor: &str,
    scope: &str,
    run_id: &str,
    status: RunStatus,
    at: DateTime<Utc>,
) -> RunRecord {
    RunRecord {
        run_id: run_id.to_string(),
        processor: processor.to_string(),
        scope: scope.to_string(),
        scope_date: day(),
        trigger: Trigger::Scheduler,
        mode: Mode::Enforce,
        started_at: micros(at - chrono::Duration::milliseconds(1500)),
        finished_at: micros(at),
        duration_ms: 1500,
        status,
        skip_reason: (status == RunStatus::Skipped).then_some(SkipReason::TimeWindow),
        would_skip_reason: None,
        previous_run_id: None,
        records_processed: (status == RunStatus::Completed).then_some(42),
        processing_key: Some("k".repeat(64)),
        error: (status == RunStatus::Failed).then(|| "boom".to_string()),
        output: Some(json!({"rows": 42, "note": "ok"})),
    }
}

/// A key row for tests.
pub fn key_record(
    key: &str,
    kind: KeyKind,
    processor: &str,
    scope: &str,
    run_id: &str,
    at: DateTime<Utc>,
) -> KeyRecord {
    KeyRecord {
        key: key.to_string(),
        kind,
        processor: processor.to_string(),
        scope: scope.to_string(),
        scope_date: day(),
        processed_at: micros(at),
        entity_count: Some(450),
        metadata: json!({"source": "test", "entities": 450}),
        run_id: run_id.to_string(),
        keep_until: Some(micros(at)),
    }
}

fn acquired(claim: Claim) -> Lease {
    match claim {
        Claim::Acquired(lease) => lease,
        Claim::Held(h) => panic!(
            "expected to acquire the lease, but run {} holds it",
            h.run_id
        ),
    }
}

async fn finish_completed(
    store: &dyn LedgerStore,
    lease: &Lease,
    keys: Vec<KeyRecord>,
    at: DateTime<Utc>,
) -> crate::Result<()> {
    store
        .finish(&Finish {
            run: run_record(
                &lease.processor,
                &lease.scope,
                &lease.run_id,
                RunStatus::Completed,
                at,
            ),
            keys,
            lease: Some(lease.clone()),
        })
        .await
}

/// What the backend's [`Capabilities`](super::Capabilities) promise, across instances
/// opened on the same `url`: with `cross_process`, a lease claimed through one instance is
/// held for the other; with `durable`, a run recorded through an instance that is then
/// dropped is in the ledger of one opened afterwards. A backend promising neither (the
/// memory store) is not held to either.
pub async fn capabilities_hold_across_instances(url: &str) {
    let first = super::open(url).await.expect("open the store");
    let second = super::open(url).await.expect("open the store again");
    let capabilities = first.capabilities();
    assert_eq!(capabilities, second.capabilities());
    let p = unique("instances");
    let t = now();
    let run = new_run_id();
    let lease = acquired(first.claim(&request(&p, "s", &run, 60, t)).await.unwrap());
    if capabilities.cross_process {
        match second
            .claim(&request(&p, "s", &new_run_id(), 60, t))
            .await
            .unwrap()
        {
            Claim::Held(h) => assert_eq!(h.run_id, run, "the other instance sees the holder"),
            Claim::Acquired(_) => panic!("two instances on one url both acquired a lease"),
        }
    }
    finish_completed(&*first, &lease, vec![], t).await.unwrap();
    drop(first);
    drop(second);
    if capabilities.durable {
        let third = super::open(url).await.expect("open the store once more");
        let runs = third
            .runs(&RunFilter {
                processor: Some(p.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            runs.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
            [run.as_str()],
            "a recorded run outlives the instance that recorded it"
        );
    }
}
