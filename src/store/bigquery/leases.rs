//! Leases without a lock: sharded over 16 tables, claimed by compare-and-set on the
//! fencing token.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::{Error, Result};
use crate::model::micros;
use crate::store::retry::Backoff;
use crate::store::rows::{lease_from_record, LeaseRow};
use crate::store::{lease_expiry, Claim, ClaimRequest, Lease, LeaseHolder, LeaseStore};

use crate::backend::bigquery::{int64, string, timestamp, Param};

use super::client::CONFLICT_RETRIES;
use super::statements::LeaseStatements;
use super::BigQueryStore;

/// The lease tables (migration 0004): a lease lives in `processing_leases_NN`, NN =
/// [`lease_shard`] of its processor and scope. BigQuery's DML limits are per table (2
/// mutating statements running, 20 queued) and concurrent mutating statements conflict
/// per table, so 16 tables take 16 times the claims, renewals and releases at once.
/// `processing_leases` (schema 1) is no longer written; cleanup still empties it.
pub const LEASE_TABLES: [&str; 16] = [
    "processing_leases_00",
    "processing_leases_01",
    "processing_leases_02",
    "processing_leases_03",
    "processing_leases_04",
    "processing_leases_05",
    "processing_leases_06",
    "processing_leases_07",
    "processing_leases_08",
    "processing_leases_09",
    "processing_leases_10",
    "processing_leases_11",
    "processing_leases_12",
    "processing_leases_13",
    "processing_leases_14",
    "processing_leases_15",
];

/// The lease table of (processor, scope): an index into [`LEASE_TABLES`], from the first
/// four bytes of SHA-256(processor NUL scope), so it is the same for every idem process
/// and version.
pub fn lease_shard(processor: &str, scope: &str) -> usize {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(processor.as_bytes());
    hash.update([0u8]);
    hash.update(scope.as_bytes());
    let digest = hash.finalize();
    let n = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    n as usize % LEASE_TABLES.len()
}

/// Claim rounds (read, then compare-and-set) before giving up; a round that lost a
/// concurrent-update conflict pauses as [`CONFLICT_RETRIES`] does before the next (one
/// whose compare-and-set merely found the row changed reads it again at once). The
/// conflicts of a fleet are mostly with other scopes' statements on the same lease table,
/// which do not hold this lease, so a claim keeps trying for about as long as
/// [`CONFLICT_RETRIES`] before it settles for `in_progress` ("unknown holder").
const CLAIM_ATTEMPTS: u32 = CONFLICT_RETRIES.attempts;

const CLAIM_ROUNDS: Backoff = Backoff {
    attempts: CLAIM_ATTEMPTS,
    ..CONFLICT_RETRIES
};

impl BigQueryStore {
    /// The lease statements of (processor, scope)'s lease table.
    pub(super) fn leases(&self, processor: &str, scope: &str) -> &LeaseStatements {
        &self.sql.leases[lease_shard(processor, scope)]
    }

    pub(super) async fn lease_row(
        &self,
        operation: &str,
        processor: &str,
        scope: &str,
    ) -> Result<Option<LeaseRow>> {
        let out = self
            .query(
                operation,
                &self.leases(processor, scope).read,
                vec![string("processor", processor), string("scope", scope)],
            )
            .await?;
        let row = out.records().next();
        row.map(|r| lease_from_record(&r))
            .transpose()
            .map_err(|e| self.bad_row(operation, e))
    }

    pub(super) async fn lease_lost(&self, lease: &Lease) -> Error {
        let holder = match self
            .lease_row("lease_holder", &lease.processor, &lease.scope)
            .await
        {
            Ok(row) => row.and_then(|r| r.holder),
            Err(e) => {
                tracing::warn!("could not read the lease holder: {e}");
                None
            }
        };
        lease.lost(holder)
    }

    pub(super) fn fenced_params(lease: &Lease) -> Vec<Param> {
        vec![
            string("processor", &lease.processor),
            string("scope", &lease.scope),
            int64("token", lease.token),
            string("run_id", &lease.run_id),
        ]
    }
}

#[async_trait]
impl LeaseStore for BigQueryStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim> {
        let now = micros(request.now);
        let expires_at = lease_expiry(now, request.ttl);
        let mut conflicts = 0;
        for attempt in 0..CLAIM_ATTEMPTS {
            let row = self
                .lease_row("claim.read", request.processor, request.scope)
                .await?;
            let seen = match &row {
                Some(r) => {
                    if let Some(holder) = r.held_at(now) {
                        return Ok(Claim::Held(holder));
                    }
                    r.token
                }
                None => {
                    self.query(
                        "claim.create",
                        &self.leases(request.processor, request.scope).create,
                        vec![
                            string("processor", request.processor),
                            string("scope", request.scope),
                            timestamp("now", now),
                        ],
                    )
                    .await?;
                    0
                }
            };
            let taken = self
                .send(
                    "claim.take",
                    &self.leases(request.processor, request.scope).take,
                    &[
                        string("processor", request.processor),
                        string("scope", request.scope),
                        string("run_id", request.run_id),
                        int64("token", seen),
                        timestamp("now", now),
                        timestamp("expires_at", expires_at),
                    ],
                )
                .await;
            match taken {
                Ok(out) => {
                    if out.affected("claim.take").map_err(|e| self.err(e))? >= 1 {
                        return Ok(request.acquired(seen + 1, now, expires_at));
                    }
                    // Another claim changed the row since it was read: read it again.
                }
                Err(e) if e.is_concurrent_update() => {
                    // Another statement on the lease table committed first; this claim
                    // did not. Read again: usually that was a competing claim (held).
                    tracing::info!("{e}: the claim lost a concurrent update");
                    conflicts += 1;
                    if attempt + 1 < CLAIM_ATTEMPTS {
                        tokio::time::sleep(CLAIM_ROUNDS.pause(attempt)).await;
                    }
                }
                Err(e) => return Err(self.err(e)),
            }
        }
        let row = self
            .lease_row("claim.read", request.processor, request.scope)
            .await?;
        if let Some(holder) = row.as_ref().and_then(|r| r.held_at(now)) {
            return Ok(Claim::Held(holder));
        }
        if conflicts > 0 {
            // Lost every round to concurrent updates of the lease table without anyone
            // holding this lease now: still "someone else was writing", not a failure.
            return Ok(Claim::Held(LeaseHolder {
                run_id: format!(
                    "unknown (the claim lost {conflicts} concurrent update conflict(s) on {})",
                    LEASE_TABLES[lease_shard(request.processor, request.scope)]
                ),
                token: row.map_or(0, |r| r.token),
                acquired_at: now,
                expires_at: now,
            }));
        }
        Err(Error::store(
            &self.url,
            format!("lease claim did not settle after {CLAIM_ATTEMPTS} attempts"),
        ))
    }

    async fn lease_holder(
        &self,
        processor: &str,
        scope: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<LeaseHolder>> {
        Ok(self
            .lease_row("lease_holder", processor, scope)
            .await?
            .and_then(|r| r.held_at(now)))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration, now: DateTime<Utc>) -> Result<Lease> {
        let expires_at = lease_expiry(micros(now), ttl);
        let mut params = Self::fenced_params(lease);
        params.push(timestamp("expires_at", expires_at));
        let sql = &self.leases(&lease.processor, &lease.scope).renew;
        if self.mutate("renew", sql, params).await? >= 1 {
            return Ok(Lease {
                expires_at,
                ..lease.clone()
            });
        }
        Err(self.lease_lost(lease).await)
    }

    async fn release(&self, lease: &Lease, now: DateTime<Utc>) -> Result<bool> {
        let mut params = Self::fenced_params(lease);
        params.push(timestamp("now", micros(now)));
        Ok(self
            .mutate(
                "release",
                &self.leases(&lease.processor, &lease.scope).release,
                params,
            )
            .await?
            >= 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_shards_spread_and_are_stable() {
        let mut counts = [0usize; 16];
        for i in 0..1600 {
            counts[lease_shard(
                &format!("job{}", i % 50),
                &format!("2025-01-{:02}", i / 50 + 1),
            )] += 1;
        }
        assert!(counts.iter().all(|&n| n > 50), "{counts:?}");
        // Stable across processes and versions: a changed hash would split a lease.
        assert_eq!(
            lease_shard("player_game_summary", "2025-11-18"),
            lease_shard("player_game_summary", "2025-11-18")
        );
        assert_ne!(lease_shard("a", "bc"), lease_shard("ab", "c"));
    }
}
