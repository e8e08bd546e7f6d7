//! The numbers an operator watches: [`DedupStats`], the batch latency histogram's
//! buckets, and the gate's [`Health`].

use super::*;

/// Counters since the gate was made.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct DedupStats {
    /// Events given to the gate (valid or not).
    pub checked: u64,
    /// Events the store found new.
    pub unique: u64,
    /// Replays + conflicts.
    pub duplicates: u64,
    /// Same key, same payload.
    pub replays: u64,
    /// Same key, different payload.
    pub conflicts: u64,
    /// Events whose key or fingerprint could not be taken.
    pub extraction_failures: u64,
    /// Batches whose store call failed (including calls refused by the open breaker).
    pub store_errors: u64,
    /// Events let through unverified because the store failed.
    pub fallbacks: u64,
    /// New events whose pending marks expired before their batch was confirmed (its
    /// records took longer than the pending timeout to be written): the next reader
    /// finds them `new` again.
    pub unconfirmed: u64,
    /// New events of written batches whose confirmation the store failed, asked twice:
    /// their marks stay pending until the pending timeout, and the next reader after it
    /// finds them `new` again.
    pub confirm_failures: u64,
    /// Batches checked against the store (successfully or not).
    pub batches: u64,
    /// Mean duration of a batch's store call, in microseconds.
    pub avg_batch_latency_us: u64,
    /// 99th percentile of a batch's store call duration, in microseconds (the upper bound of
    /// its histogram bucket: at most ~9% above the true value).
    pub p99_batch_latency_us: u64,
}

impl DedupStats {
    pub(super) fn rate(part: u64, whole: u64) -> f64 {
        if whole == 0 {
            0.0
        } else {
            part as f64 / whole as f64
        }
    }

    /// Duplicates per event checked (0 to 1).
    pub fn duplicate_rate(&self) -> f64 {
        Self::rate(self.duplicates, self.checked)
    }

    /// Store errors per batch (0 to 1).
    pub fn error_rate(&self) -> f64 {
        Self::rate(self.store_errors, self.batches)
    }

    /// Events let through unverified per event checked (0 to 1).
    pub fn fallback_rate(&self) -> f64 {
        Self::rate(self.fallbacks, self.checked)
    }

    /// Events that could not be keyed per event checked (0 to 1).
    pub fn extraction_failure_rate(&self) -> f64 {
        Self::rate(self.extraction_failures, self.checked)
    }
}

/// The upper bounds (seconds) of [`BatchLatencyHistogram`]'s buckets, `+Inf` aside.
pub const BATCH_LATENCY_BOUNDS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The batch store-call durations as a Prometheus-style histogram: cumulative counts per
/// upper bound ([`BATCH_LATENCY_BOUNDS`], counted exactly as each batch is recorded).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct BatchLatencyHistogram {
    /// (upper bound in seconds, batches that took at most that long), bounds ascending.
    pub buckets: Vec<(f64, u64)>,
    /// Every batch's duration added up, in seconds.
    pub sum_seconds: f64,
    /// Batches recorded (the `+Inf` bucket).
    pub count: u64,
}

/// Batch latencies in a fixed histogram (8 buckets per power of two of microseconds), so
/// the p99 needs no memory that grows with the batches.
#[derive(Debug, Clone)]
pub(super) struct Latencies {
    buckets: Vec<u64>,
    pub(super) count: u64,
    pub(super) total_us: u128,
    /// Per [`BATCH_LATENCY_BOUNDS`] bound (not cumulative).
    pub(super) coarse: [u64; BATCH_LATENCY_BOUNDS.len()],
}

pub(super) const SUB_BUCKETS: u32 = 8;

impl Default for Latencies {
    fn default() -> Self {
        Latencies {
            buckets: vec![0; (64 * SUB_BUCKETS) as usize],
            count: 0,
            total_us: 0,
            coarse: [0; BATCH_LATENCY_BOUNDS.len()],
        }
    }
}

impl Latencies {
    pub(super) fn bucket(us: u64) -> usize {
        if us < SUB_BUCKETS as u64 {
            return us as usize;
        }
        let power = 63 - us.leading_zeros();
        let sub = (us >> (power - 3)) & (SUB_BUCKETS as u64 - 1);
        ((power - 2) * SUB_BUCKETS + sub as u32) as usize
    }

    /// The largest value of bucket `i`.
    pub(super) fn upper(i: usize) -> u64 {
        let i = i as u64;
        if i < SUB_BUCKETS as u64 {
            return i;
        }
        let power = i / SUB_BUCKETS as u64 + 2;
        let sub = i % SUB_BUCKETS as u64;
        ((SUB_BUCKETS as u64 + sub + 1) << (power - 3)) - 1
    }

    pub(super) fn record(&mut self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        self.buckets[Self::bucket(us)] += 1;
        let secs = d.as_secs_f64();
        if let Some(i) = BATCH_LATENCY_BOUNDS.iter().position(|b| secs <= *b) {
            self.coarse[i] += 1;
        }
        self.count += 1;
        self.total_us += us as u128;
    }

    pub(super) fn average(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            (self.total_us / self.count as u128) as u64
        }
    }

    pub(super) fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((self.count as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::upper(i);
            }
        }
        Self::upper(self.buckets.len() - 1)
    }
}

#[derive(Debug, Default)]
pub(super) struct Recorder {
    pub(super) stats: DedupStats,
    pub(super) latencies: Latencies,
}

/// The store's health as [`EventGate::health`] found it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Health {
    /// The store answered a read.
    pub healthy: bool,
    /// The store's URL (password removed).
    pub store: String,
    /// `closed`, `open` or `half_open`.
    pub breaker: &'static str,
    /// How long the probe took, in microseconds (`None` when it was refused by the breaker).
    pub latency_us: Option<u64>,
    /// The error, when not healthy.
    pub error: Option<String>,
}
