//! What a backend of [`EventKeyStore`] without a better way of its own does for a method,
//! called explicitly from its implementation (the trait has no default methods).

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};

use super::{Cursor, EventKeyStore, EventMark, EventVerdict, PendingBatch};

/// A key to confirm with its real expiry (`None`: never), as
/// [`EventKeyStore::confirm_event_keys`] and [`EventKeyStore::confirm_pending_batch`]
/// take them.
pub type KeyExpiry = (String, Option<DateTime<Utc>>);

/// [`EventKeyStore::mark_event_keys`] as [`EventKeyStore::check_and_mark`] of bare keys:
/// `true` for each key found new.
pub async fn mark_by_check<S: EventKeyStore + ?Sized>(
    store: &S,
    namespace: &str,
    keys: &[String],
    now: DateTime<Utc>,
) -> Result<Vec<bool>> {
    let marks: Vec<EventMark> = keys.iter().map(EventMark::key).collect();
    let verdicts = store.check_and_mark(namespace, &marks, now).await?;
    Ok(verdicts.iter().map(EventVerdict::is_new).collect())
}

/// [`EventKeyStore::check_and_mark_pending`] with the pending state on each key: the
/// batch's marker as its decision, the shorter of its TTL and the batch's timeout
/// ([`PendingBatch::per_key`]); the cursor advanced as
/// [`EventKeyStore::check_and_mark_advancing`] does.
pub async fn pending_per_key<S: EventKeyStore + ?Sized>(
    store: &S,
    namespace: &str,
    marks: &[EventMark],
    now: DateTime<Utc>,
    batch: PendingBatch<'_>,
    cursor: Option<(&str, &Cursor)>,
) -> Result<Vec<EventVerdict>> {
    let marks: Vec<EventMark> = marks.iter().map(|m| batch.per_key(m)).collect();
    match cursor {
        None => store.check_and_mark(namespace, &marks, now).await,
        Some((name, to)) => {
            store
                .check_and_mark_advancing(namespace, &marks, now, name, to)
                .await
        }
    }
}

/// [`EventKeyStore::confirm_pending_batch`] of a batch marked by [`pending_per_key`]:
/// [`EventKeyStore::confirm_event_keys`] with the marker as owner, whole or not.
pub async fn confirm_batch_per_key<S: EventKeyStore + ?Sized>(
    store: &S,
    namespace: &str,
    marker: &str,
    keys: &[(String, Option<DateTime<Utc>>)],
) -> Result<u64> {
    store.confirm_event_keys(namespace, keys, marker).await
}

/// [`EventKeyStore::check_and_mark_advancing`] as two calls: the marks, then, once they
/// returned, the cursor's advance (so the cursor never passes a key that is not marked).
pub async fn mark_then_advance<S: EventKeyStore + ?Sized>(
    store: &S,
    namespace: &str,
    marks: &[EventMark],
    now: DateTime<Utc>,
    cursor: &str,
    to: &Cursor,
) -> Result<Vec<EventVerdict>> {
    let verdicts = store.check_and_mark(namespace, marks, now).await?;
    store.advance_cursor(namespace, cursor, to).await?;
    Ok(verdicts)
}

/// The answer of a store that cannot do `operation` (e.g. "event cursors (--cursor)").
pub fn unsupported<S: EventKeyStore + ?Sized>(store: &S, operation: &'static str) -> Error {
    Error::Unsupported {
        store: store.kind(),
        operation,
    }
}
