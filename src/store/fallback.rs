//! What a backend without a better way of its own does for a method of the store traits,
//! called explicitly from its implementation (the traits have no default methods).

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};

use super::{
    Claim, ClaimRequest, Cursor, EventKeyStore, EventMark, EventVerdict, KeyLookup, LeaseHolder,
    LeaseStore, LedgerStore, MaintenanceStore, PendingBatch, SkipOnHit,
};
use crate::model::KeyRecord;

/// A key to confirm with its real expiry (`None`: never), as
/// [`EventKeyStore::confirm_event_keys`] and [`EventKeyStore::confirm_pending_batch`]
/// take them.
pub type KeyExpiry = (String, Option<DateTime<Utc>>);

/// [`EventKeyStore::check_all_marked`] for a store that does not read ahead: never
/// `None`-free, so a gate sends every batch down its turn (BigQuery: a read is a billed
/// job, and its batches of replays are not worth one more).
pub fn never_all_marked() -> Result<Option<Vec<EventVerdict>>> {
    Ok(None)
}

/// [`EventKeyStore::check_and_mark_pending_ahead`] for a store that does not keep a row's
/// order itself: never marks ahead of a batch's turn.
pub fn never_ahead() -> Result<Option<Vec<EventVerdict>>> {
    Ok(None)
}

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

/// What [`LeaseStore::claim_and_find`] answers: the claim, and the keys read after it
/// (`None`: not read).
pub type ClaimAndKeys = (Claim, Option<Vec<Option<KeyRecord>>>);
/// What [`LedgerStore::find_keys_and_holder`] answers: the keys, and the lease holder
/// (`None`: not read).
pub type KeysAndHolder = (Vec<Option<KeyRecord>>, Option<Option<LeaseHolder>>);
/// What [`LedgerStore::find_keys_recording_skip`] answers: the keys, the holder, and
/// whether the skip was recorded.
pub type KeysHolderRecorded = (Vec<Option<KeyRecord>>, Option<Option<LeaseHolder>>, bool);

/// [`LeaseStore::claim_and_find`] as the claim alone: the keys are not read (`None`), the
/// caller reads them itself.
pub async fn claim_alone<S: LeaseStore + ?Sized>(
    store: &S,
    request: &ClaimRequest<'_>,
) -> Result<ClaimAndKeys> {
    Ok((store.claim(request).await?, None))
}

/// [`LedgerStore::find_keys_and_holder`] as [`LedgerStore::find_keys`] alone: the holder
/// is not read (`None`).
pub async fn keys_alone<S: LedgerStore + ?Sized>(
    store: &S,
    lookups: &[KeyLookup],
) -> Result<KeysAndHolder> {
    Ok((store.find_keys(lookups).await?, None))
}

/// [`LedgerStore::find_keys_recording_skip`] as the read alone (with the holder when
/// `peek`, as [`LedgerStore::find_keys_and_holder`] answers it): nothing recorded, so the
/// caller records the skip itself.
pub async fn read_without_recording<S: LedgerStore + ?Sized>(
    store: &S,
    lookups: &[KeyLookup],
    now: DateTime<Utc>,
    peek: bool,
    skip: &SkipOnHit,
) -> Result<KeysHolderRecorded> {
    if !peek {
        return Ok((store.find_keys(lookups).await?, None, false));
    }
    let (found, holder) = store
        .find_keys_and_holder(lookups, &skip.run.processor, &skip.run.scope, now)
        .await?;
    Ok((found, holder, false))
}

/// [`MaintenanceStore::set_partition_expiration`] on a store whose tables have no
/// partitions (its [`MaintenanceStore::partition_expiration`] answers `None`).
pub fn no_partitions<S: MaintenanceStore + ?Sized>(store: &S) -> Error {
    Error::input(format!(
        "partition expiration needs a BigQuery store; {} has no partitions",
        store.kind()
    ))
}
