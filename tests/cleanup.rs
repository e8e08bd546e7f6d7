//! `idem cleanup` as a user meets it: counts per table, `--dry-run` reports the same counts
//! and deletes nothing, ledger rows a kept key points at stay, bad flags exit 2.

use serde_json::{json, Value};

mod common;

use common::Sandbox;

fn job(name: &str) -> String {
    format!(
        r#"
name = "{name}"
processor = "sql"
[guards]
time_window = "1h"
[sql]
warehouse = "sqlite://wh.db"
setup = "CREATE TABLE IF NOT EXISTS out (day TEXT)"
process = "INSERT INTO out SELECT @scope WHERE @scope <> '2026-01-03' UNION ALL SELECT abs(-9223372036854775807 - 1) WHERE @scope = '2026-01-03'"
"#
    )
}

fn decision(s: &Sandbox, date: &str) -> String {
    let (_, e, err) = s.json(&["explain", "daily", "--date", date]);
    e["decision"]
        .as_str()
        .unwrap_or_else(|| panic!("{e} {err}"))
        .to_string()
}

fn ledger(s: &Sandbox) -> Vec<String> {
    let (code, v, err) = s.json(&["runs", "--limit", "0"]);
    assert_eq!(code, 0, "{err}");
    let mut scopes: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["scope"].as_str().unwrap(),
                r["status"].as_str().unwrap()
            )
        })
        .collect();
    scopes.sort();
    scopes
}

fn cleanup(s: &Sandbox, args: &[&str]) -> Value {
    let mut all = vec!["cleanup"];
    all.extend(args);
    let (code, v, err) = s.json(&all);
    assert_eq!(code, 0, "{err}");
    v
}

#[test]
fn cleanup_counts_per_table_the_dry_run_deletes_nothing_and_kept_keys_keep_their_runs() {
    let s = Sandbox::new("idem-cleanup");
    s.write_job("daily", &job("daily"));
    for d in ["2026-01-01", "2026-01-02", "2026-01-03"] {
        s.json(&["run", "daily", "--date", d]);
    }
    assert_eq!(
        ledger(&s),
        [
            "2026-01-01 completed",
            "2026-01-02 completed",
            "2026-01-03 failed"
        ]
    );

    // Keys kept an hour, the ledger not at all: only the failed run (no key) goes.
    let dry = cleanup(&s, &["--keep", "1h", "--keep-runs", "0s", "--dry-run"]);
    assert_eq!(dry["dry_run"], true);
    let expect = json!({"processing_keys": 0, "processing_runs": 1, "processing_leases": 0, "event_keys": 0});
    assert_eq!(dry["tables"], expect, "{dry}");
    assert_eq!(ledger(&s).len(), 3, "a dry run deletes nothing");
    let done = cleanup(&s, &["--keep", "1h", "--keep-runs", "0s"]);
    assert_eq!(done["tables"], expect, "{done}");
    assert_eq!(
        ledger(&s),
        ["2026-01-01 completed", "2026-01-02 completed"],
        "runs a kept key points at stay"
    );
    assert_eq!(decision(&s, "2026-01-01"), "skip");

    // Nothing kept: every key and run goes (the leases were released at once, so their
    // rows expired).
    let dry = cleanup(
        &s,
        &[
            "--keep",
            "0s",
            "--keep-runs",
            "0s",
            "--dry-run",
            "--batch",
            "1",
        ],
    );
    let counts = dry["tables"].clone();
    assert_eq!(counts["processing_keys"], 2, "{dry}");
    assert_eq!(counts["processing_runs"], 2, "{dry}");
    assert_eq!(
        decision(&s, "2026-01-01"),
        "skip",
        "a dry run deletes nothing"
    );
    let out = s.idem(&[
        "cleanup",
        "--keep",
        "0s",
        "--keep-runs",
        "0s",
        "--batch",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("deleted from sqlite://"), "{text}");
    for (table, n) in [
        ("processing_keys", &counts["processing_keys"]),
        ("processing_runs", &counts["processing_runs"]),
        ("processing_leases", &counts["processing_leases"]),
        ("event_keys", &counts["event_keys"]),
    ] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(table))
            .unwrap_or_else(|| panic!("{table}: {text}"));
        assert_eq!(
            line.split_whitespace().nth(1).unwrap(),
            n.to_string(),
            "the dry run's count: {text}"
        );
    }
    assert!(ledger(&s).is_empty());
    assert_eq!(decision(&s, "2026-01-01"), "run");
}

#[test]
fn bad_cleanup_flags_exit_2_and_delete_nothing() {
    let s = Sandbox::new("idem-cleanup-bad");
    s.write_job("daily", &job("daily"));
    s.json(&["run", "daily", "--date", "2026-01-01"]);
    for (args, expect) in [
        (
            vec!["cleanup", "--keep-runs", "soon"],
            "--keep-runs: bad duration",
        ),
        (vec!["cleanup", "--batch", "0"], "--batch"),
    ] {
        let out = s.idem(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
    assert_eq!(ledger(&s).len(), 1);
}
