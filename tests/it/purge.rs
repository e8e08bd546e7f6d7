//! `idem purge` on purpose: it asks on a terminal, refuses to guess when stdin is not one,
//! refuses an unknown job, forgets exactly the scopes asked for, and leaves a ledger row
//! (trigger `manual`, status `skipped`, skip reason `purged`) saying what it did.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::common;

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
process = "INSERT INTO out VALUES (@scope)"
"#
    )
}

fn runs(s: &Sandbox, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["runs", "--limit", "0"];
    all.extend(args);
    let (code, v, err) = s.json(&all);
    assert_eq!(code, 0, "{err}");
    v.as_array().cloned().unwrap_or_default()
}

/// What `idem explain` decides for the date now.
fn decision(s: &Sandbox, date: &str) -> String {
    let (_, e, err) = s.json(&["explain", "daily", "--date", date]);
    e["decision"]
        .as_str()
        .unwrap_or_else(|| panic!("{e} {err}"))
        .to_string()
}

fn run_days(s: &Sandbox, days: &[&str]) {
    for d in days {
        let (code, v, err) = s.json(&["run", "daily", "--date", d]);
        assert_eq!(
            (code, v["status"].as_str()),
            (0, Some("completed")),
            "{err}"
        );
    }
}

#[test]
fn purge_forgets_exactly_the_scopes_asked_for_and_records_itself_in_the_ledger() {
    let s = Sandbox::new("idem-purge");
    s.write_job("daily", &job("daily"));
    let days = ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"];
    run_days(&s, &days);
    assert!(days.iter().all(|d| decision(&s, d) == "skip"));

    // A range: its dates run again, the others are still skipped.
    let (code, v, err) = s.json(&[
        "purge",
        "daily",
        "--from",
        "2026-01-02",
        "--to",
        "2026-01-03",
        "--yes",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["keys_deleted"], 2, "{v}");
    assert_eq!(v["scope"], "2026-01-02..2026-01-03");
    let decisions: Vec<String> = days.iter().map(|d| decision(&s, d)).collect();
    assert_eq!(decisions, ["skip", "run", "run", "skip"]);
    let purges = runs(&s, &["--job", "daily", "--scope", "2026-01-02..2026-01-03"]);
    assert_eq!(purges.len(), 1, "{purges:?}");
    let p = &purges[0];
    assert_eq!(p["run_id"], v["run_id"]);
    assert_eq!(p["trigger"], "manual");
    assert_eq!(p["status"], "skipped");
    // A reason of its own (custom reasons serialise as {"custom": NAME}).
    assert_eq!(p["skip_reason"], serde_json::json!({"custom": "purged"}));
    assert_eq!(p["mode"], "off");
    assert_eq!(p["scope_date"], "2026-01-02");
    assert_eq!(p["output"]["purge"]["keys_deleted"], 2, "{p}");
    assert_eq!(p["output"]["purge"]["scopes"], 2, "{p}");
    // Completed runs still count work only: the purge is not one of them.
    let completed = runs(&s, &["--job", "daily", "--status", "completed"]);
    assert_eq!(completed.len(), 4);

    // One date, relative dates allowed.
    let (code, v, err) = s.json(&["purge", "daily", "--date", "2026-01-04", "--yes"]);
    assert_eq!((code, v["keys_deleted"].as_u64()), (0, Some(1)), "{err}");
    assert_eq!(decision(&s, "2026-01-04"), "run");
    assert_eq!(decision(&s, "2026-01-01"), "skip");

    // Everything.
    let out = s.idem(&["purge", "daily", "--all", "--yes"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("purged 1 processing key(s) of every scope of daily\n"),
        "{text}"
    );
    assert!(text.contains("(skipped: purged)"), "{text}");
    assert_eq!(decision(&s, "2026-01-01"), "run");
    let all = runs(&s, &["--job", "daily", "--scope", "*"]);
    assert_eq!(all.len(), 1);
    assert_eq!(all[0]["output"]["purge"]["all"], true);
}

#[test]
fn without_yes_purge_refuses_when_stdin_is_not_a_terminal_and_an_unknown_job() {
    let s = Sandbox::new("idem-purge-refuse");
    s.write_job("daily", &job("daily"));
    run_days(&s, &["2026-01-01"]);
    // The sandbox's stdin is /dev/null: nobody to ask.
    let out = s.idem(&["purge", "daily", "--date", "2026-01-01"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stdin is not a terminal") && err.contains("add --yes"),
        "{err}"
    );
    assert_eq!(decision(&s, "2026-01-01"), "skip", "nothing deleted");

    let out = s.idem(&["purge", "nightly", "--all", "--yes"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown job \"nightly\""), "{err}");

    for (args, expect) in [
        (vec!["purge", "daily", "--yes"], "required"),
        (
            vec!["purge", "daily", "--date", "tomorrow", "--yes"],
            "--date: bad date \"tomorrow\"",
        ),
        (
            vec![
                "purge",
                "daily",
                "--from",
                "2026-01-03",
                "--to",
                "2026-01-01",
                "--yes",
            ],
            "is after --to",
        ),
        (
            vec!["purge", "daily", "--date", "2026-01-01", "--all", "--yes"],
            "cannot be used with",
        ),
        (
            vec!["purge", "daily", "--scope", "a\u{7}b", "--yes"],
            "control character",
        ),
    ] {
        let out = s.idem(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
    assert_eq!(decision(&s, "2026-01-01"), "skip", "nothing deleted");
    assert_eq!(runs(&s, &[]).len(), 1, "no purge recorded");
}

/// `idem purge` under a pseudo-terminal (`script`), answering `answer`.
fn purge_on_a_terminal(s: &Sandbox, answer: &str) -> (i32, String) {
    let cmd = format!(
        "{} purge daily --date 2026-01-01 --store {} --jobs-dir {}",
        common::IDEM,
        s.store,
        s.dir.join("jobs").display()
    );
    let mut child = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .current_dir(&s.dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(answer.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

#[test]
fn on_a_terminal_purge_asks_first() {
    if Command::new("script").arg("--version").output().is_err() {
        common::skip(
            "skipped on_a_terminal_purge_asks_first: no `script` command (util-linux) to make \
             a terminal"
                .into(),
        );
        return;
    }
    let s = Sandbox::new("idem-purge-tty");
    s.write_job("daily", &job("daily"));
    run_days(&s, &["2026-01-01"]);
    let (code, text) = purge_on_a_terminal(&s, "n\n");
    assert!(text.contains("[y/N]"), "{text}");
    assert!(text.contains("purge cancelled: nothing deleted"), "{text}");
    assert_eq!(code, 1, "{text}");
    assert_eq!(decision(&s, "2026-01-01"), "skip");
    // Only what the README says purges: `y` or `yes`, in any case (issue 21.11).
    for other in ["yep\n", "\n", "ja\n", ""] {
        let (code, text) = purge_on_a_terminal(&s, other);
        assert_eq!(code, 1, "{other:?}: {text}");
        assert_eq!(decision(&s, "2026-01-01"), "skip", "{other:?}");
    }
    let (code, text) = purge_on_a_terminal(&s, "Yes\n");
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("purged 1 processing key(s) of daily for 2026-01-01"),
        "{text}"
    );
    assert_eq!(decision(&s, "2026-01-01"), "run");
}

/// A purge range too long is a purge range, not a "backfill" (issue 21.11).
#[test]
fn a_purge_range_error_speaks_of_the_purge_range() {
    let s = Sandbox::new("idem-purge-range");
    s.write_job("daily", &job("daily"));
    let out = s.idem(&[
        "purge",
        "daily",
        "--from",
        "0001-01-01",
        "--to",
        "9999-12-31",
        "--yes",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a range covers at most") && !err.contains("backfill"),
        "{err}"
    );
}
