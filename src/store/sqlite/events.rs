//! Event keys on SQLite: checks and marks by the batch (one writer at a time, an
//! all-or-nothing insert when the keys are fresh), cursors.

use super::event_sql::*;
use super::*;

impl SqliteStore {
    pub(super) async fn advance_in(
        &self,
        conn: &mut SqliteConnection,
        namespace: &str,
        name: &str,
        to: &Cursor,
    ) -> Result<()> {
        sqlx::query(CURSOR_ADVANCE_SQL)
            .bind(namespace)
            .bind(name)
            .bind(&to.position)
            .bind(to.value_text())
            .bind(ts(Utc::now()))
            .execute(conn)
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The stored, unexpired rows `queries` ([`read_queries`]) read on `conn`, added to
    /// `found`; returns their keys.
    pub(super) async fn read_stored<'q>(
        &self,
        conn: &mut SqliteConnection,
        queries: Vec<ReadQuery<'q>>,
        found: &mut Found,
    ) -> Result<HashSet<String>> {
        let mut present = HashSet::new();
        for query in queries {
            let stored: String = query.fetch_one(&mut *conn).await.map_err(|e| self.err(e))?;
            let rows: Vec<(String, Option<String>, Option<String>, i64)> =
                serde_json::from_str(&stored).map_err(|e| {
                    Error::store(self.location(), format!("reading event keys back: {e}"))
                })?;
            for (key, fingerprint, decision, first_seen) in rows {
                let first_seen = DateTime::from_timestamp_micros(first_seen).unwrap_or_default();
                present.insert(key.clone());
                found.stored(key, fingerprint, decision, first_seen);
            }
        }
        Ok(present)
    }

    /// The stored, unexpired rows of `firsts` (a batch's first occurrences), read on a
    /// pooled connection outside the write lock and added to `found`; returns their keys.
    async fn read_firsts(
        &self,
        namespace: &str,
        firsts: &[&EventMark],
        now: DateTime<Utc>,
        found: &mut Found,
    ) -> Result<HashSet<String>> {
        let sqls = read_sqls(firsts.len());
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let reads = read_queries(&sqls, firsts, namespace, now);
        self.read_stored(&mut conn, reads, found).await
    }

    /// `check_and_mark`, and the cursor's advance in the same transaction; with `pending`
    /// (a marker and its deadline) the keys it marks are pending for that batch, whose
    /// row (migration 0010) goes in the same transaction, so its keys are never seen
    /// without it.
    ///
    /// Without a cursor, a batch after one that found none of its keys stored is tried as
    /// one all-or-nothing insert of every key. Any other batch, or one that insert refused,
    /// reads its keys first, outside the write lock (a batch of replays writes nothing),
    /// then marks the absent ones in one write transaction that reads them again. Writers
    /// of this store take turns ([`EventWriter`]) and hold no connection while they wait
    /// for their turn, so turns and the pool never wait on each other.
    pub(super) async fn mark_batch(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        cursor: Option<(&str, &Cursor)>,
        pending: Option<(&str, DateTime<Utc>)>,
    ) -> Result<Vec<EventVerdict>> {
        if marks.is_empty() {
            if let Some((name, to)) = cursor {
                let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
                self.advance_in(&mut conn, namespace, name, to).await?;
            }
            return Ok(Vec::new());
        }
        let firsts = event_keys::firsts(marks);
        if cursor.is_none() && self.events.fresh.load(Ordering::Relaxed) {
            // Bound before this batch's turn, so it binds while the batch before it writes.
            let tried = match pending {
                // One statement is atomic alone: no BEGIN, no COMMIT.
                None => {
                    let sqls = mark_sqls(firsts.len(), true, false);
                    let queries = mark_queries(&sqls, &firsts, namespace, now, None);
                    let turn = self.events.turn.lock().await;
                    let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
                    let mut tried = Ok(());
                    for query in queries {
                        if let Err(e) = query.execute(&mut *conn).await {
                            tried = Err(e);
                            break;
                        }
                    }
                    drop(conn);
                    drop(turn);
                    tried
                }
                // Earlier batches' confirmations ride in this batch's transaction, which
                // goes to SQLite in one trip (`pending_write_sql`).
                Some((marker, deadline)) => {
                    let turn = self.events.turn.lock().await;
                    let riders = Riders::take(&self.events);
                    let sql = pending_write_sql(firsts.len(), !riders.is_empty());
                    let mut query = sqlx::query(&sql);
                    if !riders.is_empty() {
                        query = query.bind(riders.json());
                    }
                    query = query
                        .bind(namespace)
                        .bind(marker)
                        .bind(ts(now))
                        .bind(ts(deadline));
                    for chunk in firsts.chunks(EVENT_CHUNK) {
                        query = bind_marks(query, chunk, namespace, now, Some(marker));
                    }
                    let written = match self.pool.acquire().await {
                        Ok(conn) => write_in_one_trip(conn, query).await,
                        Err(e) => Err(e),
                    };
                    let tried = match written {
                        Ok(rows) => {
                            riders.answer(&rows);
                            Ok(())
                        }
                        Err(e) if refused(&e) => {
                            riders.put_back(&self.events);
                            Err(e)
                        }
                        Err(e) => Err(e),
                    };
                    drop(turn);
                    tried
                }
            };
            match tried {
                Ok(()) => return Ok(event_keys::all_new(marks, &firsts, now)),
                // Some key is stored: nothing was written; the general way below.
                Err(e) if refused(&e) => self.events.fresh.store(false, Ordering::Relaxed),
                Err(e) => return Err(self.err(e)),
            }
        }
        let mut found = Found::default();
        let present = self
            .read_firsts(namespace, &firsts, now, &mut found)
            .await?;
        let absent: Vec<&EventMark> = firsts
            .iter()
            .copied()
            .filter(|m| !present.contains(m.key.as_str()))
            .collect();
        if absent.is_empty() && cursor.is_none() {
            self.events.fresh.store(false, Ordering::Relaxed);
            return Ok(found.verdicts(marks, now));
        }
        // One write transaction (BEGIN IMMEDIATE: the write lock at once, waiting under the
        // busy timeout): read the absent keys again, then mark those still absent (or
        // expired: the upsert's WHERE). Under the lock nothing changes in between. One row
        // back per read, not one per key: sqlx passes each row from its SQLite worker
        // thread as a message, which dominated large batches.
        let again_sqls = read_sqls(absent.len());
        let again = read_queries(&again_sqls, &absent, namespace, now);
        let turn = self.events.turn.lock().await;
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.err(e))?;
        let present_now = self.read_stored(&mut tx, again, &mut found).await?;
        let batch: Vec<&EventMark> = absent
            .into_iter()
            .filter(|m| !present_now.contains(m.key.as_str()))
            .collect();
        let marker = pending.filter(|_| !batch.is_empty());
        let sqls = mark_sqls(batch.len(), false, marker.is_some());
        if let Some(p) = marker {
            insert_pending(&mut tx, namespace, p, now)
                .await
                .map_err(|e| self.err(e))?;
        }
        for query in mark_queries(&sqls, &batch, namespace, now, marker.map(|p| p.0)) {
            query.execute(&mut *tx).await.map_err(|e| self.err(e))?;
        }
        if let Some((name, to)) = cursor {
            self.advance_in(&mut tx, namespace, name, to).await?;
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        drop(conn);
        drop(turn);
        let none_stored = present.is_empty() && present_now.is_empty();
        self.events.fresh.store(none_stored, Ordering::Relaxed);
        if none_stored {
            return Ok(event_keys::all_new(marks, &firsts, now));
        }
        for m in batch {
            found.marked(m.key.clone());
        }
        Ok(found.verdicts(marks, now))
    }
}

#[async_trait]
impl EventKeyStore for SqliteStore {
    async fn check_and_mark(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Vec<EventVerdict>> {
        self.mark_batch(namespace, marks, now, None, None).await
    }

    async fn check_and_mark_advancing(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        cursor: &str,
        to: &Cursor,
    ) -> Result<Vec<EventVerdict>> {
        self.mark_batch(namespace, marks, now, Some((cursor, to)), None)
            .await
    }

    async fn forget_event_keys(&self, namespace: &str, keys: &[String]) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(
            "DELETE FROM event_keys WHERE namespace = ?1 \
             AND event_key IN (SELECT value FROM json_each(?2))",
        )
        .bind(namespace)
        .bind(serde_json::to_string(keys).unwrap_or_default())
        .execute(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }

    async fn confirm_event_keys(
        &self,
        namespace: &str,
        keys: &[(String, Option<DateTime<Utc>>)],
        owner: &str,
    ) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        // One statement per distinct expiry (a gate's keys share one, or a few per event
        // type), the keys as a JSON array; in one write transaction.
        let mut groups: Vec<(Option<DateTime<Utc>>, Vec<&str>)> = Vec::new();
        for (key, at) in keys {
            match groups.iter_mut().find(|(g, _)| g == at) {
                Some((_, ks)) => ks.push(key),
                None => groups.push((*at, vec![key])),
            }
        }
        let turn = self.events.turn.lock().await;
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.err(e))?;
        let mut done = 0;
        for (at, ks) in groups {
            done += sqlx::query(
                "UPDATE event_keys SET decision = NULL, expires_at = ?3 \
                 WHERE namespace = ?1 AND decision = ?4 \
                 AND event_key IN (SELECT value FROM json_each(?2))",
            )
            .bind(namespace)
            .bind(serde_json::to_string(&ks).unwrap_or_default())
            .bind(at.map(ts))
            .bind(owner)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected();
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        drop(conn);
        drop(turn);
        Ok(done)
    }

    async fn unmark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        first_seen: DateTime<Utc>,
    ) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(
            "DELETE FROM event_keys WHERE namespace = ?1 AND first_seen = ?3 \
             AND event_key IN (SELECT value FROM json_each(?2))",
        )
        .bind(namespace)
        .bind(serde_json::to_string(keys).unwrap_or_default())
        .bind(ts(first_seen))
        .execute(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }

    async fn cursor(&self, namespace: &str, name: &str) -> Result<Option<Cursor>> {
        let row: Option<(String, String)> = sqlx::query_as(
            "SELECT position, value FROM event_cursors WHERE namespace = ?1 AND name = ?2",
        )
        .bind(namespace)
        .bind(name)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(row.map(|(position, value)| Cursor::from_stored(position, &value)))
    }

    async fn advance_cursor(&self, namespace: &str, name: &str, to: &Cursor) -> Result<()> {
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        self.advance_in(&mut conn, namespace, name, to).await
    }

    async fn is_duplicate(
        &self,
        namespace: &str,
        keys: &[String],
        now: DateTime<Utc>,
    ) -> Result<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let live = live_keys(&mut conn, namespace, keys, now)
            .await
            .map_err(|e| self.err(e))?;
        Ok(event_keys::present(keys, live))
    }

    async fn check_all_marked(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<EventVerdict>>> {
        let firsts = event_keys::firsts(marks);
        let mut found = Found::default();
        let present = self
            .read_firsts(namespace, &firsts, now, &mut found)
            .await?;
        Ok((present.len() == firsts.len()).then(|| found.verdicts(marks, now)))
    }

    async fn record_decision(
        &self,
        namespace: &str,
        key: &str,
        decision: &serde_json::Value,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE event_keys SET decision = ?3 WHERE namespace = ?1 AND event_key = ?2",
        )
        .bind(namespace)
        .bind(key)
        .bind(decision.to_string())
        .execute(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected() > 0)
    }

    async fn mark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        now: chrono::DateTime<chrono::Utc>,
    ) -> crate::error::Result<Vec<bool>> {
        crate::store::fallback::mark_by_check(self, namespace, keys, now).await
    }

    /// SQLite's writers take turns anyway: a gate's batches mark one after another.
    async fn check_and_mark_pending_ahead(
        &self,
        _namespace: &str,
        _marks: &[crate::store::EventMark],
        _now: chrono::DateTime<chrono::Utc>,
        _batch: crate::store::PendingBatch<'_>,
    ) -> crate::error::Result<Option<Vec<crate::store::EventVerdict>>> {
        crate::store::fallback::never_ahead()
    }

    /// The batch's pending state is one row of `event_pending` (migration 0010), which its
    /// keys name; they carry their real expiry from the start.
    async fn check_and_mark_pending(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        batch: crate::store::PendingBatch<'_>,
        cursor: Option<(&str, &Cursor)>,
    ) -> Result<Vec<EventVerdict>> {
        let pending = Some((batch.marker, batch.deadline(now)));
        self.mark_batch(namespace, marks, now, cursor, pending)
            .await
    }

    /// Whole: the batch's one row deleted, which confirms every key still naming it. Some
    /// of its keys only: those stop naming it, the others stay pending.
    async fn confirm_pending_batch(
        &self,
        namespace: &str,
        marker: &str,
        keys: &[(String, Option<DateTime<Utc>>)],
        whole: bool,
    ) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        if whole {
            // Queued for the next writer's transaction; when none has taken it by the time
            // this call has the turn, it writes the queue itself.
            let (done, mut answer) = tokio::sync::oneshot::channel();
            lock(&self.events.confirms).push(Rider {
                namespace: namespace.to_string(),
                marker: marker.to_string(),
                done,
            });
            let turn = self.events.turn.lock().await;
            // Answered already: a writer before this call took it into its transaction.
            let answered = answer.try_recv().ok();
            if answered.is_none() {
                // One statement for every confirmation waiting: atomic alone.
                let mut riders = Riders::take(&self.events);
                let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
                let written = sqlx::query(RIDERS_DELETE_SQL)
                    .bind(riders.json())
                    .fetch_all(&mut *conn)
                    .await;
                drop(conn);
                match written {
                    Ok(rows) => riders.answer(&rows),
                    Err(e) => {
                        riders.error = e.to_string();
                        drop(riders);
                        drop(turn);
                        return Err(self.err(e));
                    }
                }
            }
            drop(turn);
            let answered = match answered {
                Some(answered) => Ok(answered),
                None => answer.try_recv(),
            };
            return match answered {
                Ok(Ok(true)) => Ok(keys.len() as u64),
                Ok(Ok(false)) => Ok(0),
                Ok(Err(why)) => Err(Error::store(self.location(), why)),
                Err(_) => Err(Error::store(
                    self.location(),
                    "a pending batch's confirmation was never written",
                )),
            };
        }
        let turn = self.events.turn.lock().await;
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let done = {
            let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
            sqlx::query(
                "UPDATE event_keys SET pending = NULL WHERE namespace = ?1 \
                 AND pending IN (SELECT id FROM event_pending WHERE namespace = ?1 AND marker = ?2) \
                 AND event_key IN (SELECT value FROM json_each(?3))",
            )
            .bind(namespace)
            .bind(marker)
            .bind(serde_json::to_string(&names).unwrap_or_default())
            .execute(&mut *conn)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected()
        };
        drop(conn);
        drop(turn);
        Ok(done)
    }
}
