//! Sending one statement: a lost concurrent-update conflict of a statement whose effect
//! does not depend on what it lost to is sent again (quota answers, rate limits and sends
//! without an answer are retried below, by [`Connection::query`] for every caller); a
//! failure is told apart as the store unavailable or the statement refused.
//!
//! [`Connection::query`]: crate::backend::bigquery::Connection::query

use std::time::Duration;

// tokio's clock: real time, and a paused clock in tests of these budgets.
use tokio::time::Instant;

use crate::backend::retry::Backoff;
use crate::error::{Error, Result};

use crate::backend::bigquery::{ApiError, Param, QueryOutput, QUOTA_RETRIES};

use super::BigQueryStore;

/// A mutating statement that lost a concurrent-update conflict (BigQuery itself already
/// re-ran it up to three times) is sent again after a random pause that doubles from 50 ms
/// up to 1.6 s: 16 times in all, about 20 s. Under a fleet, the statements of other scopes
/// on the same lease table are what it conflicts with, so it soon gets through.
pub(super) const CONFLICT_RETRIES: Backoff = Backoff {
    attempts: 16,
    base: Duration::from_millis(50),
    jitter: Duration::from_millis(100),
};

/// How long a quota answer is waited out, in all, for a statement that may be sent again
/// ([`QUOTA_RETRIES`]' 40 sends take about as long): a full queue of 20 statements of
/// about a second each drains many times over.
pub(super) const QUOTA_WAIT: Duration = Duration::from_secs(240);

/// How long a quota answer is waited out by what every run of a fleet sends to a table
/// the fleet shares, before anything is done or after nothing was: the claim on its lease
/// table, and a skip's ledger row (alone, or with the content check that decides it). A
/// thousand runs fired in one minute keep those queues full for minutes: a lease table
/// commits about one mutating statement a second (2 run at once and conflict, 20 queue),
/// and past its first 1,500 INSERTs of a day a table runs 10 INSERTs at once and queues
/// 100 (DML page, "INSERT DML concurrency"). Measured at the model with ~1 s statements,
/// the time to the lease decision reached 226 s (p99) at a 1,000-run fleet's per-table
/// load and 469 s on its busiest tables, against [`QUOTA_WAIT`]'s 240, and 20 of 100
/// skips gave up on their row. Ten minutes is what a Cloud Run task
/// gets by default; a run waiting here is late, not failed, and has done nothing twice.
pub(super) const BURST_WAIT: Duration = Duration::from_secs(600);

impl BigQueryStore {
    /// A failed call: [`Error::StoreUnavailable`] when BigQuery could not be reached or
    /// could not answer, [`Error::StoreRejected`] when it refused the statement.
    pub(super) fn err(&self, e: ApiError) -> Error {
        if e.is_outage() {
            let message = e.to_string();
            Error::store_source(&self.url, message, e)
        } else {
            Error::StoreRejected {
                store: self.url.to_string(),
                operation: format!("the {} statement", e.operation),
                message: e.to_string(),
                source: Some(Box::new(e)),
            }
        }
    }

    pub(super) fn bad_row(&self, operation: &str, e: String) -> Error {
        Error::store(
            &self.url,
            format!("bigquery {operation}: unexpected result row: {e}"),
        )
    }

    /// Sends one statement. Quota answers, rate limits and sends without a usable answer
    /// are retried by [`Connection::query`](crate::backend::bigquery::Connection::query)
    /// (the same `requestId` across re-sends that may have run), then reported.
    pub(super) async fn send(
        &self,
        operation: &str,
        sql: &str,
        params: &[Param],
    ) -> std::result::Result<QueryOutput, ApiError> {
        self.conn.query(operation, sql, params.to_vec()).await
    }

    pub(super) async fn query(
        &self,
        operation: &str,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<QueryOutput> {
        self.send(operation, sql, &params)
            .await
            .map_err(|e| self.err(e))
    }

    /// A statement with parameters sent as [`send_again_on_conflict`] sends it, with quota
    /// answers waited out for `quota_wait` in all.
    ///
    /// [`send_again_on_conflict`]: Self::send_again_on_conflict
    pub(super) async fn query_waiting(
        &self,
        operation: &str,
        sql: &str,
        params: Vec<Param>,
        quota_wait: Duration,
    ) -> Result<QueryOutput> {
        self.send_again(operation, |_| sql.to_owned(), &params, quota_wait, false)
            .await
            .map_err(|e| self.err(e))
    }

    /// A multi-statement script (one job, no parameters: its values are literals) that
    /// may be sent again whole after a concurrent-update conflict: the finish and the
    /// recorded skip (each write `WHERE NOT EXISTS`: sent again, nothing twice). Sent
    /// as [`mutate`](Self::mutate) sends, then reported as a conflict; quota answers are
    /// waited out for `quota_wait` in all, and the script written anew for each send:
    /// `sql` is given how long ago the first send was made.
    pub(super) async fn script_waiting(
        &self,
        operation: &str,
        sql: impl Fn(Duration) -> String,
        quota_wait: Duration,
    ) -> Result<QueryOutput> {
        self.send_again(operation, sql, &[], quota_wait, true)
            .await
            .map_err(|e| self.err(e))
    }

    /// Sends a statement (or script) whose effect does not depend on what it lost to, and
    /// that may therefore be sent again as a new statement: after a concurrent-update
    /// conflict ([`CONFLICT_RETRIES`], then reported as a conflict), and after a quota
    /// refusal that came back from its *job* — a child statement of a script refused for a
    /// full DML queue fails the script's job after BigQuery created it, and the connection
    /// never sends a statement with a job id again, so it is this caller's decision. Quota
    /// answers are waited out with [`QUOTA_RETRIES`]' pauses until [`QUOTA_WAIT`] has
    /// passed since the first send (the connection's own retries included).
    pub(super) async fn send_again_on_conflict(
        &self,
        operation: &str,
        sql: &str,
        params: &[Param],
    ) -> std::result::Result<QueryOutput, ApiError> {
        self.send_again(operation, |_| sql.to_owned(), params, QUOTA_WAIT, true)
            .await
    }

    /// [`send_again_on_conflict`](Self::send_again_on_conflict), with quota answers waited
    /// out for `quota_wait` in all, and the statement written anew for each send: `sql` is
    /// given how long ago the first send was made. `unknown_too`: also after an error
    /// that left the outcome unknown ([`ApiError::outcome_unknown`]: the statement may
    /// have committed), for statements whose second run finds the first's effect (the
    /// claim, the finish, a MERGE); not for a plain INSERT. The error given up on says
    /// how often the statement was sent, over how long.
    pub(super) async fn send_again(
        &self,
        operation: &str,
        sql: impl Fn(Duration) -> String,
        params: &[Param],
        quota_wait: Duration,
        unknown_too: bool,
    ) -> std::result::Result<QueryOutput, ApiError> {
        let started = Instant::now();
        let (mut conflicts, mut quotas) = (0u32, 0u32);
        // Sends in all: the connection's own re-sends of each call included.
        let mut sends = 0u32;
        loop {
            // The connection waits out quota answers too: only for what is left of
            // `quota_wait`, so that a second call cannot start a wait of its own.
            let statement = sql(started.elapsed());
            let send = self.conn.query_until(
                operation,
                &statement,
                params.to_vec(),
                Some(started + quota_wait),
            );
            let e = match send.await {
                Ok(out) => return Ok(out),
                Err(e) => e,
            };
            sends = sends.saturating_add(e.sends());
            let pause = if e.outcome_unknown && !unknown_too {
                None
            } else if e.is_concurrent_update() {
                conflicts += 1;
                (conflicts < CONFLICT_RETRIES.attempts)
                    .then(|| CONFLICT_RETRIES.pause(conflicts - 1))
            } else if e.is_quota() {
                quotas += 1;
                let pause = QUOTA_RETRIES.pause(quotas - 1);
                (started.elapsed() + pause < quota_wait).then_some(pause)
            } else {
                None
            };
            let Some(pause) = pause else {
                return Err(if e.is_concurrent_update() {
                    e.after_retries(
                        "BigQuery concurrent-update conflict",
                        sends,
                        started.elapsed(),
                    )
                } else if conflicts + quotas > 0 {
                    e.sent(sends, started.elapsed())
                } else {
                    e
                });
            };
            tracing::debug!("{e}; sending it again in {pause:?}");
            tokio::time::sleep(pause).await;
        }
    }

    /// A mutating statement (UPDATE/DELETE) whose effect does not depend on what it lost
    /// to: sent again after a concurrent-update conflict ([`CONFLICT_RETRIES`]), then
    /// reported as a conflict. Returns the rows affected.
    pub(super) async fn mutate(
        &self,
        operation: &str,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<u64> {
        let out = self
            .send_again_on_conflict(operation, sql, &params)
            .await
            .map_err(|e| self.err(e))?;
        out.affected(operation).map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Quota answers and conflicts that outlast their retries are reported as what they
    /// are, refused by a working BigQuery, never as the store being unavailable.
    #[tokio::test]
    async fn quota_and_conflict_errors_are_not_outages() {
        let store = BigQueryStore::connect_lazy("bigquery://p/d?endpoint=http://127.0.0.1:9")
            .await
            .unwrap();
        let quota = ApiError::dml_queue_full("claim.take", "p:d.processing_leases_03", 20)
            .after_retries("BigQuery quota exceeded", 60, Duration::from_secs(190));
        assert!(quota.is_quota() && !quota.is_outage());
        let e = store.err(quota);
        assert!(!e.is_outage(), "{e:?}");
        assert!(matches!(e, Error::StoreRejected { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "store bigquery://p/d?endpoint=http://127.0.0.1:9 rejected the claim.take statement: \
             bigquery claim.take failed: HTTP 400 (resourcesExceeded): BigQuery quota exceeded: \
             Resources exceeded during query execution: Too many DML statements outstanding \
             against table p:d.processing_leases_03, limit is 20. (sent 60 time(s) over 190.0s)"
        );
        let conflict = ApiError::concurrent_update("finish.release", "p:d.processing_leases_03")
            .after_retries(
                "BigQuery concurrent-update conflict",
                16,
                Duration::from_secs(20),
            );
        let e = store.err(conflict);
        assert!(matches!(e, Error::StoreRejected { .. }), "{e:?}");
        assert!(e.to_string().contains("BigQuery concurrent-update conflict: Could not serialize access to table p:d.processing_leases_03 due to concurrent update (sent 16 time(s) over 20.0s)"), "{e}");
        for reason in ["rateLimitExceeded", "quotaExceeded"] {
            let e = ApiError::new(
                "x",
                crate::backend::bigquery::ErrorShape::Http(403),
                Some(reason),
                "Exceeded rate limits",
            );
            assert!(e.is_quota() && !e.is_outage(), "{reason}");
        }
        let down = ApiError::new(
            "x",
            crate::backend::bigquery::ErrorShape::Http(503),
            Some("backendError"),
            "down",
        );
        assert!(!down.is_quota() && down.is_outage());
    }

    /// A store whose every send of `operation` is refused for a full INSERT queue on
    /// `processing_runs` until `drained` has passed (on tokio's clock), then refused for
    /// another reason ("the queue drained"), so no send reaches the network.
    async fn queue_full_until(drained: Duration) -> BigQueryStore {
        queue_full_until_as(drained, false).await
    }

    /// [`queue_full_until`], the refusals marked as leaving the outcome unknown when
    /// `unknown` (as a rate-limited poll of a job that may have committed).
    async fn queue_full_until_as(drained: Duration, unknown: bool) -> BigQueryStore {
        let start = tokio::time::Instant::now();
        BigQueryStore::connect_lazy("bigquery://p/d?endpoint=http://127.0.0.1:9")
            .await
            .unwrap()
            .with_fault_hook(std::sync::Arc::new(move |op: &str| {
                let op = op.to_string();
                Box::pin(async move {
                    Some(if start.elapsed() < drained {
                        let mut e = ApiError::dml_queue_full(op, "p:d.processing_runs", 100);
                        e.outcome_unknown = unknown;
                        e
                    } else {
                        ApiError::new(
                            op,
                            crate::backend::bigquery::ErrorShape::Http(400),
                            Some("invalidQuery"),
                            "the queue drained",
                        )
                    })
                })
            }))
    }

    /// A statement gives up on quota answers once [`QUOTA_WAIT`] has passed, whatever the
    /// pauses' jitter: the connection's own re-sends stop at what is left of it (before,
    /// one call in twenty or so started a second round of re-sends just inside the budget
    /// and waited about twice as long). On tokio's paused clock, many times over.
    #[tokio::test(start_paused = true)]
    async fn quota_answers_are_waited_out_for_quota_wait_at_most() {
        for _ in 0..100 {
            let (e, waited) = release_refused(BURST_WAIT).await;
            assert!(
                // tokio's timers round up to the millisecond: a last send may start at it.
                waited <= QUOTA_WAIT && waited >= QUOTA_WAIT - Duration::from_secs(10),
                "{waited:?}: {e}"
            );
        }
    }

    /// A release statement on a store whose queue is full for `drained`: given up on for
    /// a full queue, and how long that took (tokio's clock).
    async fn release_refused(drained: Duration) -> (Error, Duration) {
        let store = queue_full_until(drained).await;
        let started = tokio::time::Instant::now();
        let e = store
            .mutate("release", "UPDATE t SET x = 1", vec![])
            .await
            .unwrap_err();
        assert!(e.to_string().contains("limit is 100"), "{e}");
        (e, started.elapsed())
    }

    /// A claim and a skip's ledger row (a run without a lease that writes no key) wait
    /// out a full queue for [`BURST_WAIT`], not [`QUOTA_WAIT`]: a fleet's burst keeps its
    /// lease tables' queues and, past a table's 1,500 INSERTs of the day, the
    /// `processing_runs` INSERT queue full for minutes; a skip that gave up after 4
    /// minutes lost its row and failed (20 of 100 `in_progress` skips of the 1,000-run
    /// fleet did). Other statements still give up after [`QUOTA_WAIT`]. On tokio's paused
    /// clock: nothing is sent over the network.
    #[tokio::test(start_paused = true)]
    async fn a_claim_and_a_skip_row_wait_out_a_full_queue_for_ten_minutes() {
        use crate::model::{RunStatus, SkipReason};
        use crate::store::conformance::run_record;
        use crate::store::{Finish, LeaseStore, LedgerStore};
        let drained = Duration::from_secs(400);
        assert!(QUOTA_WAIT < drained && drained < BURST_WAIT);
        // A skip's ledger row alone, through `store`.
        let skip_row = |store: BigQueryStore| async move {
            let mut run = run_record("job", "s", "r", RunStatus::Skipped, chrono::Utc::now());
            run.skip_reason = Some(SkipReason::InProgress);
            let finish = Finish {
                run,
                keys: vec![],
                lease: None,
            };
            store.finish(&finish).await.unwrap_err()
        };
        let started = tokio::time::Instant::now();
        let e = skip_row(queue_full_until(drained).await).await;
        assert!(e.to_string().contains("the queue drained"), "{e}");
        assert!(started.elapsed() >= drained, "{:?}", started.elapsed());

        // A refusal that left the outcome unknown (the INSERT may have committed) is not
        // sent again by the store: a second send would insert nothing and be taken for
        // another run's row.
        let e = skip_row(queue_full_until_as(drained, true).await).await;
        assert!(e.to_string().contains("limit is 100"), "{e}");

        let store = queue_full_until(drained).await;
        let started = tokio::time::Instant::now();
        let e = store
            .claim(&crate::store::ClaimRequest {
                processor: "job",
                scope: "s",
                run_id: "r",
                ttl: Duration::from_secs(3600),
                now: chrono::Utc::now(),
            })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("the queue drained"), "{e}");
        assert!(started.elapsed() >= drained, "{:?}", started.elapsed());

        let (e, waited) = release_refused(drained).await;
        // One count of the sends, all of them: the connection's re-sends of each call too.
        assert_eq!(e.to_string().matches("(sent ").count(), 1, "{e}");
        assert!(e.to_string().contains("time(s) over 2"), "{e}");
        assert!(
            waited >= QUOTA_WAIT - Duration::from_secs(10) && waited < drained,
            "{waited:?}"
        );
    }
}
