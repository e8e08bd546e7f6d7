//! A batch's call with a [`StreamCursor`]: batches one after the other, each advancing the
//! cursor with its marks.

use chrono::{DateTime, Utc};

use super::batches::Admitted;
use super::StreamCursor;
use crate::error::Result;
use crate::events::strategy::{EventGate, PreparedBatch};
use crate::store::Cursor;

/// Checks and marks a batch with a cursor. Batches go one after the other: which events
/// are before the cursor depends on where the previous batch left it. The cursor
/// advances to the batch's last (timestamp, id) with the marks (`position` then says
/// so); a store call that failed (a fallback) marked nothing and moved no cursor. With
/// pending marks the cursor moves only after the records are out: then the call's `now`
/// and where the cursor is to move are returned beside the admissions.
pub(super) async fn admit_at_cursor(
    gate: &EventGate,
    c: &StreamCursor,
    prepared: PreparedBatch,
    end: Option<Cursor>,
    position: &mut Option<Cursor>,
) -> Result<(Admitted, Option<DateTime<Utc>>, Option<(String, Cursor)>)> {
    let advance = end.as_ref().map(|end| (c.name.as_str(), end));
    let failures = advance.map(|_| gate.stats().store_errors);
    // Pending marks: the cursor moves after the records are out.
    let defer = gate.marks_pending();
    let now = Utc::now();
    let admitted = gate
        .admit(prepared, now, if defer { None } else { advance })
        .await?;
    let mut later = None;
    if failures.is_some_and(|before| gate.stats().store_errors == before) {
        if defer {
            later = end.clone().map(|end| (c.name.clone(), end));
        }
        *position = end;
    }
    Ok((admitted, defer.then_some(now), later))
}
