//! The event-key statements on Postgres, the rows `COPY` sends, and the helpers the
//! event-key store shares (reads, deletes, the cursor's advance).

use super::*;
use sqlx::Column as _;

/// The batch a statement marks keys for, registered first: with a pending marker ($7, the deadline $8) one row of `event_pending` (migration 0008),
/// whose id the batch's keys carry in `pending` until the confirmation deletes that row;
/// without one ($7 NULL), nothing, and the keys carry NULL. Only when the statement will
/// insert a key (`$when`): a batch row no key names would wait for the cleanup.
macro_rules! batch_cte {
    ($when:literal) => {
        concat!(
            "batch AS (
  INSERT INTO event_pending (namespace, marker, first_seen, deadline)
  SELECT $1, $7, $6, $8 WHERE $7::text IS NOT NULL AND ",
            $when,
            "
  RETURNING id
)"
        )
    };
}

/// Two CTEs: `found`, the row of each key `i.event_key` of namespace $1 (expired or not)
/// read from `$from`, and `found_pending`, the rows of the pending batches those rows name
/// (present while a batch is unconfirmed). A statement joins them:
/// `found s LEFT JOIN found_pending p ON p.id = s.pending AND p.first_seen = s.first_seen`.
///
/// Each key is looked up through the primary key (`LATERAL … LIMIT 1` is never turned into
/// a join the planner could choose to run as a scan of the table, e.g. on statistics taken
/// while it was still small). The batches are read once per statement, not once per key
/// (issue 36): joined per key, the plan of the `event_pending` lookup followed that small,
/// churning table's statistics, and a count taken while a few batches were pending (70
/// rows, say) made it a hash join built again for every key — 14 ms per 1,000 keys
/// against 5, which slowed a replay pass round by round as the table was vacuumed.
///
/// `found`'s first column is the key (`s.event_key`) unless `$first` names another (the
/// lookup's `i.at`, the key's place in the array sent).
macro_rules! found_ctes {
    ($from:literal) => {
        found_ctes!("s.event_key", $from)
    };
    ($first:literal, $from:literal) => {
        concat!(
            "found AS MATERIALIZED (
  SELECT ",
            $first,
            ", s.fingerprint, s.decision, s.first_seen, s.expires_at, s.pending
  FROM ",
            $from,
            " CROSS JOIN LATERAL (
    SELECT s.event_key, s.fingerprint, s.decision, s.first_seen, s.expires_at, s.pending
    FROM event_keys s
    WHERE s.namespace = $1 AND s.event_key = i.event_key
    LIMIT 1
  ) s
), found_pending AS MATERIALIZED (
  SELECT p.id, p.first_seen, p.marker, p.deadline FROM event_pending p
  WHERE p.id IN (SELECT f.pending FROM found f)
)"
        )
    };
}

/// `found_ctes!`'s two tables joined: a key's row (`s`) and its unconfirmed batch (`p`).
macro_rules! found_join {
    () => {
        "found s LEFT JOIN found_pending p ON p.id = s.pending AND p.first_seen = s.first_seen"
    };
}

/// In one statement: reads the stored rows of keys unexpired at $6, and marks the first
/// occurrence of each other key (absent, or expired: the upsert's WHERE). A stored key is
/// never sent to the upsert: `ON CONFLICT DO UPDATE` locks the row it conflicts with even
/// when its WHERE is false, a write (and WAL) per replayed key. `found` is false for a key
/// that neither was marked nor is visible to the statement's snapshot (a concurrent batch
/// committed it meanwhile): read again with [`EVENTS_READ_SQL`]. Keys are inserted in the
/// order they were sent (byte order), whatever the plan. A key is expired when its expiry
/// or its unconfirmed batch's deadline has passed; a key of an unconfirmed batch reads as
/// that batch's marker.
pub(super) const EVENTS_MARK_SQL: &str = concat!(
    "WITH input AS (
  SELECT * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::timestamptz[])
    WITH ORDINALITY AS i(event_key, fingerprint, decision, expires_at, n)
), ",
    found_ctes!("input i"),
    ", stored AS (
  SELECT s.event_key, s.fingerprint, COALESCE(p.marker, s.decision::text) AS decision,
         s.first_seen
  FROM ",
    found_join!(),
    "
  WHERE (s.expires_at IS NULL OR s.expires_at > $6) AND (p.deadline IS NULL OR p.deadline > $6)
), ",
    batch_cte!(
        "(SELECT count(DISTINCT s.event_key) FROM stored s)
    < (SELECT count(DISTINCT i.event_key) FROM input i)"
    ),
    ", marked AS (
  INSERT INTO event_keys AS e
    (namespace, event_key, first_seen, fingerprint, decision, expires_at, pending)
  SELECT $1, event_key, $6, fingerprint, decision::jsonb, expires_at, (SELECT id FROM batch)
  FROM input i
  WHERE NOT EXISTS (SELECT 1 FROM stored s WHERE s.event_key = i.event_key)
  ORDER BY i.n
  ON CONFLICT (namespace, event_key) DO UPDATE SET
    first_seen = EXCLUDED.first_seen, fingerprint = EXCLUDED.fingerprint,
    decision = EXCLUDED.decision, expires_at = EXCLUDED.expires_at, pending = EXCLUDED.pending
  WHERE e.expires_at <= $6
     OR EXISTS (SELECT 1 FROM event_pending d
                WHERE d.id = e.pending AND d.first_seen = e.first_seen AND d.deadline <= $6)
  RETURNING e.event_key
)
SELECT i.event_key, m.event_key IS NOT NULL AS new, s.event_key IS NOT NULL AS found,
       s.fingerprint, s.decision, s.first_seen
FROM input i
LEFT JOIN marked m ON m.event_key = i.event_key
LEFT JOIN stored s ON s.event_key = i.event_key"
);

/// The first try of a batch without a cursor, in one statement: looks up the row of every
/// key ($2, in byte order) through the primary key, expired or not, and when none has
/// expired inserts every key it did not find, with a plain `INSERT` in the order sent.
/// [`EVENTS_MARK_SQL`]'s `ON CONFLICT` costs a speculative insertion per row (an index probe
/// before the insert and a WAL record to confirm it after) and one result row per key; this
/// returns one row (how many it inserted) and the stored rows. A key whose row another
/// transaction commits meanwhile fails the insert (unique violation, 23505) and the whole
/// statement with it, and a found row that has expired needs the upsert's take-over: both
/// are left to [`EVENTS_MARK_SQL`], this having written nothing.
pub(super) const EVENTS_INSERT_SQL: &str = concat!(
    "WITH input AS (
  SELECT * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::timestamptz[])
    WITH ORDINALITY AS i(event_key, fingerprint, decision, expires_at, n)
), ",
    found_ctes!("input i"),
    ", existing AS (
  SELECT s.event_key, s.fingerprint, COALESCE(p.marker, s.decision::text) AS decision,
         s.first_seen, (s.expires_at <= $6 OR p.deadline <= $6) AS expired
  FROM ",
    found_join!(),
    "
), ",
    batch_cte!(
        "NOT EXISTS (SELECT 1 FROM existing x WHERE x.expired)
    AND (SELECT count(DISTINCT x.event_key) FROM existing x)
      < (SELECT count(DISTINCT i.event_key) FROM input i)"
    ),
    ", inserted AS (
  INSERT INTO event_keys
    (namespace, event_key, first_seen, fingerprint, decision, expires_at, pending)
  SELECT $1, event_key, $6, fingerprint, decision::jsonb, expires_at, (SELECT id FROM batch)
  FROM input i
  WHERE NOT EXISTS (SELECT 1 FROM existing x WHERE x.event_key = i.event_key)
    AND NOT EXISTS (SELECT 1 FROM existing x WHERE x.expired)
  ORDER BY i.n
  RETURNING 1
)
SELECT (SELECT count(*) FROM inserted) AS inserted, x.event_key, x.fingerprint,
       x.decision, x.first_seen, x.expired
FROM (SELECT 1) AS one LEFT JOIN existing x ON true"
);

/// The stored rows of keys $2 (expired at $3 or not), looked up one key at a time through
/// the primary key (as in [`EVENTS_MARK_SQL`]): the first try of a batch when a batch of
/// the same stream found every key stored. A read, so nothing to write when every key is
/// found unexpired; otherwise the batch goes to [`EVENTS_INSERT_SQL`]. `expired` is NULL
/// for a key that never expires.
///
/// The keys are sent as the batch has them, repeats included, and each row says which
/// one it is by its place in $2 (`at`, from 1) rather than by the key: a replayed batch
/// is read back without a string per key to decode, hash and match (issue 36: reading the
/// keys back was a fifth of a replay's client CPU). A key found has exactly one row, so a
/// batch whose keys are all stored reads back one row per key sent.
pub(super) const EVENTS_LOOKUP_SQL: &str = concat!(
    "WITH ",
    found_ctes!(
        "i.at",
        "UNNEST($2::text[]) WITH ORDINALITY AS i(event_key, at)"
    ),
    "
SELECT s.at, s.fingerprint, COALESCE(p.marker, s.decision::text) AS decision,
       s.first_seen, (s.expires_at <= $3 OR p.deadline <= $3) AS expired
FROM ",
    found_join!()
);

/// Deletes the rows of keys $2 (only those first seen at $3, unless $3 is NULL), locking
/// them first in key order (`FOR UPDATE` under `ORDER BY`; `event_key` compares as bytes,
/// migration 0006): the order every mark locks its keys in, so a delete and a batch
/// taking over expired keys wait for each other instead of deadlocking. A row another
/// batch took over meanwhile (a new first-seen time) is re-checked under its lock and
/// stays.
pub(super) const EVENTS_FORGET_SQL: &str = "\
DELETE FROM event_keys e USING (
  SELECT event_key FROM event_keys
  WHERE namespace = $1 AND event_key = ANY($2::text[])
    AND ($3::timestamptz IS NULL OR first_seen = $3)
  ORDER BY event_key
  FOR UPDATE
) l
WHERE e.namespace = $1 AND e.event_key = l.event_key
  AND ($3::timestamptz IS NULL OR e.first_seen = $3)";

/// The unexpired rows of keys $2, looked up one key at a time (as in
/// [`EVENTS_LOOKUP_SQL`]; `event_key = ANY($2)` let the planner scan the namespace).
pub(super) const EVENTS_READ_SQL: &str = concat!(
    "WITH ",
    found_ctes!("UNNEST($2::text[]) AS i(event_key)"),
    "
SELECT s.event_key, s.fingerprint, COALESCE(p.marker, s.decision::text) AS decision,
       s.first_seen
FROM ",
    found_join!(),
    "
WHERE (s.expires_at IS NULL OR s.expires_at > $3) AND (p.deadline IS NULL OR p.deadline > $3)"
);

/// Appends `text` to a `COPY … FROM STDIN` (text format) row: backslash, tab, newline and
/// carriage return escaped.
pub(super) fn copy_field(row: &mut String, text: &str) {
    if !text.contains(['\\', '\t', '\n', '\r']) {
        row.push_str(text);
        return;
    }
    for c in text.chars() {
        match c {
            '\\' => row.push_str("\\\\"),
            '\t' => row.push_str("\\t"),
            '\n' => row.push_str("\\n"),
            '\r' => row.push_str("\\r"),
            c => row.push(c),
        }
    }
}

/// Whether `e` says the connection could not be had or used (a connection exception, or
/// no error from the statement itself), rather than an answer to the statement.
pub(super) fn connection_refused(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d.code().is_some_and(|c| c.starts_with("08")),
        sqlx::Error::RowNotFound
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::TypeNotFound { .. } => false,
        _ => true,
    }
}

/// An instant as `COPY` text (microseconds, UTC).
pub(super) fn copy_instant(at: DateTime<Utc>) -> String {
    // The year unsigned and at least 4 digits: chrono's `%Y` signs years past 9999 (an
    // expiry saturated at the largest instant), which Postgres refuses.
    use chrono::Datelike;
    format!("{:04}{}", at.year(), at.format("-%m-%d %H:%M:%S%.6f+00"))
}

/// The `COPY` text of a batch's keys (`firsts`, in byte order), marked at `now` for
/// pending batch `pending` (or none).
pub(super) fn copy_rows(
    namespace: &str,
    firsts: &[&EventMark],
    decisions: &[Option<String>],
    expiries: &[Option<DateTime<Utc>>],
    now: DateTime<Utc>,
    pending: Option<i64>,
) -> String {
    let mut head = String::with_capacity(namespace.len() + 1);
    copy_field(&mut head, namespace);
    head.push('\t');
    let mut tail = String::from("\t");
    tail.push_str(&copy_instant(now));
    tail.push('\t');
    let pending = pending.map_or_else(|| "\\N".to_string(), |id| id.to_string());
    let mut out = String::with_capacity(firsts.len() * (head.len() + 120));
    let mut last_expiry: Option<(DateTime<Utc>, String)> = None;
    for ((m, decision), expiry) in firsts.iter().zip(decisions).zip(expiries) {
        out.push_str(&head);
        copy_field(&mut out, &m.key);
        out.push_str(&tail);
        match &m.fingerprint {
            Some(f) => copy_field(&mut out, f),
            None => out.push_str("\\N"),
        }
        out.push('\t');
        match decision {
            Some(d) => copy_field(&mut out, d),
            None => out.push_str("\\N"),
        }
        out.push('\t');
        match expiry {
            Some(at) => {
                if last_expiry.as_ref().is_none_or(|(t, _)| t != at) {
                    last_expiry = Some((*at, copy_instant(*at)));
                }
                out.push_str(&last_expiry.as_ref().expect("set above").1);
            }
            None => out.push_str("\\N"),
        }
        out.push('\t');
        out.push_str(&pending);
        out.push('\n');
    }
    out
}

/// A stored event key as the reads return it ([`EVENTS_READ_SQL`], [`EVENTS_LOOKUP_SQL`],
/// and the found rows of [`EVENTS_INSERT_SQL`] and [`EVENTS_MARK_SQL`]).
pub(super) struct StoredEvent {
    /// `event_key`.
    pub(super) key: String,
    /// `fingerprint`.
    pub(super) fingerprint: Option<String>,
    /// `decision`: the pending batch's marker while the key is pending.
    pub(super) decision: Option<String>,
    /// `first_seen`.
    pub(super) first_seen: DateTime<Utc>,
}

/// The columns [`StoredEvent::read`] takes, in the order [`EVENTS_READ_SQL`] selects
/// them.
const STORED_COLUMNS: [&str; 4] = ["event_key", "fingerprint", "decision", "first_seen"];

/// Whether `row`'s first columns are named `names`, in that order (rows read by position
/// check their names in debug builds).
fn columns_start_with(row: &sqlx::postgres::PgRow, names: &[&str]) -> bool {
    names.len() <= row.columns().len()
        && names
            .iter()
            .zip(row.columns())
            .all(|(want, got)| *want == got.name())
}

impl StoredEvent {
    /// A row whose first columns are [`STORED_COLUMNS`], read by position: a replayed
    /// batch reads a row per key, and by name each column is a hash lookup of its own
    /// (issue 36: 3% of the replay pass's client CPU, about 4% of its time). Debug builds
    /// (the tests) check the names.
    fn read(row: &sqlx::postgres::PgRow) -> std::result::Result<Self, sqlx::Error> {
        debug_assert!(
            columns_start_with(row, &STORED_COLUMNS),
            "a stored event's columns are {STORED_COLUMNS:?} first, in that order"
        );
        Ok(StoredEvent {
            key: row.try_get(0)?,
            fingerprint: row.try_get(1)?,
            decision: row.try_get(2)?,
            first_seen: row.try_get(3)?,
        })
    }

    /// The row's stored key, when it has one: `key` and `first_seen` read already (both
    /// `None` on a row that found nothing), the rest read here.
    fn found(
        row: &sqlx::postgres::PgRow,
        key: Option<String>,
        first_seen: Option<DateTime<Utc>>,
    ) -> std::result::Result<Option<Self>, sqlx::Error> {
        let (Some(key), Some(first_seen)) = (key, first_seen) else {
            return Ok(None);
        };
        Ok(Some(StoredEvent {
            key,
            fingerprint: row.try_get("fingerprint")?,
            decision: row.try_get("decision")?,
            first_seen,
        }))
    }

    /// Into the batch's findings.
    pub(super) fn into_found(self, found: &mut Found) {
        found.stored(self.key, self.fingerprint, self.decision, self.first_seen);
    }
}

impl FromRow<'_, sqlx::postgres::PgRow> for StoredEvent {
    fn from_row(row: &sqlx::postgres::PgRow) -> std::result::Result<Self, sqlx::Error> {
        StoredEvent::read(row)
    }
}

/// The columns of [`EVENTS_LOOKUP_SQL`], in order.
const LOOKUP_COLUMNS: [&str; 5] = ["at", "fingerprint", "decision", "first_seen", "expired"];

/// The verdicts of `marks` from the rows [`EVENTS_LOOKUP_SQL`] read for their keys, sent
/// in the marks' order (repeats included); `None` when a key has no row (it is absent) or
/// its mark or its pending batch has expired. Each row is read by position and judged
/// where it lies ([`event_keys::against_parts`]): nothing per key is copied out but a
/// conflict's stored fingerprint and a replay's decision. Every key is stored, so a
/// repeated key is judged by its stored row like its first occurrence (as
/// [`Found::verdicts`] would: an earlier occurrence that is not new leaves the row as it
/// was).
pub(super) fn looked_up(
    marks: &[EventMark],
    rows: &[sqlx::postgres::PgRow],
) -> std::result::Result<Option<Vec<EventVerdict>>, sqlx::Error> {
    if rows.len() < marks.len() {
        return Ok(None);
    }
    let mut verdicts: Vec<Option<EventVerdict>> = marks.iter().map(|_| None).collect();
    for row in rows {
        debug_assert!(
            columns_start_with(row, &LOOKUP_COLUMNS),
            "the lookup's columns are {LOOKUP_COLUMNS:?}, in that order"
        );
        if row.try_get::<Option<bool>, _>(4)? == Some(true) {
            return Ok(None);
        }
        let at: i64 = row.try_get(0)?;
        let Some((slot, mark)) = usize::try_from(at)
            .ok()
            .and_then(|at| at.checked_sub(1))
            .and_then(|i| verdicts.get_mut(i).zip(marks.get(i)))
        else {
            return Err(sqlx::Error::Protocol(format!(
                "the event-key lookup answered for key {at} of {}",
                marks.len()
            )));
        };
        let decision: Option<&str> = row.try_get(2)?;
        *slot = Some(event_keys::against_parts(
            row.try_get(1)?,
            || event_keys::parse_decision(decision),
            row.try_get(3)?,
            mark.fingerprint.as_deref(),
        ));
    }
    Ok(verdicts.into_iter().collect())
}

/// A row of [`EVENTS_INSERT_SQL`]: how many keys it inserted (the same on every row), and a
/// stored key it found (`None` when it found none: the one row then only counts).
pub(super) struct Inserted {
    pub(super) inserted: i64,
    pub(super) found: Option<StoredEvent>,
    pub(super) expired: Option<bool>,
}

impl FromRow<'_, sqlx::postgres::PgRow> for Inserted {
    fn from_row(row: &sqlx::postgres::PgRow) -> std::result::Result<Self, sqlx::Error> {
        Ok(Inserted {
            inserted: row.try_get("inserted")?,
            found: StoredEvent::found(row, row.try_get("event_key")?, row.try_get("first_seen")?)?,
            expired: row.try_get("expired")?,
        })
    }
}

/// A row of a statement carrying confirmations (`riding!`): what its own part did, and
/// one confirmation's batch whose row it deleted (none: `None`).
pub(super) struct Carried {
    pub(super) moved: bool,
    pub(super) gone: Option<(String, String)>,
}

impl FromRow<'_, sqlx::postgres::PgRow> for Carried {
    fn from_row(row: &sqlx::postgres::PgRow) -> std::result::Result<Self, sqlx::Error> {
        let namespace: Option<String> = row.try_get("namespace")?;
        let marker: Option<String> = row.try_get("marker")?;
        Ok(Carried {
            moved: row.try_get("moved")?,
            gone: namespace.zip(marker),
        })
    }
}

/// A row of [`EVENTS_MARK_SQL`], one per key sent: `new` when this statement marked it;
/// else the row it found (`None`: committed by another batch after this statement's
/// snapshot, so neither marked nor seen).
pub(super) struct Marked {
    pub(super) key: String,
    pub(super) new: bool,
    pub(super) found: Option<StoredEvent>,
}

impl FromRow<'_, sqlx::postgres::PgRow> for Marked {
    fn from_row(row: &sqlx::postgres::PgRow) -> std::result::Result<Self, sqlx::Error> {
        let key: String = row.try_get("event_key")?;
        let present: bool = row.try_get("found")?;
        let found = StoredEvent::found(
            row,
            present.then(|| key.clone()),
            row.try_get("first_seen")?,
        )?;
        Ok(Marked {
            key,
            new: row.try_get("new")?,
            found,
        })
    }
}

impl PostgresStore {
    /// [`EVENTS_FORGET_SQL`]: deletes the rows of `keys` (first seen at `first_seen`, if
    /// given); how many went.
    pub(super) async fn delete_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        first_seen: Option<DateTime<Utc>>,
    ) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(EVENTS_FORGET_SQL)
            .bind(namespace)
            .bind(keys)
            .bind(first_seen)
            .execute(&mut self.conn().await?)
            .await
            .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }

    pub(super) async fn read_events(
        &self,
        namespace: &str,
        keys: &[&str],
        now: DateTime<Utc>,
    ) -> Result<Vec<StoredEvent>> {
        sqlx::query_as(EVENTS_READ_SQL)
            .bind(namespace)
            .bind(keys)
            .bind(micros(now))
            .fetch_all(&mut self.conn().await?)
            .await
            .map_err(|e| self.err(e))
    }
}

/// Moves cursor ($1, $2) to position $3 (value $4) when $3 is after it.
pub(super) async fn advance(
    conn: &mut sqlx::PgConnection,
    namespace: &str,
    name: &str,
    to: &Cursor,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO event_cursors AS c (namespace, name, position, value, updated_at) \
         VALUES ($1, $2, $3, $4::jsonb, now()) \
         ON CONFLICT (namespace, name) DO UPDATE SET \
           position = EXCLUDED.position, value = EXCLUDED.value, updated_at = EXCLUDED.updated_at \
         WHERE c.position COLLATE \"C\" < EXCLUDED.position COLLATE \"C\"",
    )
    .bind(namespace)
    .bind(name)
    .bind(&to.position)
    .bind(to.value_text())
    .execute(conn)
    .await?;
    Ok(())
}

// The statements below commit without waiting for their WAL to be flushed: each joins
// `(SELECT set_config('synchronous_commit', 'off', true))`, a row source of one row
// evaluated once, whose setting lasts to the end of the transaction — for a statement
// sent alone, its own; behind a transaction pooler, the one the store's executor wraps it
// in — and the commit reads `synchronous_commit` then. A statement that writes nothing
// never evaluates it, and has no commit to wait for either.

/// A whole pending batch confirmed (namespace, marker): its rows deleted, asynchronously.
pub(super) const CONFIRM_BATCH_SQL: &str = "\
DELETE FROM event_pending p
USING (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
WHERE p.namespace = $1 AND p.marker = $2";

/// Some keys of a pending batch confirmed (namespace, marker, keys): those still naming
/// it stop naming it, asynchronously.
pub(super) const CONFIRM_KEYS_SQL: &str = "\
UPDATE event_keys e SET pending = NULL
FROM UNNEST($3::text[]) AS k(event_key), event_pending p,
     (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
WHERE p.namespace = $1 AND p.marker = $2
  AND e.namespace = $1 AND e.event_key = k.event_key
  AND e.pending = p.id AND e.first_seen = p.first_seen";

/// A pending batch's row (namespace, marker, first seen, deadline), first in the
/// transaction of its keys' `COPY`, which it makes commit asynchronously: a pending mark
/// is provisional as its confirmation is (lost to a server crash, its keys are reported
/// new again: at least once, never lost), and a batch marked ahead of its turn need not
/// wait for the flush of the one before it (migration 0012).
pub(super) const PENDING_ROW_SQL: &str = "\
INSERT INTO event_pending (namespace, marker, first_seen, deadline)
SELECT $1::text, $2::text, $3::timestamptz, $4::timestamptz
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
RETURNING id";

/// [`PENDING_ROW_SQL`] of a batch in a row (row, place as the lock's `int`): its
/// transaction holds the advisory lock (`hashtext(row)`, place) to its end, which the
/// batch after it, asked ahead, waits for ([`TURN_AHEAD_SQL`]).
pub(super) const PENDING_ROW_HELD_SQL: &str = "\
INSERT INTO event_pending (namespace, marker, first_seen, deadline)
SELECT $1::text, $2::text, $3::timestamptz, $4::timestamptz
FROM (SELECT set_config('synchronous_commit', 'off', true),
             pg_advisory_xact_lock(hashtext($5::text), $6::int)) AS async_commit_held
RETURNING id";

/// A batch marked ahead of its turn (row, place, now, place before as the lock's `int`):
/// its row's last place moved to its own, from the one just before it only, once the
/// transaction of the batch before it ended (`waited`: its lock, held from its first
/// statement, [`PENDING_ROW_HELD_SQL`]). `cur` reads the row's place locked `FOR UPDATE`,
/// which reads the newest committed version whatever this statement's snapshot holds (so
/// the wait and the move are one round trip, not two); `moved` says whether it moved.
///
/// The waiting transaction holds its copied keys. Should that ever close a circle of waits
/// (its batch before it waiting on a key that another transaction holds, which waits on
/// one of this one's keys), the wait gives up first: its `lock_timeout` is half the
/// server's `deadlock_timeout`, so the server never has to pick a victim, and the batch
/// asked ahead, refused (`lock_not_available`), writes nothing and goes down its turn.
macro_rules! ahead {
    () => {
        "cur AS (
  SELECT t.place FROM event_turns t,
    (SELECT pg_advisory_xact_lock_shared(hashtext($1::text), $4::int)
     FROM (SELECT set_config('lock_timeout',
             (extract(epoch FROM current_setting('deadlock_timeout')::interval) * 500)::bigint::text,
             true)) AS bounded) AS waited
  WHERE t.row_id = $1 FOR UPDATE OF t
), part AS (
  UPDATE event_turns t SET place = $2, marked_at = $3 FROM cur
  WHERE t.row_id = $1 AND cur.place = $2 - 1 RETURNING 1
)"
    };
}

/// [`ahead!`] alone: one row, `moved`.
pub(super) const TURN_AHEAD_SQL: &str = concat!(
    "WITH ",
    ahead!(),
    "\nSELECT EXISTS (SELECT 1 FROM part) AS moved"
);

/// A batch marked in its turn (row, place, now): its place the row's last (never
/// backwards), asynchronously.
pub(super) const TURN_TAKEN_SQL: &str = "\
INSERT INTO event_turns (row_id, place, marked_at)
SELECT $1::text, $2::bigint, $3::timestamptz
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
ON CONFLICT (row_id) DO UPDATE
SET place = GREATEST(event_turns.place, EXCLUDED.place), marked_at = EXCLUDED.marked_at";

/// The rows of the whole-batch confirmations riding in a pending batch's transaction
/// (`riders::Riders`: their namespaces and markers, in pairs, as the two parameters
/// given) deleted by its last statement (`part`), which returns one row per row deleted
/// and at least one, with `moved`: what `part` did. A row another transaction holds
/// (cleanup deleting a dead batch, another confirmation of the same batch) is skipped, not
/// waited for: the carrier, which holds its own keys, never waits on it, and that
/// confirmation goes on its own. The transaction commits asynchronously already (its
/// pending row).
macro_rules! riding {
    ($namespaces:literal, $markers:literal, $part:expr) => {
        concat!(
            "WITH riders AS (
  SELECT p.id FROM event_pending p
  JOIN UNNEST(",
            $namespaces,
            "::text[], ",
            $markers,
            "::text[]) AS r(namespace, marker)
    ON p.namespace = r.namespace AND p.marker = r.marker
  FOR UPDATE OF p SKIP LOCKED
), gone AS (
  DELETE FROM event_pending p USING riders WHERE p.id = riders.id
  RETURNING p.namespace, p.marker
), ",
            $part,
            "
SELECT EXISTS (SELECT 1 FROM part) AS moved, gone.namespace, gone.marker
FROM (SELECT 1) AS one LEFT JOIN gone ON true"
        )
    };
}

/// [`TURN_AHEAD_SQL`] carrying confirmations (`$5`, `$6`; see `riding!`).
pub(super) const TURN_AHEAD_RIDING_SQL: &str = riding!("$5", "$6", ahead!());

/// [`TURN_TAKEN_SQL`] carrying confirmations (`$4`, `$5`; see `riding!`; `moved` always).
pub(super) const TURN_TAKEN_RIDING_SQL: &str = riding!(
    "$4",
    "$5",
    "part AS (
  INSERT INTO event_turns (row_id, place, marked_at)
  VALUES ($1::text, $2::bigint, $3::timestamptz)
  ON CONFLICT (row_id) DO UPDATE
  SET place = GREATEST(event_turns.place, EXCLUDED.place), marked_at = EXCLUDED.marked_at
  RETURNING 1
)"
);
