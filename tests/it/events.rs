//! Event fingerprints: the library against the vectors of the Python reference
//! (`tests/vectors/fingerprint_vectors.py`), and `idem fingerprint` as a user runs it.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use idem::events::{fingerprint, fingerprint_json, signature_json, EventSignature};
use serde_json::Value;

use crate::common;

use common::{Sandbox, IDEM};

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

fn vectors() -> Vec<Value> {
    let text = std::fs::read_to_string(vectors_dir().join("fingerprint.json"))
        .expect("tests/vectors/fingerprint.json");
    let doc: Value = serde_json::from_str(&text).expect("vectors are JSON");
    doc["vectors"].as_array().expect("a vectors list").clone()
}

fn lines(vector: &Value) -> Vec<String> {
    vector["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn vectors_match_the_python_reference() {
    let vectors = vectors();
    assert!(vectors.len() >= 15, "only {} vectors", vectors.len());
    let mut events_checked = 0;
    for v in &vectors {
        let name = v["name"].as_str().unwrap();
        let lines = lines(v);
        let signatures: Vec<EventSignature> = lines
            .iter()
            .map(|l| EventSignature::from_json(l).unwrap_or_else(|e| panic!("{name}: {e}: {l}")))
            .collect();
        assert_eq!(
            signature_json(&signatures),
            v["signature_json"].as_str().unwrap(),
            "signature bytes of vector {name:?}"
        );
        let expected = v["fingerprint"].as_str().unwrap();
        assert_eq!(fingerprint(&signatures), expected, "vector {name:?}");
        assert_eq!(
            fingerprint_json(&lines).unwrap(),
            expected,
            "vector {name:?}"
        );
        // Any order of the events: the same fingerprint.
        let reversed: Vec<EventSignature> = signatures.iter().rev().cloned().collect();
        assert_eq!(fingerprint(&reversed), expected, "vector {name:?} reversed");
        events_checked += lines.len();
    }
    assert!(events_checked > 1000, "{events_checked} events");
}

/// The checked-in vectors are exactly what the reference script prints, so no vector was
/// edited by hand. Skipped through `common::skip` when python3 is not installed.
#[test]
fn vectors_file_is_the_output_of_the_reference_script() {
    let dir = vectors_dir();
    let out = match Command::new("python3")
        .arg(dir.join("fingerprint_vectors.py"))
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            common::skip(format!(
                "skipped vectors_file_is_the_output_of_the_reference_script: python3 is not \
                 available ({e})"
            ));
            return;
        }
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let checked_in = std::fs::read(dir.join("fingerprint.json")).unwrap();
    assert!(
        out.stdout == checked_in,
        "tests/vectors/fingerprint.json is stale: regenerate it with \
         `python3 tests/vectors/fingerprint_vectors.py > tests/vectors/fingerprint.json`"
    );
}

fn vector(name: &str) -> Value {
    vectors()
        .into_iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no vector {name:?}"))
}

fn fingerprint_stdin(sandbox: &Sandbox, input: &str) -> std::process::Output {
    fingerprint_piped(sandbox, &["fingerprint"], input)
}

fn fingerprint_piped(sandbox: &Sandbox, args: &[&str], input: &str) -> std::process::Output {
    let mut child = sandbox
        .command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run idem");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn cli_prints_the_fingerprint_alone_from_a_file_or_stdin() {
    let sandbox = Sandbox::new("idem-fp-cli");
    let v = vector("non-ascii text escaped as python does");
    let expected = format!("{}\n", v["fingerprint"].as_str().unwrap());
    let mut ndjson = lines(&v).join("\n");
    ndjson.push('\n');
    let file = sandbox.dir.join("events.ndjson");
    std::fs::write(&file, &ndjson).unwrap();

    let out = sandbox.idem(&["fingerprint", file.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);

    let out = fingerprint_stdin(&sandbox, &ndjson);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);

    // `-` names standard input, as for most Unix tools.
    let out = fingerprint_piped(&sandbox, &["fingerprint", "-"], &ndjson);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);

    // Lines in another order, CRLF endings, blank lines, no final newline: same value.
    let mut shuffled = lines(&v);
    shuffled.reverse();
    let messy = format!("\r\n{}\r\n\n", shuffled.join("\r\n\n"));
    let out = fingerprint_stdin(&sandbox, messy.trim_end());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);

    let (code, doc, _) = sandbox.json(&["fingerprint", file.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert_eq!(doc["fingerprint"], v["fingerprint"]);
    assert_eq!(doc["events"], lines(&v).len());
}

#[test]
fn cli_empty_input_is_the_fingerprint_of_no_events() {
    let sandbox = Sandbox::new("idem-fp-empty");
    let out = fingerprint_stdin(&sandbox, "");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        vector("empty")["fingerprint"].as_str().unwrap()
    );
}

#[test]
fn cli_malformed_line_is_exit_2_naming_the_line() {
    let sandbox = Sandbox::new("idem-fp-bad");
    let good = lines(&vector("two events given out of order"));
    let cases = [
        (
            r#"{"timestamp": "2025-11-18T09:00:00Z""#,
            "line 3: not a JSON object",
        ),
        (
            r#"{"timestamp": "2025-11-18T09:00:00Z", "account_id": "a", "product_id": "p", "side": "buy", "price": "1", "event_type": "trade"}"#,
            "line 3: field `quantity` is missing",
        ),
        (
            r#"{"timestamp": "2025-11-18 09:00", "account_id": "a", "product_id": "p", "side": "buy", "price": "1", "quantity": 1, "event_type": "trade"}"#,
            "line 3: field `timestamp` is invalid",
        ),
        ("not json", "line 3: not a JSON object"),
    ];
    for (bad, message) in cases {
        let input = format!("{}\n\n{bad}\n{}\n", good[0], good[1]);
        let out = fingerprint_stdin(&sandbox, &input);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(out.stdout.is_empty(), "no fingerprint printed for {bad}");
        assert!(
            stderr.contains(&format!("error: standard input {message}")),
            "{bad}: {stderr}"
        );
    }

    let file = sandbox.dir.join("bad.ndjson");
    std::fs::write(&file, format!("{}\n{{\"price\": 1}}\n", good[0])).unwrap();
    let out = sandbox.idem(&["fingerprint", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr.contains(&format!(
            "{} line 2: field `timestamp` is missing",
            file.display()
        )),
        "{stderr}"
    );

    let out = sandbox.idem(&["fingerprint", "no-such-file.ndjson"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read no-such-file.ndjson"));
}

#[test]
fn cli_help_lists_fingerprint() {
    let out = Command::new(IDEM).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("  fingerprint "), "{text}");
    let out = Command::new(IDEM)
        .args(["fingerprint", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[FILE]") && text.contains("NDJSON"), "{text}");
}
