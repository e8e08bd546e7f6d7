//! Command jobs (`processor = "command"`) with real child processes: scripts written by the
//! test, run through `idem run` as a crontab line would.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::Sandbox;

/// Writes an executable script `name` into the sandbox's jobs folder.
fn script(s: &Sandbox, name: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    let path = s.dir.join("jobs").join(name);
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A command job running `run` (a TOML array) with `extra` lines in `[command]` and
/// `guards` lines in `[guards]`.
fn job(s: &Sandbox, name: &str, run: &str, extra: &str, guards: &str) -> std::path::PathBuf {
    s.write_job(
        name,
        &format!(
            "name = \"{name}\"\nprocessor = \"command\"\n[guards]\n{guards}\n[command]\nrun = {run}\n{extra}\n"
        ),
    )
}

/// The lines the scripts appended to `starts.log` (one per start of the program).
fn starts(s: &Sandbox) -> Vec<String> {
    std::fs::read_to_string(s.dir.join("jobs/starts.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn runs(s: &Sandbox, job: &str) -> Vec<Value> {
    let (code, v, err) = s.json(&["runs", "--job", job, "--limit", "0"]);
    assert_eq!(code, 0, "{err}");
    v.as_array().cloned().unwrap_or_default()
}

/// `idem exec ARGS` with `--format json` before the `--` (after it, words are the
/// program's), output captured, ready to spawn.
fn exec_command(s: &Sandbox, args: &[&str]) -> Command {
    let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    let mut all: Vec<&str> = args[..at].to_vec();
    all.extend(["--format", "json"]);
    all.extend(&args[at..]);
    let mut c = Command::new(env!("CARGO_BIN_EXE_idem"));
    c.args(&all[..at + 2])
        .arg("--store")
        .arg(&s.store)
        .arg("--jobs-dir")
        .arg(s.dir.join("jobs"))
        .args(&all[at + 2..])
        .current_dir(&s.dir)
        .env_remove("IDEM_STORE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn pid_alive(pid: i32) -> bool {
    // A zombie has exited: /proc says so.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Every process of `pids` has exited (`why` says what should have stopped it).
fn assert_gone(pids: &[i32], why: &str) {
    for p in pids {
        assert!(!pid_alive(*p), "pid {p} outlived {why}");
    }
}

fn wait_for_file(path: &Path, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.lines().count() >= 2 {
                return text;
            }
        }
        assert!(start.elapsed() < limit, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `idem run sleepy` (`[command]` lines `extra`, `[guards]` lines `guards`) on a
/// program that starts a grandchild, writes both pids and waits; returns idem's process
/// (its output captured, `--format json` unless `json` is false) once both pids are known
/// and alive.
fn start_sleepy(
    s: &Sandbox,
    extra: &str,
    guards: &str,
    json: bool,
) -> (std::process::Child, Vec<i32>) {
    script(
        s,
        "sleepy.sh",
        "#!/bin/sh\nsleep 300 &\necho $$ > pids\necho $! >> pids\nwait\n",
    );
    job(s, "sleepy", r#"["./sleepy.sh"]"#, extra, guards);
    let args = ["run", "sleepy", "--date", "2026-01-02"];
    let child = if json {
        s.json_command(&args).spawn().unwrap()
    } else {
        s.command(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let pids: Vec<i32> = wait_for_file(&s.dir.join("jobs/pids"), Duration::from_secs(30))
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert!(pids.iter().all(|p| pid_alive(*p)));
    (child, pids)
}

#[test]
fn a_second_run_inside_the_window_is_skipped_without_starting_the_program() {
    let s = Sandbox::new("idem-command-window");
    script(
        &s,
        "work.sh",
        "#!/bin/sh\necho \"$IDEM_JOB $IDEM_DATE $1 $IDEM_TRIGGER\" >> \"$(dirname \"$0\")/starts.log\"\necho working\n",
    );
    let j = job(
        &s,
        "export",
        r#"["./work.sh", "{date}"]"#,
        "",
        "time_window = \"1h\"",
    );
    let (code, v, err) = s.run(&j, "2026-01-02");
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["status"], "completed", "{v}");
    // The child's standard output went to idem's standard error (stdout carries the JSON).
    assert!(err.contains("working"), "{err}");
    let (code, v, err) = s.run(&j, "2026-01-02");
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["status"], "skipped");
    assert_eq!(v["skip_reason"], "time_window");
    assert_eq!(starts(&s), ["export 2026-01-02 2026-01-02 manual"]);
}

/// A job file found through a relative `--jobs-dir` (the README's and cron's way): its
/// program, relative to the job file, starts from the job's folder.
#[test]
fn a_relative_jobs_dir_finds_the_program_beside_the_job_file() {
    let s = Sandbox::new("idem-command-relative");
    script(
        &s,
        "work.sh",
        "#!/bin/sh\necho \"$(pwd)\" >> \"$(dirname \"$0\")/starts.log\"\n",
    );
    job(&s, "rel", r#"["./work.sh"]"#, "", "time_window = \"1h\"");
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "run",
            "rel",
            "--date",
            "2026-01-02",
            "--store",
            "sqlite://idem.db",
            "--jobs-dir",
            "jobs",
        ])
        .current_dir(&s.dir)
        .env_remove("IDEM_STORE")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ran_in = starts(&s);
    assert_eq!(ran_in.len(), 1);
    assert!(ran_in[0].ends_with("/jobs"), "{ran_in:?}");
}

#[test]
fn a_failing_program_records_a_failed_run_no_key_and_the_retry_runs() {
    let s = Sandbox::new("idem-command-fail");
    // Fails the first time (exit 3, after some stderr), succeeds the second.
    script(
        &s,
        "flaky.sh",
        "#!/bin/sh\necho start >> \"$(dirname \"$0\")/starts.log\"\nif [ ! -f tried ]; then touch tried; echo 'line one' >&2; echo 'disk full' >&2; exit 3; fi\n",
    );
    let j = job(&s, "flaky", r#"["./flaky.sh"]"#, "", "time_window = \"1h\"");
    let (code, v, err) = s.run(&j, "2026-01-02");
    assert_eq!(code, 1, "{err}");
    assert_eq!(v["status"], "failed");
    let error = v["error"].as_str().unwrap();
    assert!(
        error.contains("exited with code 3") && error.contains("disk full"),
        "{error}"
    );
    // The child's stderr also streamed through.
    assert!(err.contains("line one"), "{err}");
    let (code, v, err) = s.run(&j, "2026-01-02");
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["status"], "completed", "the retry runs: {v}");
    assert_eq!(starts(&s).len(), 2);
}

#[test]
fn identical_content_skips_and_changed_content_runs() {
    let s = Sandbox::new("idem-command-content");
    std::fs::write(s.dir.join("jobs/input.txt"), "a\nb\n").unwrap();
    script(
        &s,
        "work.sh",
        "#!/bin/sh\necho run >> \"$(dirname \"$0\")/starts.log\"\n",
    );
    let j = job(
        &s,
        "hashed",
        r#"["./work.sh"]"#,
        r#"content = ["cat", "input.txt"]"#,
        "content_hash = \"24h\"",
    );
    let (code, v, err) = s.run(&j, "2026-01-02");
    assert_eq!(
        (code, v["status"].as_str()),
        (0, Some("completed")),
        "{err}"
    );
    // The same scope again (no time window), identical content: skipped without running.
    let (code, v, err) = s.run(&j, "2026-01-02");
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["skip_reason"], "duplicate_content_hash", "{v}");
    assert_eq!(starts(&s).len(), 1);
    // Changed content: runs.
    std::fs::write(s.dir.join("jobs/input.txt"), "a\nc\n").unwrap();
    let (code, v, err) = s.run(&j, "2026-01-04");
    assert_eq!(
        (code, v["status"].as_str()),
        (0, Some("completed")),
        "{err}"
    );
    assert_eq!(starts(&s).len(), 2);
    // A content command that fails fails the run before the work starts.
    std::fs::remove_file(s.dir.join("jobs/input.txt")).unwrap();
    let (code, v, _) = s.run(&j, "2026-01-02");
    assert_eq!(code, 1);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("the content command \"cat\" exited with code 1"),
        "{v}"
    );
    assert_eq!(starts(&s).len(), 2);
}

#[test]
fn records_and_output_from_the_result_file_reach_the_ledger() {
    let s = Sandbox::new("idem-command-result");
    script(
        &s,
        "export.py",
        "#!/usr/bin/env python3\nimport json, os\nwith open(os.environ['IDEM_RESULT'], 'w') as f:\n    json.dump({'records': 42, 'output': {'file': 'orders-' + os.environ['IDEM_DATE'] + '.csv'}}, f)\n",
    );
    let j = job(
        &s,
        "export",
        r#"["./export.py"]"#,
        "",
        "time_window = \"1h\"",
    );
    let (code, v, err) = s.run(&j, "2026-01-02");
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["records_processed"], 42, "{v}");
    let r = runs(&s, "export");
    assert_eq!(r[0]["records_processed"], 42, "{r:?}");
    assert_eq!(r[0]["output"]["file"], "orders-2026-01-02.csv", "{r:?}");
}

#[test]
fn bad_command_jobs_exit_2_naming_the_field_with_nothing_recorded() {
    let s = Sandbox::new("idem-command-bad");
    script(&s, "noexec.sh", "#!/bin/sh\n");
    std::fs::set_permissions(
        s.dir.join("jobs/noexec.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let cases = [
        (
            "missing",
            r#"["no-such-program-idem", "x"]"#,
            "",
            "not found on PATH",
        ),
        ("empty", "[]", "", "[command] run is empty"),
        ("noexec", r#"["./noexec.sh"]"#, "", "is not executable"),
        (
            "placeholder",
            r#"["echo", "{dat}"]"#,
            "",
            "unknown placeholder {dat}",
        ),
        (
            "timeout",
            r#"["true"]"#,
            "timeout = \"soon\"",
            "[command] timeout",
        ),
    ];
    for (name, run, extra, says) in cases {
        job(&s, name, run, extra, "time_window = \"1h\"");
        let out = s.idem(&["run", name, "--date", "2026-01-02"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(says) && err.contains(&format!("{name}.toml")),
            "{name}: {err}"
        );
    }
    // `idem jobs` reports every one of them too.
    let out = s.idem(&["jobs"]);
    assert_eq!(out.status.code(), Some(2));
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    for (name, _, _, _) in cases {
        assert!(err.contains(&format!("{name}.toml")), "{name}: {err}");
    }
    // Nothing was claimed or recorded.
    assert!(!s.dir.join("idem.db").exists() || runs(&s, "missing").is_empty());
}

/// SIGTERM to `idem run` while the program and a grandchild sleep: the whole group is
/// stopped within the grace period, the run recorded interrupted, the lease released.
#[test]
fn sigterm_stops_the_program_and_its_children_and_records_an_interrupted_run() {
    let s = Sandbox::new("idem-command-sigterm");
    let (child, pids) = start_sleepy(&s, "grace = \"5s\"", "time_window = \"1h\"", true);
    let started = Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let (code, v, err) = common::wait(child);
    assert!(started.elapsed() < Duration::from_secs(10), "{err}");
    assert_eq!(code, 1, "{err}");
    assert_eq!(v["status"], "failed", "{v}");
    assert!(v["error"].as_str().unwrap().contains("interrupted"), "{v}");
    assert_gone(&pids, &format!("idem: {err}"));
    // The lease is released: the next run runs at once.
    std::fs::write(s.dir.join("jobs/sleepy.sh"), "#!/bin/sh\nexit 0\n").unwrap();
    let (code, v, err) = s.json(&["run", "sleepy", "--date", "2026-01-02"]);
    assert_eq!(
        (code, v["status"].as_str()),
        (0, Some("completed")),
        "{err}"
    );
}

/// SIGKILL to `idem run`: idem cannot stop anything itself. The kernel kills the program
/// (`PR_SET_PDEATHSIG`), and idem's watchdog, which sees idem's end of its pipe close,
/// stops the rest of the group (SIGTERM, SIGKILL after `grace`): a grandchild is gone too.
#[test]
fn sigkill_to_idem_kills_the_program_and_its_children() {
    let s = Sandbox::new("idem-command-sigkill");
    let (mut child, pids) = start_sleepy(&s, "grace = \"2s\"", "time_window = \"1h\"", false);
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    while pids.iter().any(|p| pid_alive(*p)) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_gone(&pids, "a SIGKILLed idem");
}

/// `idem exec` runs like a command job of that name: recorded in the same ledger, the
/// window skips the second run, `{date}` is replaced, bad input is exit 2.
#[test]
fn exec_runs_a_program_behind_the_guards_with_no_job_file() {
    let s = Sandbox::new("idem-exec");
    script(
        &s,
        "work.sh",
        "#!/bin/sh\necho \"$1 $IDEM_JOB\" >> \"$(dirname \"$0\")/starts.log\"\n",
    );
    let exec = |date: &str| {
        common::parse(
            exec_command(
                &s,
                &[
                    "exec",
                    "nightly",
                    "--date",
                    date,
                    "--time-window",
                    "1h",
                    "--",
                    "jobs/work.sh",
                    "{date}",
                ],
            )
            .output()
            .unwrap(),
        )
    };
    let (code, v, err) = exec("2026-01-02");
    assert_eq!(
        (code, v["status"].as_str()),
        (0, Some("completed")),
        "{err}"
    );
    let (code, v, err) = exec("2026-01-02");
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["skip_reason"], "time_window");
    let (code, v, err) = exec("2026-01-03");
    assert_eq!(
        (code, v["status"].as_str()),
        (0, Some("completed")),
        "{err}"
    );
    assert_eq!(starts(&s), ["2026-01-02 nightly", "2026-01-03 nightly"]);
    assert_eq!(runs(&s, "nightly").len(), 3);
    // Bad input: exit 2 naming it, nothing recorded.
    for (args, says) in [
        (
            vec!["exec", "nightly", "--", "no-such-program-idem"],
            "idem exec nightly: [command] run: program \"no-such-program-idem\" not found on PATH",
        ),
        (
            vec!["exec", "nightly", "--time-window", "soon", "--", "true"],
            "time_window",
        ),
        (
            vec!["exec", "nightly", "--date", "2026-13-01", "--", "true"],
            "2026-13-01",
        ),
        (vec!["exec", "../x", "--", "true"], "invalid job name"),
        (
            vec![
                "exec",
                "nightly",
                "--content-hash",
                "1h",
                "--content",
                "ls 'x",
                "--",
                "true",
            ],
            "--content",
        ),
        (vec!["exec", "nightly"], "PROGRAM ARGS"),
    ] {
        let out = s.idem(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(runs(&s, "nightly").len(), 3);
}

/// Eight `idem exec` of one name and date at once, as separate processes: the program
/// starts exactly once (it appends to a file); the others skip.
fn eight_execs_start_the_program_once(s: &Sandbox, name: &str) {
    script(
        s,
        "work.sh",
        "#!/bin/sh\necho start >> \"$(dirname \"$0\")/starts.log\"\nsleep 1\n",
    );
    let children: Vec<_> = (0..8)
        .map(|_| {
            exec_command(
                s,
                &[
                    "exec",
                    name,
                    "--date",
                    "2026-01-02",
                    "--time-window",
                    "1h",
                    "--",
                    "jobs/work.sh",
                ],
            )
            .spawn()
            .unwrap()
        })
        .collect();
    let mut completed = 0;
    for child in children {
        let (code, v, err) = common::wait(child);
        assert_eq!(code, 0, "{err}");
        match v["status"].as_str() {
            Some("completed") => completed += 1,
            Some("skipped") => assert!(
                matches!(
                    v["skip_reason"].as_str(),
                    Some("in_progress" | "time_window")
                ),
                "{v}"
            ),
            other => panic!("{other:?}: {v}"),
        }
    }
    assert_eq!(completed, 1);
    assert_eq!(starts(s), ["start"]);
}

#[test]
fn eight_execs_at_once_on_sqlite_start_the_program_once() {
    eight_execs_start_the_program_once(&Sandbox::new("idem-exec-eight"), "once");
}

#[test]
fn eight_execs_at_once_on_postgres_start_the_program_once() {
    let Some(url) = common::postgres_url("eight_execs_at_once_on_postgres_start_the_program_once")
    else {
        return;
    };
    let s = Sandbox::with_store("idem-exec-eight-pg", &url);
    assert_eq!(s.idem(&["migrate"]).status.code(), Some(0));
    // A name of its own: the Postgres ledger is shared by the test run.
    eight_execs_start_the_program_once(&s, &format!("once-{}", idem::new_run_id()));
}

/// A program that writes 1 GiB to standard error (which idem copies through, keeping only
/// a bounded tail for the ledger): idem's peak memory stays far below it. The bound is
/// over every process this test binary has waited for (idem's own is about 25 MiB).
#[test]
fn a_program_writing_a_gibibyte_does_not_grow_idems_memory() {
    let s = Sandbox::new("idem-command-gib");
    let out = exec_command(
        &s,
        &[
            "exec",
            "loud",
            "--",
            "sh",
            "-c",
            "head -c 1073741824 /dev/zero >&2; head -c 1073741824 /dev/zero; echo done >&2; exit 4",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    // SAFETY: getrusage writes into the struct it is given.
    let peak_kib = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage), 0);
        usage.ru_maxrss
    };
    assert!(peak_kib < 128 * 1024, "peak {peak_kib} KiB");
    // The ledger's error has the tail: the last line and the exit code.
    let r = runs(&s, "loud");
    let error = r[0]["error"].as_str().unwrap();
    assert!(
        error.contains("exited with code 4") && error.ends_with("done"),
        "{error:.200}"
    );
    assert!(error.len() < 8 * 1024, "{}", error.len());
}

/// `timeout`: a program still running after it is stopped (its whole group, SIGTERM then
/// SIGKILL after `grace`) and the run fails with no key, so the next run runs.
#[test]
fn a_program_past_its_timeout_is_stopped_with_its_group_and_the_run_fails() {
    let s = Sandbox::new("idem-command-timeout");
    // Ignores SIGTERM, so only the SIGKILL after the grace period stops it.
    script(
        &s,
        "stuck.sh",
        "#!/bin/sh\ntrap '' TERM\nsleep 300 &\necho $$ > pids\necho $! >> pids\nwhile :; do sleep 1; done\n",
    );
    let j = job(
        &s,
        "stuck",
        r#"["./stuck.sh"]"#,
        "timeout = \"1s\"\ngrace = \"1s\"",
        "time_window = \"1h\"",
    );
    let started = Instant::now();
    let (code, v, err) = s.run(&j, "2026-01-02");
    assert!(started.elapsed() < Duration::from_secs(15), "{err}");
    assert_eq!(code, 1, "{err}");
    assert_eq!(v["status"], "failed");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("ran past [command] timeout = 1s and was stopped"),
        "{v}"
    );
    let pids: Vec<i32> = std::fs::read_to_string(s.dir.join("jobs/pids"))
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_gone(&pids, "the timeout");
    // No key: the next run runs (and, fixed, completes).
    std::fs::write(s.dir.join("jobs/stuck.sh"), "#!/bin/sh\nexit 0\n").unwrap();
    let (code, v, err) = s.run(&j, "2026-01-02");
    assert_eq!(
        (code, v["status"].as_str()),
        (0, Some("completed")),
        "{err}"
    );
}

/// Everything else takes a command job by name: `explain` (its content command runs, the
/// program does not), a backfill of several dates at once, the crontab export.
#[test]
fn explain_backfill_and_export_take_a_command_job_by_name() {
    let s = Sandbox::new("idem-command-everything");
    std::fs::write(s.dir.join("jobs/input.txt"), "x\n").unwrap();
    script(
        &s,
        "work.sh",
        "#!/bin/sh\necho \"$1\" >> \"$(dirname \"$0\")/starts.log\"\n",
    );
    s.write_job(
        "exp",
        "name = \"exp\"\nprocessor = \"command\"\nschedule = \"0 6 * * *\"\ndate = \"yesterday\"\n\
         [params]\nbucket = \"gs://b\"\n[guards]\ncontent_hash = \"24h\"\n\
         [command]\nrun = [\"./work.sh\", \"{date}:{param.bucket}\"]\ncontent = [\"cat\", \"input.txt\"]\n",
    );
    let (code, v, err) = s.json(&["explain", "exp", "--date", "2026-01-01"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["decision"], "run", "{v}");
    assert!(starts(&s).is_empty(), "explain ran the program");
    let out = s.idem(&[
        "run",
        "exp",
        "--from",
        "2026-01-01",
        "--to",
        "2026-01-04",
        "--parallel",
        "2",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut started = starts(&s);
    started.sort();
    assert_eq!(
        started,
        [
            "2026-01-01:gs://b",
            "2026-01-02:gs://b",
            "2026-01-03:gs://b",
            "2026-01-04:gs://b"
        ]
    );
    let out = s.idem(&["schedule", "export", "--crontab"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text.contains("run exp --date yesterday --trigger scheduler"),
        "{text}"
    );
}

/// `--param NAME=VALUE`: over the job's `[params]` for `idem run`, the only source for
/// `idem exec`; a placeholder with no parameter is exit 2 naming it.
#[test]
fn params_from_the_command_line_reach_the_placeholders() {
    let s = Sandbox::new("idem-command-param");
    script(
        &s,
        "work.sh",
        "#!/bin/sh\necho \"$1\" >> \"$(dirname \"$0\")/starts.log\"\n",
    );
    s.write_job(
        "p",
        "name = \"p\"\nprocessor = \"command\"\n[params]\nbucket = \"gs://a\"\n[command]\nrun = [\"./work.sh\", \"{param.bucket}/{date}\"]\n",
    );
    let out = s.idem(&["run", "p", "--date", "2026-01-02"]);
    assert_eq!(out.status.code(), Some(0));
    let out = s.idem(&[
        "run",
        "p",
        "--date",
        "2026-01-03",
        "--param",
        "bucket=gs://b",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let out = exec_command(
        &s,
        &[
            "exec",
            "q",
            "--param",
            "bucket=gs://c",
            "--date",
            "2026-01-04",
            "--",
            "jobs/work.sh",
            "{param.bucket}/{date}",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        starts(&s),
        [
            "gs://a/2026-01-02",
            "gs://b/2026-01-03",
            "gs://c/2026-01-04"
        ]
    );
    for (args, says) in [
        (
            vec!["exec", "q", "--", "echo", "{param.who}"],
            "names no parameter \"who\"",
        ),
        (
            vec!["exec", "q", "--param", "who", "--", "true"],
            "expected NAME=VALUE",
        ),
    ] {
        let out = s.idem(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// `idem scheduler` fires a command job like any other (trigger `scheduler`), and the
/// Cloud Scheduler export runs it by name.
#[test]
fn the_scheduler_fires_a_command_job_and_exports_run_it_by_name() {
    let s = Sandbox::new("idem-command-scheduler");
    script(
        &s,
        "tick.sh",
        "#!/bin/sh\necho \"$IDEM_TRIGGER $IDEM_DATE\" >> \"$(dirname \"$0\")/starts.log\"\n",
    );
    s.write_job(
        "tick",
        "name = \"tick\"\nprocessor = \"command\"\nschedule = \"* * * * * *\"\n[guards]\ntime_window = \"1h\"\n[command]\nrun = [\"./tick.sh\"]\n",
    );
    let child = s
        .command(&["scheduler"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while starts(&s).is_empty() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{log}");
    let today = chrono::Utc::now().date_naive().to_string();
    // One start for today's date however many seconds fired: the window skips the rest.
    assert_eq!(starts(&s), [format!("scheduler {today}")], "{log}");
    assert!(
        log.contains("fire tick slot") && log.contains("completed"),
        "{log}"
    );
    // Cloud Scheduler has no seconds field: a daily schedule for the export.
    let daily = std::fs::read_to_string(s.dir.join("jobs/tick.toml"))
        .unwrap()
        .replace("* * * * * *", "0 6 * * *");
    s.write_job("tick", &daily);
    let out = s
        .command_with_store(
            &[
                "schedule",
                "export",
                "--cloud-scheduler",
                "proj/europe-west1",
            ],
            "postgres://idem@db/idem",
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("--args='run,tick,"), "{text}");
}

/// A lease lost while the program runs (here released from under it, as a takeover after
/// a stall would): the heartbeat sees it, the whole group is stopped, and the run is
/// recorded as failed (no key).
#[test]
fn a_lost_lease_stops_the_program_and_its_children() {
    let s = Sandbox::new("idem-command-lease-lost");
    let (child, pids) = start_sleepy(&s, "grace = \"2s\"", "lease = \"3s\"", true);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = idem::store::open(&s.store).await.unwrap();
        let now = chrono::Utc::now();
        let holder = store
            .lease_holder("sleepy", "2026-01-02", now)
            .await
            .unwrap()
            .expect("the run holds the lease");
        let lease = idem::store::Lease {
            processor: "sleepy".into(),
            scope: "2026-01-02".into(),
            run_id: holder.run_id,
            token: holder.token,
            acquired_at: holder.acquired_at,
            expires_at: holder.expires_at,
        };
        assert!(store.release(&lease, now).await.unwrap());
    });
    let started = Instant::now();
    let (code, v, err) = common::wait(child);
    assert!(started.elapsed() < Duration::from_secs(15), "{err}");
    assert_eq!(code, 1, "{err}");
    assert_eq!(v["status"], "failed", "{v}");
    assert_gone(&pids, &format!("the lost lease: {err}"));
}

/// idem as a container's entrypoint is PID 1 of its PID namespace: the program's children
/// that outlive it are re-parented to idem, and once stopped they stay zombies (still
/// members of the group) until idem reaps them. SIGTERM must stop the run at once, not
/// after the whole grace period (`[command] grace = "60s"` here; before the fix it took
/// all of it), and release the lease. Needs `unshare --pid` (root, as in CI).
#[test]
fn as_pid_1_sigterm_stops_the_run_without_waiting_out_the_grace_period() {
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        common::skip(
            "as_pid_1_sigterm_stops_the_run_without_waiting_out_the_grace_period: skipped, \
             `unshare --pid --fork` is not allowed here (run as root)"
                .to_string(),
        );
        return;
    }
    let s = Sandbox::new("idem-command-pid1");
    script(
        &s,
        "sleepy.sh",
        "#!/bin/sh\nsleep 300 &\necho $$ > pids\necho $! >> pids\nwait\n",
    );
    job(
        &s,
        "sleepy",
        r#"["./sleepy.sh"]"#,
        "grace = \"60s\"",
        "time_window = \"1h\"",
    );
    let jobs = s.dir.join("jobs");
    let child = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", common::IDEM])
        .args(["run", "sleepy", "--date", "2026-01-02", "--format", "json"])
        .arg("--store")
        .arg(&s.store)
        .arg("--jobs-dir")
        .arg(&jobs)
        .current_dir(&s.dir)
        .env_remove("IDEM_STORE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The pids the script writes are the namespace's; the kernel ends the namespace's
    // processes with its PID 1, so only the wait below can show a slow stop.
    wait_for_file(&jobs.join("pids"), Duration::from_secs(30));
    // unshare's only child is idem, PID 1 in its namespace.
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id())).unwrap();
    let idem: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{idem}/status")).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert!(nspid.ends_with("\t1"), "idem is not PID 1: {nspid}");
    let started = Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &idem.to_string()])
        .status()
        .unwrap()
        .success());
    let (code, v, err) = common::wait(child);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the stop waited for the 60 s grace period: {:?} {err}",
        started.elapsed()
    );
    assert_eq!(code, 1, "{err}");
    assert!(v["error"].as_str().unwrap().contains("interrupted"), "{v}");
    std::fs::write(jobs.join("sleepy.sh"), "#!/bin/sh\nexit 0\n").unwrap();
    let (code, v, err) = s.json(&["run", "sleepy", "--date", "2026-01-02"]);
    assert_eq!(
        (code, v["status"].as_str()),
        (0, Some("completed")),
        "{err}"
    );
}
