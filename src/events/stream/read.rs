//! Reading a batch: up to a batch of non-blank lines, each parsed (or not) and its event
//! marked, the cursor's position checked.

use std::io::BufRead;

use serde_json::Value;

use super::StreamCursor;
use crate::error::{Error, Result};
use crate::events::strategy::{EventGate, PreparedBatch};
use crate::store::Cursor;

/// One line of the batch being worked on.
pub(super) struct Pending {
    pub(super) number: u64,
    /// At or before the cursor: no store lookup.
    pub(super) before_cursor: bool,
    /// The line without its end of line (`\n`, `\r\n`) and surrounding blanks.
    pub(super) text: String,
    /// Why it is not an event, when parsing already says so.
    pub(super) error: Option<String>,
}

/// A batch read from the input: its lines, the marks of its events, and what it counts.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) pending: Vec<Pending>,
    pub(super) prepared: PreparedBatch,
    /// The greatest (timestamp, id) of its events after the cursor.
    pub(super) end: Option<Cursor>,
    /// Input lines read, blank ones included.
    pub(super) lines: u64,
    pub(super) blank: u64,
    /// The input ended in it.
    pub(super) eof: bool,
}

/// How much a batch may hold.
pub(super) struct Limits {
    /// Non-blank lines.
    pub(super) lines: usize,
    /// Bytes of one line (its end of line not counted).
    pub(super) line_bytes: usize,
    /// Bytes of the batch's lines together (at least one line's).
    pub(super) batch_bytes: usize,
}

/// What [`read_line`] found.
enum Line {
    /// The end of the input.
    End,
    /// A line, in the buffer.
    Read,
    /// A line longer than the limit, of this many bytes (its end of line included); the
    /// buffer holds none of it.
    TooLong(u64),
}

/// Reads the next line into `buf` (cleared first), its end of line included, unless it is
/// longer than `max` bytes: then it is read past without being kept.
fn read_line<R: BufRead>(input: &mut R, buf: &mut Vec<u8>, max: usize) -> std::io::Result<Line> {
    buf.clear();
    let mut total: u64 = 0;
    let mut too_long = false;
    loop {
        let available = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            break;
        }
        let (n, ended) = match memchr::memchr(b'\n', available) {
            Some(i) => (i + 1, true),
            None => (available.len(), false),
        };
        total += n as u64;
        // Kept while it may still fit: its end of line (`\n`, `\r\n`) is not counted.
        if !too_long && buf.len() + n <= max.saturating_add(2) {
            buf.extend_from_slice(&available[..n]);
        } else if !too_long {
            too_long = true;
            buf.clear();
            buf.shrink_to(max.min(1 << 16));
        }
        input.consume(n);
        if ended {
            break;
        }
    }
    let body = buf
        .strip_suffix(b"\n")
        .map(|b| b.strip_suffix(b"\r").unwrap_or(b))
        .unwrap_or(buf)
        .len();
    if !too_long && body > max {
        too_long = true;
        buf.clear();
    }
    Ok(match (total, too_long) {
        (0, _) => Line::End,
        (n, true) => Line::TooLong(n),
        (_, false) => Line::Read,
    })
}

/// Reads up to `limits.lines` non-blank lines (and about `limits.batch_bytes` bytes)
/// after line `read` and takes the marks of their events (parsing, key, fingerprint: the
/// CPU part of a batch). With a cursor, events at or before `position` are
/// `before_cursor`.
#[allow(clippy::too_many_arguments)]
pub(super) fn read_batch<R: BufRead>(
    gate: &EventGate,
    input: &mut R,
    input_name: &str,
    limits: &Limits,
    read: u64,
    cursor: Option<(&StreamCursor, Option<&Cursor>)>,
    ready: Option<&(dyn Fn() -> bool + Sync)>,
    buf: &mut Vec<u8>,
) -> Result<Batch> {
    let size = limits.lines;
    let mut batch = Batch {
        pending: Vec::with_capacity(size.min(1 << 16)),
        ..Batch::default()
    };
    let mut bytes = 0usize;
    while batch.pending.len() < size && bytes < limits.batch_bytes {
        if !batch.pending.is_empty() && ready.is_some_and(|ready| !ready()) {
            // The next line is not there yet: this batch goes now.
            break;
        }
        let line = read_line(input, buf, limits.line_bytes)
            .map_err(|e| Error::io("read", input_name, e))?;
        if let Line::End = line {
            batch.eof = true;
            break;
        }
        batch.lines += 1;
        let number = read + batch.lines;
        let bad = |error: String| Pending {
            number,
            before_cursor: false,
            text: String::new(),
            error: Some(error),
        };
        if let Line::TooLong(length) = line {
            batch.pending.push(bad(format!(
                "line {number}: {length} bytes, longer than the {} bytes a line may have \
                 (--max-line-bytes); not read",
                limits.line_bytes
            )));
            continue;
        }
        bytes += buf.len();
        let Ok(text) = std::str::from_utf8(buf) else {
            batch
                .pending
                .push(bad(format!("line {number}: not UTF-8 text")));
            continue;
        };
        let mut text = text.trim();
        if number == 1 {
            // A UTF-8 byte order mark (editors on Windows write one) is not part of line 1.
            text = text.trim_start_matches('\u{feff}').trim_start();
        }
        if text.is_empty() {
            batch.blank += 1;
            continue;
        }
        // Without a cursor, a flat event's mark comes from its text (no `Value` built);
        // any other line takes the parse below, which also names its problem.
        if cursor.is_none() && gate.prepare_line(&mut batch.prepared, text) {
            batch.pending.push(Pending {
                number,
                before_cursor: false,
                text: text.to_string(),
                error: None,
            });
            continue;
        }
        match crate::events::parse_event_line(text) {
            Ok(Value::Object(_)) if let Some(name) = crate::events::repeated_name(text) => {
                batch.pending.push(bad(format!(
                    "line {number}: the name {name:?} appears twice in one object (which \
                     value counts is not clear)"
                )));
            }
            Ok(event @ Value::Object(_)) => {
                let mut line = Pending {
                    number,
                    before_cursor: false,
                    text: text.to_string(),
                    error: None,
                };
                if let Some((c, position)) = cursor {
                    match Cursor::of_event(&event, &c.timestamp_field, &c.id_field) {
                        Err(e) => line.error = Some(format!("line {number}: {e}")),
                        Ok(at) if position.is_some_and(|p| at <= *p) => {
                            line.before_cursor = true;
                        }
                        Ok(at) => {
                            if batch.end.as_ref().is_none_or(|end| *end < at) {
                                batch.end = Some(at);
                            }
                        }
                    }
                }
                if line.error.is_none() && !line.before_cursor {
                    gate.prepare_event(&mut batch.prepared, &event);
                }
                batch.pending.push(line);
            }
            Ok(other) => batch.pending.push(bad(format!(
                "line {number}: not a JSON object (found {})",
                crate::events::json_kind_of_raw(&other.to_string())
            ))),
            Err(e) => batch
                .pending
                .push(bad(format!("line {number}: not JSON: {e}"))),
        }
    }
    Ok(batch)
}
