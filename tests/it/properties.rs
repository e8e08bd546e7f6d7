//! Property tests (issue 21.12): every parser and key path, on generated input.
//!
//! * cron: idem's fire times equal a brute-force model (minute by minute over wall-clock
//!   time, cronie's day-field rule, the DST rule of `idem::schedule`) for random
//!   expressions with lists, ranges and steps, in zones with DST (including Lord Howe's
//!   30-minute one), from random instants;
//! * dates, durations and job files: no input panics; dates round-trip;
//! * NDJSON gate input: random lines (junk, objects with random ids and payloads) through
//!   `idem::events::stream::run` never panic, and the verdicts equal a model (first sighting
//!   new, same payload replay, another payload conflict, no usable key invalid);
//! * content keys: equal content (rows in any order) gives one key; any changed cell gives
//!   another.
//!
//! Case counts are fixed (`config(N)`: 500 cron cases, 400 date/duration/job-file cases,
//! 120 gate streams of up to 60 lines, 200 content-key cases), so a run's cost is known.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::offset::LocalResult;
use chrono::{DateTime, Datelike, NaiveDateTime, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use proptest::prelude::*;
use serde_json::{json, Value};

use idem::events::dedup::Deduplicator;
use idem::events::extract::ContentHashExtractor;
use idem::events::strategy::{EventGate, Strategy as GateStrategy};
use idem::events::stream::{run, OutputFormat, Stream};
use idem::schedule::{parse_cron, DateExpr};
use idem::store::{BreakerConfig, MemoryStore};
use idem::{Content, HashAlgorithm};

/// `cases` cases, after the seeds of past failures: they are saved to, and replayed first
/// from, `tests/properties.proptest-regressions` (checked in).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    }
}

// ---- cron ---------------------------------------------------------------------------

/// One cron field: its text, and the values it matches.
#[derive(Debug, Clone)]
struct Field {
    text: String,
    values: Vec<u32>,
}

/// A field whose `*` covers `lo..=full`, its other values drawn from `lo..=hi`.
fn field(lo: u32, hi: u32, full: u32) -> impl Strategy<Value = Field> {
    let any = Just(Field {
        text: "*".into(),
        values: (lo..=full).collect(),
    });
    let step = (1..=(full - lo).max(1)).prop_map(move |k| Field {
        text: format!("*/{k}"),
        values: (lo..=full).step_by(k as usize).collect(),
    });
    let one = (lo..=hi).prop_map(|v| Field {
        text: v.to_string(),
        values: vec![v],
    });
    let list = proptest::collection::btree_set(lo..=hi, 2..4).prop_map(|s| Field {
        text: s.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        values: s.into_iter().collect(),
    });
    let range = (lo..=hi, lo..=hi, 1u32..4).prop_map(|(a, b, k)| {
        let (a, b) = (a.min(b), a.max(b));
        Field {
            text: if k == 1 {
                format!("{a}-{b}")
            } else {
                format!("{a}-{b}/{k}")
            },
            values: (a..=b).step_by(k as usize).collect(),
        }
    });
    prop_oneof![any, step, one, list, range]
}

#[derive(Debug, Clone)]
struct Expr {
    minute: Field,
    hour: Field,
    dom: Field,
    dow: Field,
}

impl Expr {
    fn text(&self) -> String {
        format!(
            "{} {} {} * {}",
            self.minute.text, self.hour.text, self.dom.text, self.dow.text
        )
    }

    /// Whether the wall-clock minute `t` matches, with cronie's day rule: when either day
    /// field starts with `*` both must match, otherwise either.
    fn matches(&self, t: &NaiveDateTime) -> bool {
        let day = self.dom.values.contains(&t.day());
        let wd = self
            .dow
            .values
            .contains(&t.weekday().num_days_from_sunday());
        let days = if self.dom.text.starts_with('*') || self.dow.text.starts_with('*') {
            day && wd
        } else {
            day || wd
        };
        days && self.minute.values.contains(&t.minute()) && self.hour.values.contains(&t.hour())
    }
}

fn expr() -> impl Strategy<Value = Expr> {
    // Hours weighted towards the early morning, where the clock changes are.
    (
        field(0, 59, 59),
        field(0, 5, 23),
        field(1, 28, 31),
        field(0, 6, 6),
    )
        .prop_map(|(minute, hour, dom, dow)| Expr {
            minute,
            hour,
            dom,
            dow,
        })
}

/// The instant a wall-clock time names: itself, its first pass when repeated, the first
/// valid minute after a gap.
fn instant_of(tz: Tz, mut t: NaiveDateTime) -> DateTime<Tz> {
    loop {
        match tz.from_local_datetime(&t) {
            LocalResult::Single(x) => return x,
            LocalResult::Ambiguous(a, b) => return a.min(b),
            LocalResult::None => t += chrono::Duration::minutes(1),
        }
    }
}

/// The model: walk wall-clock minutes from a little before `after`'s for `days` days.
fn model(e: &Expr, tz: Tz, after: DateTime<Utc>, days: i64) -> Vec<DateTime<Utc>> {
    let start = after.with_timezone(&tz).naive_local() - chrono::Duration::hours(3);
    let start = start.with_second(0).unwrap();
    let mut out: Vec<DateTime<Utc>> = Vec::new();
    let mut t = start;
    let end = start + chrono::Duration::days(days);
    while t < end {
        if e.matches(&t) {
            let at = instant_of(tz, t).with_timezone(&Utc);
            if at > after && !out.contains(&at) {
                out.push(at);
            }
        }
        t += chrono::Duration::minutes(1);
    }
    out.sort();
    out
}

fn zone() -> impl Strategy<Value = Tz> {
    prop_oneof![
        Just(Tz::UTC),
        Just(chrono_tz::Europe::London),
        Just(chrono_tz::America::Los_Angeles),
        Just(chrono_tz::Australia::Lord_Howe),
        Just(chrono_tz::America::Santiago),
    ]
}

/// Instants around the 2026 clock changes of the zones above, and anywhere in the year.
fn instant() -> impl Strategy<Value = DateTime<Utc>> {
    let changes = [
        "2026-03-08T06:00:00Z",
        "2026-03-29T00:00:00Z",
        "2026-10-25T00:00:00Z",
        "2026-11-01T06:00:00Z",
        "2026-04-04T13:00:00Z",
        "2026-10-03T14:00:00Z",
        "2026-04-05T01:00:00Z",
        "2026-09-06T02:00:00Z",
    ];
    let near = (0..changes.len(), -36 * 60i64..36 * 60).prop_map(move |(i, m)| {
        changes[i].parse::<DateTime<Utc>>().unwrap() + chrono::Duration::minutes(m)
    });
    let any = (0i64..365 * 24 * 60).prop_map(|m| {
        "2026-01-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap() + chrono::Duration::minutes(m)
    });
    prop_oneof![3 => near, 1 => any]
}

proptest! {
    #![proptest_config(config(500))]

    /// idem's next fires equal the model's, for every generated expression and zone.
    #[test]
    fn cron_fires_equal_a_brute_force_model(e in expr(), tz in zone(), after in instant()) {
        let cron = parse_cron(&e.text());
        let days = 9;
        let want = model(&e, tz, after, days);
        match cron {
            // Refused only when it never fires: then the model finds nothing either
            // (within its window: a rarer expression is still generated as valid).
            Err(err) => prop_assert!(want.is_empty(), "{} refused ({err}) but fires: {want:?}", e.text()),
            Ok(cron) => {
                let horizon = after + chrono::Duration::days(days - 1);
                let got: Vec<DateTime<Utc>> = cron
                    .upcoming(tz, after, 40)
                    .into_iter()
                    .map(|t| t.with_timezone(&Utc))
                    .take_while(|t| *t <= horizon)
                    .collect();
                // The model's fires up to the horizon (it looks further), the first 40 of
                // them: exactly what idem must return, count included (one returning
                // fewer, or none, fails).
                let want: Vec<DateTime<Utc>> = want.into_iter().take_while(|t| *t <= horizon).take(40).collect();
                prop_assert_eq!(got.len(), want.len(), "{} in {} after {}: got {:?}", e.text(), tz.name(), after, got);
                prop_assert_eq!(&got, &want, "{} in {} after {}", e.text(), tz.name(), after);
            }
        }
    }
}

// ---- dates, durations, job files ---------------------------------------------------------

proptest! {
    #![proptest_config(config(400))]

    #[test]
    fn date_expressions_never_panic_and_round_trip(s in "\\PC{0,24}", y in 1i32..=9999, m in 1u32..=12, d in 1u32..=28, n in 0u32..100_000) {
        let _ = DateExpr::parse(&s);
        let date = chrono::NaiveDate::from_ymd_opt(y, m, d).unwrap();
        let fixed = DateExpr::parse(&date.format("%Y-%m-%d").to_string()).unwrap();
        prop_assert_eq!(DateExpr::parse(&fixed.to_string()).unwrap(), fixed);
        let rel = DateExpr::parse(&format!("today-{n}")).unwrap();
        prop_assert_eq!(DateExpr::parse(&rel.to_string()).unwrap(), rel);
        let _ = idem::parse_date(&s);
    }

    #[test]
    fn durations_never_panic_and_stay_in_range(s in "[0-9]{0,22}(ns|ms|s|m|h|d|w| |x|)[0-9]{0,5}(s|h|)", text in "\\PC{0,16}") {
        for input in [&s, &text] {
            if let Ok(d) = idem::model::duration::parse_duration(input) {
                prop_assert!(d <= idem::model::duration::MAX_DURATION, "{input}: {d:?}");
            }
        }
    }

    #[test]
    fn job_files_never_panic_and_errors_name_the_file(
        name in "[a-z_./\\-]{0,12}",
        processor in "(sql|cleanup|p|)",
        schedule in "(\\*|[0-9]{1,2}|\\*/[0-9]|[0-9]-[0-9]|@daily|@x)( (\\*|[0-9]{1,2})){0,6}",
        window in "[0-9]{0,4}(s|m|h|d|x|)",
        junk in "\\PC{0,20}",
    ) {
        let toml = format!(
            "name = {name:?}\nprocessor = {processor:?}\nschedule = {schedule:?}\n[guards]\ntime_window = {window:?}\n[sql]\nprocess = \"SELECT 1\"\n# {junk}\n"
        );
        let path = std::path::Path::new("jobs/p.toml");
        if let Err(e) = idem::job::Job::parse(&toml, path) {
            prop_assert!(e.to_string().contains("jobs/p.toml"), "{e}");
        }
        let _ = idem::job::Job::parse(&junk, path);
    }
}

// ---- NDJSON gate input ------------------------------------------------------------------

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        (-1000i64..1000).prop_map(Value::from),
        "[a-c]{0,3}".prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
        Just(Value::Null),
        (-10.0f64..10.0).prop_map(|f| json!((f * 4.0).round() / 4.0)),
    ]
}

/// A line of gate input: junk, a JSON value that is not an object, or an object with
/// (usually) an id from a small set and a small payload, so keys repeat.
fn line() -> impl Strategy<Value = String> {
    let id = prop_oneof![
        4 => (0u8..6).prop_map(|i| json!(format!("e{i}"))),
        1 => (0i64..4).prop_map(Value::from),
        1 => scalar(),
        1 => Just(json!([1])),
    ];
    let object = (
        proptest::option::weighted(0.9, id),
        proptest::collection::btree_map("[a-c]", scalar(), 0..3),
    )
        .prop_map(|(id, payload)| {
            let mut o = serde_json::Map::new();
            for (k, v) in payload {
                o.insert(k, v);
            }
            if let Some(id) = id {
                o.insert("id".into(), id);
            }
            Value::Object(o).to_string()
        });
    prop_oneof![
        8 => object,
        1 => "\\PC{0,12}",
        1 => scalar().prop_map(|v| v.to_string()),
    ]
}

/// What the gate should say of each line: a key it can take (a non-empty string, a number
/// or a boolean id), then new / replay / conflict by the payload (the object without `id`).
fn model_verdicts(lines: &[String]) -> Vec<(usize, &'static str)> {
    let mut seen: HashMap<String, Value> = HashMap::new();
    let mut out = Vec::new();
    for (i, text) in lines.iter().enumerate() {
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let verdict = match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(mut o)) => {
                let key = match o.remove("id") {
                    Some(Value::String(s)) if !s.is_empty() => Some(s),
                    Some(Value::Number(n)) => Some(n.to_string()),
                    Some(Value::Bool(b)) => Some(b.to_string()),
                    _ => None,
                };
                match key {
                    None => "invalid",
                    Some(key) => {
                        let payload = Value::Object(o);
                        match seen.get(&key) {
                            None => {
                                seen.insert(key, payload);
                                "new"
                            }
                            Some(p) if *p == payload => "replay",
                            Some(_) => "conflict",
                        }
                    }
                }
            }
            _ => "invalid",
        };
        out.push((i + 1, verdict));
    }
    out
}

proptest! {
    #![proptest_config(config(120))]

    #[test]
    fn gate_verdicts_equal_a_model(lines in proptest::collection::vec(line(), 1..60), batch in 1usize..7) {
        let input = lines.join("\n");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let out = rt.block_on(async {
            let store = Arc::new(MemoryStore::new());
            let dedup = Deduplicator::new(store, "p", ["id"])
                .unwrap()
                .fingerprint(Some(ContentHashExtractor::new().exclude(["id"]).unwrap()));
            let gate = EventGate::new(dedup, GateStrategy::Strict, BreakerConfig::default())
                .pending(std::time::Duration::from_secs(30));
            let mut out = Vec::new();
            let stream = Stream {
                input: input.as_bytes(),
                input_name: "input",
                output: &mut out,
                output_name: "output",
                stop: None,
                ready: None,
                max_line_bytes: idem::events::stream::DEFAULT_MAX_LINE_BYTES,
            };
            run(&gate, stream, OutputFormat::Ndjson, batch, |_| {}).await.unwrap();
            out
        });
        let got: Vec<(usize, String)> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| {
                let r: Value = serde_json::from_str(l).unwrap();
                (r["line"].as_u64().unwrap() as usize, r["verdict"].as_str().unwrap().to_string())
            })
            .collect();
        let want: Vec<(usize, String)> = model_verdicts(&lines)
            .into_iter()
            .map(|(n, v)| (n, v.to_string()))
            .collect();
        prop_assert_eq!(got, want, "input:\n{}", input);
    }
}

// ---- content keys -----------------------------------------------------------------------

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn equal_content_one_key_any_changed_cell_another(
        rows in proptest::collection::vec(proptest::collection::btree_map("[a-d]", scalar(), 1..4), 1..8),
        seed in any::<u64>(),
        which in any::<prop::sample::Index>(),
        replacement in scalar(),
    ) {
        let rows: Vec<Value> = rows
            .into_iter()
            .map(|r| Value::Object(r.into_iter().collect()))
            .collect();
        let key = |rows: Vec<Value>| Content::new().rows(rows).key("p", "2026-01-01", HashAlgorithm::Sha256);
        let base = key(rows.clone());
        // Any order of the rows: the same key.
        let mut shuffled = rows.clone();
        let n = shuffled.len();
        for i in 0..n {
            let j = (seed.rotate_left(i as u32) as usize).wrapping_add(i) % n;
            shuffled.swap(i, j);
        }
        prop_assert_eq!(key(shuffled), base.clone());
        // One changed cell: another key (unless the replacement equals the old value).
        let mut changed = rows.clone();
        let r = which.index(n);
        let obj = changed[r].as_object_mut().unwrap();
        let col = obj.keys().next().unwrap().clone();
        if obj[&col] != replacement {
            obj.insert(col, replacement);
            prop_assert_ne!(key(changed), base);
        }
    }
}
