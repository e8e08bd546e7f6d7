//! The gate's input, read by a thread of its own in blocks of whatever the source has
//! ready (a file: 256 KiB at a time; a pipe or a terminal: what was written so far), so
//! the stream can ask whether the next line is already there ([`Feed::ready`]) and send a
//! batch of lines that trickle in without waiting for a full one.

use std::io::{BufRead, Read};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};

use crate::runner::Cancel;
use std::sync::Arc;

/// The largest block read at once.
const BLOCK: usize = 1 << 18;

/// Blocks read ahead at most (memory: `AHEAD` × 256 KiB).
const AHEAD: usize = 4;

/// How long [`Feed::ready`] waits for the next block before it says the input paused.
const PATIENCE_MS: usize = 3;

/// What the reading thread and the stream share.
#[derive(Debug, Default)]
struct Shared {
    /// Blocks read and not yet taken.
    queued: AtomicUsize,
    /// The block being consumed holds the end of a line.
    line_left: AtomicBool,
}

/// A [`BufRead`] over blocks another thread reads.
pub(super) struct Feed {
    blocks: Receiver<std::io::Result<Vec<u8>>>,
    /// When cancelled, waiting for input ends as the end of the input, between two lines.
    stop: Option<Cancel>,
    /// What was consumed so far ends a line (or nothing was).
    at_line_end: bool,
    /// Blocks read, given back to the thread to fill again.
    spent: SyncSender<Vec<u8>>,
    block: Vec<u8>,
    pos: usize,
    shared: Arc<Shared>,
}

impl Feed {
    /// Starts reading `source` on a thread of its own.
    pub(super) fn new(
        mut source: Box<dyn Read + Send>,
        stop: Option<Cancel>,
    ) -> std::io::Result<Self> {
        let (tx, blocks) = sync_channel(AHEAD);
        let (spent, reuse) = sync_channel::<Vec<u8>>(AHEAD + 2);
        let shared = Arc::new(Shared::default());
        let counts = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("gate-input".into())
            .spawn(move || loop {
                let mut block = reuse.try_recv().unwrap_or_default();
                block.resize(BLOCK, 0);
                let read = match source.read(&mut block) {
                    Ok(0) => return,
                    Ok(n) => {
                        block.truncate(n);
                        Ok(block)
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => Err(e),
                };
                let failed = read.is_err();
                counts.queued.fetch_add(1, Ordering::SeqCst);
                if tx.send(read).is_err() || failed {
                    // The stream is gone, or the source failed (reported once).
                    return;
                }
            })?;
        Ok(Feed {
            blocks,
            stop,
            at_line_end: true,
            spent,
            block: Vec::new(),
            pos: 0,
            shared,
        })
    }

    /// Whether a whole next line can be read without waiting: the block being read holds
    /// the end of a line, or another block is waiting (or comes within a few milliseconds:
    /// a reading thread a little behind is not a pause of the input).
    pub(super) fn ready(&self) -> impl Fn() -> bool + Sync + 'static {
        let shared = Arc::clone(&self.shared);
        move || {
            for _ in 0..PATIENCE_MS {
                if shared.line_left.load(Ordering::SeqCst)
                    || shared.queued.load(Ordering::SeqCst) > 0
                {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            false
        }
    }

    fn note_line_left(&self) {
        let left = self.block[self.pos..].contains(&b'\n');
        self.shared.line_left.store(left, Ordering::SeqCst);
    }
}

impl Read for Feed {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = {
            let available = self.fill_buf()?;
            let n = available.len().min(out.len());
            out[..n].copy_from_slice(&available[..n]);
            n
        };
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for Feed {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        while self.pos == self.block.len() {
            match self
                .blocks
                .recv_timeout(std::time::Duration::from_millis(100))
            {
                Err(RecvTimeoutError::Timeout) => {
                    // Told to stop while waiting for input (a terminal, an idle pipe):
                    // that is the end of the input, unless a line is half read.
                    if self.at_line_end && self.stop.as_ref().is_some_and(Cancel::is_cancelled) {
                        return Ok(&[]);
                    }
                }
                Ok(read) => {
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    let spent = std::mem::replace(&mut self.block, read?);
                    let _ = self.spent.try_send(spent);
                    self.pos = 0;
                    self.note_line_left();
                }
                // The thread ended: the end of the input.
                Err(RecvTimeoutError::Disconnected) => {
                    self.block.clear();
                    self.pos = 0;
                    return Ok(&[]);
                }
            }
        }
        Ok(&self.block[self.pos..])
    }

    fn consume(&mut self, n: usize) {
        let end = (self.pos + n).min(self.block.len());
        if end > self.pos {
            self.at_line_end = self.block[end - 1] == b'\n';
        }
        self.pos = end;
        self.note_line_left();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_what_was_written_and_says_when_a_line_is_there() {
        let (reader, mut writer) = std::io::pipe().unwrap();
        let mut feed = Feed::new(Box::new(reader), None).unwrap();
        let ready = feed.ready();
        writer.write_all(b"one\ntw").unwrap();
        let mut line = Vec::new();
        feed.read_until(b'\n', &mut line).unwrap();
        assert_eq!(line, b"one\n");
        // Half a line: not ready. Its end arrives: ready.
        assert!(!ready());
        writer.write_all(b"o\nthree\n").unwrap();
        let started = std::time::Instant::now();
        while !ready() {
            assert!(
                started.elapsed().as_secs() < 10,
                "the rest of the line arrives"
            );
            std::thread::yield_now();
        }
        let mut rest = String::new();
        drop(writer);
        feed.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "two\nthree\n");
    }
}
