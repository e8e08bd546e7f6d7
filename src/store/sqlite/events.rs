//! Event keys on SQLite: checks and marks by the batch (one writer at a time, an
//! all-or-nothing insert when the keys are fresh), cursors.

use super::event_sql::*;
use super::writer::*;
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

    /// A batch of fresh keys (`firsts`) as one all-or-nothing insert: one statement is
    /// atomic alone, no `BEGIN`, no `COMMIT`. Refused ([`refused`]) when a key is stored,
    /// having written nothing.
    async fn write_fresh(
        &self,
        namespace: &str,
        firsts: &[&EventMark],
        now: DateTime<Utc>,
    ) -> std::result::Result<bool, sqlx::Error> {
        // Bound before this batch's turn, so it binds while the batch before it writes.
        let sqls = mark_sqls(firsts.len(), true, false);
        let queries = mark_queries(&sqls, firsts, namespace, now, None);
        let _turn = self.events.take_turn().await;
        let mut conn = self.pool.acquire().await?;
        for query in queries {
            query.execute(&mut *conn).await?;
        }
        Ok(true)
    }

    /// [`write_fresh`](Self::write_fresh) of a pending batch: its row and its keys in one
    /// transaction, sent to SQLite in one trip with earlier batches' confirmations riding
    /// in it (`pending_write_sql`). In a row, the batch's place becomes the row's last
    /// marked, in its turn at the writers' lock; asked ahead (`p.ahead`), it is written only
    /// when the row's last place marked is the one just before it: `false`, nothing
    /// written, when it is not.
    async fn write_fresh_pending(
        &self,
        namespace: &str,
        firsts: &[&EventMark],
        now: DateTime<Utc>,
        p: PendingWrite<'_>,
    ) -> std::result::Result<bool, sqlx::Error> {
        let turn = self.events.take_turn().await;
        if let Some(t) = &p.turn {
            if p.ahead && !self.events.rows.follows(t) {
                return Ok(false);
            }
            // The batch after it, asked ahead, now queues behind this one for the turn.
            t.started.say();
        }
        let riders = Riders::take(&self.events);
        let sql = pending_write_sql(firsts.len(), !riders.is_empty());
        let mut query = sqlx::query(&sql);
        if !riders.is_empty() {
            query = query.bind(riders.json());
        }
        query = query
            .bind(namespace)
            .bind(p.marker)
            .bind(ts(now))
            .bind(ts(p.deadline));
        for chunk in firsts.chunks(EVENT_CHUNK) {
            query = bind_marks(query, chunk, namespace, now, Some(p.marker));
        }
        let written = match self.pool.acquire().await {
            Ok(conn) => write_in_one_trip(conn, query).await,
            Err(e) => Err(e),
        };
        match written {
            Ok(rows) => {
                if let Some(t) = &p.turn {
                    self.events.rows.marked(t);
                }
                riders.answer(&rows);
                drop(turn);
                Ok(true)
            }
            // Nothing of its transaction stayed, the riders' deletes neither: back in the
            // queue for the next writer, or for their own callers, which write the queue
            // themselves once they have the turn this one still holds. Not told this
            // batch's error: a batch failing (refused, or the store busy past its timeout)
            // is no reason for other batches' confirmations to fail, which would leave
            // their keys pending for other gates to wait on until they expire.
            Err(e) => {
                riders.put_back(&self.events);
                Err(e)
            }
        }
    }

    /// `check_and_mark`, and the cursor's advance in the same transaction; with `pending`
    /// the keys it marks are pending for that batch, whose row (migration 0010) goes in the
    /// same transaction, so its keys are never seen without it.
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
        pending: Option<PendingWrite<'_>>,
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
            let tried = match pending {
                None => self.write_fresh(namespace, &firsts, now).await,
                Some(p) => self.write_fresh_pending(namespace, &firsts, now, p).await,
            };
            match tried {
                Ok(_) => {
                    self.events.mixed.store(false, Ordering::Relaxed);
                    return Ok(event_keys::all_new(marks, &firsts, now));
                }
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
            self.events.mixed.store(false, Ordering::Relaxed);
            return Ok(found.verdicts(marks, now));
        }
        // One write transaction (BEGIN IMMEDIATE: the write lock at once, waiting under the
        // busy timeout): read the absent keys again, then mark those still absent (or
        // expired: the upsert's WHERE). Under the lock nothing changes in between. One row
        // back per read, not one per key: sqlx passes each row from its SQLite worker
        // thread as a message, which dominated large batches.
        let again_sqls = read_sqls(absent.len());
        let again = read_queries(&again_sqls, &absent, namespace, now);
        let turn = self.events.take_turn().await;
        let in_row = pending.and_then(|p| p.turn);
        if let Some(t) = &in_row {
            t.started.say();
        }
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
        let marker = pending
            .filter(|_| !batch.is_empty())
            .map(|p| (p.marker, p.deadline));
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
        if let Some(t) = &in_row {
            self.events.rows.marked(t);
        }
        drop(turn);
        let none_stored = present.is_empty() && present_now.is_empty();
        self.events.fresh.store(none_stored, Ordering::Relaxed);
        self.events
            .mixed
            .store(!none_stored && !batch.is_empty(), Ordering::Relaxed);
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
        let turn = self.events.take_turn().await;
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

    /// A batch of fresh keys, tried as one all-or-nothing write at the writers' turn, which
    /// checks there that the row's last place marked (this store's `RowPlaces`) is the
    /// one before it. Not tried (`None`) after a batch that found some of its keys stored
    /// and others not, when this one's insert would most likely be refused too.
    async fn check_and_mark_pending_ahead(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        batch: PendingBatch<'_>,
    ) -> Result<Option<Vec<EventVerdict>>> {
        if batch.turn.is_none() || marks.is_empty() || self.events.mixed.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let firsts = event_keys::firsts(marks);
        let p = PendingWrite::of(&batch, now, true);
        match self.write_fresh_pending(namespace, &firsts, now, p).await {
            Ok(true) => Ok(Some(event_keys::all_new(marks, &firsts, now))),
            Ok(false) => Ok(None),
            Err(e) if refused(&e) => {
                self.events.fresh.store(false, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// The batch's pending state is one row of `event_pending` (migration 0010), which its
    /// keys name; they carry their real expiry from the start.
    async fn check_and_mark_pending(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        batch: PendingBatch<'_>,
        cursor: Option<(&str, &Cursor)>,
    ) -> Result<Vec<EventVerdict>> {
        let p = PendingWrite::of(&batch, now, false);
        let verdicts = self
            .mark_batch(namespace, marks, now, cursor, Some(p))
            .await?;
        // Its turn came: its place is the row's last marked (a batch that wrote nothing
        // too), so the batch after it may mark ahead.
        if let Some(t) = &batch.turn {
            self.events.rows.marked(t);
        }
        Ok(verdicts)
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
            self.events.queue(Rider {
                namespace: namespace.to_string(),
                marker: marker.to_string(),
                done,
            });
            let turn = self.events.take_turn().await;
            // Answered already: a writer before this call took it into its transaction.
            let answered = match answer.try_recv() {
                Ok(answered) => answered,
                Err(_) => {
                    // One statement for every confirmation waiting: atomic alone.
                    let mut riders = Riders::take(&self.events);
                    let written = match self.pool.acquire().await {
                        Ok(mut conn) => {
                            sqlx::query(RIDERS_DELETE_SQL)
                                .bind(riders.json())
                                .fetch_all(&mut *conn)
                                .await
                        }
                        Err(e) => Err(e),
                    };
                    match written {
                        Ok(rows) => riders.answer(&rows),
                        Err(e) => {
                            // This call's confirmation fails; the others go back to the
                            // queue, for their own callers to write in their turn.
                            riders.error = e.to_string();
                            riders.put_back_others(&self.events, namespace, marker);
                            drop(riders);
                            drop(turn);
                            return Err(self.err(e));
                        }
                    }
                    answer
                        .try_recv()
                        .unwrap_or_else(|_| Err(UNWRITTEN.to_string()))
                }
            };
            drop(turn);
            return match answered {
                Ok(true) => Ok(keys.len() as u64),
                Ok(false) => Ok(0),
                Err(why) => Err(Error::store(self.location(), why)),
            };
        }
        let turn = self.events.take_turn().await;
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

/// A pending batch as [`SqliteStore::mark_batch`] writes it: its marker, its deadline, its
/// place in its row, and whether it is asked ahead of its turn.
#[derive(Debug, Clone, Copy)]
pub(super) struct PendingWrite<'a> {
    marker: &'a str,
    deadline: DateTime<Utc>,
    turn: Option<BatchTurn<'a>>,
    ahead: bool,
}

impl<'a> PendingWrite<'a> {
    fn of(batch: &PendingBatch<'a>, now: DateTime<Utc>, ahead: bool) -> Self {
        PendingWrite {
            marker: batch.marker,
            deadline: batch.deadline(now),
            turn: batch.turn,
            ahead,
        }
    }
}
