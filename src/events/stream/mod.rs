//! The NDJSON gate as a stream (what `idem gate` runs): read a batch of lines, check and
//! mark the batch in one store round trip through an [`EventGate`], write one output
//! record per line, flush, repeat. The next batch is read while the store works, and on
//! stores that can ([`Capabilities::batch_concurrency`](crate::store::Capabilities::batch_concurrency))
//! several batch calls run at once on batches that share no key. Memory holds a few
//! batches, whatever the input's size.
//!
//! Output, one record per input line that is not blank (blank lines are skipped, but
//! counted, so `line` is always the line's true 1-based number in the input):
//!
//! * `line`: the input line number;
//! * `verdict`: `new`, `replay`, `conflict` or `invalid` (and `before_cursor`, see
//!   [`run_with_cursor`]);
//! * `key`: the event's key (`null` when invalid);
//! * `pass`: whether the event goes on (new, or anything under `log_only`);
//! * `event`: the input object, byte for byte — or, for `invalid`, `error` naming the line
//!   and the problem;
//! * `decision`: for a replay whose first processing recorded one;
//! * `verified`: `false` only for an event let through unverified because the store
//!   failed (`best_effort`/`log_only`).
//!
//! CSV has a header and the same columns (`line,verdict,key,pass,verified,event,error,
//! decision`; `event` and `decision` as JSON text), quoted as RFC 4180 says.
//!
//! A batch's records are written and flushed only after its store call returned, so a
//! crash never leaves a `new` in the output for a key the store did not record.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::Serialize;

use super::strategy::{EventGate, MarkTurn, Strategy};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::store::Cursor;

// Reading a batch, its call with a cursor, the batches in flight and writing their records
// each have a file; the public types and the loop that runs them are here.
mod batches;
mod cursor;
mod read;
#[cfg(test)]
mod tests;
mod write;

use batches::{take_back, Call, InFlight, KeySet};
use cursor::admit_at_cursor;
use read::{read_batch, Batch};
use write::{confirmed, Sink};

/// How the records are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// One JSON object a line.
    #[default]
    Ndjson,
    /// A header, then one row a line.
    Csv,
}

impl std::str::FromStr for OutputFormat {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "ndjson" | "json" | "jsonl" => Ok(OutputFormat::Ndjson),
            "csv" => Ok(OutputFormat::Csv),
            _ => Err(Error::input(format!(
                "unknown output format {s:?}: expected ndjson or csv"
            ))),
        }
    }
}

/// Counts of a stream so far.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct StreamSummary {
    /// Input lines read, blank ones included.
    pub lines: u64,
    /// Blank lines (skipped, no record).
    pub blank: u64,
    /// Records per verdict.
    pub new: u64,
    /// Replays.
    pub replay: u64,
    /// Conflicts.
    pub conflict: u64,
    /// Lines that were not a usable event.
    pub invalid: u64,
    /// Events at or before the cursor (`--cursor`): skipped without a store lookup.
    pub before_cursor: u64,
    /// New events let through without the store (a subset of `new`).
    pub unverified: u64,
    /// Whoever read the output went away (a closed pipe): the stream stopped there.
    pub output_closed: bool,
    /// The stream was told to stop ([`Stream::stop`], e.g. `SIGINT`): it read no further,
    /// and every batch it had read was marked and written. The reason.
    pub interrupted: Option<&'static str>,
    /// Time since the stream started.
    #[serde(skip)]
    pub elapsed: Duration,
    /// Where the cursor (`--cursor`) stands: after the last batch whose marks (and the
    /// cursor's advance) the store recorded.
    pub cursor: Option<Cursor>,
}

impl StreamSummary {
    /// Records written (lines that were not blank).
    pub fn records(&self) -> u64 {
        self.new + self.replay + self.conflict + self.invalid + self.before_cursor
    }

    /// Input lines per second.
    pub fn lines_per_second(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.lines as f64 / secs
        } else {
            0.0
        }
    }
}

/// Where lines come from and go to, named for messages.
pub struct Stream<'a, R, W> {
    /// The input.
    pub input: R,
    /// Its name (a path, `standard input`).
    pub input_name: &'a str,
    /// The output.
    pub output: W,
    /// Its name.
    pub output_name: &'a str,
    /// When cancelled, the stream reads no further: the batches already read are marked and
    /// written, then it ends with [`StreamSummary::interrupted`]. `None`: never.
    pub stop: Option<&'a Cancel>,
    /// Whether a whole next line can be read without waiting. When it says no, a batch
    /// that holds lines ends there, so lines that trickle in (a terminal, `tail -f`) are
    /// marked and written at once rather than held until a full batch came. `None`:
    /// batches are full until the input ends.
    pub ready: Option<&'a (dyn Fn() -> bool + Sync)>,
    /// The longest line taken, in bytes (its end of line not counted): a longer one is
    /// an `invalid` record naming its length, read past without being held in memory.
    /// [`DEFAULT_MAX_LINE_BYTES`] unless said otherwise.
    pub max_line_bytes: usize,
}

/// The longest line a gate takes by default: 4 MiB.
pub const DEFAULT_MAX_LINE_BYTES: usize = 4 << 20;

/// A batch ends once its lines hold this many bytes, whatever its count of lines, so a
/// batch of long lines weighs no more than one of short lines (memory holds a few).
pub const BATCH_BYTES: usize = 8 << 20;

/// A named cursor in front of the dedup set (seed 003): events at or before it in
/// (timestamp, id) order are skipped without a store lookup (`before_cursor`); after each
/// batch it advances to the batch's last (timestamp, id), in the same transaction as the
/// batch's marks where the store has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCursor {
    /// The cursor's name (in the gate's namespace).
    pub name: String,
    /// The event field holding the timestamp.
    pub timestamp_field: String,
    /// The event field holding the id that orders events of one timestamp.
    pub id_field: String,
}

/// Runs the gate over `stream` in batches of `batch` lines; `progress` is called after
/// each batch. Stops early (with `output_closed`) when the output's reader went away.
pub async fn run<R: BufRead, W: Write>(
    gate: &EventGate,
    stream: Stream<'_, R, W>,
    format: OutputFormat,
    batch: usize,
    progress: impl FnMut(&StreamSummary),
) -> Result<StreamSummary> {
    run_with_cursor(gate, stream, format, batch, None, progress).await
}

/// [`run`] with a [`StreamCursor`] (`None`: none). The cursor is read once at the start;
/// a store that has no cursors fails here, before any line is read.
///
/// Without a cursor, the next batch is read and prepared while the store works on the
/// current one (its call runs as a task of its own, so on a multi-threaded runtime the two
/// overlap), and up to [`EventGate::batch_concurrency`] calls run at once on batches that
/// share no key (one while the breaker is not closed); records are written in input
/// order, each batch's only after its own store call returned. Batches whose calls ran but
/// whose records are not written (the output closed, an earlier call failed) have the keys
/// they marked new forgotten again. With a cursor, batches go one after the other: which
/// events are before the cursor depends on where the previous batch left it.
pub async fn run_with_cursor<R: BufRead, W: Write>(
    gate: &EventGate,
    stream: Stream<'_, R, W>,
    format: OutputFormat,
    batch: usize,
    cursor: Option<&StreamCursor>,
    mut progress: impl FnMut(&StreamSummary),
) -> Result<StreamSummary> {
    let Stream {
        mut input,
        input_name,
        mut output,
        output_name,
        stop,
        ready,
        max_line_bytes,
    } = stream;
    let limits = read::Limits {
        lines: batch.max(1),
        line_bytes: max_line_bytes.max(1),
        batch_bytes: BATCH_BYTES.max(max_line_bytes),
    };
    let started = Instant::now();
    let mut summary = StreamSummary::default();
    if let Some(c) = cursor {
        summary.cursor = gate.cursor(&c.name).await?;
    }
    let log_only = gate.strategy() == Strategy::LogOnly;
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 12);
    let mut record = Vec::with_capacity(1 << 16);
    if format == OutputFormat::Csv && write_csv_header(&mut output, output_name)? {
        summary.output_closed = true;
        return Ok(summary);
    }
    let mut sink = Sink {
        gate,
        output: &mut output,
        output_name,
        record: &mut record,
        format,
        log_only,
        started,
        confirming: VecDeque::new(),
    };
    let mut read: u64 = 0;
    let mut next = {
        let position = cursor.map(|c| (c, summary.cursor.as_ref()));
        read_batch(
            gate, &mut input, input_name, &limits, 0, position, ready, &mut buf,
        )?
    };
    read += next.lines;
    // Batches whose store call was made and whose records are not written yet, oldest
    // first. Without a cursor, up to `window` calls run at once, on batches that share no
    // key (a key's verdicts come in input order); records are written oldest first.
    let concurrency = gate.batch_concurrency();
    let mut in_flight: VecDeque<InFlight> = VecDeque::new();
    // Batches in flight mark their keys in input order (see `MarkTurn`).
    // A signal also ends the waits of batches on keys pending for another gate (they
    // fail, and the stream stops there): otherwise the batches read already could be
    // held until the other gate's marks expire.
    let mut turns = match stop {
        Some(stop) => MarkTurn::row().interrupted_by(stop.token()),
        None => MarkTurn::row(),
    };
    let mut read_error: Option<Error> = None;
    let outcome: Result<()> = async {
        loop {
            let Batch {
                pending,
                prepared,
                end,
                lines,
                blank,
                eof,
            } = std::mem::take(&mut next);
            let (call, keys, marked_at, advance) = if prepared.is_empty() {
                (Call::Done(Ok(Vec::new())), KeySet::default(), None, None)
            } else if let Some(c) = cursor {
                let (admitted, marked_at, advance) =
                    admit_at_cursor(gate, c, prepared, end, &mut summary.cursor).await?;
                (
                    Call::Done(Ok(admitted)),
                    KeySet::default(),
                    marked_at,
                    advance,
                )
            } else {
                let keys = KeySet::of(prepared.keys());
                if sink
                    .make_room(
                        concurrency,
                        &keys,
                        &mut in_flight,
                        &mut summary,
                        &mut progress,
                    )
                    .await?
                {
                    return Ok(());
                }
                let (store_gate, now) = (gate.clone(), Utc::now());
                let turn = turns.next_turn();
                let call = tokio::spawn(async move {
                    store_gate.admit_in_turn(prepared, now, None, turn).await
                });
                (Call::Running(call), keys, Some(now), None)
            };
            in_flight.push_back(InFlight {
                pending,
                lines,
                blank,
                keys,
                marked_at,
                advance,
                call,
            });
            // Every batch whose store call returned is written now, oldest first.
            if sink
                .emit_while(
                    &mut in_flight,
                    &mut summary,
                    &mut progress,
                    InFlight::is_done,
                )
                .await?
            {
                return Ok(());
            }
            if let Some(reason) = stop.filter(|c| c.is_cancelled()).and_then(Cancel::reason) {
                // Read no further; the batches in flight are written below.
                summary.interrupted = Some(reason);
                break;
            }
            if eof {
                break;
            }
            if ready.is_some_and(|ready| !ready()) {
                // The input makes us wait: write what is in flight first, so the lines
                // read so far are not held back until more come.
                if sink
                    .emit_while(&mut in_flight, &mut summary, &mut progress, |_| true)
                    .await?
                {
                    return Ok(());
                }
            }
            let position = cursor.map(|c| (c, summary.cursor.as_ref()));
            match read_batch(
                gate, &mut input, input_name, &limits, read, position, ready, &mut buf,
            ) {
                Ok(batch) => {
                    read += batch.lines;
                    next = batch;
                }
                Err(e) => {
                    // The batches in flight are reported first.
                    read_error = Some(e);
                    break;
                }
            }
        }
        sink.emit_while(&mut in_flight, &mut summary, &mut progress, |_| true)
            .await?;
        Ok(())
    }
    .await;
    if cursor.is_none() {
        // Not written: none of them waits on another gate any longer.
        turns.stop_waiting();
        take_back(gate, in_flight).await;
    }
    for call in std::mem::take(&mut sink.confirming) {
        confirmed(call).await;
    }
    outcome?;
    if let Some(e) = read_error {
        return Err(e);
    }
    summary.elapsed = started.elapsed();
    Ok(summary)
}

/// Writes the CSV header; `Ok(true)` when the output's reader went away.
fn write_csv_header<W: Write>(output: &mut W, output_name: &str) -> Result<bool> {
    let header = b"line,verdict,key,pass,verified,event,error,decision\n";
    match output.write_all(header).and_then(|()| output.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(true),
        other => other
            .map(|()| false)
            .map_err(|e| Error::io("write", output_name, e)),
    }
}
