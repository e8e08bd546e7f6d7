//! Leases and the run ledger on Postgres: claims, renewals, the fenced finish, ledger reads.

use super::*;

#[async_trait]
impl LeaseStore for PostgresStore {
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
                    "INSERT INTO processing_leases AS l \
               (processor_name, scope, holder_run_id, token, acquired_at, expires_at, \
                renewed_at, holder_host, holder_pid) \
             VALUES ($1, $2, $3, 1, $4, $5, $4, $6, $7) \
             ON CONFLICT (processor_name, scope) DO UPDATE SET \
               holder_run_id = EXCLUDED.holder_run_id, \
               token = l.token + 1, \
               acquired_at = EXCLUDED.acquired_at, \
               expires_at = EXCLUDED.expires_at, \
               renewed_at = EXCLUDED.renewed_at, \
               holder_host = EXCLUDED.holder_host, \
               holder_pid = EXCLUDED.holder_pid \
             WHERE l.holder_run_id IS NULL OR l.expires_at <= EXCLUDED.acquired_at \
             RETURNING token",
                )
                .bind(request.processor)
                .bind(request.scope)
                .bind(request.run_id)
                .bind(now)
                .bind(expires_at)
                .bind(crate::model::host_name())
                .bind(i64::from(std::process::id()))
                .fetch_optional(&mut self.conn().await?)
                .await
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
        let expires_at = lease_expiry(micros(now), ttl);
        let done = statements::update(statements::RENEW, expires_at, lease)
            .bind(micros(now))
            .execute(&mut self.conn().await?)
            .await
            .map_err(|e| self.err(e))?;
        if done.rows_affected() == 1 {
            return Ok(Lease {
                expires_at,
                ..lease.clone()
            });
        }
        Err(self.lease_lost(lease).await)
    }

    async fn release(&self, lease: &Lease, now: DateTime<Utc>) -> Result<bool> {
        let done = statements::update(statements::RELEASE, micros(now), lease)
            .execute(&mut self.conn().await?)
            .await
            .map_err(|e| self.err(e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn open_leases(&self, processor: Option<&str>) -> Result<Vec<OpenLease>> {
        let rows: Vec<OpenLeaseRow<DateTime<Utc>>> = sqlx::query_as(statements::OPEN_LEASES)
            .bind(processor)
            .fetch_all(&mut self.conn().await?)
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
impl LedgerStore for PostgresStore {
    async fn find_keys(&self, lookups: &[KeyLookup]) -> Result<Vec<Option<KeyRecord>>> {
        let mut out: Vec<Option<KeyRecord>> = vec![None; lookups.len()];
        if lookups.is_empty() {
            return Ok(out);
        }
        let keys: Vec<&str> = lookups.iter().map(|l| l.key.as_str()).collect();
        let kinds: Vec<&str> = lookups.iter().map(|l| l.kind.as_str()).collect();
        let since: Vec<DateTime<Utc>> = lookups.iter().map(|l| l.since).collect();
        // One round trip: the lookups as parallel arrays, the latest row of each by a
        // LATERAL index scan of (processing_key, kind, processed_at).
        let rows = sqlx::query(&format!(
            "SELECT l.ord, k.* \
             FROM UNNEST($1::text[], $2::text[], $3::timestamptz[]) \
                  WITH ORDINALITY AS l(key, kind, since, ord) \
             CROSS JOIN LATERAL ( \
               SELECT {KEY_COLUMNS} FROM processing_keys p \
               WHERE p.processing_key = l.key AND p.kind = l.kind AND p.processed_at >= l.since \
               ORDER BY p.processed_at DESC, p.id DESC LIMIT 1) k"
        ))
        .bind(&keys)
        .bind(&kinds)
        .bind(&since)
        .fetch_all(&mut self.conn().await?)
        .await
        .map_err(|e| self.err(e))?;
        for row in &rows {
            let ord: i64 = row.get("ord");
            if let Some(slot) = usize::try_from(ord - 1).ok().and_then(|i| out.get_mut(i)) {
                *slot = Some(Key::from_row(row).map_err(|e| self.err(e))?.0);
            }
        }
        Ok(out)
    }

    async fn finish(&self, finish: &Finish) -> Result<()> {
        let mut conn = self.conn().await?;
        let mut tx = conn.begin().await.map_err(|e| self.err(e))?;
        if let Some(lease) = &finish.lease {
            let done =
                statements::update(statements::RELEASE, micros(finish.run.finished_at), lease)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| self.err(e))?;
            if done.rows_affected() != 1 {
                tx.rollback().await.map_err(|e| self.err(e))?;
                // The connection goes back before the lease is read on one of its own.
                drop(conn);
                return Err(self.lease_lost(lease).await);
            }
        }
        let run = &finish.run;
        sqlx::query(&format!(
            "INSERT INTO processing_runs ({RUN_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)"
        ))
        .bind(&run.run_id)
        .bind(&run.processor)
        .bind(&run.scope)
        .bind(run.scope_date)
        .bind(run.trigger.as_str())
        .bind(run.mode.as_str())
        .bind(micros(run.started_at))
        .bind(micros(run.finished_at))
        .bind(run.duration_ms)
        .bind(run.status.as_str())
        .bind(run.skip_reason.as_ref().map(|r| r.as_str()))
        .bind(run.would_skip_reason.as_ref().map(|r| r.as_str()))
        .bind(&run.previous_run_id)
        .bind(run.records_processed)
        .bind(&run.processing_key)
        .bind(&run.error)
        .bind(&run.output)
        .execute(&mut *tx)
        .await
        .map_err(|e| statements::run_insert_error(&self.url, &run.run_id, e, |e| self.err(e)))?;
        if run.status == RunStatus::Completed && !finish.keys.is_empty() {
            let k = &finish.keys;
            sqlx::query(&format!(
                "INSERT INTO processing_keys ({KEY_COLUMNS}) \
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], \
                   $5::date[], $6::timestamptz[], $7::int8[], $8::jsonb[], $9::text[], \
                   $10::timestamptz[])"
            ))
            .bind(k.iter().map(|k| k.key.as_str()).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.kind.as_str()).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.processor.as_str()).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.scope.as_str()).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.scope_date).collect::<Vec<_>>())
            .bind(k.iter().map(|k| micros(k.processed_at)).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.entity_count).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.metadata.clone()).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.run_id.as_str()).collect::<Vec<_>>())
            .bind(
                k.iter()
                    .map(|k| k.keep_until.map(micros))
                    .collect::<Vec<_>>(),
            )
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))
    }

    async fn runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>> {
        // Only the filters given become conditions (better plans than `$n IS NULL OR …`);
        // every value is bound.
        let mut conditions: Vec<String> = Vec::new();
        let mut args = PgArguments::default();
        let bind_err = |e: BoxDynError| Error::store(&self.url, e);
        if let Some(p) = &filter.processor {
            args.add(p.as_str()).map_err(bind_err)?;
            conditions.push(format!("processor_name = ${}", args.len()));
        }
        if let Some(s) = &filter.scope {
            args.add(s.as_str()).map_err(bind_err)?;
            conditions.push(format!("scope = ${}", args.len()));
        }
        if let Some(s) = filter.status {
            args.add(s.as_str()).map_err(bind_err)?;
            conditions.push(format!("status = ${}", args.len()));
        }
        if let Some(t) = filter.since {
            args.add(t).map_err(bind_err)?;
            conditions.push(format!("started_at >= ${}", args.len()));
        }
        if let Some(t) = filter.trigger {
            args.add(t.as_str()).map_err(bind_err)?;
            conditions.push(format!("trigger_source = ${}", args.len()));
        }
        if let Some(id) = &filter.run_id {
            args.add(id.as_str()).map_err(bind_err)?;
            conditions.push(format!("run_id = ${}", args.len()));
        }
        if let Some(r) = &filter.except_skip_reason {
            args.add(r.as_str().to_string()).map_err(bind_err)?;
            conditions.push(format!(
                "(skip_reason IS NULL OR skip_reason <> ${})",
                args.len()
            ));
        }
        let mut sql = format!("SELECT {RUN_COLUMNS} FROM processing_runs");
        if !conditions.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&conditions.join(" AND "));
        }
        sql.push_str(" ORDER BY started_at DESC, run_id DESC");
        if filter.limit > 0 {
            args.add(filter.limit as i64).map_err(bind_err)?;
            let _ = write!(sql, " LIMIT ${}", args.len());
        }
        let rows: Vec<Run> = sqlx::query_as_with(&sql, args)
            .fetch_all(&mut self.conn().await?)
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
