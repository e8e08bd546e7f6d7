//! `idem gate` as a user runs it: verdicts on the public fund-load file checked against a
//! model computed here, durable verdicts across runs and across a SIGKILL, strategies under
//! an unreachable store, bad arguments. SQLite always; Postgres, the BigQuery emulator and
//! Redis when `IDEM_TEST_POSTGRES_URL` / `IDEM_TEST_BIGQUERY_URL` / `IDEM_TEST_REDIS_URL`
//! are set (BigQuery not in the SIGKILL, SIGINT and two-gates tests: too slow on the
//! emulator).

use std::collections::HashMap;
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common;

use common::Sandbox;

fn peer_data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/peer-data/fund_loads_input.ndjson")
}

/// The stores to run on: SQLite in the sandbox, and the services that are configured
/// (Redis under a fresh key prefix, deleted when the list is dropped).
struct Stores {
    urls: Vec<String>,
    #[cfg(feature = "redis")]
    _cleanup: Vec<common::redis::PrefixCleanup>,
}

impl<'a> IntoIterator for &'a Stores {
    type Item = String;
    type IntoIter = std::iter::Cloned<std::slice::Iter<'a, String>>;
    fn into_iter(self) -> Self::IntoIter {
        self.urls.iter().cloned()
    }
}

fn stores(sb: &Sandbox, test: &str) -> Stores {
    stores_with(sb, test, true)
}

fn stores_with(sb: &Sandbox, test: &str, bigquery: bool) -> Stores {
    let mut urls = vec![sb.store.clone()];
    urls.extend(common::postgres_url(test));
    if bigquery {
        urls.extend(common::bigquery_url(test));
    }
    #[cfg(feature = "redis")]
    {
        let mut cleanup = Vec::new();
        if let Some(url) = common::redis_url(test) {
            let (url, guard) = common::redis::fresh_prefix_url(&url);
            urls.push(url);
            cleanup.push(guard);
        }
        Stores {
            urls,
            _cleanup: cleanup,
        }
    }
    #[cfg(not(feature = "redis"))]
    Stores { urls }
}

struct Gated {
    code: i32,
    records: Vec<Value>,
    stderr: String,
}

/// `idem gate ARGS --input INPUT --store STORE` to the end.
fn gate(sb: &Sandbox, store: &str, input: &Path, args: &[&str]) -> Gated {
    let mut all = vec!["gate", "--input", input.to_str().unwrap()];
    all.extend(args);
    let out = sb
        .command_with_store(&all, store)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run idem gate");
    let stdout = String::from_utf8(out.stdout).expect("UTF-8 output");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let records = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}\nstderr: {stderr}")))
        .collect();
    Gated {
        code: out.status.code().unwrap_or(-1),
        records,
        stderr,
    }
}

fn verdicts(records: &[Value]) -> Vec<String> {
    records
        .iter()
        .map(|r| r["verdict"].as_str().unwrap().to_string())
        .collect()
}

fn counts(verdicts: &[String]) -> HashMap<String, usize> {
    let mut c = HashMap::new();
    for v in verdicts {
        *c.entry(v.clone()).or_default() += 1;
    }
    c
}

/// What the gate must say for each event, computed without idem: the first event of a key
/// is new; a later one is a replay when its payload (the event without the key fields)
/// equals the first one's, a conflict otherwise.
fn model(events: &[Value], keys: &[&str]) -> Vec<String> {
    let mut first: HashMap<String, Value> = HashMap::new();
    events
        .iter()
        .map(|e| {
            let key: Vec<&str> = keys.iter().map(|k| e[*k].as_str().unwrap()).collect();
            let mut payload = e.clone();
            for k in keys {
                payload.as_object_mut().unwrap().remove(*k);
            }
            match first.get(&key.join(":")) {
                None => {
                    first.insert(key.join(":"), payload);
                    "new"
                }
                Some(p) if *p == payload => "replay",
                Some(_) => "conflict",
            }
            .to_string()
        })
        .collect()
}

/// What a second pass over the same input must say: every `new` is now a `replay`.
fn second_pass(first: &[String]) -> Vec<String> {
    first
        .iter()
        .map(|v| {
            if v == "new" {
                "replay".into()
            } else {
                v.clone()
            }
        })
        .collect()
}

fn peer_events() -> Vec<Value> {
    std::fs::read_to_string(peer_data())
        .expect("../shared/peer-data/fund_loads_input.ndjson")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn namespace() -> String {
    format!("gate-{}", idem::new_run_id())
}

#[test]
fn peer_data_verdicts_match_the_model_and_are_durable() {
    let sb = Sandbox::new("gate-peer");
    let events = peer_events();
    assert_eq!(events.len(), 1000);
    for store in &stores(&sb, "peer_data_verdicts_match_the_model_and_are_durable") {
        for keys in [vec!["id"], vec!["id", "customer_id"]] {
            let ns = namespace();
            let key_arg = keys.join(",");
            let args = ["--key", &key_arg, "--namespace", &ns];
            let expected = model(&events, &keys);
            let first = gate(&sb, &store, &peer_data(), &args);
            assert_eq!(first.code, 0, "{store} {key_arg}: {}", first.stderr);
            let got = verdicts(&first.records);
            assert_eq!(counts(&got), counts(&expected), "{store} key {key_arg}");
            assert_eq!(got, expected, "{store} key {key_arg}: verdict per line");
            assert!(
                counts(&expected).get("conflict").copied().unwrap_or(0) > 0,
                "the file has conflicting ids"
            );
            for (i, r) in first.records.iter().enumerate() {
                assert_eq!(r["line"], i + 1);
                assert_eq!(r["event"], events[i], "the event is passed on unchanged");
                let key: Vec<&str> = keys
                    .iter()
                    .map(|k| events[i][*k].as_str().unwrap())
                    .collect();
                assert_eq!(r["key"], key.join(":"));
            }
            assert!(first.stderr.contains("1000 line(s)"), "{}", first.stderr);
            assert!(first.stderr.contains("lines/s"), "{}", first.stderr);

            // Same input, same store and namespace: every new is now a replay, every
            // conflict still a conflict.
            let second = gate(&sb, &store, &peer_data(), &args);
            assert_eq!(second.code, 0, "{}", second.stderr);
            let again = verdicts(&second.records);
            let want = second_pass(&expected);
            assert_eq!(again, want, "{store} key {key_arg}: second pass");
        }
    }
}

#[test]
fn a_malformed_line_is_invalid_and_the_others_flow() {
    let sb = Sandbox::new("gate-bad-line");
    let text = std::fs::read_to_string(peer_data()).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(500, r#"{"id": "1", "customer_id": "2", "load_amount": "#);
    let input = sb.dir.join("with-bad-line.ndjson");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let events = peer_events();
    let expected = model(&events, &["id"]);
    for store in &stores(&sb, "a_malformed_line_is_invalid_and_the_others_flow") {
        let ns = namespace();
        let out = gate(&sb, &store, &input, &["--key", "id", "--namespace", &ns]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        assert_eq!(out.records.len(), 1001);
        let bad = &out.records[500];
        assert_eq!(bad["line"], 501);
        assert_eq!(bad["verdict"], "invalid");
        assert!(bad["key"].is_null());
        assert!(bad.get("event").is_none());
        let error = bad["error"].as_str().unwrap();
        assert!(error.starts_with("line 501: not JSON"), "{error}");
        // The lines around it: their own verdicts, their true line numbers.
        let mut got = verdicts(&out.records);
        got.remove(500);
        assert_eq!(got, expected);
        assert_eq!(out.records[499]["line"], 500);
        assert_eq!(out.records[501]["line"], 502);
        assert_eq!(out.records[501]["event"], events[500]);
    }
}

/// Events whose keys come back 20 to 80 lines after they were first seen (one line in
/// twenty), with the same payload or (one in three) another: with small batches, a key is
/// often still in a batch whose store call has not returned when it comes back.
fn near_repeats(lines: usize, seed: u64) -> Vec<Value> {
    let mut state = seed;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    let mut events: Vec<Value> = Vec::with_capacity(lines);
    for i in 0..lines {
        let event = if i >= 80 && next(20) == 0 {
            let back = &events[i - 20 - next(61) as usize];
            let mut again = back.clone();
            if next(3) == 0 {
                again["v"] = serde_json::json!(back["v"].as_u64().unwrap() + 1);
            }
            again
        } else {
            serde_json::json!({"id": format!("k{i}"), "v": next(1000)})
        };
        events.push(event);
    }
    events
}

#[test]
fn a_key_back_while_its_batch_is_in_flight_keeps_input_order() {
    // Stores that run several batch calls at once (Postgres, Redis) must still give a key's
    // verdicts in input order: its first line new, later ones replay/conflict against it.
    let sb = Sandbox::new("gate-near-repeats");
    let events = near_repeats(4000, 7);
    let input = sb.dir.join("near-repeats.ndjson");
    write_lines(&input, &events);
    let expected = model(&events, &["id"]);
    let repeats = expected.iter().filter(|v| *v != "new").count();
    assert!(repeats > 150, "the input repeats keys ({repeats})");
    let name = "a_key_back_while_its_batch_is_in_flight_keeps_input_order";
    for store in &stores_with(&sb, name, false) {
        for batch in ["16", "50"] {
            let ns = namespace();
            let args = ["--key", "id", "--namespace", &ns, "--batch", batch];
            let first = gate(&sb, &store, &input, &args);
            assert_eq!(first.code, 0, "{store}: {}", first.stderr);
            assert_eq!(
                verdicts(&first.records),
                expected,
                "{store} --batch {batch}"
            );
            let lines: Vec<u64> = first
                .records
                .iter()
                .map(|r| r["line"].as_u64().unwrap())
                .collect();
            assert_eq!(
                lines,
                (1..=4000).collect::<Vec<u64>>(),
                "records in input order"
            );
            let second = gate(&sb, &store, &input, &args);
            let want = second_pass(&expected);
            assert_eq!(
                verdicts(&second.records),
                want,
                "{store} --batch {batch}: second pass"
            );
        }
    }
}

/// Lines `id` k0..k(distinct-1) then repeats: every other repeat with another amount.
fn write_big_input(path: &Path, lines: usize, distinct: usize) {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for i in 0..lines {
        let k = i % distinct;
        let amount = if i >= distinct && i % 2 == 0 {
            k + 1
        } else {
            k
        };
        writeln!(
            f,
            r#"{{"id":"k{k}","customer_id":"{}","load_amount":"${amount}.00"}}"#,
            k % 97
        )
        .unwrap();
    }
    f.flush().unwrap();
}

/// The complete records of an output file (a record cut by the kill is not reported).
fn complete_records(path: &Path) -> Vec<Value> {
    let mut text = String::new();
    std::fs::File::open(path)
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `idem gate --key id --batch 500` over `input` into `out`, started (stderr piped).
fn spawn_gate(
    sb: &Sandbox,
    store: &str,
    ns: &str,
    input: &Path,
    out: &Path,
) -> std::process::Child {
    gate_command(sb, store, ns, input.to_str().unwrap(), out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn gate_command(sb: &Sandbox, store: &str, ns: &str, input: &str, out: &Path) -> Command {
    sb.command_with_store(
        &[
            "gate",
            "--key",
            "id",
            "--namespace",
            ns,
            "--batch",
            "500",
            "--pending-timeout",
            "2s",
            "--input",
            input,
            "--output",
            out.to_str().unwrap(),
        ],
        store,
    )
}

/// The gate of [`spawn_gate`] on its standard input, fed the first `head` lines of `input`
/// and no end: returned once `out` holds a record, with the pipe still open, so the run
/// cannot finish before the caller stops it, however fast it is (a file it could).
fn gate_mid_stream(
    sb: &Sandbox,
    store: &str,
    ns: &str,
    input: &Path,
    head: usize,
    out: &Path,
) -> (std::process::Child, std::process::ChildStdin) {
    use std::io::Write;
    let text = std::fs::read(input).unwrap();
    let end = text
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(head - 1)
        .map(|(i, _)| i + 1)
        .expect("the input has `head` lines");
    let mut child = gate_command(sb, store, ns, "-", out)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&text[..end]).unwrap();
    stdin.flush().unwrap();
    while !std::fs::metadata(out).is_ok_and(|m| m.len() > 0) {
        if let Some(status) = child.try_wait().unwrap() {
            let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
            panic!("{store}: the gate ended ({status}) with its input still open: {stderr}");
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    (child, stdin)
}

#[test]
fn sigkill_mid_run_loses_no_line_and_reports_nothing_unrecorded() {
    let sb = Sandbox::new("gate-kill");
    let input = sb.dir.join("big.ndjson");
    const LINES: usize = 40_000;
    write_big_input(&input, LINES, 30_000);
    for store in &stores_with(
        &sb,
        "sigkill_mid_run_loses_no_line_and_reports_nothing_unrecorded",
        false,
    ) {
        let ns = namespace();
        let first_out = sb.dir.join("first.ndjson");
        let _ = std::fs::remove_file(&first_out);
        // Killed as soon as some output exists, a quarter of the way in at most.
        let (mut child, stdin) = gate_mid_stream(&sb, &store, &ns, &input, LINES / 4, &first_out);
        child.kill().unwrap();
        let status = child.wait().unwrap();
        drop(stdin);
        assert!(
            !status.success(),
            "{store}: the run was killed, not finished"
        );
        let reported = complete_records(&first_out);
        assert!(
            !reported.is_empty() && reported.len() <= LINES / 4,
            "{store}: {} reported",
            reported.len()
        );

        let second_out = sb.dir.join("second.ndjson");
        let status = sb
            .command_with_store(
                &[
                    "gate",
                    "--key",
                    "id",
                    "--namespace",
                    &ns,
                    "--pending-timeout",
                    "2s",
                    "--input",
                    input.to_str().unwrap(),
                    "--output",
                    second_out.to_str().unwrap(),
                ],
                &store,
            )
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let second = complete_records(&second_out);
        // No line lost: one record per input line, in order.
        assert_eq!(second.len(), LINES, "{store}");
        for (i, r) in second.iter().enumerate() {
            assert_eq!(r["line"], i + 1);
        }
        // Every event is reported `new` at least once, by one run or the other (issue
        // 21.1): the batches the killed run marked but never wrote were pending, expired,
        // and are `new` in the second run. A `replay` is one some run reported `new`.
        let key = |r: &Value| r["key"].as_str().unwrap_or_default().to_string();
        let mut seen_new: std::collections::HashSet<String> = reported
            .iter()
            .filter(|r| r["verdict"] == "new")
            .map(key)
            .collect();
        for r in &second {
            match r["verdict"].as_str().unwrap() {
                "new" => {
                    seen_new.insert(key(r));
                }
                "replay" | "conflict" => assert!(
                    seen_new.contains(&key(r)),
                    "{store}: line {} is {} but no run reported its key new",
                    r["line"],
                    r["verdict"]
                ),
                other => panic!("unexpected verdict {other}"),
            }
        }
        // What was reported before the kill is recorded: `replay` now, or, for a batch
        // written but not yet confirmed when the kill came, `new` again (at least once,
        // at most the batches in flight: 4 of 500 lines).
        let mut again = 0;
        for r in &reported {
            let line = r["line"].as_u64().unwrap() as usize;
            let now = second[line - 1]["verdict"].as_str().unwrap();
            match (r["verdict"].as_str().unwrap(), now) {
                ("new", "new") => again += 1,
                ("new" | "replay", "replay") | ("conflict", "conflict") => {}
                (before, now) => {
                    panic!("{store}: line {line} was {before} before the kill, {now} after")
                }
            }
        }
        assert!(again <= 2000, "{store}: {again} lines new twice");
    }
}

/// SIGINT mid-run: the gate reads no further, marks and writes every line it had read,
/// prints its summary and exits 1; the output holds only whole records, and the same
/// input again continues exactly where it stopped: the first run's records for the lines
/// it reached, then the second run's for the rest, equal one uninterrupted run's.
#[test]
fn sigint_stops_after_the_lines_read_and_marks_nothing_unreported() {
    let sb = Sandbox::new("gate-sigint");
    let input = sb.dir.join("big.ndjson");
    const LINES: usize = 40_000;
    write_big_input(&input, LINES, 30_000);
    for store in &stores_with(
        &sb,
        "sigint_stops_after_the_lines_read_and_marks_nothing_unreported",
        false,
    ) {
        let run = |ns: &str, out: &Path| spawn_gate(&sb, &store, ns, &input, out);
        let (ns, reference_ns) = (namespace(), namespace());
        let first_out = sb.dir.join("first.ndjson");
        let _ = std::fs::remove_file(&first_out);
        // Stopped once some output exists, its input still open: SIGINT alone ends it.
        let (child, stdin) = gate_mid_stream(&sb, &store, &ns, &input, LINES / 4, &first_out);
        let kill = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let done = child.wait_with_output().unwrap();
        drop(stdin);
        let stderr = String::from_utf8_lossy(&done.stderr);
        assert_eq!(done.status.code(), Some(1), "{store}: {stderr}");
        assert!(
            stderr.contains("stopped by SIGINT: the lines after line"),
            "{store}: {stderr}"
        );
        let text = std::fs::read_to_string(&first_out).unwrap();
        assert!(text.ends_with('\n'), "{store}: a record was cut");
        let first = complete_records(&first_out);
        let reached = first.len();
        assert!(
            reached > 0 && reached <= LINES / 4,
            "{store}: {reached} lines"
        );

        let second_out = sb.dir.join("second.ndjson");
        let second = run(&ns, &second_out).wait_with_output().unwrap();
        assert!(second.status.success(), "{store}");
        let reference_out = sb.dir.join("reference.ndjson");
        let reference = run(&reference_ns, &reference_out)
            .wait_with_output()
            .unwrap();
        assert!(reference.status.success(), "{store}");
        let verdicts = |records: &[Value]| -> Vec<String> {
            records
                .iter()
                .map(|r| r["verdict"].as_str().unwrap().to_string())
                .collect()
        };
        let mut resumed = verdicts(&first);
        resumed.extend(verdicts(&complete_records(&second_out)).split_off(reached));
        assert_eq!(
            resumed,
            verdicts(&complete_records(&reference_out)),
            "{store}: stopped after line {reached}"
        );
    }
}

/// A gate that finds keys pending for a gate that died (its marks live an hour) says it
/// waits, and a signal ends the wait: it exits 1 naming it, writes no record for the lines
/// it could not judge, and leaves nothing of its own marked (its keys are new to the next
/// run at once), instead of holding its batches until the dead gate's marks expire.
#[test]
fn a_signal_ends_a_wait_on_a_dead_gates_pending_marks() {
    use std::io::{BufRead, Read, Write};
    let sb = Sandbox::new("gate-dead-wait");
    // Records wider than the pipe's buffer: the first gate blocks writing its first
    // batch's records, before it confirms them.
    let pad = "x".repeat(200);
    let lines = |range: std::ops::Range<usize>| -> String {
        range
            .map(|i| format!("{{\"id\":\"k{i}\",\"pad\":\"{pad}\"}}\n"))
            .collect()
    };
    let fresh = sb.dir.join("fresh.ndjson");
    std::fs::write(&fresh, lines(1000..2000)).unwrap();
    let both = sb.dir.join("both.ndjson");
    std::fs::write(&both, lines(0..2000)).unwrap();
    // Waits for `child` to end; one that runs on past `limit` is killed and fails the
    // test (a hang guard: every gate here ends long before it when it works).
    let ended = |mut child: std::process::Child, what: &str| {
        let limit = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > limit {
                let _ = child.kill();
                panic!("{what} still ran after 120 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        child.wait_with_output().unwrap()
    };
    for store in &stores_with(
        &sb,
        "a_signal_ends_a_wait_on_a_dead_gates_pending_marks",
        false,
    ) {
        let ns = namespace();
        let gate_args = |input: &str| {
            vec![
                "gate".to_string(),
                "--key".into(),
                "id".into(),
                "--namespace".into(),
                ns.clone(),
                "--batch".into(),
                "1000".into(),
                "--pending-timeout".into(),
                "1h".into(),
                "--input".into(),
                input.into(),
            ]
        };
        let args = gate_args("-");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut dead = sb
            .command_with_store(&args, &store)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = dead.stdin.take().unwrap();
        stdin.write_all(lines(0..1000).as_bytes()).unwrap();
        stdin.flush().unwrap();
        // A first byte of output: its keys are marked, pending.
        let mut stdout = dead.stdout.take().unwrap();
        let mut byte = [0u8; 1];
        stdout.read_exact(&mut byte).unwrap();
        dead.kill().unwrap();
        dead.wait().unwrap();
        drop((stdin, stdout));

        let out = sb.dir.join("waiting.ndjson");
        let args = gate_args(both.to_str().unwrap());
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend(["--output", out.to_str().unwrap()]);
        let mut waiting = sb
            .command_with_store(&args, &store)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Its standard error, line by line, read on a thread of its own (so a gate that
        // never says it waits fails the test instead of hanging it).
        let (said_tx, said) = std::sync::mpsc::channel();
        let stderr = std::io::BufReader::new(waiting.stderr.take().unwrap());
        let reader = std::thread::spawn(move || {
            for line in stderr.lines() {
                let _ = said_tx.send(line.unwrap());
            }
        });
        let next_line = || {
            said.recv_timeout(std::time::Duration::from_secs(120))
                .unwrap_or_else(|e| panic!("{store}: no line from the waiting gate: {e}"))
        };
        let mut before = String::new();
        while !before.contains("pending for another gate") {
            before.push_str(&next_line());
        }
        assert!(before.contains("waiting up to 1h"), "{store}: {before}");
        let kill = Command::new("kill")
            .args(["-TERM", &waiting.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let done = ended(waiting, "the waiting gate, after SIGTERM");
        reader.join().unwrap();
        let rest: String = said.try_iter().collect::<Vec<_>>().join("\n");
        assert_eq!(done.status.code(), Some(1), "{store}: {before}\n{rest}");
        assert!(
            rest.contains("key(s) waited for another gate to confirm them"),
            "{store}: {rest}"
        );
        assert!(
            complete_records(&out).is_empty(),
            "{store}: records written for lines it could not judge"
        );

        // Nothing of the stopped gate stays marked: the keys only it saw are new at once.
        let next_out = sb.dir.join("next.ndjson");
        let args = gate_args(fresh.to_str().unwrap());
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend(["--output", next_out.to_str().unwrap()]);
        let next = sb
            .command_with_store(&args, &store)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let next = ended(next, "the next gate");
        assert_eq!(
            next.status.code(),
            Some(0),
            "{store}: {}",
            String::from_utf8_lossy(&next.stderr)
        );
        let records = complete_records(&next_out);
        assert_eq!(records.len(), 1000, "{store}");
        assert!(
            records.iter().all(|r| r["verdict"] == "new"),
            "{store}: {:?}",
            records.iter().find(|r| r["verdict"] != "new")
        );
    }
}

#[test]
fn strategies_under_an_unreachable_store() {
    let sb = Sandbox::new("gate-down");
    // A refused port, retried for 1 s (`connect_timeout`), not the default 5 s.
    let dead = "postgres://127.0.0.1:1/x?connect_timeout=1";
    let strict = gate(&sb, dead, &peer_data(), &["--key", "id"]);
    assert_eq!(strict.code, 3, "{}", strict.stderr);
    assert!(
        strict.records.is_empty(),
        "strict reports nothing it did not record"
    );
    assert!(strict.stderr.contains("unavailable"), "{}", strict.stderr);

    let best = gate(
        &sb,
        dead,
        &peer_data(),
        &["--key", "id", "--strategy", "best_effort"],
    );
    assert_eq!(best.code, 0, "{}", best.stderr);
    assert_eq!(best.records.len(), 1000);
    assert!(best
        .records
        .iter()
        .all(|r| r["verdict"] == "new" && r["pass"] == true && r["verified"] == false));
    assert!(best.stderr.contains("1000 fallback(s)"), "{}", best.stderr);

    let log_only = gate(
        &sb,
        dead,
        &peer_data(),
        &["--key", "id", "--strategy", "log_only"],
    );
    assert_eq!(log_only.code, 0, "{}", log_only.stderr);
    assert_eq!(log_only.records.len(), 1000);
    assert!(log_only.records.iter().all(|r| r["pass"] == true));

    // A cursor is read at the start, whatever the strategy: no store, no run.
    let cursor = gate(
        &sb,
        dead,
        &peer_data(),
        &[
            "--key",
            "id",
            "--strategy",
            "best_effort",
            "--cursor",
            "c",
            "--order-by",
            "time,id",
        ],
    );
    assert_eq!(cursor.code, 3, "{}", cursor.stderr);
    assert!(cursor.records.is_empty());
}

#[test]
fn log_only_checks_and_marks_but_never_filters() {
    let sb = Sandbox::new("gate-log-only");
    let events = peer_events();
    let expected = model(&events, &["id"]);
    let args = ["--key", "id", "--strategy", "log_only"];
    let first = gate(&sb, &sb.store, &peer_data(), &args);
    assert_eq!(verdicts(&first.records), expected);
    assert!(first.records.iter().all(|r| r["pass"] == true));
    // The marks were made: a strict gate filters every line now.
    let strict = gate(&sb, &sb.store, &peer_data(), &["--key", "id"]);
    assert!(strict.records.iter().all(|r| r["pass"] == false));
    assert!(strict
        .records
        .iter()
        .all(|r| r["verdict"] == "replay" || r["verdict"] == "conflict"));
}

#[test]
fn amounts_normalised_on_request_and_csv_output() {
    let sb = Sandbox::new("gate-amounts");
    let input = sb.dir.join("amounts.ndjson");
    std::fs::write(
        &input,
        "{\"id\":\"1\",\"load_amount\":\"100.5\"}\n\n{\"id\":\"1\",\"load_amount\":\"$100.50\"}\n{\"id\":\"1\",\"load_amount\":100.50}\n{\"id\":\"1\",\"load_amount\":\"$100.51\"}\n",
    )
    .unwrap();
    let plain = gate(&sb, "memory://", &input, &["--key", "id"]);
    assert_eq!(
        verdicts(&plain.records),
        ["new", "conflict", "conflict", "conflict"]
    );
    let normalised = gate(
        &sb,
        "memory://",
        &input,
        &["--key", "id", "--normalize-amounts", "load_amount"],
    );
    assert_eq!(
        verdicts(&normalised.records),
        ["new", "replay", "replay", "conflict"]
    );
    // The blank line 2 is skipped; numbering stays true.
    let lines: Vec<u64> = normalised
        .records
        .iter()
        .map(|r| r["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [1, 3, 4, 5]);

    let out = sb
        .command_with_store(
            &[
                "gate",
                "--key",
                "id",
                "--format",
                "csv",
                "--input",
                input.to_str().unwrap(),
            ],
            "memory://",
        )
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(
        rows[0],
        "line,verdict,key,pass,verified,event,error,decision"
    );
    assert_eq!(
        rows[1],
        r#"1,new,1,true,true,"{""id"":""1"",""load_amount"":""100.5""}",,"#
    );
    assert_eq!(rows.len(), 5);
}

#[test]
fn bad_arguments_exit_2_naming_the_problem() {
    let sb = Sandbox::new("gate-args");
    let input = peer_data();
    let input = input.to_str().unwrap();
    for (args, needle) in [
        (vec!["gate", "--key", "", "--input", input], "--key"),
        (vec!["gate", "--key", "id,,x", "--input", input], "--key"),
        (
            vec!["gate", "--key", "id, id", "--input", input],
            "--key \"id, id\" names \"id\" twice",
        ),
        (
            vec![
                "gate",
                "--key",
                "id",
                "--ttl",
                "3 fortnights",
                "--input",
                input,
            ],
            "--ttl",
        ),
        (
            vec!["gate", "--key", "id", "--format", "xml", "--input", input],
            "xml",
        ),
        (
            vec!["gate", "--key", "id", "--format", "html", "--input", input],
            "--format html is for idem report",
        ),
        (
            vec![
                "gate",
                "--key",
                "id",
                "--strategy",
                "yolo",
                "--input",
                input,
            ],
            "--strategy",
        ),
        (
            vec!["gate", "--key", "id", "--input", "/no/such/file.ndjson"],
            "/no/such/file.ndjson",
        ),
        (vec!["runs", "--format", "csv"], "idem gate only"),
    ] {
        let out = sb.idem(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn a_closed_stdout_is_not_a_crash_and_marks_nothing_unreported() {
    // `| head -1`: the gate stops quietly. The batch whose write failed and the batches
    // whose store call was under way (up to 4 at once on Postgres and Redis) are unmarked
    // again: the same input afterwards says `new` for every line after the last batch the
    // gate wrote whole, as if the first run had stopped there.
    let sb = Sandbox::new("gate-pipe");
    let events = peer_events();
    let expected = model(&events, &["id"]);
    let name = "a_closed_stdout_is_not_a_crash_and_marks_nothing_unreported";
    for store in &stores_with(&sb, name, false) {
        let ns = namespace();
        let args = ["--key", "id", "--batch", "10", "--namespace", &ns];
        let input = peer_data();
        let mut all = vec!["gate", "--input", input.to_str().unwrap()];
        all.extend(args);
        let mut child = sb
            .command_with_store(&all, &store)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        // The reader is gone (`| head -1`).
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(first.contains("\"line\":1"), "{first}");
        assert_eq!(out.status.code(), Some(0), "{store}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stderr.contains("the output was closed"), "{stderr}");
        // The lines of the batches it wrote (the last one into the closed pipe).
        let written: usize = stderr
            .split("gate: ")
            .nth(1)
            .and_then(|s| s.split(" line(s)").next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a summary: {stderr}"));
        assert!(written < 1000, "{store}: stopped early ({written})");
        let again = gate(&sb, &store, &peer_data(), &args);
        assert_eq!(again.code, 0, "{}", again.stderr);
        // The pass after equals a first run cut at some line c: replays up to c, then what
        // a fresh run says. c is at least the line the reader saw, and before the end of
        // the batch whose write failed (that batch was unmarked too).
        let got = verdicts(&again.records);
        let cut_at = |c: usize| {
            let mut want = second_pass(&expected[..c]);
            want.extend_from_slice(&expected[c..]);
            want
        };
        let cut = (1..written).find(|&c| cut_at(c) == got);
        assert!(
            cut.is_some(),
            "{store}: after {written} lines written, the second pass is no cut of the first: {got:?}"
        );
    }
}

#[test]
fn lines_that_trickle_in_are_written_without_waiting_for_a_full_batch() {
    // `tail -f events.ndjson | idem gate`: batches are 1000 lines by default, but lines that
    // come one at a time get their records as soon as they are marked.
    use std::io::Write;
    let sb = Sandbox::new("gate-trickle");
    let name = "lines_that_trickle_in_are_written_without_waiting_for_a_full_batch";
    for store in &stores_with(&sb, name, false) {
        let ns = namespace();
        let mut child = sb
            .command_with_store(&["gate", "--key", "id", "--namespace", &ns], &store)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<Value>();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let record = serde_json::from_str(&line.unwrap()).unwrap();
                if tx.send(record).is_err() {
                    break;
                }
            }
        });
        let records = |n: usize| -> Vec<(u64, String)> {
            (0..n)
                .map(|_| {
                    let r = rx
                        .recv_timeout(std::time::Duration::from_secs(20))
                        .expect("a record without waiting for more input");
                    (
                        r["line"].as_u64().unwrap(),
                        r["verdict"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        };
        let pair = |line: u64, verdict: &str| (line, verdict.to_string());
        stdin
            .write_all(b"{\"id\":\"a\",\"v\":1}\n{\"id\":\"b\",\"v\":1}\n")
            .unwrap();
        stdin.flush().unwrap();
        assert_eq!(records(2), [pair(1, "new"), pair(2, "new")], "{store}");
        stdin.write_all(b"{\"id\":\"a\",\"v\":1}\n").unwrap();
        stdin.flush().unwrap();
        assert_eq!(records(1), [pair(3, "replay")], "{store}");
        stdin.write_all(b"{\"id\":\"b\",\"v\":2}\n").unwrap();
        stdin.flush().unwrap();
        assert_eq!(records(1), [pair(4, "conflict")], "{store}");
        // Ctrl-C while it waits for more input (stdin still open): it stops at once.
        let kill = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > std::time::Duration::from_secs(20) {
                child.kill().unwrap();
                panic!("{store}: SIGINT did not stop a gate waiting for input");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(status.code(), Some(1), "{store}: {stderr}");
        assert!(
            stderr.contains("4 line(s)") && stderr.contains("stopped by SIGINT"),
            "{store}: {stderr}"
        );
        drop(stdin);
    }
}

#[test]
fn an_output_that_would_destroy_the_input_or_the_ledger_is_refused_before_anything_runs() {
    let sb = Sandbox::new("gate-overwrite");
    let input = sb.dir.join("in.ndjson");
    std::fs::copy(peer_data(), &input).unwrap();
    let db = sb.dir.join("gate.db");
    let store = format!("sqlite://{}", db.display());
    let other = sb.dir.join("out.ndjson");
    let refused = |args: &[&str], what: &str| {
        let mut all = vec!["gate", "--key", "id", "--input", input.to_str().unwrap()];
        all.extend(args);
        let out = sb.command_with_store(&all, &store).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(what), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing ran");
    };
    let same_name = sb.dir.join(".").join("in.ndjson");
    refused(&["--output", input.to_str().unwrap()], "the same file as");
    refused(
        &["--output", same_name.to_str().unwrap()],
        "the same file as",
    );
    // The ledger, before it exists and after.
    refused(&["--output", db.to_str().unwrap()], "SQLite database");
    refused(
        &["--metrics-file", input.to_str().unwrap()],
        "the same file as",
    );
    refused(
        &[
            "--output",
            other.to_str().unwrap(),
            "--metrics-file",
            other.to_str().unwrap(),
        ],
        "the same file as",
    );
    refused(&["--metrics-file", "/nonexistent/m.prom"], "does not exist");
    // Every file of the ledger, not only its main file, before it exists.
    for suffix in ["-wal", "-shm", "-journal"] {
        let companion = format!("{}{suffix}", db.display());
        refused(&["--output", &companion], "SQLite database");
        refused(&["--metrics-file", &companion], "SQLite database");
    }
    // A folder is found bad before any work, not when the metrics are written after it.
    refused(&["--metrics-file", sb.dir.to_str().unwrap()], "is a folder");
    refused(&["--output", sb.dir.to_str().unwrap()], "is a folder");
    assert_eq!(
        std::fs::read(&input).unwrap(),
        std::fs::read(peer_data()).unwrap(),
        "the input is untouched"
    );
    assert!(!db.exists(), "nothing was recorded");
    let ok = gate(&sb, &store, &input, &["--key", "id"]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert_eq!(
        counts(&verdicts(&ok.records))["new"],
        984,
        "every key new: none marked before"
    );
    refused(&["--output", db.to_str().unwrap()], "SQLite database");
    // The files of any SQLite database, a warehouse as well as this ledger: here another
    // database in WAL mode, open in another store's name.
    let warehouse = sb.dir.join("warehouse.db");
    let wal = sb.dir.join("warehouse.db-wal");
    let other_store = format!("sqlite://{}", warehouse.display());
    let made = gate(&sb, &other_store, &input, &["--key", "id"]);
    assert_eq!(made.code, 0, "{}", made.stderr);
    for file in [&warehouse, &wal] {
        refused(&["--output", file.to_str().unwrap()], "SQLite database");
    }
    let check = integrity_check(&db);
    assert_eq!(check, "ok", "the ledger is intact");
}

/// `pragma integrity_check` of a SQLite file, opened read-only.
fn integrity_check(db: &Path) -> String {
    use sqlx::{ConnectOptions, Row};
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(db)
            .read_only(true)
            .connect()
            .await
            .unwrap();
        sqlx::query("pragma integrity_check")
            .fetch_one(&mut conn)
            .await
            .unwrap()
            .get::<String, _>(0)
    })
}

#[test]
fn a_failed_write_leaves_nothing_marked() {
    // `--output /dev/full`: no record can be written, so no key may stay marked (else the
    // next run would call every line a replay that nobody saw as new).
    let full = Path::new("/dev/full");
    if !full.exists() {
        common::skip("skipped a_failed_write_leaves_nothing_marked: no /dev/full".into());
        return;
    }
    let sb = Sandbox::new("gate-full");
    let expected = model(&peer_events(), &["id"]);
    for store in &stores_with(&sb, "a_failed_write_leaves_nothing_marked", false) {
        let ns = namespace();
        let args = ["--key", "id", "--batch", "100", "--namespace", &ns];
        let mut all = vec!["--output", "/dev/full"];
        all.extend(args);
        let failed = gate(&sb, &store, &peer_data(), &all);
        // Keys were marked before the write failed: a failure after work, exit 1, never
        // the usage error's 2 ("nothing was run").
        assert_eq!(failed.code, 1, "{store}: {}", failed.stderr);
        assert!(failed.stderr.contains("/dev/full"), "{}", failed.stderr);
        let again = gate(&sb, &store, &peer_data(), &args);
        assert_eq!(again.code, 0, "{}", again.stderr);
        assert_eq!(
            verdicts(&again.records),
            expected,
            "{store}: as a first run"
        );
    }
}

#[test]
fn a_replay_carries_the_decision_recorded_by_the_first_processing() {
    use idem::events::dedup::Deduplicator;
    use idem::events::strategy::{EventGate, Strategy};
    let sb = Sandbox::new("gate-decision");
    let input = sb.dir.join("one.ndjson");
    std::fs::write(&input, "{\"id\":\"p-1\",\"amount\":\"5.00\"}\n").unwrap();
    for store in &stores(
        &sb,
        "a_replay_carries_the_decision_recorded_by_the_first_processing",
    ) {
        let ns = namespace();
        // A service processed the event first, through the library, and stored its decision.
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let opened = idem::store::open_event_keys(&store).await.unwrap();
            let dedup = Deduplicator::new(opened, &ns, ["id"]).unwrap();
            let gate = EventGate::new(dedup, Strategy::Strict, Default::default());
            let event = serde_json::json!({"amount": "5.00", "id": "p-1"});
            let first = gate
                .check_and_mark(&[event], chrono::Utc::now())
                .await
                .unwrap();
            assert_eq!(first[0].as_ref().unwrap().verdict_name(), "new");
            let decision = serde_json::json!({"status": "accepted"});
            assert!(gate.record_decision("p-1", &decision).await.unwrap());
        });
        let out = gate(&sb, &store, &input, &["--key", "id", "--namespace", &ns]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        assert_eq!(out.records[0]["verdict"], "replay", "{store}");
        assert_eq!(
            out.records[0]["decision"],
            serde_json::json!({"status": "accepted"})
        );
        assert_eq!(out.records[0]["pass"], false);
    }
}

#[test]
fn two_gates_on_one_store_never_both_say_new() {
    let sb = Sandbox::new("gate-two");
    let input = sb.dir.join("shared.ndjson");
    const LINES: usize = 20_000;
    write_big_input(&input, LINES, LINES);
    // The second gate reads the same events the other way round, in batches of another
    // size: the two meet in the middle, each batch overlapping two or three of the other's.
    let reversed = sb.dir.join("reversed.ndjson");
    let text = std::fs::read_to_string(&input).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.reverse();
    std::fs::write(&reversed, lines.join("\n") + "\n").unwrap();
    for store in &stores_with(&sb, "two_gates_on_one_store_never_both_say_new", false) {
        let ns = namespace();
        let gates: Vec<_> = [(&input, "100"), (&reversed, "70")]
            .into_iter()
            .enumerate()
            .map(|(n, (input, batch))| {
                let out = sb.dir.join(format!("out-{n}.ndjson"));
                let child = sb
                    .command_with_store(
                        &[
                            "gate",
                            "--key",
                            "id",
                            "--namespace",
                            &ns,
                            "--batch",
                            batch,
                            // Longer than the watchdog below: a mark that expired while its
                            // gate was slow (a busy machine) would make its key `new` in
                            // both gates by design (at least once), which is not what
                            // this test is after; two gates waiting on each other now
                            // hang until the watchdog instead of ending at the timeout.
                            "--pending-timeout",
                            "600s",
                            "--input",
                            input.to_str().unwrap(),
                            "--output",
                            out.to_str().unwrap(),
                        ],
                        &store,
                    )
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                (child, out)
            })
            .collect();
        // Two gates waiting on each other would never end: past a bound far beyond a
        // run's seconds, both are killed and the test fails with what they said.
        let pids: Vec<u32> = gates.iter().map(|(c, _)| c.id()).collect();
        let (ended, deadline) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            // Disconnected: both ended (the sender dropped) before the bound.
            let waited = deadline.recv_timeout(Duration::from_secs(300));
            if waited == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                for pid in pids {
                    let _ = Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .status();
                }
                return true;
            }
            false
        });
        // Both waited for at once: a gate blocked on a full stderr pipe never waits on us.
        let waits: Vec<_> = gates
            .into_iter()
            .map(|(child, out)| std::thread::spawn(move || (child.wait_with_output(), out)))
            .collect();
        let done: Vec<_> = waits.into_iter().map(|w| w.join().unwrap()).collect();
        drop(ended);
        let killed = watchdog.join().unwrap();
        let done: Vec<_> = done.into_iter().map(|(d, out)| (d.unwrap(), out)).collect();
        // Both gates' stderr when either failed: the one that did not end may be waiting
        // on what the other said went wrong.
        assert!(
            !killed && done.iter().all(|(d, _)| d.status.success()),
            "{store}: {}{}",
            if killed {
                "the gates never ended (killed after 300 s)"
            } else {
                "a gate failed"
            },
            done.iter()
                .enumerate()
                .map(|(n, (d, _))| format!(
                    "\n--- gate {n} ({}), stderr:\n{}",
                    d.status,
                    String::from_utf8_lossy(&d.stderr)
                ))
                .collect::<String>()
        );
        let mut new_by_key: HashMap<String, usize> = HashMap::new();
        for (_, out) in done {
            let records = complete_records(&out);
            assert_eq!(records.len(), LINES);
            for r in records.iter().filter(|r| r["verdict"] == "new") {
                *new_by_key
                    .entry(r["key"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
        }
        assert_eq!(new_by_key.len(), LINES, "{store}: every key new somewhere");
        assert!(
            new_by_key.values().all(|&n| n == 1),
            "{store}: a key was new in both gates"
        );
    }
}

fn write_lines(path: &Path, lines: &[Value]) {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, text).unwrap();
}

fn cursor_args<'a>(ns: &'a str, cursor: &'a str, batch: &'a str) -> Vec<&'a str> {
    vec![
        "--key",
        "ts,id",
        "--namespace",
        ns,
        "--cursor",
        cursor,
        "--order-by",
        "ts,id",
        "--batch",
        batch,
        "--pending-timeout",
        "1s",
    ]
}

#[test]
fn cursor_keeps_timestamp_ties_and_skips_redelivery_after_a_restart() {
    use serde_json::json;
    let sb = Sandbox::new("gate-cursor");
    let first = sb.dir.join("first.ndjson");
    let again = sb.dir.join("again.ndjson");
    write_lines(
        &first,
        &[
            json!({"ts": 1, "id": "a"}),
            json!({"ts": 2, "id": "a"}),
            json!({"ts": 2, "id": "b"}),
        ],
    );
    // A source that redelivers from the cursor's timestamp on (`ts >= 2`): (2,c) shares
    // the cursor's timestamp but comes after it by id, so it is new, not lost.
    write_lines(
        &again,
        &[
            json!({"ts": 2, "id": "a"}),
            json!({"ts": 2, "id": "b"}),
            json!({"ts": 2, "id": "c"}),
            json!({"ts": 3, "id": "a"}),
        ],
    );
    for store in &stores(
        &sb,
        "cursor_keeps_timestamp_ties_and_skips_redelivery_after_a_restart",
    ) {
        let ns = namespace();
        let args = cursor_args(&ns, "c", "2");
        let run = gate(&sb, &store, &first, &args);
        if store.starts_with("bigquery://") {
            assert_eq!(run.code, 2, "{store}: {}", run.stderr);
            assert!(
                run.stderr.contains("does not support event cursors"),
                "{store}: {}",
                run.stderr
            );
            continue;
        }
        assert_eq!(run.code, 0, "{store}: {}", run.stderr);
        assert_eq!(verdicts(&run.records), ["new", "new", "new"], "{store}");
        assert!(
            run.stderr.contains("cursor at (2, \"b\")"),
            "{store}: {}",
            run.stderr
        );
        // A restart: the process is new, the cursor is in the store.
        let run = gate(&sb, &store, &again, &args);
        assert_eq!(run.code, 0, "{store}: {}", run.stderr);
        assert_eq!(
            verdicts(&run.records),
            ["before_cursor", "before_cursor", "new", "new"],
            "{store}"
        );
        assert!(run.records[..2]
            .iter()
            .all(|r| r["pass"] == false && r["key"].is_null()));
        assert!(
            run.stderr.contains("2 before_cursor") && run.stderr.contains("cursor at (3, \"a\")"),
            "{store}: {}",
            run.stderr
        );

        // Marks without the cursor (as after a crash between the marks and the advance):
        // the dedup set catches the redelivered events after the cursor.
        let ns = namespace();
        let plain = gate(&sb, &store, &first, &["--key", "ts,id", "--namespace", &ns]);
        assert_eq!(verdicts(&plain.records), ["new", "new", "new"], "{store}");
        let args = cursor_args(&ns, "c", "2");
        let run = gate(&sb, &store, &first, &args);
        assert_eq!(
            verdicts(&run.records),
            ["replay", "replay", "replay"],
            "{store}"
        );
        let run = gate(&sb, &store, &first, &args);
        assert_eq!(
            verdicts(&run.records),
            ["before_cursor", "before_cursor", "before_cursor"],
            "{store}"
        );
    }
}

/// xorshift64*: a seeded generator, enough for generated streams.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A stream in (ts, id) order with many events per timestamp, and redelivered copies of
/// recent events out of order; the distinct events in order.
fn generated_stream(seed: u64, events: usize) -> (Vec<Value>, Vec<(i64, String)>) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut distinct: Vec<(i64, String)> = Vec::with_capacity(events);
    let mut ts = 1_700_000_000i64;
    while distinct.len() < events {
        // 1 to 8 events share a timestamp; ids random, sorted within it.
        let n = 1 + rng.below(8) as usize;
        let mut ids: Vec<String> = (0..n)
            .map(|_| format!("{:x}", rng.below(1 << 20)))
            .collect();
        ids.sort();
        ids.dedup();
        distinct.extend(ids.into_iter().map(|id| (ts, id)));
        ts += 1 + rng.below(2) as i64;
    }
    distinct.truncate(events);
    let mut lines = Vec::with_capacity(events * 11 / 10);
    for (i, (ts, id)) in distinct.iter().enumerate() {
        lines.push(serde_json::json!({"ts": ts, "id": id, "amount": i}));
        if i > 0 && rng.below(10) == 0 {
            let j = i - rng.below(i.min(30) as u64) as usize;
            let (ts, id) = &distinct[j];
            lines.push(serde_json::json!({"ts": ts, "id": id, "amount": j}));
        }
    }
    (lines, distinct)
}

/// The property: over generated streams, a gate with a cursor SIGKILLed mid-run and run
/// again over the whole stream (a redelivery of everything) reports no event `new` twice,
/// and loses none: each event is `new` in one of the runs, or (the one batch in flight
/// when the kill came: marked, cursor advanced, records not yet written) the rerun finds
/// it recorded. A third run skips every line by the cursor alone.
#[test]
fn cursor_sigkill_property_no_event_lost_or_new_twice() {
    let sb = Sandbox::new("gate-cursor-kill");
    const EVENTS: usize = 3000;
    const BATCH: usize = 50;
    let stores = stores_with(
        &sb,
        "cursor_sigkill_property_no_event_lost_or_new_twice",
        false,
    );
    for seed in 1..=3u64 {
        let (lines, distinct) = generated_stream(seed, EVENTS);
        let input = sb.dir.join(format!("stream-{seed}.ndjson"));
        write_lines(&input, &lines);
        for store in &stores {
            let ns = namespace();
            let batch = BATCH.to_string();
            let args = cursor_args(&ns, "trades", &batch);
            let out1 = sb.dir.join("killed.ndjson");
            let _ = std::fs::remove_file(&out1);
            let mut all = vec![
                "gate",
                "--input",
                input.to_str().unwrap(),
                "--output",
                out1.to_str().unwrap(),
            ];
            all.extend(&args);
            let mut child = sb
                .command_with_store(&all, &store)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            // Kill once the output passed a size the seed picks.
            let mut rng = Rng(seed + 7);
            let threshold = 1 + rng.below(lines.len() as u64 * 40);
            loop {
                if std::fs::metadata(&out1).is_ok_and(|m| m.len() >= threshold) {
                    break;
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let _ = child.kill();
            child.wait().unwrap();
            let killed = complete_records(&out1);

            let rerun = gate(&sb, &store, &input, &args);
            assert_eq!(rerun.code, 0, "{store}: {}", rerun.stderr);
            assert_eq!(
                rerun.records.len(),
                lines.len(),
                "{store}: one record a line"
            );

            let key = |r: &Value| {
                let e = &r["event"];
                (
                    e["ts"].as_i64().unwrap(),
                    e["id"].as_str().unwrap().to_string(),
                )
            };
            let mut new: HashMap<(i64, String), usize> = HashMap::new();
            for r in killed.iter().chain(&rerun.records) {
                if r["verdict"] == "new" {
                    *new.entry(key(r)).or_default() += 1;
                }
            }
            let killed_new: std::collections::HashSet<_> = killed
                .iter()
                .filter(|r| r["verdict"] == "new")
                .map(key)
                .collect();
            // Every event is `new` at least once (issue 21.1: a mark is pending until its
            // record is out, so the batch the kill cut is `new` in the rerun); twice only
            // for a batch written but not yet confirmed when the kill came.
            let mut twice = 0;
            for e in &distinct {
                match new.get(e).copied().unwrap_or(0) {
                    1 => {}
                    0 => panic!("{store} seed {seed}: {e:?} never reported new: lost"),
                    2 if killed_new.contains(e) => twice += 1,
                    n => panic!("{store} seed {seed}: {e:?} new {n} times"),
                }
            }
            eprintln!(
                "{store} seed {seed}: {} of {} lines reported before the kill, {twice} new again",
                killed.len(),
                lines.len()
            );
            assert!(
                twice <= BATCH,
                "{store} seed {seed}: {twice} events new twice (batch {BATCH})"
            );

            let third = gate(&sb, &store, &input, &args);
            assert_eq!(third.code, 0, "{store}: {}", third.stderr);
            assert!(
                third
                    .records
                    .iter()
                    .all(|r| r["verdict"] == "before_cursor"),
                "{store} seed {seed}: the cursor covers the whole stream"
            );
        }
    }
}

/// The samples of a Prometheus text file, checking every line is `# HELP`, `# TYPE` or
/// `name{labels} value`: (name with its labels, value).
fn prometheus_samples(text: &str) -> HashMap<String, f64> {
    let mut samples = HashMap::new();
    assert!(text.ends_with('\n'), "the file ends with a line feed");
    for line in text.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not `name value`: {line:?}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "metric name {name:?} in {line:?}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "labels in {line:?}");
        }
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value in {line:?}")),
        };
        samples.insert(series.to_string(), value);
    }
    samples
}

#[test]
fn metrics_file_is_prometheus_text_matching_the_summary_and_never_partial() {
    let sb = Sandbox::new("gate-metrics");
    let metrics = sb.dir.join("prom").join("idem_gate.prom");
    std::fs::create_dir_all(metrics.parent().unwrap()).unwrap();
    let ns = namespace();
    // A reader that keeps reading the file while gates rewrite it: every read it makes is
    // a whole file (the temp file + rename), never a prefix.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (stop, path) = (stop.clone(), metrics.clone());
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(text) = std::fs::read_to_string(&path) {
                    assert!(
                        text.trim_end().lines().last().is_some_and(
                            |l| l.starts_with("idem_gate_batch_duration_seconds_count")
                        ),
                        "a partial metrics file was visible: {text:?}"
                    );
                    reads += 1;
                }
            }
            reads
        })
    };
    let mut last = None;
    for _ in 0..5 {
        let run = gate(
            &sb,
            &sb.store,
            &peer_data(),
            &[
                "--key",
                "id",
                "--namespace",
                &ns,
                "--batch",
                "100",
                "--metrics-file",
                metrics.to_str().unwrap(),
                "--stats-format",
                "json",
            ],
        );
        assert_eq!(run.code, 0, "{}", run.stderr);
        last = Some(run);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(reader.join().unwrap() > 0, "the reader saw the file");
    let leftovers: Vec<_> = std::fs::read_dir(metrics.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, [std::ffi::OsString::from("idem_gate.prom")]);

    let run = last.unwrap();
    let stats: Value = serde_json::from_str(run.stderr.trim().lines().last().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {}", run.stderr));
    let summary = &stats["summary"];
    assert_eq!(summary["lines"], 1000);
    assert_eq!(summary["replay"], 984, "{stats}");
    let m = prometheus_samples(&std::fs::read_to_string(&metrics).unwrap());
    let get = |series: &str| {
        *m.get(series)
            .unwrap_or_else(|| panic!("{series} missing from {m:?}"))
    };
    let label = format!("namespace=\"{ns}\"");
    for verdict in [
        "new",
        "replay",
        "conflict",
        "invalid",
        "before_cursor",
        "blank",
    ] {
        assert_eq!(
            get(&format!(
                "idem_gate_lines_total{{{label},verdict=\"{verdict}\"}}"
            )),
            summary[verdict].as_f64().unwrap(),
            "{verdict}"
        );
    }
    for (metric, stat) in [
        ("checked_total", "checked"),
        ("unique_total", "unique"),
        ("duplicates_total", "duplicates"),
        ("store_errors_total", "store_errors"),
        ("extraction_failures_total", "extraction_failures"),
        ("fallbacks_total", "fallbacks"),
        ("unconfirmed_total", "unconfirmed"),
        ("confirm_failures_total", "confirm_failures"),
        ("batches_total", "batches"),
    ] {
        assert_eq!(
            get(&format!("idem_gate_{metric}{{{label}}}")),
            stats["stats"][stat].as_f64().unwrap(),
            "{metric}"
        );
    }
    assert_eq!(get(&format!("idem_gate_batches_total{{{label}}}")), 10.0);
    assert_eq!(
        get(&format!("idem_gate_circuit_breaker_state{{{label}}}")),
        0.0
    );
    assert_eq!(
        get(&format!(
            "idem_gate_batch_duration_seconds_bucket{{{label},le=\"+Inf\"}}"
        )),
        10.0
    );
    assert_eq!(
        get(&format!(
            "idem_gate_batch_duration_seconds_count{{{label}}}"
        )),
        10.0
    );
    assert!(get(&format!("idem_gate_batch_duration_seconds_sum{{{label}}}")) > 0.0);
    assert!((get(&format!("idem_gate_duplicate_ratio{{{label}}}")) - 1.0).abs() < 1e-9);
}

/// `rediss://` end to end against a TLS-only `redis-server` of the test's own, whose
/// certificate a throwaway CA signed: verified with `tls_ca` (new, then replays); refused
/// without it (the system's roots do not know the CA) and over plain `redis://`, both as an
/// unusable store (exit 3) saying why; a missing CA file is a config error (exit 2).
#[cfg(feature = "redis")]
#[test]
fn rediss_with_a_private_ca_verifies_and_refuses_untrusted_or_plain() {
    let test = "gate::rediss_with_a_private_ca_verifies_and_refuses_untrusted_or_plain";
    // A Redis test like the others: it runs where IDEM_TEST_REDIS_URL says Redis is wanted.
    if common::redis_url(test).is_none() {
        return;
    }
    let Some(server) = common::redis_tls::TlsRedis::start(test) else {
        return;
    };
    let sb = Sandbox::new("gate-tls");
    let input = sb.dir.join("events.ndjson");
    std::fs::write(
        &input,
        "{\"id\":\"a\",\"v\":1}\n{\"id\":\"b\",\"v\":2}\n{\"id\":\"a\",\"v\":1}\n",
    )
    .unwrap();
    let port = server.port;
    let ca = server.ca.display().to_string();
    let trusted = format!("rediss://127.0.0.1:{port}/?tls_ca={ca}");
    let no_panic = |g: &Gated| assert!(!g.stderr.contains("panicked"), "{}", g.stderr);

    let first = gate(&sb, &trusted, &input, &["--key", "id"]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert_eq!(verdicts(&first.records), ["new", "new", "replay"]);
    let second = gate(&sb, &trusted, &input, &["--key", "id"]);
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert_eq!(verdicts(&second.records), ["replay", "replay", "replay"]);

    // The redis crate's #insecure: no verification, same data.
    let insecure = format!("rediss://127.0.0.1:{port}/#insecure");
    let third = gate(&sb, &insecure, &input, &["--key", "id"]);
    assert_eq!(third.code, 0, "{}", third.stderr);
    assert_eq!(verdicts(&third.records), ["replay", "replay", "replay"]);

    let untrusted = gate(
        &sb,
        &format!("rediss://127.0.0.1:{port}/"),
        &input,
        &["--key", "id"],
    );
    assert_eq!(untrusted.code, 3, "{}", untrusted.stderr);
    assert!(untrusted.records.is_empty());
    assert!(
        untrusted
            .stderr
            .contains("TLS certificate failed verification")
            && untrusted.stderr.contains("UnknownIssuer")
            && untrusted.stderr.contains("tls_ca="),
        "{}",
        untrusted.stderr
    );
    no_panic(&untrusted);

    let plain = gate(
        &sb,
        &format!("redis://127.0.0.1:{port}/"),
        &input,
        &["--key", "id"],
    );
    assert_eq!(plain.code, 3, "{}", plain.stderr);
    assert!(plain.records.is_empty());
    assert!(
        plain.stderr.contains("unavailable") && plain.stderr.contains("rediss://"),
        "{}",
        plain.stderr
    );
    no_panic(&plain);

    let missing = sb.dir.join("no-such-ca.pem");
    let bad_ca = gate(
        &sb,
        &format!(
            "rediss://:s3cret@127.0.0.1:{port}/?tls_ca={}",
            missing.display()
        ),
        &input,
        &["--key", "id"],
    );
    assert_eq!(bad_ca.code, 2, "{}", bad_ca.stderr);
    assert!(
        bad_ca.stderr.contains(&missing.display().to_string()),
        "{}",
        bad_ca.stderr
    );
    assert!(!bad_ca.stderr.contains("s3cret"), "{}", bad_ca.stderr);
    no_panic(&bad_ca);
}

/// Numbers compare as Python's `json` compares them (issue 21.7, 21.11): integers beyond
/// 64 bits exactly (two amounts in wei that differ in the last digit conflict), also under
/// `--normalize-amounts`; `-0` and `0` are equal (a replay); a UTF-8 byte order mark does
/// not make line 1 invalid.
#[test]
fn numbers_compare_exactly_and_a_byte_order_mark_is_not_part_of_line_one() {
    let sb = Sandbox::new("idem-gate-numbers");
    let input = sb.dir.join("in.ndjson");
    std::fs::write(
        &input,
        "\u{feff}{\"id\":\"a\",\"wei\":18446744073709551616}\n\
         {\"id\":\"a\",\"wei\":18446744073709551617}\n\
         {\"id\":\"a\",\"wei\":18446744073709551616}\n\
         {\"id\":\"z\",\"n\":0}\n\
         {\"id\":\"z\",\"n\":-0}\n\
         {\"id\":\"f\",\"n\":0.0}\n\
         {\"id\":\"f\",\"n\":-0.0}\n\
         {\"id\":\"k\",\"big\":123456789012345678901234567890}\n\
         {\"id\":\"k\",\"big\":123456789012345678901234567890}\n",
    )
    .unwrap();
    let g = gate(&sb, &sb.store, &input, &["--key", "id"]);
    assert_eq!(g.code, 0, "{}", g.stderr);
    assert_eq!(
        verdicts(&g.records),
        ["new", "conflict", "replay", "new", "replay", "new", "replay", "new", "replay"],
        "{:?}",
        g.records
    );
    // The same with the amount normalised: 1e20 wei and 1e20 + 1 wei differ.
    let amounts = sb.dir.join("amounts.ndjson");
    std::fs::write(
        &amounts,
        "{\"id\":\"p\",\"amount\":100000000000000000000.5}\n\
         {\"id\":\"p\",\"amount\":100000000000000000001}\n\
         {\"id\":\"q\",\"amount\":100000000000000000000}\n\
         {\"id\":\"q\",\"amount\":100000000000000000001}\n",
    )
    .unwrap();
    let g = gate(
        &sb,
        &sb.store,
        &amounts,
        &[
            "--key",
            "id",
            "--namespace",
            "wei",
            "--normalize-amounts",
            "amount",
        ],
    );
    assert_eq!(g.code, 0, "{}", g.stderr);
    let v = verdicts(&g.records);
    assert_eq!(v[2..], ["new", "conflict"], "{:?}", g.records);
}

/// A namespace is printable text: a control character is refused before anything is read
/// or marked (issue 21.11).
#[test]
fn a_namespace_with_a_control_character_is_refused() {
    let sb = Sandbox::new("idem-gate-namespace");
    let input = sb.dir.join("in.ndjson");
    std::fs::write(&input, "{\"id\":\"a\"}\n").unwrap();
    for ns in ["pay\nments", "pay\tments", "\u{7}"] {
        let g = gate(&sb, &sb.store, &input, &["--key", "id", "--namespace", ns]);
        assert_eq!(g.code, 2, "{ns:?}: {}", g.stderr);
        assert!(
            g.stderr.contains("--namespace") && g.stderr.contains("control character"),
            "{}",
            g.stderr
        );
        assert!(g.records.is_empty());
    }
}

/// A Redis server of the test's own on a free port, killed on drop (the shared one on
/// 6379 must not see its clients killed).
struct OwnRedis {
    child: std::process::Child,
    url: String,
}

impl OwnRedis {
    /// The server, or `None` after saying why the test is skipped (see `common::skip`):
    /// `IDEM_TEST_REDIS_URL` unset, or no `redis-server` to run. A server that starts but
    /// never accepts a connection fails the test.
    fn start(test: &str) -> Option<OwnRedis> {
        common::redis_url(test)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = match std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(child) => child,
            Err(e) => {
                common::skip(format!(
                    "skipped {test}: cannot run `redis-server` ({e}); the test runs a Redis \
                     server of its own"
                ));
                return None;
            }
        };
        // Killed on drop, also when an assertion below fails.
        let mut redis = OwnRedis {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        };
        let start = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = redis.child.try_wait().unwrap() {
                panic!("{test}: redis-server on port {port} exited ({status}) before accepting");
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(30),
                "{test}: redis-server on port {port} accepted no connection in 30 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Some(redis)
    }

    /// Sends the server SIGSTOP or SIGCONT.
    fn signal(&self, which: &str) {
        let _ = std::process::Command::new("kill")
            .args([&format!("-{which}"), &self.child.id().to_string()])
            .status();
    }

    /// Drops every client connection (the gate's), mid-pipeline if one is in flight.
    fn kill_clients(&self) {
        let client = redis::Client::open(self.url.as_str()).unwrap();
        let mut conn = client.get_connection().unwrap();
        let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query(&mut conn);
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 21.1a: `--strategy strict` on Redis when the server stops answering mid-batch:
/// the gate gives up (and cannot take its marks back), then the server runs the queued
/// pipeline and marks keys whose batch was never written. Those marks are pending:
/// after the pending timeout the next run reports them `new`. No event is left marked
/// and never reported.
#[test]
fn a_redis_server_stalled_mid_batch_leaves_no_event_marked_and_never_reported() {
    let test = "a_redis_server_stalled_mid_batch_leaves_no_event_marked_and_never_reported";
    let Some(redis) = OwnRedis::start(test) else {
        return;
    };
    let sb = Sandbox::new("gate-redis-drop");
    let input = sb.dir.join("big.ndjson");
    const LINES: usize = 200_000;
    write_big_input(&input, LINES, 200_000);
    let first_out = sb.dir.join("first.ndjson");
    let args = |out: &Path| {
        vec![
            "gate".to_string(),
            "--key".into(),
            "id".into(),
            "--strategy".into(),
            "strict".into(),
            "--batch".into(),
            "1000".into(),
            "--pending-timeout".into(),
            "2s".into(),
            "--input".into(),
            input.to_str().unwrap().into(),
            "--output".into(),
            out.to_str().unwrap().into(),
        ]
    };
    let first_args = args(&first_out);
    let first_refs: Vec<&str> = first_args.iter().map(String::as_str).collect();
    let mut child = sb
        .command_with_store(&first_refs, &redis.url)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if std::fs::metadata(&first_out).is_ok_and(|m| m.len() > 0) {
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // The server stops answering mid-batch (its commands wait in the socket): the strict
    // gate times out and stops, and cannot take its marks back either. Then the server
    // goes on and runs the queued pipeline: keys marked that nobody reported.
    redis.signal("STOP");
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() && started.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    redis.signal("CONT");
    redis.kill_clients();
    let status = child.wait().unwrap();
    let reported = complete_records(&first_out);
    assert!(
        reported.len() < LINES,
        "the connection drops stopped the strict gate ({status:?})"
    );
    let second_out = sb.dir.join("second.ndjson");
    let second_args = args(&second_out);
    let second_refs: Vec<&str> = second_args.iter().map(String::as_str).collect();
    let out = sb
        .command_with_store(&second_refs, &redis.url)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = complete_records(&second_out);
    assert_eq!(second.len(), LINES);
    let key = |r: &Value| r["key"].as_str().unwrap_or_default().to_string();
    let mut seen_new: std::collections::HashSet<String> = reported
        .iter()
        .filter(|r| r["verdict"] == "new")
        .map(key)
        .collect();
    let mut never = 0;
    for r in &second {
        if r["verdict"] == "new" {
            seen_new.insert(key(r));
        } else if !seen_new.contains(&key(r)) {
            never += 1;
        }
    }
    assert_eq!(
        never, 0,
        "{never} events marked by the cut-off run were never reported new by anyone"
    );
    eprintln!(
        "redis drop: {} lines reported before the gate stopped, all {} distinct keys reported new",
        reported.len(),
        seen_new.len()
    );
}

#[test]
fn a_line_longer_than_max_line_bytes_is_invalid_and_never_held_in_memory() {
    let sb = Sandbox::new("gate-long-line");
    let input = sb.dir.join("long.ndjson");
    let line = |id: &str, pad: usize| format!("{{\"id\":\"{id}\",\"p\":\"{}\"}}", "x".repeat(pad));
    // 100 bytes exactly (with \n, then with \r\n), 101 bytes, a 1 MiB line, a short one.
    let exact = line("exact", 100 - line("exact", 0).len());
    let crlf = line("crlf", 100 - line("crlf", 0).len());
    let over = line("over", 101 - line("over", 0).len());
    let huge = line("huge", 1 << 20);
    std::fs::write(
        &input,
        format!("{exact}\n{crlf}\r\n{over}\n{huge}\n{{\"id\":\"after\"}}\n"),
    )
    .unwrap();
    let out = gate(
        &sb,
        &sb.store,
        &input,
        &["--key", "id", "--max-line-bytes", "100"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        verdicts(&out.records),
        ["new", "new", "invalid", "invalid", "new"],
        "{:?}",
        out.records
    );
    let error = out.records[3]["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("{} bytes", huge.len() + 1)) && error.contains("--max-line-bytes"),
        "{error}"
    );
    assert_eq!(out.records[4]["line"], 5, "line numbers go on past it");
    let bad = sb
        .command(&["gate", "--key", "id", "--max-line-bytes", "0"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

/// Peak resident memory (KiB) of `idem gate --key id` over `input` on a fresh ledger,
/// measured by a launcher process of its own ([`gate_rss_launcher`], this binary again): a
/// child's peak counts what its parent held when it forked it, and this test process holds
/// what the tests running beside it hold (in CI, six at a time: once 421 MB, for a gate
/// that needed far less).
fn gate_peak_rss_kib(sb: &Sandbox, input: &Path) -> i64 {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &common::libtest_name(module_path!(), "gate_rss_launcher"),
        ])
        .args(["--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env("IDEM_RSS_DIR", &sb.dir)
        .env("IDEM_RSS_INPUT", input)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.split_once("peak_rss_kib=").map(|(_, n)| n))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "the launcher said no peak: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// Runs `idem gate --key id --input $IDEM_RSS_INPUT` on a fresh ledger in
/// `$IDEM_RSS_DIR` and prints its peak resident memory (`peak_rss_kib=N`), from a process
/// that holds nothing else.
#[test]
#[ignore = "child process of the_gates_memory_does_not_grow_with_line_length, run by it"]
fn gate_rss_launcher() {
    let (Some(dir), Some(input)) = (
        std::env::var_os("IDEM_RSS_DIR"),
        std::env::var_os("IDEM_RSS_INPUT"),
    ) else {
        panic!(
            "IDEM_RSS_DIR and IDEM_RSS_INPUT are not set: gate_rss_launcher runs only as the \
             child process of the_gates_memory_does_not_grow_with_line_length"
        );
    };
    let dir = PathBuf::from(dir);
    let store = format!(
        "sqlite://{}",
        dir.join(format!("rss-{}.db", idem::new_run_id())).display()
    );
    let sb = Sandbox {
        dir,
        store: store.clone(),
    };
    let child = sb
        .command_with_store(
            &["gate", "--key", "id", "--input", input.to_str().unwrap()],
            &store,
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill; `pid` is our own child,
    // reaped here (the Child handle is forgotten so it does not wait again).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    std::mem::forget(child);
    // The folder is the calling test's: not removed with this handle.
    std::mem::forget(sb);
    assert_eq!(waited, pid, "{}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status}"
    );
    println!("peak_rss_kib={}", usage.ru_maxrss);
}

#[test]
fn the_gates_memory_does_not_grow_with_line_length() {
    // Peak RSS for a 1 KiB line and for a 200 MiB one (over the default --max-line-bytes)
    // and 1,000 lines of 256 KiB (under it): within a fixed bound of each other. Before,
    // a line was read whole (a 300 MiB line: 915 MB) and batches were bounded in lines.
    let sb = Sandbox::new("gate-rss");
    // Written in small pieces: a child's peak RSS counts what its parent held when it
    // was forked, so this process never holds a long line itself.
    let write = |name: &str, lines: usize, pad: usize| {
        use std::io::Write;
        let path = sb.dir.join(name);
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let piece = [b'x'; 1 << 12];
        for i in 0..lines {
            write!(f, "{{\"id\":\"k{i}\",\"p\":\"").unwrap();
            for start in (0..pad).step_by(piece.len()) {
                f.write_all(&piece[..piece.len().min(pad - start)]).unwrap();
            }
            writeln!(f, "\"}}").unwrap();
        }
        f.flush().unwrap();
        path
    };
    let small = gate_peak_rss_kib(&sb, &write("small.ndjson", 3, 1 << 10));
    let huge_line = write("huge.ndjson", 1, 200 << 20);
    let huge = gate_peak_rss_kib(&sb, &huge_line);
    std::fs::remove_file(huge_line).unwrap();
    let many_lines = write("many.ndjson", 1000, 256 << 10);
    let many = gate_peak_rss_kib(&sb, &many_lines);
    std::fs::remove_file(many_lines).unwrap();
    // The bound: a batch's bytes (8 MiB) a few times over, for the batches in flight.
    let bound = 64 << 10;
    assert!(
        huge <= small + bound && many <= small + bound,
        "peak RSS: 1 KiB line {small} KiB, 200 MiB line {huge} KiB, 1,000 lines of 256 KiB {many} KiB"
    );
}

/// Every batch's pending marks are confirmed (issue 36 item 8 keeps them once per batch, and
/// SQLite confirms a batch in the next batch's write): a run of fresh keys ends with no
/// confirmation lost, so a second run finds every key a replay, never `new` again once the
/// (short) pending timeout has passed. A batch whose records took longer than the timeout
/// to be written (a busy machine) is confirmed too late: the first run must say so, and
/// only those keys are `new` again.
#[test]
fn every_pending_batch_of_a_run_is_confirmed() {
    let sb = Sandbox::new("pending-confirmed");
    let stores = stores_with(&sb, "every_pending_batch_of_a_run_is_confirmed", false);
    let input = sb.dir.join("fresh.ndjson");
    write_big_input(&input, 20_000, 20_000);
    let timeout = Duration::from_secs(2);
    for store in &stores.urls {
        let ns = namespace();
        let args = [
            "--key",
            "id",
            "--namespace",
            &ns,
            "--pending-timeout",
            "2s",
            "--stats-format",
            "json",
        ];
        let stats = |run: &Gated| -> Value {
            serde_json::from_str(run.stderr.trim().lines().last().unwrap())
                .unwrap_or_else(|e| panic!("{store}: {e}: {}", run.stderr))
        };
        let first = gate(&sb, store, &input, &args);
        assert_eq!(first.code, 0, "{store}: {}", first.stderr);
        assert!(
            !first.stderr.contains("could not be confirmed"),
            "{store}: {}",
            first.stderr
        );
        assert_eq!(counts(&verdicts(&first.records)).get("new"), Some(&20_000));
        let late = stats(&first)["stats"]["unconfirmed"].as_u64().unwrap();
        assert_eq!(
            late > 0,
            first.stderr.contains("after the pending timeout"),
            "{store}: late confirmations are warned about: {}",
            first.stderr
        );
        // Past the pending timeout: an unconfirmed mark would be taken over as new.
        std::thread::sleep(timeout + Duration::from_millis(100));
        let second = gate(&sb, store, &input, &args);
        assert_eq!(second.code, 0, "{store}: {}", second.stderr);
        let c = counts(&verdicts(&second.records));
        assert_eq!(
            (c.get("new").copied().unwrap_or(0) as u64, c.get("replay")),
            (late, Some(&(20_000 - late as usize))),
            "{store}: only the keys confirmed late are new again: {}",
            second.stderr
        );
    }
}

/// A gate on standard input holding its first batch's marks pending: every line of
/// `input` written in and standard input left open, its first record read. 1,000 records
/// do not fit in the pipe, so that batch is neither written out whole nor confirmed until
/// the caller reads on.
struct LiveGate {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    out: std::io::BufReader<std::process::ChildStdout>,
    /// Where its standard error goes (a file: nobody has to read it while it runs).
    stderr: PathBuf,
}

impl LiveGate {
    fn start(sb: &Sandbox, store: &str, ns: &str, input: &Path, pending: &str) -> LiveGate {
        use std::io::Write;
        let stderr = sb.dir.join(format!("live-{ns}.stderr"));
        let mut child = sb
            .command_with_store(
                &[
                    "gate",
                    "--key",
                    "id",
                    "--namespace",
                    ns,
                    "--pending-timeout",
                    pending,
                ],
                store,
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&std::fs::read(input).unwrap()).unwrap();
        stdin.flush().unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        assert!(
            first.contains(r#""verdict":"new""#),
            "{store}: the live gate's first record: {first:?}"
        );
        LiveGate {
            child,
            stdin,
            out,
            stderr,
        }
    }

    /// Reads the rest of its records, to its end: how many there were and what it said on
    /// standard error.
    fn finish(self) -> (usize, String) {
        let LiveGate {
            mut child,
            stdin,
            mut out,
            stderr,
        } = self;
        drop(stdin);
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        assert!(child.wait().unwrap().success(), "the live gate");
        (
            rest.lines().count(),
            std::fs::read_to_string(stderr).unwrap(),
        )
    }
}

/// A gate whose reader stalls for longer than the pending timeout: its first batch (marked
/// before its first record was read) is confirmed after the timeout. The gate says how
/// many keys that left unconfirmed, and a second run finds exactly those `new` again (none
/// lost, none silently doubled). Redis expires the batch at its deadline, so there its
/// 1,000 keys are unconfirmed; the SQL stores keep an expired batch's row until a cleanup,
/// so there the late confirmation still lands (and none are).
#[test]
fn a_batch_written_after_its_pending_timeout_is_counted_and_new_again() {
    let sb = Sandbox::new("gate-late-confirm");
    let input = sb.dir.join("fresh.ndjson");
    write_big_input(&input, 3_000, 3_000);
    let stores = stores_with(
        &sb,
        "a_batch_written_after_its_pending_timeout_is_counted_and_new_again",
        false,
    );
    for store in &stores.urls {
        let ns = namespace();
        let live = LiveGate::start(&sb, store, &ns, &input, "1s");
        // The reader stalls: the first batch cannot be written out past the pipe meanwhile.
        std::thread::sleep(Duration::from_millis(1500));
        let (rest, stderr) = live.finish();
        assert_eq!(rest, 2_999, "{store}: {stderr}");
        let unconfirmed: usize = stderr
            .split("; ")
            .find_map(|part| part.strip_suffix(" new line(s) unconfirmed: written after their pending marks expired, the next run reports them `new` again (raise --pending-timeout)"))
            .map_or(0, |n| n.parse().unwrap());
        if store.starts_with("redis") {
            assert!(unconfirmed >= 1_000, "{store}: {stderr}");
            assert!(
                stderr.contains("confirmed after the pending timeout (1s) had passed"),
                "{store}: {stderr}"
            );
        } else {
            assert_eq!(unconfirmed, 0, "{store}: {stderr}");
        }
        let second = gate(&sb, store, &input, &["--key", "id", "--namespace", &ns]);
        assert_eq!(second.code, 0, "{store}: {}", second.stderr);
        let c = counts(&verdicts(&second.records));
        assert_eq!(
            (
                c.get("new").copied().unwrap_or(0),
                c.get("replay").copied().unwrap_or(0)
            ),
            (unconfirmed, 3_000 - unconfirmed),
            "{store}: the keys new again are those the first run said it left unconfirmed"
        );
    }
}

/// A written batch whose confirmation the store refuses (a trigger on `event_pending` here;
/// in life, a store lost between a batch's write and its confirmation): every line has its
/// record, the summary and the JSON stats count the new lines left unconfirmed, and the
/// gate fails under `strict` (exit 3, a store failure) where `best_effort` exits 0. Those
/// events stay pending until the timeout, then a run reports them `new` again. SQLite, and
/// Postgres in a schema of its own (`IDEM_TEST_POSTGRES_URL`).
#[test]
fn a_confirmation_the_store_fails_is_counted_and_fails_a_strict_gate() {
    let test = "a_confirmation_the_store_fails_is_counted_and_fails_a_strict_gate";
    let sb = Sandbox::new("gate-confirm-refused");
    let input = sb.dir.join("five.ndjson");
    write_big_input(&input, 5, 5);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut stores = vec![(
        format!("sqlite://{}", sb.dir.join("refusing.db").display()),
        None,
    )];
    if let Some(url) = common::postgres_url(test) {
        let schema = format!("idem_gate_refuse_{}", std::process::id());
        let sep = if url.contains('?') { '&' } else { '?' };
        stores.push((
            format!("{url}{sep}options[search_path]={schema}"),
            Some((url, schema)),
        ));
    }
    // Statements of the test's own on the Postgres server (not through the store).
    let on_postgres = |url: &str, sql: &str| {
        use sqlx::Connection;
        rt.block_on(async {
            let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
            sqlx::raw_sql(sql).execute(&mut conn).await.unwrap();
        })
    };
    for (store, postgres) in &stores {
        if let Some((url, schema)) = postgres {
            on_postgres(url, &format!("CREATE SCHEMA {schema}"));
        }
        let migrated = sb.command_with_store(&["migrate"], store).output().unwrap();
        assert!(migrated.status.success(), "{store}: {migrated:?}");
        let refuse = |on: bool| match postgres {
            None => rt.block_on(async {
                use sqlx::Connection;
                let mut conn = sqlx::SqliteConnection::connect(store).await.unwrap();
                let sql = if on {
                    "CREATE TRIGGER refuse BEFORE DELETE ON event_pending \
                     BEGIN SELECT RAISE(ABORT, 'confirmations refused'); END"
                } else {
                    "DROP TRIGGER refuse"
                };
                sqlx::raw_sql(sql).execute(&mut conn).await.unwrap();
            }),
            Some((url, schema)) if on => on_postgres(
                url,
                &format!(
                    "CREATE FUNCTION {schema}.refuse() RETURNS trigger \
                     LANGUAGE plpgsql AS $$ BEGIN \
                     RAISE EXCEPTION 'confirmations refused'; END $$; \
                     CREATE TRIGGER refuse BEFORE DELETE ON {schema}.event_pending \
                     FOR EACH ROW EXECUTE FUNCTION {schema}.refuse()"
                ),
            ),
            Some((url, schema)) => on_postgres(
                url,
                &format!("DROP TRIGGER refuse ON {schema}.event_pending"),
            ),
        };
        refuse(true);
        let mut namespaces = Vec::new();
        for (strategy, code) in [("strict", 3), ("best_effort", 0)] {
            let ns = namespace();
            let run = gate(
                &sb,
                store,
                &input,
                &[
                    "--key",
                    "id",
                    "--namespace",
                    &ns,
                    "--strategy",
                    strategy,
                    "--pending-timeout",
                    "1s",
                ],
            );
            assert_eq!(run.code, code, "{store}, {strategy}: {}", run.stderr);
            assert_eq!(
                verdicts(&run.records),
                vec!["new"; 5],
                "{store}, {strategy}: every line has its record"
            );
            assert!(
                run.stderr.contains(
                    "; 5 new line(s) not confirmed: the store failed to confirm their batch, \
                     so the next run after --pending-timeout reports them `new` again"
                ),
                "{store}, {strategy}: {}",
                run.stderr
            );
            namespaces.push(ns);
        }
        refuse(false);
        // Pending for a run that is over: waited on until the timeout (1 s), then new.
        for ns in &namespaces {
            let again = gate(
                &sb,
                store,
                &input,
                &["--key", "id", "--namespace", ns, "--stats-format", "json"],
            );
            assert_eq!(again.code, 0, "{store}: {}", again.stderr);
            assert_eq!(verdicts(&again.records), vec!["new"; 5], "{store}");
            let stats: Value = serde_json::from_str(again.stderr.lines().last().unwrap()).unwrap();
            assert_eq!(
                stats["stats"]["confirm_failures"], 0,
                "{store}: {}",
                again.stderr
            );
        }
        if let Some((url, schema)) = postgres {
            on_postgres(url, &format!("DROP SCHEMA {schema} CASCADE"));
        }
    }
}

/// Issue 33 item 4: `idem cleanup --keep 0s` beside a live gate deletes none of the gate's
/// unconfirmed (pending) marks, nor the batch state that keeps them pending. On the stores
/// a cleanup runs on (SQLite, Postgres), a gate holds its first batch marked and
/// unconfirmed (its output is a pipe nobody reads) while a cleanup with no retention at all
/// runs; then
/// - the gate goes on and ends: a second gate over the same keys finds every one a replay
///   (a cleanup that deleted the pending keys makes them `new` again, twice reported);
/// - or the gate is killed: once its (short) pending timeout has passed, a second gate
///   finds the batch's keys `new` (a cleanup that deleted the batch's pending state but
///   not its keys turns them into plain marks: events nobody was told about, lost).
#[test]
fn cleanup_with_no_retention_leaves_a_live_gate_s_pending_marks() {
    let sb = Sandbox::new("gate-cleanup-pending");
    let input = sb.dir.join("fresh.ndjson");
    write_big_input(&input, 3_000, 3_000);
    let first_batch = sb.dir.join("first-batch.ndjson");
    write_big_input(&first_batch, 1_000, 1_000);
    let test = "cleanup_with_no_retention_leaves_a_live_gate_s_pending_marks";
    // `idem cleanup --keep 0s` deletes every confirmed key and run of its store: on
    // Postgres, those of a schema of the test's own, not of the database the tests share.
    let scratch =
        common::postgres_url(test).map(|url| common::PgScratch::schema(&url, "idem_gate_cleanup"));
    let stores = [
        Some(sb.store.clone()),
        scratch.as_ref().map(|s| s.url.clone()),
    ];
    let cleanup = |store: &str| {
        let out = sb
            .command_with_store(&["cleanup", "--keep", "0s", "--keep-runs", "0s"], store)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{store}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    for store in stores.iter().flatten() {
        // The gate goes on after the cleanup and ends.
        let ns = namespace();
        let live = LiveGate::start(&sb, store, &ns, &input, "10m");
        let said = cleanup(store);
        let (rest, stderr) = live.finish();
        assert_eq!(rest, 2_999, "{store}: {stderr}");
        let second = gate(&sb, store, &input, &["--key", "id", "--namespace", &ns]);
        assert_eq!(second.code, 0, "{store}: {}", second.stderr);
        let c = counts(&verdicts(&second.records));
        assert_eq!(
            (c.get("new"), c.get("replay")),
            (None, Some(&3_000)),
            "{store}: keys a live gate had pending were found new again after \
             `idem cleanup --keep 0s` (it said: {said})"
        );

        // The gate is killed after the cleanup: its first batch was never confirmed.
        let ns = namespace();
        let mut live = LiveGate::start(&sb, store, &ns, &input, "5s");
        let said = cleanup(store);
        live.child.kill().unwrap();
        live.child.wait().unwrap();
        let second = gate(
            &sb,
            store,
            &first_batch,
            &["--key", "id", "--namespace", &ns],
        );
        assert_eq!(second.code, 0, "{store}: {}", second.stderr);
        let c = counts(&verdicts(&second.records));
        assert_eq!(
            c.get("new"),
            Some(&1_000),
            "{store}: a killed gate's unconfirmed batch must be reported new once its \
             pending timeout passed; after `idem cleanup --keep 0s` (it said: {said}): {c:?}"
        );
    }
}
