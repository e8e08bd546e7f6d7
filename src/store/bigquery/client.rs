//! Sending one statement: a lost concurrent-update conflict of a statement whose effect
//! does not depend on what it lost to is sent again (quota answers, rate limits and sends
//! without an answer are retried below, by [`Connection::query`] for every caller); a
//! failure is told apart as the store unavailable or the statement refused.
//!
//! [`Connection::query`]: crate::backend::bigquery::Connection::query

use std::time::{Duration, Instant};

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

    /// A multi-statement script (one job, no parameters: its values are literals) that
    /// may be sent again whole after a concurrent-update conflict: the claim (each
    /// statement commits by itself; sent again it is a new claim round) and the finish (a
    /// transaction, rolled back whole when it conflicts). Sent as [`mutate`](Self::mutate)
    /// sends, then reported as a conflict.
    pub(super) async fn script(&self, operation: &str, sql: &str) -> Result<QueryOutput> {
        self.script_waiting(operation, |_| sql.to_owned(), QUOTA_WAIT)
            .await
    }

    /// [`script`](Self::script), with quota answers waited out for `quota_wait` in all
    /// rather than [`QUOTA_WAIT`], and the script written anew for each send: `sql` is
    /// given how long ago the first send was made.
    pub(super) async fn script_waiting(
        &self,
        operation: &str,
        sql: impl Fn(Duration) -> String,
        quota_wait: Duration,
    ) -> Result<QueryOutput> {
        self.send_again(operation, sql, &[], quota_wait)
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
        self.send_again(operation, |_| sql.to_owned(), params, QUOTA_WAIT)
            .await
    }

    /// [`send_again_on_conflict`](Self::send_again_on_conflict), with quota answers waited
    /// out for `quota_wait` in all. The error given up on says how often the statement was
    /// sent, over how long.
    async fn send_again(
        &self,
        operation: &str,
        sql: impl Fn(Duration) -> String,
        params: &[Param],
        quota_wait: Duration,
    ) -> std::result::Result<QueryOutput, ApiError> {
        let started = Instant::now();
        let (mut conflicts, mut quotas) = (0u32, 0u32);
        loop {
            let e = match self.send(operation, &sql(started.elapsed()), params).await {
                Ok(out) => return Ok(out),
                Err(e) => e,
            };
            let pause = if e.is_concurrent_update() {
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
                let sends = conflicts + quotas + 1;
                return Err(if e.is_concurrent_update() {
                    e.after_retries(
                        "BigQuery concurrent-update conflict",
                        sends,
                        started.elapsed(),
                    )
                } else if quotas > 0 {
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
}
