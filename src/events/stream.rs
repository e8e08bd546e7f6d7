//! The NDJSON gate as a stream (what `idem gate` runs): read a batch of lines, check and
//! mark the batch in one store round trip through an [`EventGate`], write one output
//! record per line, flush, repeat. The next batch is read while the store works, and on
//! stores that can ([`EventKeyStore::batch_concurrency`](crate::store::EventKeyStore::batch_concurrency))
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

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use super::fingerprint::write_int;
use super::strategy::{Admission, EventGate, PreparedBatch, Strategy};
use super::InvalidEvent;
use crate::error::{Error, Result};
use crate::runner::Cancel;
use crate::store::breaker::BreakerPhase;
use crate::store::{Cursor, EventVerdict};

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
}

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

/// One line of the batch being worked on.
struct Pending {
    number: u64,
    /// At or before the cursor: no store lookup.
    before_cursor: bool,
    /// The line without its end of line (`\n`, `\r\n`) and surrounding blanks.
    text: String,
    /// Why it is not an event, when parsing already says so.
    error: Option<String>,
}

/// A batch read from the input: its lines, the marks of its events, and what it counts.
#[derive(Default)]
struct Batch {
    pending: Vec<Pending>,
    prepared: PreparedBatch,
    /// The greatest (timestamp, id) of its events after the cursor.
    end: Option<Cursor>,
    /// Input lines read, blank ones included.
    lines: u64,
    blank: u64,
    /// The input ended in it.
    eof: bool,
}

/// Reads up to `size` non-blank lines after line `read` and takes the marks of their
/// events (parsing, key, fingerprint: the CPU part of a batch). With a cursor, events at
/// or before `position` are `before_cursor`.
#[allow(clippy::too_many_arguments)]
fn read_batch<R: BufRead>(
    gate: &EventGate,
    input: &mut R,
    input_name: &str,
    size: usize,
    read: u64,
    cursor: Option<(&StreamCursor, Option<&Cursor>)>,
    ready: Option<&(dyn Fn() -> bool + Sync)>,
    buf: &mut Vec<u8>,
) -> Result<Batch> {
    let mut batch = Batch {
        pending: Vec::with_capacity(size),
        ..Batch::default()
    };
    while batch.pending.len() < size {
        if !batch.pending.is_empty() && ready.is_some_and(|ready| !ready()) {
            // The next line is not there yet: this batch goes now.
            break;
        }
        buf.clear();
        let n = input
            .read_until(b'\n', buf)
            .map_err(|e| Error::io("read", input_name, e))?;
        if n == 0 {
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
        match super::parse_event_line(text) {
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
                super::json_kind_of_raw(&other.to_string())
            ))),
            Err(e) => batch
                .pending
                .push(bad(format!("line {number}: not JSON: {e}"))),
        }
    }
    Ok(batch)
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
    } = stream;
    let size = batch.max(1);
    let started = Instant::now();
    let mut summary = StreamSummary::default();
    if let Some(c) = cursor {
        summary.cursor = gate.cursor(&c.name).await?;
    }
    let log_only = gate.strategy() == Strategy::LogOnly;
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 12);
    let mut record = Vec::with_capacity(1 << 16);
    let write_err = |e: std::io::Error| Error::io("write", output_name, e);
    if format == OutputFormat::Csv {
        let header = b"line,verdict,key,pass,verified,event,error,decision\n";
        match output.write_all(header).and_then(|()| output.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                summary.output_closed = true;
                return Ok(summary);
            }
            other => other.map_err(write_err)?,
        }
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
            gate, &mut input, input_name, size, 0, position, ready, &mut buf,
        )?
    };
    read += next.lines;
    // Batches whose store call was made and whose records are not written yet, oldest
    // first. Without a cursor, up to `window` calls run at once, on batches that share no
    // key (a key's verdicts come in input order); records are written oldest first.
    let concurrency = gate.batch_concurrency();
    let mut in_flight: VecDeque<InFlight> = VecDeque::new();
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
                // With a cursor, batches go one after the other: which events are before
                // the cursor depends on where the previous batch left it. The cursor
                // advances to the batch's last (timestamp, id) with the marks; a store
                // call that failed (a fallback) marked nothing and moved no cursor.
                let advance = end.as_ref().map(|end| (c.name.as_str(), end));
                let failures = advance.map(|_| gate.stats().store_errors);
                // Pending marks: the cursor moves after the records are out (below).
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
                    summary.cursor = end;
                }
                (
                    Call::Done(Ok(admitted)),
                    KeySet::default(),
                    defer.then_some(now),
                    later,
                )
            } else {
                let keys = KeySet::of(prepared.keys());
                // Room for it: while the calls still running fill the window, or one of
                // them has one of its keys, wait for the oldest running call (batches
                // whose calls returned are written below, while this batch's call runs).
                // One call at a time while the breaker is not closed: a recovering store
                // gets its one probe, not a window of refusals.
                loop {
                    let window = match gate.breaker_phase() {
                        BreakerPhase::Closed => concurrency,
                        _ => 1,
                    };
                    let running = in_flight.iter().filter(|f| !f.is_done()).count();
                    let blocked = in_flight
                        .iter()
                        .any(|f| !f.is_done() && f.keys.shares(&keys));
                    if running < window && !blocked {
                        break;
                    }
                    // (Calls finish on their own meanwhile: none may be left running.)
                    let Some(oldest) = in_flight.iter_mut().find(|f| !f.is_done()) else {
                        continue;
                    };
                    if !oldest.settle().await {
                        // It failed (under `strict`): write what came before it, and stop.
                        while !in_flight.is_empty() {
                            if sink
                                .emit_oldest(&mut in_flight, &mut summary, &mut progress)
                                .await?
                            {
                                return Ok(());
                            }
                        }
                    }
                }
                let (store_gate, now) = (gate.clone(), Utc::now());
                let call = tokio::spawn(async move { store_gate.admit(prepared, now, None).await });
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
            while in_flight.front().is_some_and(InFlight::is_done) {
                if sink
                    .emit_oldest(&mut in_flight, &mut summary, &mut progress)
                    .await?
                {
                    return Ok(());
                }
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
                while !in_flight.is_empty() {
                    if sink
                        .emit_oldest(&mut in_flight, &mut summary, &mut progress)
                        .await?
                    {
                        return Ok(());
                    }
                }
            }
            let position = cursor.map(|c| (c, summary.cursor.as_ref()));
            match read_batch(
                gate, &mut input, input_name, size, read, position, ready, &mut buf,
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
        while !in_flight.is_empty() {
            if sink
                .emit_oldest(&mut in_flight, &mut summary, &mut progress)
                .await?
            {
                break;
            }
        }
        Ok(())
    }
    .await;
    if cursor.is_none() {
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

/// Batches whose records will not be written (the output closed, or an earlier batch's
/// store call failed under `strict`): their calls are let finish rather than cut off, and
/// the keys they marked new are forgotten again, so the same input again says `new` for
/// those lines, not `replay` for lines nobody was told were new.
async fn take_back(gate: &EventGate, in_flight: VecDeque<InFlight>) {
    let mut left = Untaken::default();
    for f in in_flight {
        // A call the stream made itself (`--cursor`, an empty batch) is written at once.
        let Some(now) = f.marked_at else {
            continue;
        };
        let outcome = match f.call {
            Call::Running(call) => joined(call.await),
            Call::Done(outcome) => outcome,
        };
        if let Ok(admitted) = outcome {
            left.add(unmark_new(gate, &admitted, now).await);
        }
    }
    left.warn();
}

/// Takes back the marks of the keys a call at `now` found new: `Err` with how many keys
/// stay marked when the store refused.
async fn unmark_new(
    gate: &EventGate,
    admitted: &Admitted,
    now: DateTime<Utc>,
) -> std::result::Result<(), (usize, Error)> {
    let marked: Vec<String> = admitted
        .iter()
        .filter_map(|a| match a {
            Ok(a) if matches!(a.verdict, Some(EventVerdict::New)) => Some(a.key.clone()),
            _ => None,
        })
        .collect();
    if marked.is_empty() {
        return Ok(());
    }
    gate.unmark(&marked, now)
        .await
        .map(|_| ())
        .map_err(|e| (marked.len(), e))
}

/// Keys that could not be unmarked.
#[derive(Default)]
struct Untaken {
    left: usize,
    error: Option<Error>,
}

impl Untaken {
    fn add(&mut self, outcome: std::result::Result<(), (usize, Error)>) {
        if let Err((n, e)) = outcome {
            self.left += n;
            self.error = Some(e);
        }
    }

    fn warn(self) {
        if let Some(e) = self.error {
            tracing::warn!(
                "{} key(s) were marked new by batches whose records were not written, and \
                 could not be unmarked ({e}): the same input again says `replay` for them",
                self.left
            );
        }
    }
}

/// The keys of a batch in flight, hashed (two keys with the same hash only make a batch
/// wait when it need not).
#[derive(Default)]
struct KeySet(std::collections::HashSet<u64, std::hash::BuildHasherDefault<Hashed>>);

/// The hasher of a set of hashes: a value is its own hash (the default hasher would hash
/// each one again, on every insert and lookup).
#[derive(Default)]
struct Hashed(u64);

impl std::hash::Hasher for Hashed {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl KeySet {
    fn of<'k>(keys: impl Iterator<Item = &'k str>) -> Self {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let hasher = BuildHasherDefault::<DefaultHasher>::default();
        KeySet(keys.map(|k| hasher.hash_one(k)).collect())
    }

    fn shares(&self, other: &KeySet) -> bool {
        let (small, large) = if self.0.len() <= other.0.len() {
            (&self.0, &other.0)
        } else {
            (&other.0, &self.0)
        };
        small.iter().any(|k| large.contains(k))
    }
}

type Admitted = Vec<std::result::Result<Admission, InvalidEvent>>;

/// A batch whose store call was made: running as a task of its own, or returned.
enum Call {
    Running(tokio::task::JoinHandle<Result<Admitted>>),
    Done(Result<Admitted>),
}

/// The outcome of a store call's task.
fn joined(
    outcome: std::result::Result<Result<Admitted>, tokio::task::JoinError>,
) -> Result<Admitted> {
    match outcome {
        Ok(admitted) => admitted,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(Error::input(format!("the store call stopped: {e}"))),
    }
}

/// A batch between its store call and its records.
struct InFlight {
    pending: Vec<Pending>,
    lines: u64,
    blank: u64,
    /// The keys its store call marks (empty when the stream made the call itself).
    keys: KeySet,
    /// The `now` of its store call, when it runs as a task of its own (what the marks it
    /// makes hold as first seen).
    marked_at: Option<DateTime<Utc>>,
    /// With pending marks and a cursor: where the cursor moves once the batch's records
    /// are out and confirmed (never before: a crash in between must leave the batch's
    /// lines ahead of the cursor, to be checked again).
    advance: Option<(String, Cursor)>,
    call: Call,
}

/// A batch whose store call returned.
struct Finished {
    pending: Vec<Pending>,
    lines: u64,
    blank: u64,
    admitted: Vec<std::result::Result<Admission, InvalidEvent>>,
}

impl InFlight {
    /// Whether its store call returned.
    fn is_done(&self) -> bool {
        match &self.call {
            Call::Done(_) => true,
            Call::Running(call) => call.is_finished(),
        }
    }

    /// Waits for its store call to return, keeping the outcome: `false` when it failed.
    async fn settle(&mut self) -> bool {
        if let Call::Running(call) = &mut self.call {
            self.call = Call::Done(joined(call.await));
        }
        matches!(self.call, Call::Done(Ok(_)))
    }

    /// Waits for the store call; a store error (under `strict`) is returned as it is.
    async fn finish(self) -> Result<Finished> {
        let admitted = match self.call {
            Call::Done(admitted) => admitted?,
            Call::Running(call) => joined(call.await)?,
        };
        Ok(Finished {
            pending: self.pending,
            lines: self.lines,
            blank: self.blank,
            admitted,
        })
    }
}

/// Where a stream's records go.
struct Sink<'a, W> {
    gate: &'a EventGate,
    output: &'a mut W,
    output_name: &'a str,
    record: &'a mut Vec<u8>,
    format: OutputFormat,
    log_only: bool,
    started: Instant,
    /// Confirmations of written batches still running (pending marks), oldest first: they
    /// overlap the next batches' calls, and are all awaited before the stream ends.
    confirming: VecDeque<tokio::task::JoinHandle<Result<u64>>>,
}

/// How many confirmations may run at once before the stream waits for the oldest.
const CONFIRMS_IN_FLIGHT: usize = 4;

/// Waits for a confirmation; warns when it failed (its keys' marks then expire and the
/// same events are reported `new` again: at least once, never lost).
async fn confirmed(call: tokio::task::JoinHandle<Result<u64>>) {
    let outcome = match call.await {
        Ok(outcome) => outcome,
        Err(e) => Err(Error::Io {
            action: "confirm",
            path: "the confirmation task".into(),
            source: std::io::Error::other(e.to_string()),
        }),
    };
    if let Err(e) = outcome {
        tracing::warn!(
            "the marks of a written batch could not be confirmed ({e}): they expire after \
             the pending timeout and the same events are reported `new` again"
        );
    }
}

impl<W: Write> Sink<'_, W> {
    /// Writes a finished batch's records and reports progress; `Ok(true)` (and
    /// `output_closed`) when the output's reader went away.
    fn emit(
        &mut self,
        summary: &mut StreamSummary,
        done: &Finished,
        progress: &mut impl FnMut(&StreamSummary),
    ) -> Result<bool> {
        let closed = write_batch(
            self.output,
            self.record,
            summary,
            done,
            self.format,
            self.log_only,
        )
        .map_err(|e| Error::io("write", self.output_name, e))?;
        summary.elapsed = self.started.elapsed();
        summary.output_closed = closed;
        if !closed {
            progress(summary);
        }
        Ok(closed)
    }

    /// Waits for the oldest batch in flight and writes it (see [`emit`](Self::emit)).
    async fn emit_oldest(
        &mut self,
        in_flight: &mut VecDeque<InFlight>,
        summary: &mut StreamSummary,
        progress: &mut impl FnMut(&StreamSummary),
    ) -> Result<bool> {
        let Some(oldest) = in_flight.pop_front() else {
            return Ok(false);
        };
        let marked_at = oldest.marked_at;
        let advance = oldest.advance.clone();
        let done = oldest.finish().await?;
        let written = self.emit(summary, &done, progress);
        if matches!(written, Ok(false)) && self.gate.marks_pending() {
            // The records are out: the batch's pending marks become marks for good (a
            // gate killed before this leaves them to expire, and they are `new` again).
            let keys = self.gate.confirmations(&done.admitted);
            if let Some((name, to)) = &advance {
                // With a cursor: confirmed first, then the cursor moves.
                match self.gate.confirm_keys(keys).await {
                    Ok(_) => self.gate.advance_cursor(name, to).await?,
                    Err(e) => tracing::warn!(
                        "the marks of a written batch could not be confirmed ({e}): they \
                         expire after the pending timeout and the same events are reported \
                         `new` again; the cursor stays"
                    ),
                }
            } else if !keys.is_empty() {
                while self.confirming.len() >= CONFIRMS_IN_FLIGHT {
                    if let Some(oldest) = self.confirming.pop_front() {
                        confirmed(oldest).await;
                    }
                }
                let gate = self.gate.clone();
                self.confirming
                    .push_back(tokio::spawn(async move { gate.confirm_keys(keys).await }));
            }
        }
        if !matches!(written, Ok(false)) {
            // Not (wholly) written: the output's reader went away or writing failed. The
            // batch's new keys are unmarked, so they are `new` again next time (a line
            // the reader did see then comes twice rather than one it did not never).
            if let Some(now) = marked_at {
                let mut left = Untaken::default();
                left.add(unmark_new(self.gate, &done.admitted, now).await);
                left.warn();
            }
        }
        written
    }
}

/// Writes and flushes a finished batch's records; `Ok(true)` when the output's reader
/// went away.
fn write_batch<W: Write>(
    output: &mut W,
    record: &mut Vec<u8>,
    summary: &mut StreamSummary,
    batch: &Finished,
    format: OutputFormat,
    log_only: bool,
) -> std::result::Result<bool, std::io::Error> {
    let admitted = &batch.admitted;
    summary.lines += batch.lines;
    summary.blank += batch.blank;
    record.clear();
    let mut admitted = admitted.iter();
    for line in &batch.pending {
        if line.before_cursor {
            summary.before_cursor += 1;
            match format {
                OutputFormat::Ndjson => {
                    record.extend_from_slice(b"{\"line\":");
                    write_int(record, i128::from(line.number));
                    record.extend_from_slice(
                        b",\"verdict\":\"before_cursor\",\"key\":null,\"pass\":",
                    );
                    record.extend_from_slice(if log_only { b"true" } else { b"false" });
                    record.extend_from_slice(b",\"event\":");
                    record.extend_from_slice(line.text.as_bytes());
                    record.extend_from_slice(b"}\n");
                }
                OutputFormat::Csv => {
                    write_int(record, i128::from(line.number));
                    record.extend_from_slice(if log_only {
                        b",before_cursor,,true,true,"
                    } else {
                        b",before_cursor,,false,true,"
                    });
                    csv_field(record, &line.text);
                    record.extend_from_slice(b",,\n");
                }
            }
            continue;
        }
        let outcome = match &line.error {
            Some(error) => Err(error.clone()),
            None => admitted
                .next()
                .expect("one admission per event")
                .as_ref()
                .map_err(|invalid| format!("line {}: {}", line.number, invalid.error)),
        };
        match &outcome {
            Err(_) => summary.invalid += 1,
            Ok(a) => {
                match a.verdict_name() {
                    "new" => summary.new += 1,
                    "replay" => summary.replay += 1,
                    _ => summary.conflict += 1,
                }
                if !a.verified() {
                    summary.unverified += 1;
                }
            }
        }
        match format {
            OutputFormat::Ndjson => write_ndjson(record, line, &outcome),
            OutputFormat::Csv => write_csv(record, line, &outcome),
        }
    }
    match output.write_all(record).and_then(|()| output.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(true),
        Err(e) => Err(e),
        Ok(()) => Ok(false),
    }
}

fn json_string(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("writing to a Vec");
}

fn decision_of(a: &Admission) -> Option<&Value> {
    match &a.verdict {
        Some(EventVerdict::Replay { decision, .. }) => decision.as_ref(),
        _ => None,
    }
}

fn write_ndjson(
    out: &mut Vec<u8>,
    line: &Pending,
    outcome: &std::result::Result<&Admission, String>,
) {
    out.extend_from_slice(b"{\"line\":");
    write_int(out, i128::from(line.number));
    match outcome {
        Err(error) => {
            out.extend_from_slice(
                b",\"verdict\":\"invalid\",\"key\":null,\"pass\":false,\"error\":",
            );
            json_string(out, error);
        }
        Ok(a) => {
            out.extend_from_slice(b",\"verdict\":\"");
            out.extend_from_slice(a.verdict_name().as_bytes());
            out.extend_from_slice(b"\",\"key\":");
            json_string(out, &a.key);
            out.extend_from_slice(if a.passes {
                b",\"pass\":true"
            } else {
                b",\"pass\":false"
            });
            if !a.verified() {
                out.extend_from_slice(b",\"verified\":false");
            }
            if let Some(decision) = decision_of(a) {
                out.extend_from_slice(b",\"decision\":");
                serde_json::to_writer(&mut *out, decision).expect("writing to a Vec");
            }
            out.extend_from_slice(b",\"event\":");
            out.extend_from_slice(line.text.as_bytes());
        }
    }
    out.extend_from_slice(b"}\n");
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_field(out: &mut Vec<u8>, field: &str) {
    if field.contains([',', '"', '\n', '\r']) {
        out.push(b'"');
        out.extend_from_slice(field.replace('"', "\"\"").as_bytes());
        out.push(b'"');
    } else {
        out.extend_from_slice(field.as_bytes());
    }
}

fn write_csv(out: &mut Vec<u8>, line: &Pending, outcome: &std::result::Result<&Admission, String>) {
    write_int(out, i128::from(line.number));
    match outcome {
        Err(error) => {
            out.extend_from_slice(b",invalid,,false,,,");
            csv_field(out, error);
            out.push(b',');
        }
        Ok(a) => {
            out.push(b',');
            out.extend_from_slice(a.verdict_name().as_bytes());
            out.push(b',');
            csv_field(out, &a.key);
            out.extend_from_slice(if a.passes { b",true," } else { b",false," });
            out.extend_from_slice(if a.verified() { b"true," } else { b"false," });
            csv_field(out, &line.text);
            out.extend_from_slice(b",,");
            if let Some(decision) = decision_of(a) {
                csv_field(out, &decision.to_string());
            }
        }
    }
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::dedup::Deduplicator;
    use crate::events::strategy::Strategy;
    use crate::store::{BreakerConfig, MemoryStore};
    use std::sync::Arc;

    async fn gate_text(input: &str, format: OutputFormat) -> (String, StreamSummary) {
        let dedup = Deduplicator::new(Arc::new(MemoryStore::new()), "t", ["id"]).unwrap();
        let gate = EventGate::new(dedup, Strategy::Strict, BreakerConfig::default());
        let mut out = Vec::new();
        let summary = run(
            &gate,
            Stream {
                input: input.as_bytes(),
                input_name: "input",
                output: &mut out,
                output_name: "output",
                stop: None,
                ready: None,
            },
            format,
            2,
            |_| {},
        )
        .await
        .unwrap();
        (String::from_utf8(out).unwrap(), summary)
    }

    #[tokio::test]
    async fn records_keep_line_numbers_across_blank_and_bad_lines() {
        let input = "{\"id\":\"a\",\"v\":1}\n\n  \n{\"id\":\"a\",\"v\":1}\r\n{oops\n[1]\n{\"id\":\"a\", \"v\":2}\n{\"v\":3}";
        let (text, s) = gate_text(input, OutputFormat::Ndjson).await;
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let got: Vec<(u64, &str)> = records
            .iter()
            .map(|r| (r["line"].as_u64().unwrap(), r["verdict"].as_str().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                (1, "new"),
                (4, "replay"),
                (5, "invalid"),
                (6, "invalid"),
                (7, "conflict"),
                (8, "invalid")
            ]
        );
        assert_eq!(records[0]["event"], serde_json::json!({"id": "a", "v": 1}));
        assert!(
            text.lines()
                .nth(4)
                .unwrap()
                .ends_with(",\"event\":{\"id\":\"a\", \"v\":2}}"),
            "unchanged bytes"
        );
        assert!(records[2]["error"]
            .as_str()
            .unwrap()
            .starts_with("line 5: not JSON"));
        assert_eq!(
            records[3]["error"],
            "line 6: not a JSON object (found an array)"
        );
        assert_eq!(records[5]["error"], "line 8: field `id` is missing");
        assert_eq!(
            (s.lines, s.blank, s.new, s.replay, s.conflict, s.invalid),
            (8, 2, 1, 1, 1, 3)
        );
    }

    #[tokio::test]
    async fn csv_is_quoted() {
        let (text, _) = gate_text(
            "{\"id\":\"a,b\",\"q\":\"say \\\"hi\\\"\"}\nnope\n",
            OutputFormat::Csv,
        )
        .await;
        let mut lines = text.lines();
        assert_eq!(
            lines.next().unwrap(),
            "line,verdict,key,pass,verified,event,error,decision"
        );
        assert_eq!(
            lines.next().unwrap(),
            r#"1,new,"a,b",true,true,"{""id"":""a,b"",""q"":""say \""hi\""""}",,"#
        );
        let bad = lines.next().unwrap();
        assert!(bad.starts_with("2,invalid,,false,,,"), "{bad}");
        assert!(bad.contains("line 2: not JSON: "), "{bad}");
    }

    /// A real memory store whose batch calls take longer the earlier they were made
    /// (40, 30, 20, 10 ms, again), so a later call overtakes an earlier one unless the
    /// stream waits; it runs up to 4 at once and counts the most that ran together.
    #[derive(Debug, Default)]
    struct Overtaking {
        inner: MemoryStore,
        calls: std::sync::atomic::AtomicU64,
        running: std::sync::atomic::AtomicU64,
        most: std::sync::atomic::AtomicU64,
        /// The first call fails (after its 40 ms), as a store outage would.
        fail_first: bool,
    }

    #[async_trait::async_trait]
    impl crate::store::StoreBase for Overtaking {
        fn kind(&self) -> &'static str {
            "overtaking"
        }
        fn location(&self) -> String {
            "overtaking://".into()
        }
        fn capabilities(&self) -> crate::store::Capabilities {
            self.inner.capabilities()
        }
        async fn migrate(&self) -> Result<()> {
            Ok(())
        }
    }

    #[async_trait::async_trait]
    impl crate::store::EventKeyStore for Overtaking {
        fn batch_concurrency(&self) -> usize {
            4
        }
        async fn check_and_mark(
            &self,
            namespace: &str,
            marks: &[crate::store::EventMark],
            now: chrono::DateTime<Utc>,
        ) -> Result<Vec<EventVerdict>> {
            use std::sync::atomic::Ordering::SeqCst;
            let call = self.calls.fetch_add(1, SeqCst);
            let running = self.running.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(running, SeqCst);
            tokio::time::sleep(Duration::from_millis(40 - 10 * (call % 4))).await;
            let verdicts = if call == 0 && self.fail_first {
                Err(crate::error::Error::store(
                    "overtaking://",
                    "connection reset",
                ))
            } else {
                self.inner.check_and_mark(namespace, marks, now).await
            };
            self.running.fetch_sub(1, SeqCst);
            verdicts
        }
        async fn is_duplicate(
            &self,
            namespace: &str,
            keys: &[String],
            now: chrono::DateTime<Utc>,
        ) -> Result<Vec<bool>> {
            self.inner.is_duplicate(namespace, keys, now).await
        }
        async fn record_decision(
            &self,
            namespace: &str,
            key: &str,
            decision: &Value,
        ) -> Result<bool> {
            self.inner.record_decision(namespace, key, decision).await
        }
        async fn unmark_event_keys(
            &self,
            namespace: &str,
            keys: &[String],
            first_seen: chrono::DateTime<Utc>,
        ) -> Result<u64> {
            self.inner
                .unmark_event_keys(namespace, keys, first_seen)
                .await
        }
    }

    /// The gate over `input` in batches of 2 on `store`, strict: its outcome and output.
    async fn run_on(store: &Arc<Overtaking>, input: &str) -> (Result<StreamSummary>, Vec<u8>) {
        let dedup = Deduplicator::new(store.clone(), "t", ["id"]).unwrap();
        let gate = EventGate::new(dedup, Strategy::Strict, BreakerConfig::default());
        let mut out = Vec::new();
        let stream = Stream {
            input: input.as_bytes(),
            input_name: "input",
            output: &mut out,
            output_name: "output",
            stop: None,
            ready: None,
        };
        let outcome = run(&gate, stream, OutputFormat::Ndjson, 2, |_| {}).await;
        (outcome, out)
    }

    async fn overtaking_run(input: &str) -> (Vec<(u64, String)>, u64) {
        let store = Arc::new(Overtaking::default());
        let (outcome, out) = run_on(&store, input).await;
        outcome.unwrap();
        let records = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| {
                let r: Value = serde_json::from_str(l).unwrap();
                (
                    r["line"].as_u64().unwrap(),
                    r["verdict"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        (
            records,
            store.most.load(std::sync::atomic::Ordering::SeqCst),
        )
    }

    #[tokio::test]
    async fn batches_sharing_no_key_run_at_once_and_a_shared_key_waits() {
        // Eight batches of two distinct keys: up to 4 calls at once, records in input order.
        let input: String = (0..16).map(|i| format!("{{\"id\":\"k{i}\"}}\n")).collect();
        let (records, most) = overtaking_run(&input).await;
        assert_eq!(most, 4, "the store's 4 calls ran at once");
        let want: Vec<(u64, String)> = (1..=16).map(|n| (n, "new".to_string())).collect();
        assert_eq!(records, want);

        // Key `a` comes back in the next batch, whose call would finish first: it waits.
        let input =
            "{\"id\":\"a\",\"v\":1}\n{\"id\":\"b\"}\n{\"id\":\"c\"}\n{\"id\":\"a\",\"v\":2}\n\
                     {\"id\":\"d\"}\n{\"id\":\"e\"}\n{\"id\":\"a\",\"v\":1}\n{\"id\":\"f\"}\n";
        let (records, _) = overtaking_run(input).await;
        let verdicts: Vec<&str> = records.iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(
            verdicts,
            ["new", "new", "new", "conflict", "new", "new", "replay", "new"]
        );
    }

    #[tokio::test]
    async fn a_failed_call_under_strict_leaves_the_later_batches_unmarked() {
        // Calls 2-4 finish (and mark) before call 1 fails; their records are never
        // written, so their marks are taken back: the next run says `new` for them.
        let store = Arc::new(Overtaking {
            fail_first: true,
            ..Overtaking::default()
        });
        let input: String = (0..8).map(|i| format!("{{\"id\":\"k{i}\"}}\n")).collect();
        let (outcome, out) = run_on(&store, &input).await;
        let err = outcome.unwrap_err();
        assert!(err.to_string().contains("connection reset"), "{err}");
        assert!(out.is_empty(), "no record before the failed batch's");
        let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
        let seen = crate::store::EventKeyStore::is_duplicate(&store.inner, "t", &keys, Utc::now())
            .await
            .unwrap();
        assert_eq!(seen, [false; 8], "nothing left marked");
        assert!(store.calls.load(std::sync::atomic::Ordering::SeqCst) >= 4);
    }
}
