//! Event fingerprint throughput (`cargo bench --bench fingerprint`), against the floor
//! measured in the same run.
//!
//! * floor: the same signatures, already sorted and with their timestamps already
//!   rendered, serialised by serde_json (with Python's `", "` separators, so the bytes are
//!   the same) into a buffer, then `Sha256::digest` over it. No parsing, no sorting, no
//!   timestamp rendering, no escaping logic of idem's: the raw serialise + SHA-256 cost.
//! * `idem::events::fingerprint` over the typed signatures, given in time order and
//!   shuffled (sorting, rendering, Python escaping and hashing included).
//! * for honesty, end to end from NDJSON text (`fingerprint_json`: parsing and
//!   validating each line as well).
//!
//! Each round runs every case once over 10,000 events, in turn; a figure is the median
//! over the rounds, a ratio the median of the per-round ratios (robust to load from other
//! processes). The target is fingerprint ≤ 1.35 × floor.

use std::hint::black_box;
use std::io;
use std::time::Instant;

use idem::events::{fingerprint, fingerprint_json, signature_json, EventSignature};
use serde::Serialize;
use sha2::{Digest, Sha256};

const EVENTS: usize = 10_000;
const ROUNDS: usize = 41;

/// serde_json with `json.dumps`' separators: `", "` between items (no objects here).
struct PythonSeparators;

impl serde_json::ser::Formatter for PythonSeparators {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
}

#[derive(Serialize)]
struct Row<'a>(&'a str, &'a str, &'a str, &'a str, &'a str, i64, &'a str);

/// Tiny deterministic generator (no rand dependency).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn lines(rng: &mut Lcg) -> Vec<String> {
    let products = ["BTC-USD", "ETH-USD", "SOL-USD", "ADA-USD"];
    let types = ["trade", "cancel", "amend"];
    (0..EVENTS)
        .map(|i| {
            let secs = 1_763_456_400 + i as i64 * 3; // in time order, 3 s apart
            let micros = if rng.below(2) == 0 { 0 } else { rng.below(1_000_000) };
            let t = chrono::DateTime::from_timestamp(secs, micros as u32 * 1000).unwrap();
            format!(
                r#"{{"timestamp": "{}", "account_id": "acc-{}", "product_id": "{}", "side": "{}", "price": "{}.{:02}", "quantity": {}, "event_type": "{}"}}"#,
                t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
                rng.below(5000),
                products[rng.below(4) as usize],
                if rng.below(2) == 0 { "buy" } else { "sell" },
                rng.below(100_000),
                rng.below(100),
                rng.below(1000) + 1,
                types[rng.below(3) as usize],
            )
        })
        .collect()
}

/// Runs every case once per round, in turn, so a burst of load from other processes
/// hits all of them alike; returns each case's median ns/event and the median of its
/// per-round ratio to case 0 (the floor).
fn measure(cases: &mut [&mut dyn FnMut() -> String]) -> Vec<(f64, f64)> {
    let mut samples = vec![Vec::with_capacity(ROUNDS); cases.len()];
    for _ in 0..ROUNDS {
        for (case, f) in cases.iter_mut().enumerate() {
            let start = Instant::now();
            black_box(f());
            samples[case].push(start.elapsed().as_nanos() as f64 / EVENTS as f64);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (0..cases.len())
        .map(|c| {
            let ratios = (0..ROUNDS).map(|r| samples[c][r] / samples[0][r]).collect();
            (median(samples[c].clone()), median(ratios))
        })
        .collect()
}

fn main() {
    let mut rng = Lcg(11);
    let lines = lines(&mut rng);
    let in_order: Vec<EventSignature> = lines
        .iter()
        .map(|l| EventSignature::from_json(l).unwrap())
        .collect();
    let mut shuffled = in_order.clone();
    for i in (1..shuffled.len()).rev() {
        shuffled.swap(i, rng.below(i as u64 + 1) as usize);
    }

    // The floor's input: sorted signatures with rendered timestamps.
    let mut sorted = in_order.clone();
    sorted.sort();
    let rendered: Vec<String> = sorted.iter().map(|e| e.timestamp_iso()).collect();
    let rows: Vec<Row<'_>> = sorted
        .iter()
        .zip(&rendered)
        .map(|(e, ts)| {
            Row(
                ts,
                e.account_id(),
                e.product_id(),
                e.side(),
                e.price(),
                e.quantity() as i64,
                e.event_type(),
            )
        })
        .collect();
    let mut buf = Vec::with_capacity(2 << 20);
    let serialise_floor = |buf: &mut Vec<u8>| {
        buf.clear();
        let mut ser = serde_json::Serializer::with_formatter(&mut *buf, PythonSeparators);
        rows.serialize(&mut ser).unwrap();
        format!("{:x}", Sha256::digest(&*buf))
    };
    let floor_fp = serialise_floor(&mut buf);
    let floor_bytes = buf.len();
    let signature_bytes = buf.clone();
    // Same bytes, same hash: the floor is a fair one.
    assert_eq!(signature_json(&shuffled).as_bytes(), &signature_bytes[..]);
    assert_eq!(fingerprint(&in_order), floor_fp);
    assert_eq!(fingerprint(&shuffled), floor_fp);
    assert_eq!(fingerprint_json(lines.iter()).unwrap(), floor_fp);

    let results = measure(&mut [
        &mut || serialise_floor(&mut buf),
        &mut || format!("{:x}", Sha256::digest(&signature_bytes)),
        &mut || fingerprint(&in_order),
        &mut || fingerprint(&shuffled),
        &mut || fingerprint_json(lines.iter()).unwrap(),
    ]);
    let [(floor, _), (hash_only, _), (ordered, ordered_x), (random, random_x), (end_to_end, end_x)] =
        results[..]
    else {
        unreachable!()
    };

    println!(
        "event fingerprint, {EVENTS} events ({:.0} signature bytes/event), median of {ROUNDS} rounds",
        floor_bytes as f64 / EVENTS as f64
    );
    println!("  SHA-256 alone over the signature bytes      {hash_only:>7.1} ns/event");
    println!("  floor: serde_json serialise + SHA-256       {floor:>7.1} ns/event");
    println!(
        "  fingerprint, events in time order           {ordered:>7.1} ns/event  {ordered_x:.2} x floor"
    );
    println!(
        "  fingerprint, events shuffled                {random:>7.1} ns/event  {random_x:.2} x floor"
    );
    println!(
        "  end to end from NDJSON (parse + fingerprint){end_to_end:>7.1} ns/event  {end_x:.2} x floor"
    );
    println!("  target: fingerprint <= 1.35 x floor (ratios: median of the per-round ratios)");
}
