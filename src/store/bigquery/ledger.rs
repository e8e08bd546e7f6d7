//! The ledger and keys: one query per guard decision, a finish in the order that keeps
//! the guarantees, the run queries.

use std::time::Duration;

use async_trait::async_trait;
use chrono::DateTime;

use crate::error::{Error, Result};
use crate::model::{micros, time, KeyRecord, RunRecord, RunStatus};
use crate::store::rows::{key_from_record, run_from_record};
use crate::store::{Finish, KeyLookup, LedgerStore, RunFilter};

use crate::backend::bigquery::{
    date, int64, opt_int64, opt_string, string, string_array, struct_array, timestamp,
    timestamp_text,
};

use super::BigQueryStore;

/// How long a finishing run keeps its lease at least while its ledger row and keys are
/// written (a crash right then blocks the scope this long, or until the lease's own expiry).
const FINISH_HOLD: Duration = Duration::from_secs(600);

#[async_trait]
impl LedgerStore for BigQueryStore {
    async fn find_keys(&self, lookups: &[KeyLookup]) -> Result<Vec<Option<KeyRecord>>> {
        let mut out = vec![None; lookups.len()];
        let Some(oldest) = lookups.iter().map(|l| micros(l.since)).min() else {
            return Ok(out);
        };
        let mut keys: Vec<String> = lookups.iter().map(|l| l.key.clone()).collect();
        keys.sort();
        keys.dedup();
        let rows = lookups
            .iter()
            .enumerate()
            .map(|(i, l)| {
                vec![
                    Some(i.to_string()),
                    Some(l.key.clone()),
                    Some(l.kind.as_str().to_string()),
                    Some(timestamp_text(micros(l.since))),
                ]
            })
            .collect();
        let result = self
            .query(
                "find_keys",
                &self.sql.find_keys,
                vec![
                    struct_array(
                        "lookups",
                        &[
                            ("pos", "INT64"),
                            ("key", "STRING"),
                            ("kind", "STRING"),
                            ("since", "TIMESTAMP"),
                        ],
                        rows,
                    ),
                    string_array("keys", &keys),
                    timestamp("oldest_since", oldest),
                ],
            )
            .await?;
        for r in result.records() {
            let pos = r.i64("pos").map_err(|e| self.bad_row("find_keys", e))?;
            let slot = usize::try_from(pos)
                .ok()
                .and_then(|p| out.get_mut(p))
                .ok_or_else(|| self.bad_row("find_keys", format!("position {pos} out of range")))?;
            *slot = Some(key_from_record(&r).map_err(|e| self.bad_row("find_keys", e))?);
        }
        Ok(out)
    }

    async fn finish(&self, finish: &Finish) -> Result<()> {
        let run = &finish.run;
        let writes_keys = run.status == RunStatus::Completed && !finish.keys.is_empty();
        // 1. The fence: nothing is written for a run whose lease was taken over. A run
        //    that writes keys keeps its lease (held a little longer) until they are
        //    written, so a run claiming the scope after it re-checks and sees them; any
        //    other run releases at once. A lease that is held for FINISH_HOLD more anyway
        //    needs no fence: it cannot have been taken over (a claim takes only an expired
        //    lease) and stays held while the keys are written — one mutating statement
        //    less per run, which is what a fleet is short of.
        let hold = chrono::Duration::from_std(FINISH_HOLD).unwrap_or_default();
        let fence = finish
            .lease
            .as_ref()
            .filter(|l| !writes_keys || l.expires_at < run.finished_at + hold);
        if let Some(lease) = fence {
            let statements = self.leases(&lease.processor, &lease.scope);
            let mut params = Self::fenced_params(lease);
            let (operation, sql) = if writes_keys {
                params.push(timestamp(
                    "hold_until",
                    micros(
                        run.finished_at
                            + chrono::Duration::from_std(FINISH_HOLD).unwrap_or_default(),
                    ),
                ));
                ("finish.fence", &statements.hold)
            } else {
                params.push(timestamp("now", micros(run.finished_at)));
                ("finish.release", &statements.release)
            };
            if self.mutate(operation, sql, params).await? == 0 {
                return Err(self.lease_lost(lease).await);
            }
        }
        // 2. The ledger row (once per run id).
        let inserted = self
            .query(
                "finish.run",
                &self.sql.run_insert,
                vec![
                    string("run_id", &run.run_id),
                    string("processor", &run.processor),
                    string("scope", &run.scope),
                    date("scope_date", run.scope_date),
                    string("trigger_source", run.trigger.as_str()),
                    string("mode", run.mode.as_str()),
                    timestamp("started_at", micros(run.started_at)),
                    timestamp("finished_at", micros(run.finished_at)),
                    int64("duration_ms", run.duration_ms),
                    string("status", run.status.as_str()),
                    opt_string("skip_reason", run.skip_reason.as_ref().map(|r| r.as_str())),
                    opt_string(
                        "would_skip_reason",
                        run.would_skip_reason.as_ref().map(|r| r.as_str()),
                    ),
                    opt_string("previous_run_id", run.previous_run_id.as_deref()),
                    opt_int64("records_processed", run.records_processed),
                    opt_string("processing_key", run.processing_key.as_deref()),
                    opt_string("error", run.error.as_deref()),
                    opt_string(
                        "output",
                        run.output.as_ref().map(|v| v.to_string()).as_deref(),
                    ),
                ],
            )
            .await?
            .affected("finish.run")
            .map_err(|e| self.err(e))?;
        if inserted == 0 {
            return Err(Error::DuplicateRunId {
                store: self.url.clone(),
                run_id: run.run_id.clone(),
            });
        }
        // 3. The keys, only for a completed run.
        if writes_keys {
            let rows = finish
                .keys
                .iter()
                .map(|k| {
                    vec![
                        Some(k.key.clone()),
                        Some(k.kind.as_str().to_string()),
                        Some(k.processor.clone()),
                        Some(k.scope.clone()),
                        Some(time::day_text(k.scope_date)),
                        Some(timestamp_text(micros(k.processed_at))),
                        k.entity_count.map(|n| n.to_string()),
                        Some(k.metadata.to_string()),
                        Some(k.run_id.clone()),
                    ]
                })
                .collect();
            self.query(
                "finish.keys",
                &self.sql.keys_insert,
                vec![struct_array(
                    "keys",
                    &[
                        ("processing_key", "STRING"),
                        ("kind", "STRING"),
                        ("processor_name", "STRING"),
                        ("scope", "STRING"),
                        ("scope_date", "DATE"),
                        ("processed_at", "TIMESTAMP"),
                        ("entity_count", "INT64"),
                        ("metadata", "STRING"),
                        ("run_id", "STRING"),
                    ],
                    rows,
                )],
            )
            .await?;
            // 4. Now the keys are visible: release.
            if let Some(lease) = &finish.lease {
                let mut params = Self::fenced_params(lease);
                params.push(timestamp("now", micros(run.finished_at)));
                // The result is recorded whatever happens here, so this cannot fail the
                // finish; a lease not released expires by itself.
                match self
                    .mutate(
                        "finish.release",
                        &self.leases(&lease.processor, &lease.scope).release,
                        params,
                    )
                    .await
                {
                    Ok(0) => tracing::warn!(
                        "run {}: the lease on {}/{} was taken over while its result was being recorded (finishing took longer than {:?})",
                        run.run_id,
                        lease.processor,
                        lease.scope,
                        FINISH_HOLD
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(
                        "run {} is recorded, but its lease could not be released; it expires by {}: {e}",
                        run.run_id,
                        time::utc_text(
                            (run.finished_at + chrono::Duration::from_std(FINISH_HOLD).unwrap_or_default())
                                .max(lease.expires_at)
                        )
                    ),
                }
            }
        }
        Ok(())
    }

    async fn runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>> {
        let since = filter
            .since
            .map(micros)
            .unwrap_or_else(|| DateTime::from_timestamp_micros(0).unwrap_or_default());
        let limit = if filter.limit == 0 {
            i64::MAX
        } else {
            i64::try_from(filter.limit).unwrap_or(i64::MAX)
        };
        let out = self
            .query(
                "runs",
                &self.sql.runs,
                vec![
                    timestamp("since", since),
                    opt_string("processor", filter.processor.as_deref()),
                    opt_string("scope", filter.scope.as_deref()),
                    opt_string("status", filter.status.map(|s| s.as_str())),
                    opt_string("trigger", filter.trigger.map(|t| t.as_str())),
                    opt_string(
                        "except_skip",
                        filter.except_skip_reason.as_ref().map(|r| r.as_str()),
                    ),
                    opt_string("run_id", filter.run_id.as_deref()),
                    int64("limit", limit),
                ],
            )
            .await?;
        out.records()
            .map(|r| run_from_record(&r).map_err(|e| self.bad_row("runs", e)))
            .collect()
    }
}
