//! The stream end to end on a memory store, and batches in flight on a store that
//! answers out of order.

use std::sync::Arc;

use serde_json::Value;

use super::*;
use crate::events::dedup::Deduplicator;
use crate::events::strategy::Strategy;
use crate::store::{BreakerConfig, EventVerdict, MemoryStore};

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
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
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
    // A key a spreadsheet would run as a formula is shown as text.
    let (text, _) = gate_text(
        "{\"id\":\"=HYPERLINK(1)\"}\n{\"id\":\"@SUM(A1)\"}\n{\"id\":\"-2+3\"}\n{\"id\":\"+1\"}\n",
        OutputFormat::Csv,
    )
    .await;
    let keys: Vec<&str> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(2).unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            r#""'=HYPERLINK(1)""#,
            r#""'@SUM(A1)""#,
            r#""'-2+3""#,
            r#""'+1""#
        ]
    );
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
    /// The markers of the pending batches, in the order they were marked.
    marked: std::sync::Mutex<Vec<String>>,
}

/// `StoreBase` for a test store over a memory store (its field `inner`), named `$kind`:
/// its capabilities, with up to 4 batch calls at once and the fields given changed.
macro_rules! over_memory {
    ($store:ty, $kind:literal $(, $field:ident: $value:expr)*) => {
        #[async_trait::async_trait]
        impl crate::store::StoreBase for $store {
            fn kind(&self) -> &'static str {
                $kind
            }
            fn location(&self) -> String {
                concat!($kind, "://").into()
            }
            fn capabilities(&self) -> crate::store::Capabilities {
                crate::store::Capabilities {
                    batch_concurrency: 4,
                    $($field: $value,)*
                    ..self.inner.capabilities()
                }
            }
            async fn migrate(&self) -> Result<()> {
                Ok(())
            }
        }
    };
}
over_memory!(Overtaking, "overtaking");

impl Overtaking {
    /// The memory store's `check_and_mark`, made to overtake (see [`Overtaking`]).
    async fn overtaking_check_and_mark(
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
            crate::store::EventKeyStore::check_and_mark(&self.inner, namespace, marks, now).await
        };
        self.running.fetch_sub(1, SeqCst);
        verdicts
    }

    /// The memory store's pending batch, marked after the same delays (see
    /// [`Overtaking`]); its marker is written down when it marks.
    async fn overtaking_pending(
        &self,
        namespace: &str,
        marks: &[crate::store::EventMark],
        now: chrono::DateTime<Utc>,
        batch: crate::store::PendingBatch<'_>,
        cursor: Option<(&str, &crate::store::Cursor)>,
    ) -> Result<Vec<EventVerdict>> {
        use std::sync::atomic::Ordering::SeqCst;
        let call = self.calls.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(40 - 10 * (call % 4))).await;
        if call == 0 && self.fail_first {
            return Err(crate::error::Error::store(
                "overtaking://",
                "connection reset",
            ));
        }
        self.marked.lock().unwrap().push(batch.marker.to_string());
        crate::store::EventKeyStore::check_and_mark_pending(
            &self.inner,
            namespace,
            marks,
            now,
            batch,
            cursor,
        )
        .await
    }
}

/// Batch calls overtake each other ([`Overtaking::overtaking_check_and_mark`]), pending
/// batches too ([`Overtaking::overtaking_pending`]); every other call goes to the memory
/// store.
macro_rules! overtaking {
    ($s:ident, check_and_mark($($arg:expr),*)) => {
        $s.overtaking_check_and_mark($($arg),*).await
    };
    ($s:ident, check_and_mark_pending($($arg:expr),*)) => {
        $s.overtaking_pending($($arg),*).await
    };
    ($s:ident, $method:ident($($arg:expr),*)) => {
        $s.inner.$method($($arg),*).await
    };
}
crate::forward_event_key_store!([] Overtaking, overtaking);

/// The gate over `input` in batches of 2 on `store`, strict: its outcome and output.
async fn run_on(store: &Arc<Overtaking>, input: &str) -> (Result<StreamSummary>, Vec<u8>) {
    let dedup = Deduplicator::new(store.clone(), "t", ["id"]).unwrap();
    let gate = EventGate::new(dedup, Strategy::Strict, BreakerConfig::default());
    run_gate(&gate, input).await
}

/// `gate` over `input` in batches of 2: its outcome and output.
async fn run_gate(gate: &EventGate, input: &str) -> (Result<StreamSummary>, Vec<u8>) {
    let mut out = Vec::new();
    let stream = Stream {
        input: input.as_bytes(),
        input_name: "input",
        output: &mut out,
        output_name: "output",
        stop: None,
        ready: None,
        max_line_bytes: DEFAULT_MAX_LINE_BYTES,
    };
    let outcome = run(gate, stream, OutputFormat::Ndjson, 2, |_| {}).await;
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
    let input = "{\"id\":\"a\",\"v\":1}\n{\"id\":\"b\"}\n{\"id\":\"c\"}\n{\"id\":\"a\",\"v\":2}\n\
                 {\"id\":\"d\"}\n{\"id\":\"e\"}\n{\"id\":\"a\",\"v\":1}\n{\"id\":\"f\"}\n";
    let (records, _) = overtaking_run(input).await;
    let verdicts: Vec<&str> = records.iter().map(|(_, v)| v.as_str()).collect();
    assert_eq!(
        verdicts,
        ["new", "new", "new", "conflict", "new", "new", "replay", "new"]
    );
}

/// With pending marks, a gate's batches mark their keys in input order however their
/// calls would overtake: a later batch marked first could hold keys another gate waits
/// for while this gate waits for that gate (see `MarkTurn`).
#[tokio::test]
async fn pending_batches_mark_in_input_order() {
    let store = Arc::new(Overtaking::default());
    let dedup = Deduplicator::new(store.clone(), "t", ["id"]).unwrap();
    let gate = EventGate::new(dedup, Strategy::Strict, BreakerConfig::default())
        .pending(Duration::from_secs(30));
    assert!(gate.marks_pending());
    let input: String = (0..16).map(|i| format!("{{\"id\":\"k{i}\"}}\n")).collect();
    let (summary, _) = run_gate(&gate, &input).await;
    assert_eq!(summary.unwrap().new, 16);
    let numbers: Vec<u64> = store
        .marked
        .lock()
        .unwrap()
        .iter()
        .map(|m| {
            let m: Value = serde_json::from_str(m).unwrap();
            let tag = m["idem_pending"].as_str().unwrap();
            tag.rsplit('/').next().unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(
        numbers,
        (0..8).collect::<Vec<u64>>(),
        "marked in input order"
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

#[tokio::test]
async fn a_line_over_the_limit_is_invalid_wherever_the_reads_cut_it() {
    // Read 3 bytes at a time: a line's end, its `\r`, and the limit fall across reads.
    for limit in [10usize, 11, 12] {
        let input = "{\"id\":\"a\"}\r\n{\"id\":\"bb\"}\n{\"id\":\"ccc\"}\n{\"id\":\"d\"}";
        let dedup = Deduplicator::new(Arc::new(MemoryStore::new()), "t", ["id"]).unwrap();
        let gate = EventGate::new(dedup, Strategy::Strict, BreakerConfig::default());
        let mut out = Vec::new();
        run(
            &gate,
            Stream {
                input: std::io::BufReader::with_capacity(3, input.as_bytes()),
                input_name: "input",
                output: &mut out,
                output_name: "output",
                stop: None,
                ready: None,
                max_line_bytes: limit,
            },
            OutputFormat::Ndjson,
            2,
            |_| {},
        )
        .await
        .unwrap();
        let verdicts: Vec<String> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["verdict"].to_string())
            .collect();
        // The lines are 10, 11, 12 and 10 bytes long, without their ends of line.
        let expected: Vec<&str> = [10, 11, 12, 10]
            .iter()
            .map(|len| {
                if *len <= limit {
                    "\"new\""
                } else {
                    "\"invalid\""
                }
            })
            .collect();
        assert_eq!(verdicts, expected, "limit {limit}");
    }
}

#[tokio::test]
async fn an_object_repeating_a_name_is_invalid_at_any_depth() {
    let input = "{\"id\":\"a\",\"v\":1,\"v\":2}\n{\"id\":\"b\",\"n\":{\"x\":1,\"x\":1}}\n\
                 {\"id\":\"c\",\"l\":[{\"y\":1},{\"y\":2}]}\n{\"id\":\"d\",\"id\":\"d\"}\n";
    let (text, s) = gate_text(input, OutputFormat::Ndjson).await;
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let verdicts: Vec<&str> = records
        .iter()
        .map(|r| r["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts, ["invalid", "invalid", "new", "invalid"], "{text}");
    assert_eq!(s.invalid, 3);
    assert!(
        records[0]["error"]
            .as_str()
            .unwrap()
            .contains("the name \"v\" appears twice"),
        "{text}"
    );
    assert!(
        records[1]["error"].as_str().unwrap().contains("\"x\""),
        "{text}"
    );
}

/// A gate whose first batch fails, while a later batch of it waits on a key pending for
/// another gate (which may itself wait on the failed batch's keys, never to be confirmed):
/// the stream ends without waiting for that gate's mark to expire, and the later batch's
/// own new keys are taken back. It waited out the other gate's 600 s before (a CI run's
/// two gates on Redis hung so: one's store call timed out, and its exit waited on a batch
/// waiting on the other gate, which waited on the failed batch's keys).
#[tokio::test(start_paused = true)]
async fn a_failed_stream_does_not_wait_on_another_gate_to_take_its_batches_back() {
    let store = Arc::new(Overtaking {
        fail_first: true,
        ..Overtaking::default()
    });
    // Another gate's batch holds `x` pending, for long (its gate never confirms it here).
    let now = Utc::now();
    let other = crate::store::PendingBatch {
        marker: r#"{"idem_pending":"other-gate/0"}"#,
        timeout: Duration::from_secs(600),
        turn: None,
    };
    let held = crate::store::EventKeyStore::check_and_mark_pending(
        &store.inner,
        "t",
        &[crate::store::EventMark::key("x")],
        now,
        other,
        None,
    )
    .await
    .unwrap();
    assert_eq!(held, [EventVerdict::New]);
    let dedup = Deduplicator::new(store.clone(), "t", ["id"]).unwrap();
    let gate = EventGate::new(dedup, Strategy::Strict, BreakerConfig::default())
        .pending(Duration::from_secs(600));
    // Batches of 2: the first fails; the second has `x`, and `y` it marks new.
    let input = "{\"id\":\"a\"}\n{\"id\":\"b\"}\n{\"id\":\"x\"}\n{\"id\":\"y\"}\n";
    // Tokio's clock is paused: it moves only when every task waits on a timer, so this
    // measures how long the stream's tasks slept, however busy the machine. (The marks'
    // deadlines go by the wall clock, which does not move: bounded here, a stream that
    // waits on would never end.)
    let started = tokio::time::Instant::now();
    let ran = tokio::time::timeout(Duration::from_secs(3600), run_gate(&gate, input)).await;
    let waited = started.elapsed();
    let (outcome, out) = ran.unwrap_or_else(|_| {
        panic!("the stream still waited on the other gate's key after {waited:?}")
    });
    let err = outcome.unwrap_err();
    assert!(err.to_string().contains("connection reset"), "{err}");
    assert!(out.is_empty(), "no record before the failed batch's");
    assert!(
        waited < Duration::from_secs(600),
        "the stream waited {waited:?}: until the other gate's mark expired"
    );
    let seen = crate::store::EventKeyStore::is_duplicate(
        &store.inner,
        "t",
        &["x".to_string(), "y".to_string()],
        Utc::now(),
    )
    .await
    .unwrap();
    assert_eq!(
        seen,
        [true, false],
        "`x` still the other gate's, `y` taken back"
    );
}

/// A real memory store on which batch 1's pending call waits (up to a minute) for batch
/// 0's confirmation, as a batch waits on another gate that waits on keys of this gate's
/// batch 0; batch 0's call takes 10 ms.
#[derive(Debug, Default)]
struct WaitsOnConfirmation {
    inner: MemoryStore,
    confirmed: tokio::sync::Notify,
    first_confirmed: std::sync::atomic::AtomicBool,
    /// The first confirmation fails, as a store busy past its timeout would.
    fail_first_confirmation: std::sync::atomic::AtomicBool,
}

over_memory!(WaitsOnConfirmation, "waits-on-confirmation", marks_ahead: false);

impl WaitsOnConfirmation {
    async fn pending(
        &self,
        namespace: &str,
        marks: &[crate::store::EventMark],
        now: chrono::DateTime<Utc>,
        batch: crate::store::PendingBatch<'_>,
        cursor: Option<(&str, &crate::store::Cursor)>,
    ) -> Result<Vec<EventVerdict>> {
        use std::sync::atomic::Ordering::SeqCst;
        if batch.marker.ends_with("/0\"}") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        } else if batch.marker.ends_with("/1\"}") {
            let confirmed = async {
                while !self.first_confirmed.load(SeqCst) {
                    let notified = self.confirmed.notified();
                    if self.first_confirmed.load(SeqCst) {
                        break;
                    }
                    notified.await;
                }
            };
            if tokio::time::timeout(Duration::from_secs(60), confirmed)
                .await
                .is_err()
            {
                return Err(crate::error::Error::store(
                    "waits-on-confirmation://",
                    "batch 1 waited a minute for batch 0's confirmation",
                ));
            }
        }
        crate::store::EventKeyStore::check_and_mark_pending(
            &self.inner,
            namespace,
            marks,
            now,
            batch,
            cursor,
        )
        .await
    }

    async fn confirm(
        &self,
        namespace: &str,
        marker: &str,
        keys: &[(String, Option<chrono::DateTime<Utc>>)],
        whole: bool,
    ) -> Result<u64> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.fail_first_confirmation.swap(false, SeqCst) {
            return Err(crate::error::Error::store(
                "waits-on-confirmation://",
                "database is locked",
            ));
        }
        let done = crate::store::EventKeyStore::confirm_pending_batch(
            &self.inner,
            namespace,
            marker,
            keys,
            whole,
        )
        .await;
        if marker.ends_with("/0\"}") {
            self.first_confirmed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            self.confirmed.notify_waiters();
        }
        done
    }
}

/// Pending calls and confirmations through [`WaitsOnConfirmation`]'s own methods; every
/// other call goes to the memory store (the dispatch `forward_event_key_store!` asks of a
/// wrapper).
macro_rules! waits_on_confirmation {
    ($s:ident, check_and_mark_pending($($arg:expr),*)) => {
        $s.pending($($arg),*).await
    };
    ($s:ident, confirm_pending_batch($($arg:expr),*)) => {
        $s.confirm($($arg),*).await
    };
    ($s:ident, $method:ident($($arg:expr),*)) => {
        $s.inner.$method($($arg),*).await
    };
}
crate::forward_event_key_store!([] WaitsOnConfirmation, waits_on_confirmation);

/// A batch whose call returned is written (and its confirmation sent) before the stream
/// waits on a later batch's call: that call may wait on another gate, which may wait on
/// the earlier batch's keys. Here batch 2 shares `c` with batch 1, so the stream waits for
/// batch 1's call, which waits for batch 0's confirmation; before, batch 0 (returned,
/// unwritten) was written only after batch 1's call returned, and the two waited on each
/// other until the store gave up.
#[tokio::test(start_paused = true)]
async fn a_returned_batch_is_written_before_the_stream_waits_on_a_later_call() {
    let store = Arc::new(WaitsOnConfirmation::default());
    let dedup = Deduplicator::new(store.clone(), "t", ["id"]).unwrap();
    let gate = EventGate::new(dedup, Strategy::Strict, BreakerConfig::default())
        .pending(Duration::from_secs(600));
    let input = "{\"id\":\"a\"}\n{\"id\":\"b\"}\n{\"id\":\"c\"}\n{\"id\":\"d\"}\n\
                 {\"id\":\"c\"}\n{\"id\":\"e\"}\n";
    let (outcome, out) = run_gate(&gate, input).await;
    let summary = outcome.unwrap();
    assert_eq!((summary.new, summary.replay), (5, 1));
    let verdicts: Vec<String> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["verdict"].to_string())
        .collect();
    assert_eq!(
        verdicts,
        [
            "\"new\"",
            "\"new\"",
            "\"new\"",
            "\"new\"",
            "\"replay\"",
            "\"new\""
        ]
    );
}

/// A confirmation the store failed (busy past its timeout, a connection lost) is asked
/// once more: its keys are confirmed, not left pending for other gates to wait on until
/// they expire.
#[tokio::test(start_paused = true)]
async fn a_failed_confirmation_is_asked_again() {
    let store = Arc::new(WaitsOnConfirmation::default());
    store
        .fail_first_confirmation
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let dedup = Deduplicator::new(store.clone(), "t", ["id"]).unwrap();
    let gate = EventGate::new(dedup, Strategy::Strict, BreakerConfig::default())
        .pending(Duration::from_secs(600));
    let (outcome, _) = run_gate(&gate, "{\"id\":\"a\"}\n{\"id\":\"b\"}\n").await;
    assert_eq!(outcome.unwrap().new, 2);
    assert!(
        !store
            .fail_first_confirmation
            .load(std::sync::atomic::Ordering::SeqCst),
        "the first confirmation was asked for and failed"
    );
    // Another gate finds both keys confirmed: replays of no pending batch.
    let verdicts = crate::store::EventKeyStore::check_and_mark(
        &store.inner,
        "t",
        &[
            crate::store::EventMark::key("a"),
            crate::store::EventMark::key("b"),
        ],
        Utc::now(),
    )
    .await
    .unwrap();
    for v in verdicts {
        assert!(
            matches!(&v, EventVerdict::Replay { decision: None, .. }),
            "still pending: {v:?}"
        );
    }
}
