//! Event keys on SQLite: checks and marks by the batch (one writer at a time, an
//! all-or-nothing insert when the keys are fresh), cursors.

use super::*;

/// Rows a statement of the batch marks or reads at most: its bound parameters (4 a row
/// marked) stay far below SQLite's limit (32,766), a batch of the gate's default size is
/// one statement, and the few statement shapes (one per chunk size) stay in sqlx's
/// statement cache.
pub(super) const EVENT_CHUNK: usize = 1000;

/// `INSERT` marking `n` keys: namespace and `now` once, then (`pending`) the namespace
/// and marker of the batch whose row names the keys, then four anonymous parameters a row (key, fingerprint, decision, expiry), then
/// `now` twice more: a key found absent is inserted, one that is dead by `now` ([`DEAD`]:
/// expired, or pending for a batch whose deadline passed unconfirmed) is taken over. A key
/// stored and alive is left alone (the upsert's WHERE) or, `all_or_nothing`, fails the
/// whole statement: its `event_key` would be set to NULL, which the column's NOT NULL
/// refuses, and SQLite undoes everything the statement did ([`refused`]). `WHERE true`
/// tells SQLite's parser that `ON` starts the upsert, not a join. Bound values, not a JSON
/// array: SQLite's JSON functions parsing the batch back were a third of the worker's
/// time; and not six a row: each bound text is copied twice on its way to SQLite.
/// Anonymous `?`, not `?NNN`: sqlx looks up each numbered parameter's name, which SQLite
/// finds by a linear scan (quadratic in the batch).
pub(super) fn events_mark_sql(n: usize, all_or_nothing: bool, pending: bool) -> String {
    let mut sql = String::from(
        "INSERT INTO event_keys (namespace, event_key, first_seen, pending, fingerprint, decision, expires_at) \
         SELECT ?, column1, ?, ",
    );
    // The batch's row, inserted just before in the same transaction (the newest of its
    // namespace and marker): a subquery evaluated once, so the statement is bound before
    // the row exists, outside the batch's turn.
    sql.push_str(match pending {
        true => "(SELECT max(id) FROM event_pending WHERE namespace = ? AND marker = ?)",
        false => "NULL",
    });
    sql.push_str(", column2, column3, column4 FROM (VALUES ");
    for i in 0..n {
        sql.push_str(if i > 0 { ",(?,?,?,?)" } else { "(?,?,?,?)" });
    }
    sql.push_str(
        ") WHERE true ON CONFLICT (namespace, event_key) DO UPDATE SET \
         first_seen = excluded.first_seen, fingerprint = excluded.fingerprint, \
         decision = excluded.decision, expires_at = excluded.expires_at, \
         pending = excluded.pending",
    );
    match all_or_nothing {
        true => {
            sql.push_str(", event_key = CASE WHEN ");
            sql.push_str(DEAD);
            sql.push_str(" THEN event_keys.event_key END");
        }
        false => {
            sql.push_str(" WHERE ");
            sql.push_str(DEAD);
        }
    }
    sql
}

/// Whether the stored row `event_keys` is dead at the two `?` (both `now`): expired, or
/// pending for a batch whose deadline passed unconfirmed (a key whose batch row is gone
/// was confirmed: alive until its own expiry).
const DEAD: &str = "((event_keys.expires_at IS NOT NULL AND event_keys.expires_at <= ?) \
    OR (event_keys.pending IS NOT NULL AND EXISTS (SELECT 1 FROM event_pending p \
        WHERE p.id = event_keys.pending AND p.deadline <= ?)))";

/// Whether `e` is an all-or-nothing insert ([`events_mark_sql`]) refusing a batch because
/// one of its keys is stored and unexpired.
pub(super) fn refused(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.kind() == sqlx::error::ErrorKind::NotNullViolation)
}

/// The statements marking `n` keys, one per chunk of [`EVENT_CHUNK`] (`pending`: for a
/// pending batch).
pub(super) fn mark_sqls(n: usize, all_or_nothing: bool, pending: bool) -> Vec<String> {
    (0..n)
        .step_by(EVENT_CHUNK)
        .map(|start| events_mark_sql((n - start).min(EVENT_CHUNK), all_or_nothing, pending))
        .collect()
}

/// The statements reading `n` keys, one per chunk of [`EVENT_CHUNK`].
pub(super) fn read_sqls(n: usize) -> Vec<String> {
    (0..n)
        .step_by(EVENT_CHUNK)
        .map(|start| events_read_batch_sql((n - start).min(EVENT_CHUNK)))
        .collect()
}

/// A bound [`events_read_batch_sql`].
pub(super) type ReadQuery<'q> =
    sqlx::query::QueryScalar<'q, sqlx::Sqlite, String, sqlx::sqlite::SqliteArguments<'q>>;

/// `sqls` ([`read_sqls`] of `marks.len()`) bound to the keys of `marks` of `namespace` at
/// `now`.
pub(super) fn read_queries<'q>(
    sqls: &'q [String],
    marks: &[&'q EventMark],
    namespace: &'q str,
    now: DateTime<Utc>,
) -> Vec<ReadQuery<'q>> {
    sqls.iter()
        .zip(marks.chunks(EVENT_CHUNK))
        .map(|(sql, chunk)| {
            let query = sqlx::query_scalar(sql).bind(namespace).bind(ts(now));
            chunk
                .iter()
                .fold(query, |q, m| q.bind(m.key.as_str()))
                .bind(ts(now))
        })
        .collect()
}

/// `sqls` ([`mark_sqls`] of `marks.len()`) bound to `marks` of `namespace` at `now`,
/// pending for the batch of marker `pending` when given (then without their decisions: a
/// confirmed pending mark keeps none).
pub(super) fn mark_queries<'q>(
    sqls: &'q [String],
    marks: &[&'q EventMark],
    namespace: &'q str,
    now: DateTime<Utc>,
    pending: Option<&'q str>,
) -> Vec<sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>> {
    sqls.iter()
        .zip(marks.chunks(EVENT_CHUNK))
        .map(|(sql, chunk)| {
            let mut query = sqlx::query(sql).bind(namespace).bind(ts(now));
            if let Some(marker) = pending {
                query = query.bind(namespace).bind(marker);
            }
            chunk
                .iter()
                .fold(query, |query, m| {
                    query
                        .bind(m.key.as_str())
                        .bind(m.fingerprint.as_deref())
                        .bind(event_keys::decision_text(m).filter(|_| pending.is_none()))
                        .bind(m.expires_at(now).map(ts))
                })
                .bind(ts(now))
                .bind(ts(now))
        })
        .collect()
}

/// Inserts the row of a pending batch marked at `now` (its marker and deadline), which the
/// batch's keys then name ([`events_mark_sql`], in the same transaction).
pub(super) async fn insert_pending(
    conn: &mut SqliteConnection,
    namespace: &str,
    (marker, deadline): (&str, DateTime<Utc>),
    now: DateTime<Utc>,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO event_pending (namespace, marker, first_seen, deadline) \
         VALUES (?1, ?2, ?3, ?4)",
    )
    .bind(namespace)
    .bind(marker)
    .bind(ts(now))
    .bind(ts(deadline))
    .execute(conn)
    .await
    .map(|_| ())
}

/// The live rows of namespace `?` at `?` of `n` keys (`?`…, then `now` again), as one
/// JSON array of [key, fingerprint, decision, first_seen] (`[]` when none): one row back,
/// not one per key (sqlx passes each row from its SQLite worker thread as a message). A
/// key pending for a batch whose deadline has not passed reads as a replay whose decision
/// is the batch's marker; past it, as absent.
pub(super) fn events_read_batch_sql(n: usize) -> String {
    let mut sql = String::from(
        "SELECT json_group_array(json_array(e.event_key, e.fingerprint, \
         coalesce(p.marker, e.decision), e.first_seen)) \
         FROM event_keys e LEFT JOIN event_pending p ON p.id = e.pending \
         WHERE e.namespace = ? AND (e.expires_at IS NULL OR e.expires_at > ?) \
         AND e.event_key IN (",
    );
    for i in 0..n {
        sql.push_str(if i > 0 { ",?" } else { "?" });
    }
    sql.push_str(") AND (p.deadline IS NULL OR p.deadline > ?)");
    sql
}

/// The live keys among those in the JSON array ?2 (as [`events_read_batch_sql`]).
pub(super) const EVENTS_LIVE_SQL: &str = "\
SELECT e.event_key
FROM event_keys e LEFT JOIN event_pending p ON p.id = e.pending
WHERE e.namespace = ?1 AND e.event_key IN (SELECT value FROM json_each(?2))
  AND (e.expires_at IS NULL OR e.expires_at > ?3) AND (p.deadline IS NULL OR p.deadline > ?3)";

/// Which of `keys` are marked and unexpired at `now`.
pub(super) async fn live_keys(
    conn: &mut SqliteConnection,
    namespace: &str,
    keys: &[impl serde::Serialize],
    now: DateTime<Utc>,
) -> std::result::Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(EVENTS_LIVE_SQL)
        .bind(namespace)
        .bind(serde_json::to_string(keys).unwrap_or_default())
        .bind(ts(now))
        .fetch_all(conn)
        .await
}

/// Moves cursor (?1, ?2) to position ?3 (value ?4, at ?5) when ?3 is after it.
pub(super) const CURSOR_ADVANCE_SQL: &str = "\
INSERT INTO event_cursors (namespace, name, position, value, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5)
ON CONFLICT (namespace, name) DO UPDATE SET
  position = excluded.position, value = excluded.value, updated_at = excluded.updated_at
WHERE event_cursors.position < excluded.position";

/// A whole-batch confirmation waiting for a write transaction to ride in.
#[derive(Debug)]
pub(super) struct Rider {
    namespace: String,
    marker: String,
    /// Whether the batch's row was deleted, once the transaction committed; or why not.
    done: tokio::sync::oneshot::Sender<std::result::Result<bool, String>>,
}

/// The confirmations a writer took from the queue into its transaction: each answered
/// once it committed ([`answer`](Self::answer)), put back when the transaction was undone
/// for a reason of the writer's own ([`put_back`](Self::put_back)), or told the error
/// when dropped unanswered (the transaction failed).
pub(super) struct Riders {
    riders: Vec<Rider>,
    deleted: Vec<bool>,
    error: String,
}

impl Riders {
    /// Every confirmation waiting now.
    fn take(writer: &EventWriter) -> Self {
        let riders = std::mem::take(&mut *lock(&writer.confirms));
        Riders {
            riders,
            deleted: Vec::new(),
            error: "the write transaction it was confirmed in failed".to_string(),
        }
    }

    /// Deletes their batches' rows, in the caller's transaction.
    async fn delete(
        &mut self,
        conn: &mut SqliteConnection,
    ) -> std::result::Result<(), sqlx::Error> {
        for r in &self.riders {
            let done =
                sqlx::query("DELETE FROM event_pending WHERE namespace = ?1 AND marker = ?2")
                    .bind(&r.namespace)
                    .bind(&r.marker)
                    .execute(&mut *conn)
                    .await?;
            self.deleted.push(done.rows_affected() > 0);
        }
        Ok(())
    }

    /// The transaction committed: each hears whether its row was deleted.
    fn answer(mut self) {
        let deleted = std::mem::take(&mut self.deleted);
        for (r, deleted) in self.riders.drain(..).zip(deleted) {
            let _ = r.done.send(Ok(deleted));
        }
    }

    /// The transaction was undone for its writer's own reason: back in the queue, for the
    /// next writer (they wait for the turn this writer still holds).
    fn put_back(mut self, writer: &EventWriter) {
        lock(&writer.confirms).extend(self.riders.drain(..));
    }
}

impl Drop for Riders {
    fn drop(&mut self) {
        for r in self.riders.drain(..) {
            let _ = r.done.send(Err(self.error.clone()));
        }
    }
}

/// The queue's lock (a panic elsewhere does not make it unusable: it holds no invariant).
fn lock(m: &std::sync::Mutex<Vec<Rider>>) -> std::sync::MutexGuard<'_, Vec<Rider>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
            let sqls = mark_sqls(firsts.len(), true, pending.is_some());
            let marker = pending.map(|p| p.0);
            let queries = mark_queries(&sqls, &firsts, namespace, now, marker);
            let turn = self.events.turn.lock().await;
            let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
            let mut riders = None;
            let tried = async {
                if let (None, [_]) = (pending, queries.as_slice()) {
                    // One statement is atomic alone: no BEGIN, no COMMIT.
                    for query in queries {
                        query.execute(&mut *conn).await?;
                    }
                    return Ok(());
                }
                let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
                if let Some(batch) = pending {
                    // Earlier batches' confirmations ride in this transaction.
                    let riders = riders.insert(Riders::take(&self.events));
                    riders.delete(&mut tx).await?;
                    insert_pending(&mut tx, namespace, batch, now).await?;
                }
                for query in queries {
                    query.execute(&mut *tx).await?;
                }
                tx.commit().await
            }
            .await;
            match (&tried, riders) {
                (Ok(()), Some(riders)) => riders.answer(),
                (Err(e), Some(riders)) if refused(e) => riders.put_back(&self.events),
                _ => {}
            }
            drop(conn);
            drop(turn);
            match tried {
                Ok(()) => return Ok(event_keys::all_new(marks, &firsts, now)),
                // Some key is stored: nothing was written; the general way below.
                Err(e) if refused(&e) => self.events.fresh.store(false, Ordering::Relaxed),
                Err(e) => return Err(self.err(e)),
            }
        }
        let first_sqls = read_sqls(firsts.len());
        let mut found = Found::default();
        let present = {
            let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
            let reads = read_queries(&first_sqls, &firsts, namespace, now);
            self.read_stored(&mut conn, reads, &mut found).await?
        };
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
                let mut riders = Riders::take(&self.events);
                let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
                let written = async {
                    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
                    riders.delete(&mut tx).await?;
                    tx.commit().await
                }
                .await;
                drop(conn);
                match written {
                    Ok(()) => riders.answer(),
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
