//! The ledger and keys: one query per guard decision (with the lease row, when the lease
//! guard comes next), a finish that is one transaction, the run queries.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::{Error, Result};
use crate::model::{micros, KeyRecord, RunRecord, RunStatus};
use crate::store::rows::{key_from_record, lease_from_record, run_from_record};
use crate::store::{Finish, KeyLookup, LeaseHolder, LeaseStore, LedgerStore, RunFilter, SkipOnHit};

use crate::backend::bigquery::{
    date, int64, opt_int64, opt_string, string, string_array, struct_array, timestamp,
    timestamp_text, Param,
};

use super::client::{BURST_WAIT, QUOTA_WAIT};
use super::schema::{lease_shard, LEASE_TABLES};
use super::{scripts, BigQueryStore};

impl BigQueryStore {
    /// The parameters of [`super::FIND_KEYS_SQL`]; `None` without lookups.
    fn find_keys_params(lookups: &[KeyLookup]) -> Option<Vec<Param>> {
        let oldest = lookups.iter().map(|l| micros(l.since)).min()?;
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
        Some(vec![
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
        ])
    }

    /// The ledger row alone (once per run id), one parameterised statement; a full
    /// INSERT queue is waited out for [`BURST_WAIT`]. Sent again only after an answer
    /// that says it did not run: never after a poll that left its job's outcome unknown
    /// (it may have committed), so a send that inserts nothing means another row.
    async fn insert_run(&self, run: &RunRecord) -> Result<()> {
        let inserted = self
            .query_waiting(
                "finish.run",
                &self.sql.run_insert,
                vec![
                    string("run_id", &run.run_id),
                    timestamp("run_id_since", scripts::run_id_since(run)),
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
                BURST_WAIT,
            )
            .await?
            .affected("finish.run")
            .map_err(|e| self.err(e))?;
        if inserted == 0 {
            return Err(Error::DuplicateRunId {
                store: self.url.to_string(),
                run_id: run.run_id.clone(),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl LedgerStore for BigQueryStore {
    async fn find_keys(&self, lookups: &[KeyLookup]) -> Result<Vec<Option<KeyRecord>>> {
        let mut out = vec![None; lookups.len()];
        let Some(params) = Self::find_keys_params(lookups) else {
            return Ok(out);
        };
        let result = self.query("find_keys", &self.sql.find_keys, params).await?;
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

    async fn find_keys_and_holder(
        &self,
        lookups: &[KeyLookup],
        processor: &str,
        scope: &str,
        now: DateTime<Utc>,
    ) -> Result<(Vec<Option<KeyRecord>>, Option<Option<LeaseHolder>>)> {
        let Some(params) = Self::find_keys_params(lookups) else {
            let holder = self.lease_holder(processor, scope, now).await?;
            return Ok((Vec::new(), Some(holder)));
        };
        let mut params = params;
        params.push(string("processor", processor));
        params.push(string("scope", scope));
        let out = self
            .query("find_keys", &self.leases(processor, scope).peek, params)
            .await?;
        let (lease, found) = self.lease_and_keys("find_keys", &out, lookups.len())?;
        Ok((found, Some(lease.and_then(|r| r.held_at(micros(now))))))
    }

    async fn find_keys_recording_skip(
        &self,
        lookups: &[KeyLookup],
        now: DateTime<Utc>,
        peek: bool,
        skip: &SkipOnHit,
    ) -> Result<(Vec<Option<KeyRecord>>, Option<Option<LeaseHolder>>, bool)> {
        let run = &skip.run;
        if skip.position >= lookups.len() {
            return Err(Error::config(format!(
                "a skip recorded on the hit of lookup {} of {}",
                skip.position,
                lookups.len()
            )));
        }
        let sql = scripts::find_recording_skip(
            &self.config.table("processing_runs"),
            &self.config.table("processing_keys"),
            &self
                .config
                .table(LEASE_TABLES[lease_shard(&run.processor, &run.scope)]),
            lookups,
            skip,
        );
        let out = self
            .script_waiting("find_keys.record_skip", |_| sql.clone(), BURST_WAIT)
            .await?;
        let mut lease = None;
        let mut found = vec![None; lookups.len()];
        let mut recorded_previous = None;
        for r in out.records() {
            let bad = |e| self.bad_row("find_keys.record_skip", e);
            match r.str("row_kind").map_err(bad)?.as_str() {
                "lease" => lease = Some(lease_from_record(&r).map_err(bad)?),
                scripts::RECORDED_ROW => {
                    recorded_previous = Some(r.opt_str("run_id").map_err(bad)?);
                }
                _ => {
                    let pos = r.i64("pos").map_err(bad)?;
                    let slot = usize::try_from(pos)
                        .ok()
                        .and_then(|p| found.get_mut(p))
                        .ok_or_else(|| bad(format!("position {pos} out of range")))?;
                    *slot = Some(key_from_record(&r).map_err(bad)?);
                }
            }
        }
        // Recorded when this run's skip row is in the ledger and names the key read (an
        // earlier attempt of the script may have recorded it on another key: then the
        // caller records as usual and meets the run id taken).
        let hit = found[skip.position].as_ref().map(|k| k.run_id.as_str());
        let recorded = hit.is_some() && recorded_previous.flatten().as_deref() == hit;
        let holder = peek.then(|| lease.and_then(|r| r.held_at(micros(now))));
        Ok((found, holder, recorded))
    }

    async fn finish(&self, finish: &Finish) -> Result<()> {
        let run = &finish.run;
        let writes_keys = run.status == RunStatus::Completed && !finish.keys.is_empty();
        if finish.lease.is_none() && !writes_keys {
            // A run without a lease that writes no key (a skip): the ledger row alone, one
            // parameterised statement.
            return self.insert_run(run).await;
        }
        // Everything else is one job, a script that is not a transaction
        // ([`scripts::finish`]): with the lease held (extended first if it expires soon),
        // the ledger row and the keys of a completed run, then the fenced release; nothing
        // when the lease was taken over or the run id is recorded for another run. The keys
        // are visible before the lease is free, so a run that claims the scope next and
        // re-checks sees them.
        let keys: &[KeyRecord] = if writes_keys { &finish.keys } else { &[] };
        let leases = finish
            .lease
            .as_ref()
            .map(|l| {
                self.config
                    .table(LEASE_TABLES[lease_shard(&l.processor, &l.scope)])
            })
            .unwrap_or_default();
        let (runs, keys_table) = (
            self.config.table("processing_runs"),
            self.config.table("processing_keys"),
        );
        // The work is done: a finish refused for a full DML queue is sent again for as
        // long as its lease holds (at least [`QUOTA_WAIT`]); giving up sooner would only
        // leave the scope locked until then and the work to be redone. Each send is
        // written for its own time, `finished_at` plus the time since the first send, so
        // that the lease's margin is checked against when the statements run.
        let until_expiry = finish
            .lease
            .as_ref()
            .and_then(|l| (l.expires_at - Utc::now()).to_std().ok())
            .unwrap_or_default();
        let sql = |since_first: std::time::Duration| {
            let now = chrono::Duration::from_std(since_first)
                .ok()
                .and_then(|d| run.finished_at.checked_add_signed(d))
                .unwrap_or(run.finished_at);
            scripts::finish(
                &runs,
                &keys_table,
                &leases,
                run,
                keys,
                finish.lease.as_ref(),
                now,
            )
        };
        let out = self
            .script_waiting("finish", sql, until_expiry.max(QUOTA_WAIT))
            .await?;
        let outcome = out
            .records()
            .next()
            .map(|r| r.str("outcome"))
            .transpose()
            .map_err(|e| self.bad_row("finish", e))?;
        match outcome.as_deref() {
            Some(scripts::RECORDED) => Ok(()),
            Some(scripts::DUPLICATE) => Err(Error::DuplicateRunId {
                store: self.url.to_string(),
                run_id: run.run_id.clone(),
            }),
            Some(scripts::LOST) => match &finish.lease {
                Some(lease) => Err(self.lease_lost(lease).await),
                None => Err(self.bad_row("finish", "lease lost without a lease".into())),
            },
            other => Err(self.bad_row("finish", format!("unexpected outcome {other:?}"))),
        }
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
