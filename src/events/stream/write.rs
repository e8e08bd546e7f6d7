//! Writing a batch's records, NDJSON or CSV, once its store call returned; confirming
//! pending marks once they are out; making room for the next call by writing what is in
//! flight.

use std::collections::VecDeque;
use std::io::Write;
use std::time::Instant;

use serde_json::Value;

use super::batches::{unmark_new, Finished, InFlight, KeySet, Untaken};
use super::read::Pending;
use super::{OutputFormat, StreamSummary};
use crate::error::{Error, Result};
use crate::events::fingerprint::write_int;
use crate::events::strategy::{Admission, EventGate};
use crate::store::breaker::BreakerPhase;
use crate::store::EventVerdict;

/// Where a stream's records go.
pub(super) struct Sink<'a, W> {
    pub(super) gate: &'a EventGate,
    pub(super) output: &'a mut W,
    pub(super) output_name: &'a str,
    pub(super) record: &'a mut Vec<u8>,
    pub(super) format: OutputFormat,
    pub(super) log_only: bool,
    pub(super) started: Instant,
    /// Confirmations of written batches still running (pending marks), oldest first: they
    /// overlap the next batches' calls, and are all awaited before the stream ends.
    pub(super) confirming: VecDeque<tokio::task::JoinHandle<Result<u64>>>,
}

/// How many confirmations may run at once before the stream waits for the oldest.
const CONFIRMS_IN_FLIGHT: usize = 4;

/// Waits for a confirmation; warns when it failed (its keys' marks then expire and the
/// same events are reported `new` again: at least once, never lost).
pub(super) async fn confirmed(call: tokio::task::JoinHandle<Result<u64>>) {
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
        .map_err(|e| Error::write(self.output_name, e))?;
        summary.elapsed = self.started.elapsed();
        summary.output_closed = closed;
        if !closed {
            progress(summary);
        }
        Ok(closed)
    }

    /// Makes room for a batch's store call: while the calls still running fill the window,
    /// or one of them has one of the batch's `keys`, writes the batches at the front whose
    /// calls returned, then waits for the oldest running call (the batches after it whose
    /// calls returned are written by the caller, while this batch's call runs). One call
    /// at a time while the breaker is not closed: a recovering store gets its one probe,
    /// not a window of refusals. `Ok(true)` when the stream stops: a call
    /// failed (under `strict`), what came before it is written, or the output's reader went
    /// away meanwhile.
    pub(super) async fn make_room(
        &mut self,
        concurrency: usize,
        keys: &KeySet,
        in_flight: &mut VecDeque<InFlight>,
        summary: &mut StreamSummary,
        progress: &mut impl FnMut(&StreamSummary),
    ) -> Result<bool> {
        loop {
            let window = match self.gate.breaker_phase() {
                BreakerPhase::Closed => concurrency,
                _ => 1,
            };
            let running = in_flight.iter().filter(|f| !f.is_done()).count();
            let blocked = in_flight
                .iter()
                .any(|f| !f.is_done() && f.keys.shares(keys));
            if running < window && !blocked {
                return Ok(false);
            }
            // The batches at the front whose calls returned are written first (their
            // confirmations sent): a running call may wait on another gate's batch, which
            // may wait on their keys; unwritten, they are confirmed only after that call
            // returns, and the two gates wait on each other until the marks expire.
            if self
                .emit_while(in_flight, summary, progress, InFlight::is_done)
                .await?
            {
                return Ok(true);
            }
            // (Calls finish on their own meanwhile: none may be left running.)
            let Some(oldest) = in_flight.iter_mut().find(|f| !f.is_done()) else {
                continue;
            };
            if !oldest.settle().await {
                // It failed (under `strict`): write what came before it, and stop.
                if self
                    .emit_while(in_flight, summary, progress, |_| true)
                    .await?
                {
                    return Ok(true);
                }
            }
        }
    }

    /// Writes the oldest batch in flight (waiting for its store call) while there is one
    /// and `write` says so of it: `InFlight::is_done` writes the batches whose calls
    /// returned, `|_| true` every batch. `Ok(true)` when the output's reader went away.
    pub(super) async fn emit_while(
        &mut self,
        in_flight: &mut VecDeque<InFlight>,
        summary: &mut StreamSummary,
        progress: &mut impl FnMut(&StreamSummary),
        write: impl Fn(&InFlight) -> bool,
    ) -> Result<bool> {
        while in_flight.front().is_some_and(&write) {
            if self.emit_oldest(in_flight, summary, progress).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Waits for the oldest batch in flight and writes it (see [`emit`](Self::emit)).
    pub(super) async fn emit_oldest(
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
        let mut done = oldest.finish().await?;
        let written = self.emit(summary, &done, progress);
        if matches!(written, Ok(false)) && self.gate.marks_pending() {
            // The records are out: the batch's pending marks become marks for good (a
            // gate killed before this leaves them to expire, and they are `new` again).
            // Its keys are not read again (only a batch not written is unmarked, below).
            let keys = self.gate.take_confirmations(&mut done.admitted);
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

/// A CSV field, quoted when it holds a comma, a quote or a line break. A field a
/// spreadsheet would take for a formula (starting with `=`, `+`, `-`, `@`, a tab or a
/// carriage return: OWASP's "CSV injection") is quoted with a `'` in front, which the
/// spreadsheet shows as text.
fn csv_field(out: &mut Vec<u8>, field: &str) {
    let formula = field.starts_with(['=', '+', '-', '@', '\t', '\r']);
    if formula || field.contains([',', '"', '\n', '\r']) {
        out.push(b'"');
        if formula {
            out.push(b'\'');
        }
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
