//! Leases and the run ledger on SQLite: claims, renewals, the fenced finish, ledger reads.

use super::*;

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim> {
        let now = micros(request.now);
        let expires_at = lease_expiry(now, request.ttl);
        upsert_claim(
            &self.url,
            request,
            now,
            expires_at,
            || async {
                sqlx::query_scalar(
                    "INSERT INTO processing_leases \
               (processor_name, scope, holder_run_id, token, acquired_at, expires_at, \
                renewed_at, holder_host, holder_pid) \
             VALUES (?1, ?2, ?3, 1, ?4, ?5, ?4, ?6, ?7) \
             ON CONFLICT (processor_name, scope) DO UPDATE SET \
               holder_run_id = excluded.holder_run_id, \
               token = processing_leases.token + 1, \
               acquired_at = excluded.acquired_at, \
               expires_at = excluded.expires_at, \
               renewed_at = excluded.renewed_at, \
               holder_host = excluded.holder_host, \
               holder_pid = excluded.holder_pid \
             WHERE processing_leases.holder_run_id IS NULL \
                OR processing_leases.expires_at <= excluded.acquired_at \
             RETURNING token",
                )
                .bind(request.processor)
                .bind(request.scope)
                .bind(request.run_id)
                .bind(ts(now))
                .bind(ts(expires_at))
                .bind(crate::model::host_name())
                .bind(i64::from(std::process::id()))
                // Stepped to the end, not stopped at the returned row: the statement commits
                // when it finishes, and a commit that fails (a full disk) must fail the
                // claim. A row read before that is not a claim anyone else will see.
                .fetch_all(&self.pool)
                .await
                .map(|tokens: Vec<i64>| tokens.into_iter().next())
                .map_err(|e| self.err(e))
            },
            || self.lease_row(request.processor, request.scope),
        )
        .await
    }

    async fn lease_holder(
        &self,
        processor: &str,
        scope: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<LeaseHolder>> {
        let row = self.lease_row(processor, scope).await?;
        Ok(row.and_then(|r| r.held_at(now)))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration, now: DateTime<Utc>) -> Result<Lease> {
        let expires_at = lease_expiry(now, ttl);
        let done = statements::update(statements::RENEW, ts(expires_at), lease)
            .bind(ts(micros(now)))
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        if done.rows_affected() == 1 {
            return Ok(Lease {
                expires_at,
                ..lease.clone()
            });
        }
        Err(self.lease_lost(lease).await?)
    }

    async fn release(&self, lease: &Lease, now: DateTime<Utc>) -> Result<bool> {
        let done = statements::update(statements::RELEASE, ts(micros(now)), lease)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn open_leases(&self, processor: Option<&str>) -> Result<Vec<OpenLease>> {
        let rows: Vec<OpenLeaseRow<i64>> = sqlx::query_as(statements::OPEN_LEASES)
            .bind(processor)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }

    async fn claim_and_find(
        &self,
        request: &crate::store::ClaimRequest<'_>,
        _lookups: &[crate::store::KeyLookup],
    ) -> crate::error::Result<(
        crate::store::Claim,
        Option<Vec<Option<crate::model::KeyRecord>>>,
    )> {
        crate::store::fallback::claim_alone(self, request).await
    }
}

#[async_trait]
impl LedgerStore for SqliteStore {
    async fn find_keys(&self, lookups: &[KeyLookup]) -> Result<Vec<Option<KeyRecord>>> {
        let mut out = Vec::with_capacity(lookups.len());
        for l in lookups {
            let row: Option<Key> = sqlx::query_as(&format!(
                "SELECT {KEY_COLUMNS} FROM processing_keys \
                 WHERE processing_key = ?1 AND kind = ?2 AND processed_at >= ?3 \
                 ORDER BY processed_at DESC, id DESC LIMIT 1"
            ))
            .bind(&l.key)
            .bind(l.kind.as_str())
            .bind(ts(l.since))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
            out.push(row.map(|r| r.0));
        }
        Ok(out)
    }

    async fn finish(&self, finish: &Finish) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(|e| self.err(e))?;
        if let Some(lease) = &finish.lease {
            let done = statements::update(
                statements::RELEASE,
                ts(micros(finish.run.finished_at)),
                lease,
            )
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
            if done.rows_affected() != 1 {
                tx.rollback().await.map_err(|e| self.err(e))?;
                return Err(self.lease_lost(lease).await?);
            }
        }
        let run = &finish.run;
        sqlx::query(&format!(
            "INSERT INTO processing_runs ({RUN_COLUMNS}) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
        ))
        .bind(&run.run_id)
        .bind(&run.processor)
        .bind(&run.scope)
        .bind(time::day_text(run.scope_date))
        .bind(run.trigger.as_str())
        .bind(run.mode.as_str())
        .bind(ts(run.started_at))
        .bind(ts(run.finished_at))
        .bind(run.duration_ms)
        .bind(run.status.as_str())
        .bind(run.skip_reason.as_ref().map(|r| r.as_str().to_string()))
        .bind(
            run.would_skip_reason
                .as_ref()
                .map(|r| r.as_str().to_string()),
        )
        .bind(&run.previous_run_id)
        .bind(run.records_processed)
        .bind(&run.processing_key)
        .bind(&run.error)
        .bind(run.output.as_ref().map(|v| v.to_string()))
        .execute(&mut *tx)
        .await
        .map_err(|e| statements::run_insert_error(&self.url, &run.run_id, e, |e| self.err(e)))?;
        if run.status == RunStatus::Completed {
            for k in &finish.keys {
                sqlx::query(&format!(
                    "INSERT INTO processing_keys ({KEY_COLUMNS}) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
                ))
                .bind(&k.key)
                .bind(k.kind.as_str())
                .bind(&k.processor)
                .bind(&k.scope)
                .bind(time::day_text(k.scope_date))
                .bind(ts(k.processed_at))
                .bind(k.entity_count)
                .bind(k.metadata.to_string())
                .bind(&k.run_id)
                .bind(k.keep_until.map(ts))
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
            }
        }
        tx.commit().await.map_err(|e| self.err(e))
    }

    async fn runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>> {
        // Optional filters as `(?n IS NULL OR col = ?n)`: one fixed statement, every value
        // bound. A run id given is a plain `run_id = ?8`, so the primary key finds the row
        // (the optional form scans the job's runs: a Python skip reads its earlier run).
        let by_id = if filter.run_id.is_some() {
            "run_id = ?8"
        } else {
            "?8 IS NULL"
        };
        let select = format!(
            "SELECT {RUN_COLUMNS} FROM processing_runs \
             WHERE (?1 IS NULL OR processor_name = ?1) AND (?2 IS NULL OR scope = ?2) \
               AND (?3 IS NULL OR status = ?3) AND (?4 IS NULL OR started_at >= ?4) \
               AND (?6 IS NULL OR trigger_source = ?6) \
               AND (?7 IS NULL OR skip_reason IS NULL OR skip_reason <> ?7) \
               AND {by_id} \
             ORDER BY started_at DESC, run_id DESC LIMIT ?5"
        );
        macro_rules! bind_filter {
            ($query:expr) => {
                $query
                    .bind(&filter.processor)
                    .bind(&filter.scope)
                    .bind(filter.status.map(|s| s.as_str()))
                    .bind(filter.since.map(ts))
                    .bind(if filter.limit == 0 {
                        -1
                    } else {
                        filter.limit as i64
                    })
                    .bind(filter.trigger.map(|t| t.as_str()))
                    .bind(
                        filter
                            .except_skip_reason
                            .as_ref()
                            .map(|r| r.as_str().to_string()),
                    )
                    .bind(&filter.run_id)
            };
        }
        if filter.limit == 0 || filter.limit > BULK_RUNS {
            // Many rows (`idem status`, `runs --limit 0`): sqlx hands each row from its
            // SQLite worker thread to the runtime, some 15 µs a row; one JSON array of
            // them all is one hand-over, built in SQLite's C and parsed by serde_json.
            let sql = format!("SELECT json_group_array(json_array({RUN_COLUMNS})) FROM ({select})");
            let text: String = bind_filter!(sqlx::query_scalar(&sql))
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.err(e))?;
            let rows: Vec<Vec<serde_json::Value>> = serde_json::from_str(&text)
                .map_err(|e| Error::store(&self.url, format!("reading the ledger: {e}")))?;
            let mut runs = rows
                .into_iter()
                .map(run_from_json)
                .collect::<std::result::Result<Vec<_>, String>>()
                .map_err(|e| Error::store(&self.url, format!("reading the ledger: {e}")))?;
            // The aggregate keeps no order of its own: the statement's, again.
            runs.sort_by(|a, b| (b.started_at, &b.run_id).cmp(&(a.started_at, &a.run_id)));
            return Ok(runs);
        }
        let rows: Vec<Run> = bind_filter!(sqlx::query_as(&select))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }

    async fn find_keys_and_holder(
        &self,
        lookups: &[crate::store::KeyLookup],
        _processor: &str,
        _scope: &str,
        _now: chrono::DateTime<chrono::Utc>,
    ) -> crate::error::Result<(
        Vec<Option<crate::model::KeyRecord>>,
        Option<Option<crate::store::LeaseHolder>>,
    )> {
        crate::store::fallback::keys_alone(self, lookups).await
    }

    async fn find_keys_recording_skip(
        &self,
        lookups: &[crate::store::KeyLookup],
        now: chrono::DateTime<chrono::Utc>,
        peek: bool,
        skip: &crate::store::SkipOnHit,
    ) -> crate::error::Result<(
        Vec<Option<crate::model::KeyRecord>>,
        Option<Option<crate::store::LeaseHolder>>,
        bool,
    )> {
        crate::store::fallback::read_without_recording(self, lookups, now, peek, skip).await
    }
}

/// Above this many rows asked for, [`SqliteStore`] reads the ledger as one JSON array.
const BULK_RUNS: usize = 500;

/// A ledger row from `json_array(RUN_COLUMNS)`, as [`Run`] decodes a row.
fn run_from_json(row: Vec<serde_json::Value>) -> std::result::Result<RunRecord, String> {
    use serde_json::Value;
    let cols: [Value; 17] = row
        .try_into()
        .map_err(|r: Vec<Value>| format!("a row of {} columns, not 17", r.len()))?;
    let text = |i: usize| -> std::result::Result<String, String> {
        cols[i]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("column {i} is not text: {}", cols[i]))
    };
    let opt_text = |i: usize| cols[i].as_str().map(str::to_string);
    let int = |i: usize| -> std::result::Result<i64, String> {
        cols[i]
            .as_i64()
            .ok_or_else(|| format!("column {i} is not an integer: {}", cols[i]))
    };
    let instant = |i: usize| int(i).map(|m| DateTime::from_timestamp_micros(m).unwrap_or_default());
    let parse = |e: crate::Error| e.to_string();
    Ok(RunRecord {
        run_id: text(0)?,
        processor: text(1)?,
        scope: text(2)?,
        scope_date: crate::model::time::parse_day(&text(3)?).unwrap_or_default(),
        trigger: text(4)?.parse().map_err(parse)?,
        mode: text(5)?.parse().map_err(parse)?,
        started_at: instant(6)?,
        finished_at: instant(7)?,
        duration_ms: int(8)?,
        status: text(9)?.parse().map_err(parse)?,
        skip_reason: opt_text(10).map(|s| crate::model::SkipReason::parse(&s)),
        would_skip_reason: opt_text(11).map(|s| crate::model::SkipReason::parse(&s)),
        previous_run_id: opt_text(12),
        records_processed: cols[13].as_i64(),
        processing_key: opt_text(14),
        error: opt_text(15),
        output: opt_text(16).and_then(|t| serde_json::from_str(&t).ok()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Mode, RunStatus, SkipReason, Trigger};

    /// Reading many rows as one JSON array gives the same records, in the same order, as
    /// reading them row by row: every column, nulls, a custom skip reason, JSON output,
    /// text that needs escaping, and runs started at the same instant.
    #[tokio::test]
    async fn the_bulk_read_equals_the_row_by_row_read() {
        let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
        let at = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 123_456_000).unwrap();
        for i in 0..40i64 {
            let status =
                [RunStatus::Completed, RunStatus::Failed, RunStatus::Skipped][i as usize % 3];
            let run = RunRecord {
                run_id: format!("run-{i:02}"),
                processor: format!("job \"{}\"\n", i % 4),
                scope: format!("2026-11-{:02}", 1 + i % 20),
                scope_date: chrono::NaiveDate::from_ymd_opt(2026, 11, 1 + (i % 20) as u32).unwrap(),
                trigger: [Trigger::Scheduler, Trigger::Manual][i as usize % 2],
                mode: [Mode::Enforce, Mode::Shadow][i as usize % 2],
                started_at: at(i / 2),
                finished_at: at(i / 2 + 1),
                duration_ms: i * 7,
                status,
                skip_reason: (status == RunStatus::Skipped).then(|| {
                    if i % 2 == 0 {
                        SkipReason::TimeWindow
                    } else {
                        SkipReason::Custom("purged".into())
                    }
                }),
                would_skip_reason: (i % 5 == 0).then_some(SkipReason::DuplicateContentHash),
                previous_run_id: (i % 3 == 0).then(|| format!("run-{:02}", i / 2)),
                records_processed: (i % 4 != 0).then_some(i * 1000),
                processing_key: (i % 6 == 0).then(|| "ab".repeat(32)),
                error: (status == RunStatus::Failed).then(|| format!("boom \\ {i} ✗")),
                output: (i % 2 == 1).then(|| serde_json::json!({"n": i, "s": "x\"y"})),
            };
            store
                .finish(&crate::store::Finish {
                    run,
                    keys: Vec::new(),
                    lease: None,
                })
                .await
                .unwrap();
        }
        for filter in [
            RunFilter::default(),
            RunFilter {
                processor: Some("job \"1\"\n".into()),
                ..RunFilter::default()
            },
            RunFilter {
                status: Some(RunStatus::Skipped),
                since: Some(at(5)),
                ..RunFilter::default()
            },
        ] {
            let bulk = store
                .runs(&RunFilter {
                    limit: 0,
                    ..filter.clone()
                })
                .await
                .unwrap();
            let rows = store
                .runs(&RunFilter {
                    limit: 100,
                    ..filter
                })
                .await
                .unwrap();
            assert!(!rows.is_empty());
            assert_eq!(bulk, rows);
        }
    }
}
