//! A batch's marks prepared before its store call ([`PreparedBatch`]): the events or
//! lines read, their keys and fingerprints.

use super::*;

/// A batch's marks taken before its store call (keys, fingerprints, TTLs: the CPU part of
/// a check), made with [`EventGate::prepare`] or event by event with
/// [`EventGate::prepare_event`], and checked with [`EventGate::admit`].
#[derive(Debug, Default)]
pub struct PreparedBatch {
    pub(super) marks: Vec<EventMark>,
    /// Per event: its mark's index, or why it has none.
    pub(super) slots: Vec<std::result::Result<usize, InvalidEvent>>,
}

impl PreparedBatch {
    /// Events in the batch (valid or not).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the batch holds no event.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The keys its store call will check and mark (repeats included).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.marks.iter().map(|m| m.key.as_str())
    }
}

impl EventGate {
    /// The marks of `events` (see [`PreparedBatch`]).
    pub fn prepare(&self, events: &[Value]) -> PreparedBatch {
        let mut batch = PreparedBatch {
            marks: Vec::with_capacity(events.len()),
            slots: Vec::with_capacity(events.len()),
        };
        for event in events {
            self.prepare_event(&mut batch, event);
        }
        batch
    }

    /// Adds `event`'s mark (or the reason it has none) to `batch`.
    pub fn prepare_event(&self, batch: &mut PreparedBatch, event: &Value) {
        let position = batch.slots.len() + 1;
        let slot = match self.dedup.mark(event) {
            Ok(mark) => {
                batch.marks.push(mark);
                Ok(batch.marks.len() - 1)
            }
            Err(err) => Err(err.at(position)),
        };
        batch.slots.push(slot);
    }

    /// Adds the mark of the event on `line` (JSON text) to `batch` straight from the text,
    /// when the deduplicator's fields and the line's shape allow it (top-level key and
    /// fingerprint fields; a flat object of plain values): `false` when they do not, and
    /// the line must be parsed and given to [`prepare_event`](Self::prepare_event).
    pub fn prepare_line(&self, batch: &mut PreparedBatch, line: &str) -> bool {
        let Some(mark) = self.dedup.mark_line(line) else {
            return false;
        };
        batch.marks.push(mark);
        batch.slots.push(Ok(batch.marks.len() - 1));
        true
    }
}
