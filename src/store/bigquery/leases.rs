//! Leases without a lock: sharded over 16 tables, claimed by compare-and-set on the
//! fencing token.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::{Error, Result};
use crate::model::micros;
use crate::model::KeyRecord;
use crate::store::rows::{
    key_from_record, lease_from_record, open_lease_from_record, LeaseRow, OPEN_LEASE_COLUMNS,
};
use crate::store::{
    lease_expiry, Claim, ClaimRequest, KeyLookup, Lease, LeaseHolder, LeaseStore, OpenLease,
};

use crate::backend::bigquery::{int64, string, timestamp, Param, QueryOutput};

use super::client::BURST_WAIT;
use super::schema::{lease_shard, LEASE_TABLES};
use super::scripts;
use super::statements::LeaseStatements;
use super::BigQueryStore;

/// Claim scripts sent when one found the lease free yet not taken by it (released
/// between its statements). A script that lost a concurrent-update conflict is sent again
/// as [`CONFLICT_RETRIES`] says (the conflicts of a fleet are mostly with other scopes'
/// statements on the same lease table, which do not hold this lease) before the claim
/// settles for `in_progress` ("unknown holder").
const CLAIM_ATTEMPTS: u32 = 4;

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

impl BigQueryStore {
    /// The rows of a claim or merged read ([`scripts::claim`], [`scripts::peek_sql`]): the
    /// lease row, if any, and the latest key per lookup position.
    pub(super) fn lease_and_keys(
        &self,
        operation: &str,
        out: &QueryOutput,
        lookups: usize,
    ) -> Result<(Option<LeaseRow>, Vec<Option<KeyRecord>>)> {
        let mut lease = None;
        let mut found = vec![None; lookups];
        for r in out.records() {
            let kind = r.str("row_kind").map_err(|e| self.bad_row(operation, e))?;
            if kind == "lease" {
                lease = Some(lease_from_record(&r).map_err(|e| self.bad_row(operation, e))?);
                continue;
            }
            let pos = r.i64("pos").map_err(|e| self.bad_row(operation, e))?;
            let slot = usize::try_from(pos)
                .ok()
                .and_then(|p| found.get_mut(p))
                .ok_or_else(|| self.bad_row(operation, format!("position {pos} out of range")))?;
            *slot = Some(key_from_record(&r).map_err(|e| self.bad_row(operation, e))?);
        }
        Ok((lease, found))
    }

    /// The claim as one script ([`scripts::claim`]): create the row if missing, take the
    /// lease if free or expired, and answer the lease row and the keys of `lookups` read
    /// after it. A script that lost a concurrent-update conflict is sent again (a new
    /// claim round; BigQuery already re-ran the UPDATE against the new data three times);
    /// one that lost every round reads the lease: held, or `in_progress` with an unknown
    /// holder, never a run failure.
    async fn claim_script(
        &self,
        request: &ClaimRequest<'_>,
        lookups: &[KeyLookup],
    ) -> Result<(Claim, Option<Vec<Option<KeyRecord>>>)> {
        let table = LEASE_TABLES[lease_shard(request.processor, request.scope)];
        let (leases, keys) = (
            self.config.table(table),
            self.config.table("processing_keys"),
        );
        // A claim refused for a full queue waits up to [`BURST_WAIT`] (a round; a claim
        // that must claim again waits anew). Each send by this store is written for the
        // time it is sent (`request.now` plus the time since the first), so a lease that
        // expired meanwhile is seen expired and the lease taken runs from about then; the
        // connection's own re-sends of a refused call keep the text, so a lease won may
        // already be past its expiry, and is then claimed again below.
        let started = tokio::time::Instant::now();
        // The time it is now, on the clock of `request.now`.
        let now_since_request = || {
            chrono::Duration::from_std(started.elapsed())
                .ok()
                .and_then(|d| request.now.checked_add_signed(d))
                .unwrap_or(request.now)
        };
        let sent_at = AtomicI64::new(micros(request.now).timestamp_micros());
        let first = std::sync::atomic::AtomicBool::new(true);
        let render = |_: std::time::Duration| {
            // The first send is the claim at `request.now`; a later one, later.
            let later = !first.swap(false, Ordering::SeqCst);
            let now = micros(if later {
                now_since_request()
            } else {
                request.now
            });
            sent_at.store(now.timestamp_micros(), Ordering::SeqCst);
            scripts::claim(
                &leases,
                &keys,
                request.processor,
                request.scope,
                request.run_id,
                now,
                lease_expiry(now, request.ttl),
                lookups,
            )
        };
        for _ in 0..CLAIM_ATTEMPTS {
            let sent = self
                .send_again("claim.take", &render, &[], BURST_WAIT, true)
                .await;
            let now = DateTime::from_timestamp_micros(sent_at.load(Ordering::SeqCst))
                .unwrap_or(request.now);
            let out = match sent {
                Ok(out) => out,
                Err(e) if e.is_concurrent_update() => {
                    // Lost every round to concurrent updates of the lease table: read it.
                    tracing::info!("{e}: the claim lost concurrent updates");
                    let row = self
                        .lease_row("claim.read", request.processor, request.scope)
                        .await?;
                    if let Some(holder) = row.as_ref().and_then(|r| r.held_at(now)) {
                        return Ok((Claim::Held(holder), None));
                    }
                    return Ok((
                        Claim::Held(LeaseHolder {
                            run_id: format!(
                                "unknown (the claim lost to concurrent updates on {table}: {e})"
                            ),
                            token: row.map_or(0, |r| r.token),
                            acquired_at: now,
                            expires_at: now,
                        }),
                        None,
                    ));
                }
                Err(e) => return Err(self.err(e)),
            };
            let (lease, found) = self.lease_and_keys("claim", &out, lookups.len())?;
            let Some(row) = lease else {
                return Err(self.bad_row("claim", "no lease row after the claim".into()));
            };
            // Won when the row with the highest token names this run: run ids are unique
            // per run, and only the claim's own UPDATE writes this one (a timestamp read
            // back is no test: a poll answers TIMESTAMP cells as float seconds).
            if row.holder.as_deref() == Some(request.run_id) {
                // The lease as the row holds it: a send that committed yet answered a
                // quota error is sent again and finds the row this run took then, so
                // `acquired_at` is the row's (its expiry less the ttl), not this send's.
                let acquired = if row.expires_at == lease_expiry(now, request.ttl) {
                    now
                } else {
                    chrono::Duration::from_std(request.ttl)
                        .ok()
                        .and_then(|ttl| row.expires_at.checked_sub_signed(ttl))
                        .map_or(now, micros)
                };
                // A claim that waited in a queue may take a lease already past its expiry
                // (the connection re-sends a refused call with the same text): another
                // run could take it at once. Claim again, for the time it is now.
                if row.expires_at > now_since_request() {
                    return Ok((
                        request.acquired(row.token, acquired, row.expires_at),
                        Some(found),
                    ));
                }
                continue;
            }
            if let Some(holder) = row.held_at(now) {
                return Ok((Claim::Held(holder), None));
            }
            // Free, yet not taken by this claim: another run released it between the
            // statements. Claim again.
        }
        Err(Error::store(
            &self.url,
            format!("lease claim did not settle after {CLAIM_ATTEMPTS} attempts"),
        ))
    }
}

#[async_trait]
impl LeaseStore for BigQueryStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim> {
        Ok(self.claim_script(request, &[]).await?.0)
    }

    async fn claim_and_find(
        &self,
        request: &ClaimRequest<'_>,
        lookups: &[KeyLookup],
    ) -> Result<(Claim, Option<Vec<Option<KeyRecord>>>)> {
        self.claim_script(request, lookups).await
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
        params.push(timestamp("now", micros(now)));
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

    /// One query over the lease tables (the sixteen shards; the schema-1 table is no
    /// longer written).
    async fn open_leases(&self, processor: Option<&str>) -> Result<Vec<OpenLease>> {
        let sql = LEASE_TABLES
            .iter()
            .map(|t| {
                format!(
                    "SELECT {OPEN_LEASE_COLUMNS} FROM {} WHERE holder_run_id IS NOT NULL \
                     AND (@processor IS NULL OR processor_name = @processor)",
                    self.config.table(t)
                )
            })
            .collect::<Vec<_>>()
            .join("\nUNION ALL\n");
        let sql = format!("{sql}\nORDER BY acquired_at DESC, processor_name, scope");
        let out = self
            .query(
                "open_leases",
                &sql,
                vec![crate::backend::bigquery::opt_string("processor", processor)],
            )
            .await?;
        out.records()
            .map(|r| open_lease_from_record(&r))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| self.bad_row("open_leases", e))
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
