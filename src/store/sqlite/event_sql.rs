//! Event keys on SQLite, the statements: marks and reads by the batch, a pending batch's
//! write in one trip, the confirmations that ride in it (`writer::Riders`).

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
pub(super) const DEAD: &str =
    "((event_keys.expires_at IS NOT NULL AND event_keys.expires_at <= ?) \
    OR (event_keys.pending IS NOT NULL AND EXISTS (SELECT 1 FROM event_pending p \
        WHERE p.id = event_keys.pending AND p.deadline <= ?)))";

/// Whether `e` is an all-or-nothing insert ([`events_mark_sql`]) refusing a batch because
/// one of its keys is stored and unexpired.
pub(super) fn refused(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.kind() == sqlx::error::ErrorKind::NotNullViolation)
}

/// The text of a batch's statement: shared, built once per shape ([`cached`]).
pub(super) type Sql = std::sync::Arc<str>;

/// A statement's shape: what it does, how many keys, its two flags.
type Shape = (&'static str, usize, bool, bool);

/// Statement texts by shape, built once each and kept: a batch's statements are
/// kilobytes of text (a `(?,?,?,?)` per key), which every batch built again, and a
/// process asks for a handful of shapes (one per chunk size). Bounded all the same: past
/// `kept`, the oldest goes.
struct Shapes {
    built: std::sync::Mutex<std::collections::VecDeque<(Shape, Sql)>>,
    kept: usize,
}

impl Shapes {
    const fn new(kept: usize) -> Self {
        Shapes {
            built: std::sync::Mutex::new(std::collections::VecDeque::new()),
            kept,
        }
    }

    /// The text of `shape`, built by `build` when not kept.
    fn get(&self, shape: Shape, build: impl FnOnce() -> String) -> Sql {
        let built = || {
            self.built
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if let Some((_, sql)) = built().iter().find(|(s, _)| *s == shape) {
            return sql.clone();
        }
        // Built without the lock: a shape may be built of others (`pending_write_sql`).
        let sql: Sql = build().into();
        let mut built = built();
        if !built.iter().any(|(s, _)| *s == shape) {
            if built.len() >= self.kept {
                built.pop_front();
            }
            built.push_back((shape, sql.clone()));
        }
        sql
    }
}

/// The process's statement texts ([`Shapes`]); a forked child keeps its own
/// ([`PerProcess`](crate::per_process::PerProcess): a thread of the parent could hold the
/// lock at the instant of the fork).
fn cached(shape: Shape, build: impl FnOnce() -> String) -> Sql {
    static SHAPES: crate::per_process::PerProcess<Shapes> =
        crate::per_process::PerProcess::new(|| Shapes::new(32));
    SHAPES.get().get(shape, build)
}

/// The statements marking `n` keys, one per chunk of [`EVENT_CHUNK`] (`pending`: for a
/// pending batch).
pub(super) fn mark_sqls(n: usize, all_or_nothing: bool, pending: bool) -> Vec<Sql> {
    (0..n)
        .step_by(EVENT_CHUNK)
        .map(|start| {
            let rows = (n - start).min(EVENT_CHUNK);
            cached(("mark", rows, all_or_nothing, pending), || {
                events_mark_sql(rows, all_or_nothing, pending)
            })
        })
        .collect()
}

/// The statements reading `n` keys, one per chunk of [`EVENT_CHUNK`].
pub(super) fn read_sqls(n: usize) -> Vec<Sql> {
    (0..n)
        .step_by(EVENT_CHUNK)
        .map(|start| {
            let rows = (n - start).min(EVENT_CHUNK);
            cached(("read", rows, false, false), || events_read_batch_sql(rows))
        })
        .collect()
}

/// A bound [`events_read_batch_sql`].
pub(super) type ReadQuery<'q> =
    sqlx::query::QueryScalar<'q, sqlx::Sqlite, String, sqlx::sqlite::SqliteArguments<'q>>;

/// `sqls` ([`read_sqls`] of `marks.len()`) bound to the keys of `marks` of `namespace` at
/// `now`.
pub(super) fn read_queries<'q>(
    sqls: &'q [Sql],
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
    sqls: &'q [Sql],
    marks: &[&'q EventMark],
    namespace: &'q str,
    now: DateTime<Utc>,
    pending: Option<&'q str>,
) -> Vec<SqliteQuery<'q>> {
    sqls.iter()
        .zip(marks.chunks(EVENT_CHUNK))
        .map(|(sql, chunk)| bind_marks(sqlx::query(sql), chunk, namespace, now, pending))
        .collect()
}

/// A query of `sqlx::query`.
pub(super) type SqliteQuery<'q> =
    sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

/// `query`'s next statement, an [`events_mark_sql`] of `chunk.len()` keys, bound (see
/// [`mark_queries`]).
pub(super) fn bind_marks<'q>(
    query: SqliteQuery<'q>,
    chunk: &[&'q EventMark],
    namespace: &'q str,
    now: DateTime<Utc>,
    pending: Option<&'q str>,
) -> SqliteQuery<'q> {
    let mut query = query.bind(namespace).bind(ts(now));
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
}

/// Deletes the rows of the pending batches `?` names (a JSON array of `[namespace,
/// marker]`), returning those it found: one statement for every confirmation riding in a
/// transaction, or for those a confirmation writes itself.
pub(super) const RIDERS_DELETE_SQL: &str =
    "DELETE FROM event_pending WHERE (namespace, marker) IN \
    (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?)) \
    RETURNING namespace, marker";

/// The row of a pending batch (namespace, marker, marked at, deadline: anonymous `?`, so
/// it can stand in a string of statements).
pub(super) const PENDING_INSERT_SQL: &str =
    "INSERT INTO event_pending (namespace, marker, first_seen, deadline) VALUES (?, ?, ?, ?)";

/// The whole write of a pending batch whose keys are fresh, as one string of statements
/// that goes to SQLite's worker thread in one trip (sqlx runs a string's statements one
/// after the other, binding its anonymous parameters in order): `BEGIN IMMEDIATE`, the
/// rows of the confirmations riding in it deleted (`riders`), the batch's row, its `n`
/// keys chunk by chunk all-or-nothing, `COMMIT`. Each trip is two thread hand-offs, and
/// a transaction of separate statements was five trips to marks off's one (issue 36).
/// A statement that fails leaves the transaction open: [`write_in_one_trip`] rolls it
/// back.
pub(super) fn pending_write_sql(n: usize, riders: bool) -> Sql {
    cached(("pending write", n, riders, false), || {
        let mut sql = String::from("BEGIN IMMEDIATE;\n");
        if riders {
            sql.push_str(RIDERS_DELETE_SQL);
            sql.push_str(";\n");
        }
        sql.push_str(PENDING_INSERT_SQL);
        sql.push_str(";\n");
        for statement in mark_sqls(n, true, true) {
            sql.push_str(&statement);
            sql.push_str(";\n");
        }
        sql.push_str("COMMIT");
        sql
    })
}

/// Runs a string of statements from `BEGIN` to `COMMIT` ([`pending_write_sql`]) on a
/// pooled connection and returns the rows they returned; when one fails, rolls the
/// transaction back and returns its error. The connection goes back to the pool only
/// outside a transaction: when the rollback fails too, or when this call is dropped
/// midway (its caller cancelled), it is closed instead (SQLite rolls back on close), since
/// sqlx does not know of a transaction begun by a statement of the string.
pub(super) async fn write_in_one_trip(
    conn: sqlx::pool::PoolConnection<sqlx::Sqlite>,
    query: SqliteQuery<'_>,
) -> std::result::Result<Vec<sqlx::sqlite::SqliteRow>, sqlx::Error> {
    let mut open = InTransaction(Some(conn));
    let Some(conn) = open.0.as_mut() else {
        return Err(sqlx::Error::PoolClosed);
    };
    match query.fetch_all(&mut **conn).await {
        Ok(rows) => {
            open.0.take();
            Ok(rows)
        }
        Err(e) => {
            // `BEGIN` itself may be what failed (busy): then there is nothing to roll back
            // and SQLite says so, which costs only the connection.
            if sqlx::query("ROLLBACK").execute(&mut **conn).await.is_ok() {
                open.0.take();
            }
            Err(e)
        }
    }
}

/// A pooled connection that may be inside a transaction sqlx does not know of: closed, not
/// given back to the pool, when dropped still holding it ([`write_in_one_trip`]).
struct InTransaction(Option<sqlx::pool::PoolConnection<sqlx::Sqlite>>);

impl Drop for InTransaction {
    fn drop(&mut self) {
        if let Some(conn) = self.0.as_mut() {
            conn.close_on_drop();
        }
    }
}

/// Inserts the row of a pending batch marked at `now` (its marker and deadline), which the
/// batch's keys then name ([`events_mark_sql`], in the same transaction).
pub(super) async fn insert_pending(
    conn: &mut SqliteConnection,
    namespace: &str,
    (marker, deadline): (&str, DateTime<Utc>),
    now: DateTime<Utc>,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(PENDING_INSERT_SQL)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A shape's text is built once and shared, the oldest forgotten past the bound; a
    /// shape built of others (a pending batch's whole write, of its chunks' statements)
    /// is built, not waited for.
    #[test]
    fn a_statement_shape_is_built_once_and_the_oldest_goes() {
        let shapes = Shapes::new(2);
        let built = std::cell::Cell::new(0);
        let get = |n: usize| {
            shapes.get(("test", n, false, false), || {
                built.set(built.get() + 1);
                format!("shape {n}")
            })
        };
        let one = get(1);
        assert!(Sql::ptr_eq(&one, &get(1)));
        assert_eq!((&*one, built.get()), ("shape 1", 1));
        get(2);
        get(3);
        assert_eq!(built.get(), 3);
        assert_eq!(&*get(1), "shape 1", "built again once pushed out");
        assert_eq!(built.get(), 4);
        let nested = shapes.get(("outer", 0, false, false), || {
            format!("{} and {}", get(5), get(6))
        });
        assert_eq!(&*nested, "shape 5 and shape 6");
    }

    /// A whole pending write is its chunks' statements between `BEGIN` and `COMMIT`.
    #[test]
    fn a_pending_write_holds_each_chunk_of_its_batch() {
        let n = EVENT_CHUNK + 7;
        let chunks = mark_sqls(n, true, true);
        assert_eq!(chunks.len(), 2, "a full chunk and a tail");
        assert_eq!(&*chunks[1], events_mark_sql(7, true, true));
        let expected = format!(
            "BEGIN IMMEDIATE;\n{RIDERS_DELETE_SQL};\n{PENDING_INSERT_SQL};\n{};\n{};\nCOMMIT",
            chunks[0], chunks[1]
        );
        assert_eq!(&*pending_write_sql(n, true), expected);
        assert!(
            !pending_write_sql(n, false).contains("DELETE"),
            "without riders"
        );
        assert_eq!(&*read_sqls(3)[0], events_read_batch_sql(3));
    }
}
