//! Event keys on Postgres: checks and marks by the batch (bulk `COPY` when the keys are
//! fresh), pending batches and their confirmation, cursors.

use super::*;

/// A place in a row of batches as Postgres keeps it (`BIGINT`).
fn place(turn: BatchTurn<'_>) -> i64 {
    i64::try_from(turn.place).unwrap_or(i64::MAX)
}

/// A place as the second key of its transaction's advisory lock (an `int`, wrapping: two
/// places 2³¹ apart share a lock, which costs a wait, never a wrong answer).
fn lock_place(place: u64) -> i32 {
    (place % (1 << 31)) as i32
}

/// A pending batch's copy ([`PostgresStore::copy_fresh`]): its marker, its deadline, and
/// its place in its row with whether it is asked ahead of its turn.
type PendingCopy<'a> = (&'a str, DateTime<Utc>, Option<(BatchTurn<'a>, bool)>);

/// SQLSTATE `deadlock_detected`.
const DEADLOCK_DETECTED: &str = "40P01";

/// SQLSTATE `lock_not_available` (a `lock_timeout` passed).
const LOCK_NOT_AVAILABLE: &str = "55P03";

impl PostgresStore {
    /// The first try of a batch without a cursor when the last batch found every key
    /// absent: its rows sent with `COPY` straight into `event_keys`, as a bulk load (rows
    /// written a page at a time, one WAL record per page rather than per row; the primary
    /// key's unique check is the lookup). A key stored, expired or not, fails the copy
    /// whole (unique violation): nothing is written, and `false` sends the batch on to
    /// [`EVENTS_INSERT_SQL`]. A pending batch's row (migration 0008) goes in the same
    /// transaction, so its keys are never seen without it, and makes it commit
    /// asynchronously ([`PENDING_ROW_SQL`]); so does, with `ahead` (a
    /// batch marked ahead of its turn), the move of its row's last place marked
    /// (migration 0012) to its own, which must find the place before it there: when it
    /// does not, the transaction is rolled back and `false` says nothing was written.
    /// That move comes last, so its row lock is only ever held by a transaction about to
    /// commit: a batch waiting for it waits for a commit, never for a lock held by a
    /// transaction that waits in turn (no deadlock through it).
    pub(super) async fn copy_fresh(
        &self,
        namespace: &str,
        firsts: &[&EventMark],
        decisions: &[Option<String>],
        expiries: &[Option<DateTime<Utc>>],
        now: DateTime<Utc>,
        pending: Option<PendingCopy<'_>>,
    ) -> Result<bool> {
        const COPY: &str = "COPY event_keys (namespace, event_key, first_seen, fingerprint, \
                            decision, expires_at, pending) FROM STDIN";
        let now = micros(now);
        let copied = match pending {
            None => {
                let rows = copy_rows(namespace, firsts, decisions, expiries, now, None);
                async {
                    let mut conn = self.turn().await?;
                    let mut copy = conn.copy_in_raw(COPY).await?;
                    copy.send(rows.as_bytes()).await?;
                    copy.finish().await.map(Some)
                }
                .await
            }
            // The batch's row and its keys in one transaction (one commit to wait for).
            // Not the row committed on its own ahead of the copy (two round trips fewer,
            // tried for issue 36): cleanup could then delete a row whose deadline passed
            // before a slow copy committed, and the copy's keys would read as confirmed
            // where they must be dead.
            Some((marker, deadline, turn)) => {
                // A batch in a row carries the confirmations that ask while it is on its
                // way (`riders`): open before it waits for a connection.
                let carrier = turn.map(|_| self.riders.carrier());
                async {
                    let mut conn = self.turn().await?;
                    let mut tx = conn.begin().await?;
                    let row = sqlx::query_scalar(match turn {
                        None => PENDING_ROW_SQL,
                        Some(_) => PENDING_ROW_HELD_SQL,
                    })
                    .bind(namespace)
                    .bind(marker)
                    .bind(now)
                    .bind(micros(deadline));
                    let row = match turn {
                        None => row,
                        Some((t, _)) => row.bind(t.row).bind(lock_place(t.place)),
                    };
                    let id: i64 = row.fetch_one(&mut *tx).await?;
                    if let Some((t, _)) = turn {
                        // Held: the batch after it, asked ahead, may now wait for it.
                        t.started.say();
                    }
                    let rows = copy_rows(namespace, firsts, decisions, expiries, now, Some(id));
                    let mut copy = tx.copy_in_raw(COPY).await?;
                    copy.send(rows.as_bytes()).await?;
                    let n = copy.finish().await?;
                    let Some((t, ahead)) = turn else {
                        return tx.commit().await.map(|()| Some(n));
                    };
                    // The row's last place moved (ahead: once the batch before it ended,
                    // from its place only; in its turn: never backwards), with the
                    // confirmations waiting now.
                    let riders = carrier.map(riders::Carrier::take).filter(|r| !r.is_empty());
                    let before = lock_place(t.place.wrapping_sub(1));
                    let (moved, deleted) = match (&riders, ahead) {
                        (None, true) => {
                            let moved: bool = sqlx::query_scalar(TURN_AHEAD_SQL)
                                .bind(t.row)
                                .bind(place(t))
                                .bind(now)
                                .bind(before)
                                .fetch_one(&mut *tx)
                                .await?;
                            (moved, Vec::new())
                        }
                        (None, false) => {
                            sqlx::query(TURN_TAKEN_SQL)
                                .bind(t.row)
                                .bind(place(t))
                                .bind(now)
                                .execute(&mut *tx)
                                .await?;
                            (true, Vec::new())
                        }
                        (Some(riders), _) => {
                            let (namespaces, markers) = riders.batches();
                            let query = sqlx::query_as(if ahead {
                                TURN_AHEAD_RIDING_SQL
                            } else {
                                TURN_TAKEN_RIDING_SQL
                            })
                            .bind(t.row)
                            .bind(place(t))
                            .bind(now);
                            let query = if ahead { query.bind(before) } else { query };
                            let rows: Vec<Carried> = query
                                .bind(&namespaces)
                                .bind(&markers)
                                .fetch_all(&mut *tx)
                                .await?;
                            let moved = rows.first().is_some_and(|r| r.moved);
                            (moved, rows.into_iter().filter_map(|r| r.gone).collect())
                        }
                    };
                    if !moved {
                        // Refused: dropped unfinished, the transaction is rolled back all
                        // the same (and the riders, dropped, go on their own).
                        let _ = tx.rollback().await;
                        return Ok(None);
                    }
                    tx.commit().await?;
                    if let Some(riders) = riders {
                        riders.answer(&deleted);
                    }
                    Ok(Some(n))
                }
                .await
            }
        };
        match copied {
            Ok(None) => Ok(false),
            Ok(Some(_)) => Ok(true),
            // A key is stored (or was committed meanwhile), a batch asked ahead gave up
            // waiting for the one before it, or the server broke a circle of waits by
            // failing this transaction: nothing written.
            Err(sqlx::Error::Database(e))
                if e.kind() == sqlx::error::ErrorKind::UniqueViolation
                    || matches!(
                        e.code().as_deref(),
                        Some(DEADLOCK_DETECTED | LOCK_NOT_AVAILABLE)
                    ) =>
            {
                Ok(false)
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// The verdicts of `marks` when every one of their keys is stored and alive, looked
    /// up in one statement ([`looked_up`]); `None` when one is absent or expired.
    pub(super) async fn all_marked(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<EventVerdict>>> {
        let keys: Vec<&str> = marks.iter().map(|m| m.key.as_str()).collect();
        let rows = sqlx::query(EVENTS_LOOKUP_SQL)
            .bind(namespace)
            .bind(&keys)
            .bind(micros(now))
            .fetch_all(&mut self.conn().await?)
            .await
            .map_err(|e| self.err(e))?;
        looked_up(marks, &rows).map_err(|e| self.err(e))
    }

    /// Keeps what a batch found, for the next to choose its first statement by.
    pub(super) fn remember(&self, shape: BatchShape) {
        self.last_batch.store(shape as u8, Ordering::Relaxed);
    }

    /// [`Self::mark_batch_placed`] of a batch in no row.
    pub(super) async fn mark_batch(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        cursor: Option<(&str, &Cursor)>,
        pending: Option<(&str, DateTime<Utc>)>,
    ) -> Result<Vec<EventVerdict>> {
        self.mark_batch_placed(namespace, marks, now, cursor, pending, None)
            .await
            .map(|(verdicts, _)| verdicts)
    }

    /// `check_and_mark`, and the cursor's advance in the same transaction; with `pending`
    /// (a marker and its deadline) the keys it marks are pending for that batch. With
    /// `turn` (a pending batch's place in its row), `true` when the place was recorded in
    /// the transaction of its marks (the fresh batch's `COPY`).
    pub(super) async fn mark_batch_placed(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        cursor: Option<(&str, &Cursor)>,
        pending: Option<(&str, DateTime<Utc>)>,
        turn: Option<BatchTurn<'_>>,
    ) -> Result<(Vec<EventVerdict>, bool)> {
        let (marker, deadline) = (pending.map(|p| p.0), pending.map(|p| micros(p.1)));
        if marks.is_empty() {
            if let Some((name, to)) = cursor {
                return self
                    .advance_cursor(namespace, name, to)
                    .await
                    .map(|()| (Vec::new(), false));
            }
            return Ok((Vec::new(), false));
        }
        // One round trip (a transaction with the cursor). Repeats inside the batch are removed here and the keys sent in
        // byte order, the order the function scan inserts them in: two batches sharing
        // keys lock them in the same order, so they cannot deadlock.
        let firsts = event_keys::firsts(marks);
        let keys: Vec<&str> = firsts.iter().map(|m| m.key.as_str()).collect();
        let fingerprints: Vec<Option<&str>> =
            firsts.iter().map(|m| m.fingerprint.as_deref()).collect();
        // A pending batch's keys keep no decision (as a confirmed per-key pending mark).
        let decisions: Vec<Option<String>> = firsts
            .iter()
            .map(|m| event_keys::decision_text(m).filter(|_| pending.is_none()))
            .collect();
        let expiries: Vec<Option<DateTime<Utc>>> =
            firsts.iter().map(|m| m.expires_at(now)).collect();
        if cursor.is_none() {
            // The statement the last batch's shape suggests, when it can say alone.
            match BatchShape::load(&self.last_batch) {
                BatchShape::Fresh => {
                    if self
                        .copy_fresh(
                            namespace,
                            &firsts,
                            &decisions,
                            &expiries,
                            now,
                            pending.map(|(marker, deadline)| {
                                (marker, deadline, turn.map(|t| (t, false)))
                            }),
                        )
                        .await?
                    {
                        // With a place in a row: recorded in the copy's transaction.
                        return Ok((event_keys::all_new(marks, &firsts, now), turn.is_some()));
                    }
                }
                BatchShape::Seen => {
                    if let Some(verdicts) = self.all_marked(namespace, marks, now).await? {
                        return Ok((verdicts, false));
                    }
                    // A key absent or expired: marked below.
                }
                BatchShape::Mixed => {}
            }
            // A plain insert first; the upsert below when it cannot say (nothing written).
            let tried: std::result::Result<Vec<Inserted>, sqlx::Error> =
                sqlx::query_as(EVENTS_INSERT_SQL)
                    .bind(namespace)
                    .bind(&keys)
                    .bind(&fingerprints)
                    .bind(&decisions)
                    .bind(&expiries)
                    .bind(micros(now))
                    .bind(marker)
                    .bind(deadline)
                    .fetch_all(&mut self.conn().await?)
                    .await;
            match tried {
                Ok(rows) if !rows.iter().any(|r| r.expired == Some(true)) => {
                    let inserted = rows.first().map_or(0, |r| r.inserted);
                    let mut found = Found::default();
                    let mut present = std::collections::HashSet::new();
                    for stored in rows.into_iter().filter_map(|r| r.found) {
                        present.insert(stored.key.clone());
                        stored.into_found(&mut found);
                    }
                    // Each key was found (at most one row: the primary key) or inserted:
                    // the plain INSERT writes every row it is given or fails whole. The
                    // rows are committed by now, so a mismatch must not become an error
                    // that reports them to no one.
                    debug_assert_eq!(inserted as usize + present.len(), firsts.len());
                    self.remember(BatchShape::of(present.len(), firsts.len()));
                    if present.is_empty() {
                        return Ok((event_keys::all_new(marks, &firsts, now), false));
                    }
                    for m in firsts.iter().filter(|m| !present.contains(m.key.as_str())) {
                        found.marked(m.key.clone());
                    }
                    return Ok((found.verdicts(marks, now), false));
                }
                // A found key has expired: taken over by the upsert.
                Ok(_) => {}
                // Another transaction committed one of the keys meanwhile.
                Err(sqlx::Error::Database(e))
                    if e.kind() == sqlx::error::ErrorKind::UniqueViolation => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        self.remember(BatchShape::Mixed);
        let query = sqlx::query_as(EVENTS_MARK_SQL)
            .bind(namespace)
            .bind(&keys)
            .bind(&fingerprints)
            .bind(&decisions)
            .bind(&expiries)
            .bind(micros(now))
            .bind(marker)
            .bind(deadline);
        let rows: Vec<Marked> = match cursor {
            None => query.fetch_all(&mut self.conn().await?).await,
            Some((name, to)) => {
                // The marks and the cursor's advance commit together.
                let mut conn = self.conn().await?;
                let mut tx = conn.begin().await.map_err(|e| self.err(e))?;
                let rows = query.fetch_all(&mut *tx).await.map_err(|e| self.err(e))?;
                advance(&mut tx, namespace, name, to)
                    .await
                    .map_err(|e| self.err(e))?;
                tx.commit().await.map(|()| rows)
            }
        }
        .map_err(|e| self.err(e))?;
        let mut found = Found::default();
        let mut unseen = Vec::new();
        for row in rows {
            match (row.new, row.found) {
                (true, _) => found.marked(row.key),
                (false, Some(stored)) => stored.into_found(&mut found),
                (false, None) => unseen.push(row.key),
            }
        }
        if !unseen.is_empty() {
            // Rare: committed by a concurrent batch after this statement's snapshot.
            let refs: Vec<&str> = unseen.iter().map(String::as_str).collect();
            let mut missing: std::collections::HashSet<String> = unseen.iter().cloned().collect();
            for stored in self.read_events(namespace, &refs, now).await? {
                missing.remove(&stored.key);
                stored.into_found(&mut found);
            }
            if !missing.is_empty() {
                // Rarer: gone again before the read (the other batch took its marks back,
                // or they expired): marked anew here, never answered as a replay of a
                // mark nobody holds.
                let again: Vec<EventMark> = firsts
                    .iter()
                    .filter(|m| missing.contains(&m.key))
                    .map(|m| (*m).clone())
                    .collect();
                let verdicts =
                    Box::pin(self.mark_batch(namespace, &again, now, None, pending)).await?;
                for (m, v) in again.into_iter().zip(verdicts) {
                    match v {
                        EventVerdict::New => found.marked(m.key),
                        EventVerdict::Replay {
                            decision,
                            first_seen,
                        } => found.stored(m.key, None, decision.map(|d| d.to_string()), first_seen),
                        EventVerdict::Conflict {
                            stored_fingerprint,
                            first_seen,
                        } => found.stored(m.key, Some(stored_fingerprint), None, first_seen),
                    }
                }
            }
        }
        Ok((found.verdicts(marks, now), false))
    }
}

#[async_trait]
impl EventKeyStore for PostgresStore {
    /// The plain batch mark (no fingerprint, decision or TTL) keeps its own statement, as
    /// fast as a hand-written batch insert: `check_and_mark` joins back to the stored rows
    /// for replay/conflict, which a yes/no answer does not need.
    async fn mark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        now: DateTime<Utc>,
    ) -> Result<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // One round trip. Repeats inside the batch are removed here and the keys sent in
        // byte order, the order the function scan inserts them in: two batches sharing
        // keys lock them in the same order, so they cannot deadlock. RETURNING gives the
        // keys that were new, or whose earlier mark had expired (then re-marked, forever);
        // the first occurrence of each in the input is the one marked new.
        let mut unique: Vec<&str> = keys.iter().map(String::as_str).collect();
        unique.sort_unstable();
        unique.dedup();
        let now = micros(now);
        let new: Vec<String> = sqlx::query_scalar(
            "INSERT INTO event_keys AS e (namespace, event_key, first_seen) \
             SELECT $1, k, $3 FROM UNNEST($2::text[]) AS t(k) \
             ON CONFLICT (namespace, event_key) DO UPDATE SET \
               first_seen = EXCLUDED.first_seen, fingerprint = NULL, decision = NULL, \
               expires_at = NULL, pending = NULL \
             WHERE (e.expires_at IS NOT NULL AND e.expires_at <= EXCLUDED.first_seen) \
                OR EXISTS (SELECT 1 FROM event_pending d \
                           WHERE d.id = e.pending AND d.first_seen = e.first_seen \
                             AND d.deadline <= EXCLUDED.first_seen) \
             RETURNING event_key",
        )
        .bind(namespace)
        .bind(&unique)
        .bind(now)
        .fetch_all(&mut self.conn().await?)
        .await
        .map_err(|e| self.err(e))?;
        let mut new: std::collections::HashSet<&str> = new.iter().map(String::as_str).collect();
        Ok(keys.iter().map(|k| new.remove(k.as_str())).collect())
    }

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

    /// The batch's pending state is one row of `event_pending` (migration 0008), which its
    /// keys name; they carry their real expiry and decision from the start.
    async fn check_and_mark_pending(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        batch: PendingBatch<'_>,
        cursor: Option<(&str, &Cursor)>,
    ) -> Result<Vec<EventVerdict>> {
        let (verdicts, placed) = self
            .mark_batch_placed(
                namespace,
                marks,
                now,
                cursor,
                Some((batch.marker, batch.deadline(now))),
                batch.turn,
            )
            .await?;
        if let Some(turn) = batch.turn.filter(|_| !placed) {
            // Its turn came: its place is the row's last marked, so the batch after it
            // can mark ahead. Unless the copy's transaction recorded it: after its marks
            // are committed, on its own (lost, the next batch only waits for its turn).
            let recorded = sqlx::query(TURN_TAKEN_SQL)
                .bind(turn.row)
                .bind(place(turn))
                .bind(micros(now))
                .execute(&mut self.conn().await?)
                .await;
            if let Err(e) = recorded {
                tracing::debug!("the place of a gate's batch was not recorded: {e}");
            }
        }
        Ok(verdicts)
    }

    /// A batch of fresh keys: its bulk `COPY` with its row's last place moved in the same
    /// transaction (`copy_fresh`). Not tried (`None`) after a batch that found some of its
    /// keys stored and others not, when this one's copy would most likely fail too.
    async fn check_and_mark_pending_ahead(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        batch: PendingBatch<'_>,
    ) -> Result<Option<Vec<EventVerdict>>> {
        let Some(turn) = batch.turn else {
            return Ok(None);
        };
        if marks.is_empty() || matches!(BatchShape::load(&self.last_batch), BatchShape::Mixed) {
            return Ok(None);
        }
        let firsts = event_keys::firsts(marks);
        // A pending batch's keys keep no decision (see `mark_batch`).
        let decisions = vec![None; firsts.len()];
        let expiries: Vec<Option<DateTime<Utc>>> =
            firsts.iter().map(|m| m.expires_at(now)).collect();
        let pending = Some((batch.marker, batch.deadline(now), Some((turn, true))));
        let marked = self
            .copy_fresh(namespace, &firsts, &decisions, &expiries, now, pending)
            .await?;
        Ok(marked.then(|| event_keys::all_new(marks, &firsts, now)))
    }

    /// One row deleted: the batch's keys that still name it are confirmed at once (their
    /// real expiry and decision were stored with them).
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
            // In the transaction of a batch on its way, when one is (see `riders`).
            if let Some(ride) = self.riders.ride(namespace, marker) {
                if self.riders.carried(ride).await {
                    return Ok(keys.len() as u64);
                }
            }
        }
        let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        // On its own: one statement, committed with `synchronous_commit` off
        // ([`CONFIRM_BATCH_SQL`]): a confirmation lost to a server crash leaves the batch
        // unconfirmed, its keys expire with its timeout and are reported `new` again (at
        // least once, never lost), so it need not wait for a WAL flush of its own. Whole:
        // the batch's rows go. Some of its keys only: those keys stop naming it, the
        // others stay pending.
        let confirm = || async {
            let mut conn = self.turn().await?;
            if whole {
                let done = sqlx::query(CONFIRM_BATCH_SQL)
                    .bind(namespace)
                    .bind(marker)
                    .execute(&mut conn)
                    .await?;
                Ok(if done.rows_affected() > 0 {
                    keys.len() as u64
                } else {
                    0
                })
            } else {
                sqlx::query(CONFIRM_KEYS_SQL)
                    .bind(namespace)
                    .bind(marker)
                    .bind(&names)
                    .execute(&mut conn)
                    .await
                    .map(|done| done.rows_affected())
            }
        };
        // Owed for records already written: asked again (a connection lost, a pool busy
        // under load) before the keys are left to expire.
        let mut pause = Duration::from_millis(100);
        let mut tries = 0;
        loop {
            tries += 1;
            match confirm().await {
                Ok(n) => return Ok(n),
                Err(e) if tries < 4 && connection_refused(&e) => {
                    tracing::debug!("confirming a pending batch again: {e}");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Err(e) => return Err(self.err(e)),
            }
        }
    }

    async fn forget_event_keys(&self, namespace: &str, keys: &[String]) -> Result<u64> {
        self.delete_event_keys(namespace, keys, None).await
    }

    async fn unmark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        first_seen: DateTime<Utc>,
    ) -> Result<u64> {
        self.delete_event_keys(namespace, keys, Some(micros(first_seen)))
            .await
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
        // One statement: keys and expiries as parallel arrays; the rows still carrying
        // this gate's pending mark are locked in key order (the order every mark locks
        // them in, so no deadlock with a batch taking them over) and then updated through
        // their row ids (a TID scan). Joining the update to the locked rows by key let the
        // planner scan the whole namespace once per batch: 7 times slower at 600 k keys.
        let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        let expiries: Vec<Option<DateTime<Utc>>> =
            keys.iter().map(|(_, at)| at.map(micros)).collect();
        let done = sqlx::query(
            "WITH c AS ( \
               SELECT l.ctid AS row_id, k.expires_at \
               FROM unnest($2::text[], $3::timestamptz[]) AS k(event_key, expires_at) \
               JOIN event_keys l ON l.namespace = $1 AND l.event_key = k.event_key \
               WHERE l.decision = $4::jsonb \
               ORDER BY k.event_key FOR UPDATE OF l) \
             UPDATE event_keys e SET decision = NULL, expires_at = c.expires_at \
             FROM c WHERE e.ctid = c.row_id AND e.decision = $4::jsonb",
        )
        .bind(namespace)
        .bind(&names)
        .bind(&expiries)
        .bind(owner)
        .execute(&mut self.conn().await?)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }

    async fn cursor(&self, namespace: &str, name: &str) -> Result<Option<Cursor>> {
        let row: Option<(String, String)> = sqlx::query_as(
            "SELECT position, value::text FROM event_cursors WHERE namespace = $1 AND name = $2",
        )
        .bind(namespace)
        .bind(name)
        .fetch_optional(&mut self.conn().await?)
        .await
        .map_err(|e| self.err(e))?;
        Ok(row.map(|(position, value)| Cursor::from_stored(position, &value)))
    }

    async fn advance_cursor(&self, namespace: &str, name: &str, to: &Cursor) -> Result<()> {
        let mut conn = self.conn().await?;
        advance(&mut conn, namespace, name, to)
            .await
            .map_err(|e| self.err(e))
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
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let rows = self.read_events(namespace, &refs, now).await?;
        Ok(event_keys::present(keys, rows.into_iter().map(|r| r.key)))
    }

    async fn check_all_marked(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<EventVerdict>>> {
        self.all_marked(namespace, marks, now).await
    }

    async fn record_decision(
        &self,
        namespace: &str,
        key: &str,
        decision: &serde_json::Value,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE event_keys SET decision = $3::text::jsonb \
             WHERE namespace = $1 AND event_key = $2",
        )
        .bind(namespace)
        .bind(key)
        .bind(decision.to_string())
        .execute(&mut self.conn().await?)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected() > 0)
    }
}
