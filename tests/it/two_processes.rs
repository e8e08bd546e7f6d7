//! Two processes, one key set: two separate OS processes mark the same 5,000 event keys in
//! batches on one shared store, started together; every key must be `new` in exactly one
//! of them. Runs on SQLite (a new file), Redis (`IDEM_TEST_REDIS_URL`) and Postgres
//! (`IDEM_TEST_POSTGRES_URL`), skipping the last two with a message when unset.
//!
//! The processes are this test binary re-run with `--ignored --exact two_processes::child_marks_keys` and
//! the `IDEM_CHILD_*` variables set: the child marks the keys, writes the ones it found new
//! to a file and exits. It is `#[ignore]`d, so a normal run does not count it (it tests
//! nothing alone); run by hand without the variables it fails, saying so.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idem::store::{open_event_keys, EventMark};

use crate::common;

/// Keys both processes mark.
const KEYS: usize = 5_000;
/// Keys per `check_and_mark` call.
const BATCH: usize = 250;

/// The keys in the order process `seed` marks them: a different permutation per process
/// (a multiplicative step coprime with `KEYS`), so their batches overlap partly.
fn order(seed: u64) -> Vec<String> {
    let step = [1usize, 2_999][seed as usize % 2];
    (0..KEYS)
        .map(|i| format!("event-{:05}", (i * step + seed as usize * 7) % KEYS))
        .collect()
}

/// The child: once its store is open it creates `READY`, then marks every key in batches
/// once `GO` exists and writes the new ones to `OUT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of the two-process tests, run by them"]
async fn child_marks_keys() {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set: child_marks_keys runs only as the child process of the \
                 *_two_processes_mark_each_key_once tests"
            )
        })
    };
    let url = var("IDEM_CHILD_URL");
    let namespace = var("IDEM_CHILD_NAMESPACE");
    let out = PathBuf::from(var("IDEM_CHILD_OUT"));
    let go = PathBuf::from(var("IDEM_CHILD_GO"));
    let ready = PathBuf::from(var("IDEM_CHILD_READY"));
    let seed: u64 = var("IDEM_CHILD_SEED").parse().unwrap();
    let store = open_event_keys(&url).await.expect("open the store");
    std::fs::write(&ready, "").expect("say the store is open");
    let start = Instant::now();
    while !go.exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "no go signal");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut new = Vec::new();
    for batch in order(seed).chunks(BATCH) {
        let marks: Vec<EventMark> = batch
            .iter()
            .map(|k| EventMark::key(k).fingerprint("same payload"))
            .collect();
        let verdicts = store
            .check_and_mark(&namespace, &marks, chrono::Utc::now())
            .await
            .expect("check and mark");
        for (key, verdict) in batch.iter().zip(verdicts) {
            assert!(verdict.name() != "conflict", "{key}: {verdict:?}");
            if verdict.is_new() {
                new.push(key.clone());
            }
        }
    }
    std::fs::write(&out, new.join("\n")).expect("write the new keys");
}

/// Runs two children on `url` and checks each key was new in exactly one.
fn two_processes_mark_each_key_once(url: &str, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let namespace = format!("two-processes-{}", idem::new_run_id());
    let go = dir.join("go");
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..2u64)
        .map(|seed| {
            let out = dir.join(format!("new-{seed}.txt"));
            let ready = dir.join(format!("ready-{seed}"));
            let child = Command::new(&exe)
                .args(["--ignored", "--exact"])
                .arg(common::libtest_name(module_path!(), "child_marks_keys"))
                .args(["--nocapture", "--test-threads=1"])
                .env("IDEM_CHILD_URL", url)
                .env("IDEM_CHILD_NAMESPACE", &namespace)
                .env("IDEM_CHILD_OUT", &out)
                .env("IDEM_CHILD_GO", &go)
                .env("IDEM_CHILD_READY", &ready)
                .env("IDEM_CHILD_SEED", seed.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn the child process");
            (child, out, ready)
        })
        .collect();
    // Both have opened the store: let them go together.
    let start = Instant::now();
    while !children.iter().all(|(_, _, ready)| ready.exists()) {
        // One cannot end before `go` but by failing.
        if let Some(i) = children
            .iter_mut()
            .position(|(child, _, _)| child.try_wait().unwrap().is_some())
        {
            let output = children.swap_remove(i).0.wait_with_output().unwrap();
            panic!(
                "a child ended before opening the store: {}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the children did not open the store within 60 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::write(&go, "").unwrap();
    let mut seen = std::collections::HashMap::<String, u64>::new();
    let mut counts = Vec::new();
    for (seed, (child, out, _)) in children.into_iter().enumerate() {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "child {seed} failed: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        // It ran the child test (an empty filter match would also exit 0).
        assert!(
            stdout.contains("test result: ok. 1 passed"),
            "child {seed} ran no test: {stdout}"
        );
        let text = std::fs::read_to_string(&out).expect("the child wrote its new keys");
        let keys: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        counts.push(keys.len());
        for key in keys {
            *seen.entry(key.to_string()).or_default() += 1;
        }
    }
    let _ = std::fs::remove_dir_all(dir);
    eprintln!("new per process on {url}: {counts:?}");
    assert_eq!(seen.len(), KEYS, "every key was new somewhere");
    assert!(
        seen.values().all(|n| *n == 1),
        "some key was new in both processes"
    );
    assert_eq!(counts.iter().sum::<usize>(), KEYS);
}

fn temp_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("idem-{name}-{}", idem::new_run_id()))
}

#[test]
fn sqlite_two_processes_mark_each_key_once() {
    let dir = temp_dir("two-processes-sqlite");
    let url = format!("sqlite://{}", dir.join("ledger.db").display());
    two_processes_mark_each_key_once(&url, &dir);
}

#[cfg(feature = "redis")]
#[test]
fn redis_two_processes_mark_each_key_once() {
    let Some(url) = common::redis_url("redis two-process check") else {
        return;
    };
    let (url, cleanup) = common::redis::fresh_prefix_url(&url);
    two_processes_mark_each_key_once(&url, &temp_dir("two-processes-redis"));
    assert_eq!(
        cleanup.delete_keys().unwrap(),
        KEYS,
        "one redis key per event key"
    );
}

#[test]
fn postgres_two_processes_mark_each_key_once() {
    let Some(url) = common::postgres_url("postgres two-process check") else {
        return;
    };
    two_processes_mark_each_key_once(&url, &temp_dir("two-processes-postgres"));
}
