//! Command jobs (`processor = "command"`) with real child processes: scripts written by the
//! test, run through `idem run` as a crontab line would.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;

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

/// Exit 0 and a completed run.
fn assert_completed(code: i32, v: &Value, err: &str) {
    assert_eq!(
        (code, v["status"].as_str()),
        (0, Some("completed")),
        "{v} {err}"
    );
}

fn runs(s: &Sandbox, job: &str) -> Vec<Value> {
    let (code, v, err) = s.json(&["runs", "--job", job, "--limit", "0"]);
    assert_eq!(code, 0, "{err}");
    v.as_array().cloned().unwrap_or_default()
}

/// SIGTERM to process `pid` (an idem under test), by `kill`.
fn sigterm(pid: u32) {
    assert!(Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
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
    // `idem run` exits with the program's status, as `idem exec` does.
    assert_eq!(code, 3, "{err}");
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
    assert_completed(code, &v, &err);
    // The same scope again (no time window), identical content: skipped without running.
    let (code, v, err) = s.run(&j, "2026-01-02");
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["skip_reason"], "duplicate_content_hash", "{v}");
    assert_eq!(starts(&s).len(), 1);
    // Changed content, same scope (the content key holds the scope, so only the content
    // differs): runs.
    std::fs::write(s.dir.join("jobs/input.txt"), "a\nc\n").unwrap();
    let (code, v, err) = s.run(&j, "2026-01-02");
    assert_completed(code, &v, &err);
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
            r#"["echo", "{param.dat}"]"#,
            "",
            "{param.dat} names no parameter \"dat\"",
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
    sigterm(child.id());
    let (code, v, err) = common::wait(child);
    assert!(started.elapsed() < Duration::from_secs(10), "{err}");
    // 128 + 15, as a shell reports a program SIGTERM stopped.
    assert_eq!(code, 143, "{err}");
    assert_eq!(v["status"], "failed", "{v}");
    assert!(v["error"].as_str().unwrap().contains("interrupted"), "{v}");
    assert_gone(&pids, &format!("idem: {err}"));
    // The lease is released: the next run runs at once.
    std::fs::write(s.dir.join("jobs/sleepy.sh"), "#!/bin/sh\nexit 0\n").unwrap();
    let (code, v, err) = s.json(&["run", "sleepy", "--date", "2026-01-02"]);
    assert_completed(code, &v, &err);
}

/// A program that cleans up on SIGTERM by starting a process of its own (a trap's
/// cleanup, in its group, after the group got the signal) has it run to its end within
/// the grace period, whichever stop sent the signal: SIGTERM to `idem exec`, or its
/// `--timeout`. Before, idem's stop signalled every process of the group it had not seen
/// at the first signal: the cleanup got its own SIGTERM within 20 ms (a CI run of
/// `tests/it/scheduler.rs` read an empty file a trap's `date` had been killed writing).
#[test]
fn a_cleanup_the_program_starts_on_sigterm_is_not_signalled_again() {
    let s = Sandbox::new("idem-exec-cleanup");
    for (date, timeout) in [("2026-01-02", None), ("2026-01-03", Some("1s"))] {
        let trap = format!(
            "trap 'sh -c \"sleep 0.5; echo cleaned > jobs/cleaned-{date}\"; exit 0' TERM; touch jobs/started-{date}; while :; do sleep 0.05; done"
        );
        let mut args = vec!["exec", "cleanup", "--date", date, "--grace", "30s"];
        if let Some(t) = timeout {
            args.extend(["--timeout", t]);
        }
        args.extend(["--", "sh", "-c", &trap]);
        let child = exec_command(&s, &args).spawn().unwrap();
        let started = s.dir.join(format!("jobs/started-{date}"));
        common::wait_until(
            "the program's start",
            Duration::from_secs(60),
            Duration::from_millis(20),
            || started.exists(),
        );
        if timeout.is_none() {
            sigterm(child.id());
        }
        let (code, v, err) = common::wait(child);
        assert_eq!(v["status"], "failed", "{date}: {v} {err}");
        let why = if timeout.is_some() {
            "ran past [command] timeout"
        } else {
            "interrupted"
        };
        assert!(v["error"].as_str().unwrap().contains(why), "{date}: {v}");
        assert_eq!(
            std::fs::read_to_string(s.dir.join(format!("jobs/cleaned-{date}")))
                .ok()
                .as_deref(),
            Some("cleaned\n"),
            "{date}: the program's cleanup did not run to its end: exit {code}, {err}"
        );
    }
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
    assert_completed(code, &v, &err);
    let (code, v, err) = exec("2026-01-02");
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["skip_reason"], "time_window");
    let (code, v, err) = exec("2026-01-03");
    assert_completed(code, &v, &err);
    assert_eq!(starts(&s), ["2026-01-02 nightly", "2026-01-03 nightly"]);
    assert_eq!(runs(&s, "nightly").len(), 3);
    // Bad input: exit 2 naming it, nothing recorded.
    for (args, says) in [
        (
            vec!["exec", "nightly", "--", ""],
            "idem exec nightly: the program is empty: give it after `--`",
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
/// a bounded tail for the ledger): idem's peak memory stays far below it. The peak is that
/// of this idem process and the processes it waited for (`wait4` on its pid), not of every
/// process this test binary ran (idem's own is about 25 MiB).
#[test]
fn a_program_writing_a_gibibyte_does_not_grow_idems_memory() {
    let s = Sandbox::new("idem-command-gib");
    let child = exec_command(
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
    .spawn()
    .unwrap();
    let pid = child.id() as libc::pid_t;
    // SAFETY: wait4 reaps `pid`, a child of this process not waited for elsewhere, and
    // writes into the status and struct it is given.
    let (status, peak_kib) = unsafe {
        let mut status: libc::c_int = 0;
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::wait4(pid, &mut status, 0, &mut usage), pid);
        (status, usage.ru_maxrss)
    };
    drop(child);
    // The program's own exit status.
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 4,
        "{status}"
    );
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
    // As timeout(1) says it.
    assert_eq!(code, 124, "{err}");
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
    assert_completed(code, &v, &err);
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
    sigterm(child.id());
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
    // A grace period at most half the lease (a longer one is refused).
    let (child, pids) = start_sleepy(&s, "grace = \"2s\"", "lease = \"4s\"", true);
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
    sigterm(idem as u32);
    let (code, v, err) = common::wait(child);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the stop waited for the 60 s grace period: {:?} {err}",
        started.elapsed()
    );
    assert_eq!(code, 143, "{err}");
    assert!(v["error"].as_str().unwrap().contains("interrupted"), "{v}");
    std::fs::write(jobs.join("sleepy.sh"), "#!/bin/sh\nexit 0\n").unwrap();
    let (code, v, err) = s.json(&["run", "sleepy", "--date", "2026-01-02"]);
    assert_completed(code, &v, &err);
}

// ---------------------------------------------------------------------------------------
// `idem exec` as a drop-in cron wrapper: exit status, standard input, arguments, output,
// signals, the program's tree (issue 34).
// ---------------------------------------------------------------------------------------

/// [`common::wait_until`], looking every 20 ms.
fn wait_until(what: &str, limit: Duration, done: impl FnMut() -> bool) {
    common::wait_until(what, limit, Duration::from_millis(20), done)
}

/// The pid a script wrote to `jobs/NAME` (waits for it).
fn pid_in(s: &Sandbox, name: &str) -> i32 {
    let path = s.dir.join("jobs").join(name);
    wait_until(&format!("{name} written"), Duration::from_secs(30), || {
        std::fs::read_to_string(&path).is_ok_and(|t| t.ends_with('\n'))
    });
    std::fs::read_to_string(&path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Sends `signal` (a name for kill(1): HUP, TERM, …) to process `pid`.
fn send(signal: &str, pid: u32) {
    assert!(Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

/// Ends processes a test left running on purpose (by pid).
fn end(pids: &[i32]) {
    for p in pids {
        // SAFETY: kill(2) on a pid this test started.
        unsafe {
            libc::kill(*p, libc::SIGKILL);
        }
    }
}

/// `idem FLAGS --store STORE --jobs-dir DIR --` (`FLAGS`: `exec NAME …`, human output),
/// ready for the program and its arguments.
fn exec_with(s: &Sandbox, store: &str, flags: &[&str]) -> Command {
    let mut c = Command::new(common::IDEM);
    c.args(flags)
        .arg("--store")
        .arg(store)
        .arg("--jobs-dir")
        .arg(s.dir.join("jobs"))
        .arg("--")
        .current_dir(&s.dir)
        .env_remove("IDEM_STORE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

/// `idem exec` with `--format json`, to its end.
fn exec_json(s: &Sandbox, args: &[&str]) -> (i32, Value, String) {
    common::parse(exec_command(s, args).output().unwrap())
}

/// The program's own exit status comes out of `idem exec` and `idem run` as `timeout(1)`
/// gives it: its code, 128+N when signal N killed it, 124 past `--timeout`, 127 when it
/// is not there, 126 when it cannot start (each a failed run in the ledger, whether the
/// command line names the program or a parameter does); a skip is 0, or the code
/// `--skip-exit-code` names.
#[test]
fn the_programs_exit_status_passes_through() {
    let s = Sandbox::new("idem-exec-status");
    let text = s.dir.join("not-a-program.txt");
    std::fs::write(&text, "plain text\n").unwrap();
    let text = text.to_str().unwrap();
    let folder = s.dir.to_str().unwrap();
    let script = s.dir.join("no-interpreter.sh");
    std::fs::write(&script, "#!/no/such/interpreter-idem\necho hi\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script = script.to_str().unwrap();
    let cases: [(&[&str], i32, &str); 10] = [
        (&["--", "sh", "-c", "exit 7"], 7, "exited with code 7"),
        (
            &["--", "sh", "-c", "kill -KILL $$"],
            137,
            "was killed by signal 9 (SIGKILL)",
        ),
        (
            &["--timeout", "1s", "--grace", "1s", "--", "sleep", "60"],
            124,
            "ran past [command] timeout = 1s",
        ),
        (
            &["--param", "p=no-such-program-idem", "--", "{param.p}"],
            127,
            "not found on PATH",
        ),
        (&["--", "true"], 0, ""),
        (&["--", "no-such-program-idem"], 127, "not found on PATH"),
        (
            &["--", "./no-such-program-idem"],
            127,
            "not found (looked at",
        ),
        (&["--", text], 126, "is not executable"),
        (&["--", folder], 126, "is a folder"),
        (&["--", script], 126, "the interpreter its `#!` line names"),
    ];
    for (i, (args, want, says)) in cases.into_iter().enumerate() {
        let name = format!("status{i}");
        let mut all = vec!["exec", name.as_str(), "--date", "2026-01-02"];
        all.extend(args);
        let (code, v, err) = exec_json(&s, &all);
        assert_eq!(code, want, "{args:?}: {v} {err}");
        if want != 0 {
            assert_eq!(v["status"], "failed", "{v}");
            assert!(v["error"].as_str().unwrap().contains(says), "{v}");
            // Recorded: the ledger holds the failed run and says why.
            let recorded = runs(&s, &name);
            assert_eq!(recorded.len(), 1, "{args:?}: {recorded:?}");
            assert_eq!(recorded[0]["status"], "failed", "{recorded:?}");
            assert!(
                recorded[0]["error"].as_str().unwrap_or("").contains(says),
                "{recorded:?}"
            );
        }
    }
    // A skip: 0 by default (cron must not mail), or the code asked for.
    let skip = |extra: &[&str]| {
        let mut all = vec![
            "exec",
            "status4",
            "--date",
            "2026-01-02",
            "--time-window",
            "1h",
        ];
        all.extend(extra);
        all.extend(["--", "true"]);
        exec_json(&s, &all)
    };
    let (code, v, _) = skip(&[]);
    assert_eq!(
        (code, v["skip_reason"].as_str()),
        (0, Some("time_window")),
        "{v}"
    );
    let (code, v, _) = skip(&["--skip-exit-code", "100"]);
    assert_eq!(
        (code, v["skip_reason"].as_str()),
        (100, Some("time_window")),
        "{v}"
    );
    // `idem run` of a command job: the same.
    job(&s, "seven", r#"["sh", "-c", "exit 7"]"#, "", "");
    let (code, v, err) = s.json(&["run", "seven", "--date", "2026-01-02"]);
    assert_eq!(code, 7, "{v} {err}");
    let j = job(&s, "once", r#"["true"]"#, "", "time_window = \"1h\"");
    assert_eq!(s.run(&j, "2026-01-02").0, 0);
    let out = s.idem(&[
        "run",
        "once",
        "--date",
        "2026-01-02",
        "--skip-exit-code",
        "100",
    ]);
    assert_eq!(out.status.code(), Some(100));
}

/// `echo data | idem exec j -- cat`: the program reads idem's standard input.
#[test]
fn standard_input_reaches_the_program() {
    let s = Sandbox::new("idem-exec-stdin");
    let mut child = exec_command(
        &s,
        &[
            "exec",
            "j",
            "--date",
            "2026-01-02",
            "--",
            "sh",
            "-c",
            "cat > got.txt",
        ],
    )
    .stdin(Stdio::piped())
    .spawn()
    .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"line one\nline two\n").unwrap();
    }
    let (code, v, err) = common::wait(child);
    assert_completed(code, &v, &err);
    assert_eq!(
        std::fs::read_to_string(s.dir.join("got.txt")).unwrap(),
        "line one\nline two\n"
    );
}

/// Braces that are not idem's placeholders, `${VAR}`, and bytes that are not UTF-8 reach
/// the program unchanged; `{date}` is replaced and `{{date}}` is the text `{date}`.
#[test]
fn arguments_reach_the_program_as_given() {
    use std::os::unix::ffi::OsStrExt as _;
    let s = Sandbox::new("idem-exec-args");
    std::fs::write(s.dir.join("found.txt"), "found me\n").unwrap();
    let not_utf8 = std::ffi::OsStr::from_bytes(b"caf\xe9-{date}.csv");
    let out = exec_with(&s, &s.store, &["exec", "args", "--date", "2026-01-02"])
        .args([
            "sh",
            "-c",
            "for a in \"$@\"; do printf '%s\\n' \"$a\"; done > args.txt",
            "sh",
        ])
        .args([
            "BEGIN{print}",
            "{}",
            ";",
            "{\"a\":1}",
            "${HOME}",
            "{date}",
            "{{date}}",
        ])
        .arg(not_utf8)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let want: Vec<u8> = {
        // The placeholder inside the non-UTF-8 argument is replaced too.
        let mut w = b"BEGIN{print}\n{}\n;\n{\"a\":1}\n${HOME}\n2026-01-02\n{date}\n".to_vec();
        w.extend_from_slice(b"caf\xe9-2026-01-02.csv\n");
        w
    };
    assert_eq!(std::fs::read(s.dir.join("args.txt")).unwrap(), want);
    // The programs a crontab runs this way: awk, find -exec, a shell's ${VAR}.
    for (args, prints) in [
        (vec!["awk", "BEGIN{print \"awk ran\"}"], "awk ran"),
        (
            vec!["find", ".", "-name", "found.txt", "-exec", "cat", "{}", ";"],
            "found me",
        ),
        (vec!["sh", "-c", "echo \"home is ${HOME}\""], "home is /"),
    ] {
        let name = format!("prog-{}", args[0]);
        let out = exec_with(&s, &s.store, &["exec", &name])
            .args(&args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert!(stdout.contains(prints), "{args:?}: {stdout}");
    }
}

/// `--quiet`: nothing of idem's own on a completed or skipped run (cron mails any
/// output), one error line on a failed one.
#[test]
fn quiet_prints_nothing_unless_the_run_fails() {
    let s = Sandbox::new("idem-exec-quiet");
    let quiet = |name: &str, program: &[&str]| {
        let flags = [
            "exec",
            name,
            "--quiet",
            "--date",
            "2026-01-02",
            "--time-window",
            "1h",
        ];
        exec_with(&s, &s.store, &flags)
            .args(program)
            .output()
            .unwrap()
    };
    for what in ["completed", "skipped"] {
        let out = quiet("q", &["true"]);
        assert_eq!(out.status.code(), Some(0), "{what}");
        assert!(out.stdout.is_empty(), "{what}: {out:?}");
        assert!(out.stderr.is_empty(), "{what}: {out:?}");
    }
    assert_eq!(runs(&s, "q").len(), 2);
    let out = quiet("f", &["sh", "-c", "echo 'disk full' >&2; exit 4"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(out.stdout.is_empty(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    // The program's own stderr, then idem's one line.
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert_eq!(lines[0], "disk full");
    assert!(
        lines[1].starts_with("error: f for 2026-01-02 failed: \"sh\" exited with code 4"),
        "{err}"
    );
}

/// A program that leaves a background child and a `setsid` daemon behind: both are
/// stopped (SIGTERM) once it exits, and the run is recorded, its lease released, only after
/// they are gone. Each leftover, told to stop, waits for the test's `go`: meanwhile the
/// lease is still held (another run of the date is skipped in_progress) and idem has not
/// exited. `--keep-descendants` leaves a daemon running.
#[test]
fn what_the_program_leaves_running_is_stopped_before_the_lease_is_free() {
    let s = Sandbox::new("idem-exec-tree");
    // A leftover: on SIGTERM says so, then waits for `go`.
    script(
        &s,
        "leftover.sh",
        "#!/bin/sh\ncd \"$(dirname \"$0\")\"\ntrap 'echo stopping > \"stopping-$1\"; while [ ! -f go ]; do sleep 0.02; done; exit 0' TERM\necho $$ > \"$1.pid\"\nwhile :; do sleep 0.05; done\n",
    );
    let child = exec_command(
        &s,
        &[
            "exec",
            "tree",
            "--date",
            "2026-01-02",
            "--",
            "sh",
            "-c",
            "jobs/leftover.sh bg >/dev/null 2>&1 & setsid jobs/leftover.sh daemon >/dev/null 2>&1 & while [ ! -f jobs/bg.pid ] || [ ! -f jobs/daemon.pid ]; do sleep 0.02; done",
        ],
    )
    .spawn()
    .unwrap();
    let pids = [pid_in(&s, "bg.pid"), pid_in(&s, "daemon.pid")];
    let mut child = child;
    // Both are told to stop while idem still runs (on main idem exited, leaving them).
    let stopping = |p: &str| s.dir.join("jobs").join(format!("stopping-{p}")).exists();
    let start = Instant::now();
    while !(stopping("bg") && stopping("daemon")) {
        if let Some(status) = child.try_wait().unwrap() {
            end(&pids);
            panic!("idem exited ({status}) with the program's processes still running");
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never told to stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "idem exited before its tree"
    );
    let (code, v, err) = exec_json(&s, &["exec", "tree", "--date", "2026-01-02", "--", "true"]);
    assert_eq!(
        (code, v["skip_reason"].as_str()),
        (0, Some("in_progress")),
        "the lease was free while the tree ran: {v} {err}"
    );
    std::fs::write(s.dir.join("jobs/go"), "").unwrap();
    let (code, v, err) = common::wait(child);
    assert_completed(code, &v, &err);
    assert_gone(&pids, "the run");
    // Now the date is free.
    let (code, v, err) = exec_json(&s, &["exec", "tree", "--date", "2026-01-02", "--", "true"]);
    assert_completed(code, &v, &err);

    // --keep-descendants: the daemon a job starts stays.
    let (code, v, err) = exec_json(
        &s,
        &[
            "exec",
            "daemon",
            "--keep-descendants",
            "--",
            "sh",
            "-c",
            "setsid sleep 300 >/dev/null 2>&1 & echo $! > jobs/kept.pid",
        ],
    );
    assert_completed(code, &v, &err);
    let kept = pid_in(&s, "kept.pid");
    assert!(pid_alive(kept), "--keep-descendants stopped the daemon");
    end(&[kept]);
}

/// `--timeout 2s --grace 1s` bounds idem, whatever holds the program's standard error: a
/// `setsid` descendant (stopped with the tree), or a process outside the tree that opened
/// the pipe (idem stops reading). The holders would hold it for an hour: idem must end
/// while they still could (it does in about 3 s; nothing here is timed but a guard against
/// hanging, which ends the test as failed after 2 minutes). The content command is
/// bounded too.
#[test]
fn the_timeout_bounds_idem_whatever_holds_its_pipes() {
    let s = Sandbox::new("idem-exec-bound");
    // Waits for idem; after the guard, ends it and `holders` and fails.
    let ends = |child: std::process::Child, holders: &dyn Fn() -> Vec<i32>| {
        let mut child = child;
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(120) {
                let _ = child.kill();
                end(&holders());
                panic!("idem did not end: it waits for what holds the program's pipe");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("idem ended after {:?}", started.elapsed());
        common::wait(child)
    };
    let escaped = || vec![pid_in(&s, "escaped.pid")];
    let child = exec_command(
        &s,
        &[
            "exec",
            "escaped",
            "--timeout",
            "2s",
            "--grace",
            "1s",
            "--",
            "sh",
            "-c",
            "setsid sleep 3600 & echo $! > jobs/escaped.pid; sleep 3600",
        ],
    )
    .spawn()
    .unwrap();
    let (code, v, err) = ends(child, &escaped);
    assert_eq!(code, 124, "{v} {err}");
    assert_gone(&escaped(), "the timeout");

    // A process outside the tree (this test) holds the program's stderr, for as long as
    // idem runs.
    let child = exec_command(
        &s,
        &[
            "exec",
            "held",
            "--timeout",
            "2s",
            "--grace",
            "1s",
            "--",
            "sh",
            "-c",
            "echo $$ > jobs/held.pid; sleep 3600",
        ],
    )
    .spawn()
    .unwrap();
    let program = pid_in(&s, "held.pid");
    let holder = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{program}/fd/2"))
        .unwrap();
    let (code, v, err) = ends(child, &|| vec![program]);
    drop(holder);
    assert_eq!(code, 124, "{v} {err}");

    // The content command.
    let child = exec_command(
        &s,
        &[
            "exec",
            "slow-content",
            "--content-hash",
            "1h",
            "--content",
            "sh -c 'echo $$ > jobs/content.pid; exec sleep 3600'",
            "--timeout",
            "1s",
            "--grace",
            "1s",
            "--",
            "true",
        ],
    )
    .spawn()
    .unwrap();
    let (code, v, err) = ends(child, &|| vec![pid_in(&s, "content.pid")]);
    assert_eq!(code, 124, "{v} {err}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("the content command \"sh\" ran past"),
        "{v}"
    );
}

/// SIGHUP (a closed ssh session), SIGQUIT and SIGINT to idem: each reaches the program as
/// sent, the run is recorded interrupted with exit 128+N, no process of the tree is left,
/// and the lease is free. SIGUSR1 is only passed on: a program that handles it goes on.
#[test]
fn signals_reach_the_program_and_leave_a_recorded_run_and_a_free_lease() {
    let s = Sandbox::new("idem-exec-signals");
    script(
        &s,
        "sleepy.sh",
        "#!/bin/sh\ncd \"$(dirname \"$0\")\"\nfor sig in HUP QUIT INT USR1; do trap \"echo $sig >> got; [ $sig = USR1 ] || exit 1\" $sig; done\nsleep 300 &\necho $! > child.pid\necho $$ > program.pid\nwhile [ ! -f go ]; do sleep 0.02; done\n",
    );
    for (sig, number) in [("HUP", 1), ("QUIT", 3), ("INT", 2)] {
        for f in ["got", "child.pid", "program.pid"] {
            let _ = std::fs::remove_file(s.dir.join("jobs").join(f));
        }
        let child = exec_command(
            &s,
            &[
                "exec",
                "sleepy",
                "--date",
                "2026-01-02",
                "--grace",
                "5s",
                "--",
                "jobs/sleepy.sh",
            ],
        )
        .spawn()
        .unwrap();
        let pids = [pid_in(&s, "program.pid"), pid_in(&s, "child.pid")];
        send(sig, child.id());
        let (code, v, err) = common::wait(child);
        assert_eq!(code, 128 + number, "{sig}: {v} {err}");
        assert_eq!(v["status"], "failed", "{sig}: {v}");
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains(&format!("interrupted by SIG{sig}")),
            "{sig}: {v}"
        );
        assert_eq!(
            std::fs::read_to_string(s.dir.join("jobs/got")).unwrap(),
            format!("{sig}\n"),
            "the program got another signal than SIG{sig}"
        );
        assert_gone(&pids, &format!("SIG{sig}: {err}"));
        let recorded = runs(&s, "sleepy");
        assert!(
            recorded[0]["error"]
                .as_str()
                .unwrap()
                .contains(&format!("interrupted by SIG{sig}")),
            "{recorded:?}"
        );
    }
    // The lease is free: the next run runs at once.
    let (code, v, err) = exec_json(
        &s,
        &["exec", "sleepy", "--date", "2026-01-02", "--", "true"],
    );
    assert_completed(code, &v, &err);
    // SIGUSR1 is passed on; the program handles it and finishes.
    let _ = std::fs::remove_file(s.dir.join("jobs/got"));
    let _ = std::fs::remove_file(s.dir.join("jobs/program.pid"));
    let child = exec_command(
        &s,
        &[
            "exec",
            "sleepy",
            "--date",
            "2026-01-03",
            "--",
            "jobs/sleepy.sh",
        ],
    )
    .spawn()
    .unwrap();
    pid_in(&s, "program.pid");
    send("USR1", child.id());
    let got = s.dir.join("jobs/got");
    wait_until("the program got SIGUSR1", Duration::from_secs(30), || {
        std::fs::read_to_string(&got).is_ok_and(|t| t == "USR1\n")
    });
    std::fs::write(s.dir.join("jobs/go"), "").unwrap();
    let (code, v, err) = common::wait(child);
    assert_completed(code, &v, &err);
}

/// SIGKILL to idem: its watchdog stops what left the program's group too, and removes
/// the run's private folder (mode 0700) with its result file.
#[test]
fn sigkill_to_idem_leaves_no_process_and_no_result_folder() {
    let s = Sandbox::new("idem-exec-sigkill");
    let mut child = exec_command(
        &s,
        &[
            "exec",
            "killed",
            "--grace",
            "1s",
            "--",
            "sh",
            "-c",
            "setsid sleep 300 >/dev/null 2>&1 & echo $! > jobs/escaped.pid; \
             stat -c %a \"$(dirname \"$IDEM_RESULT\")\" > jobs/mode; \
             echo \"$IDEM_RESULT\" > jobs/result; echo 1 > \"$IDEM_RESULT\"; \
             echo $$ > jobs/program.pid; sleep 300",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let pids = [pid_in(&s, "escaped.pid"), pid_in(&s, "program.pid")];
    let result = std::fs::read_to_string(s.dir.join("jobs/result")).unwrap();
    let folder = Path::new(result.trim()).parent().unwrap().to_path_buf();
    assert_eq!(
        std::fs::read_to_string(s.dir.join("jobs/mode")).unwrap(),
        "700\n"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    wait_until("the watchdog's stop", Duration::from_secs(30), || {
        pids.iter().all(|p| !pid_alive(*p)) && !folder.exists()
    });
    // The content command, and what it started, too.
    let mut child = exec_command(
        &s,
        &[
            "exec",
            "killed-content",
            "--grace",
            "1s",
            "--content-hash",
            "1h",
            "--content",
            "sh -c 'sleep 300 & echo $! > jobs/content-child.pid; echo $$ > jobs/content.pid; wait'",
            "--",
            "true",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let pids = [pid_in(&s, "content.pid"), pid_in(&s, "content-child.pid")];
    child.kill().unwrap();
    child.wait().unwrap();
    wait_until(
        "the content command's stop",
        Duration::from_secs(30),
        || pids.iter().all(|p| !pid_alive(*p)),
    );
}

/// The result folder is removed when the run is stopped from outside (SIGTERM) too.
#[test]
fn the_result_folder_is_removed_when_the_run_is_stopped() {
    let s = Sandbox::new("idem-exec-folder");
    let child = exec_command(
        &s,
        &[
            "exec",
            "stopped",
            "--",
            "sh",
            "-c",
            "echo \"$IDEM_RESULT\" > jobs/result; echo $$ > jobs/program.pid; sleep 300",
        ],
    )
    .spawn()
    .unwrap();
    pid_in(&s, "program.pid");
    let result = std::fs::read_to_string(s.dir.join("jobs/result")).unwrap();
    let folder = Path::new(result.trim()).parent().unwrap().to_path_buf();
    assert!(folder.is_dir());
    send("TERM", child.id());
    let (code, _, err) = common::wait(child);
    assert!(!folder.exists(), "{} is still there", folder.display());
    assert_eq!(code, 143, "{err}");
}

/// A grace period over half the lease: if idem died, the lease could expire while the
/// watchdog still lets the old tree run, and a second run start beside it. Refused (exit 2,
/// naming both), for `idem exec` and job files alike; nothing runs.
#[test]
fn a_grace_period_over_half_the_lease_is_refused_naming_both() {
    let s = Sandbox::new("idem-exec-grace");
    let out = exec_with(&s, &s.store, &["exec", "g", "--lease", "10s"])
        .args(["sh", "-c", "echo ran > jobs/ran"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--grace 30s (the default) is more than half of --lease 10s"),
        "{err}"
    );
    let out = exec_with(
        &s,
        &s.store,
        &["exec", "g", "--lease", "10s", "--grace", "6s"],
    )
    .arg("true")
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--grace 6s is more than half"));
    let (code, v, err) = exec_json(
        &s,
        &["exec", "g", "--lease", "10s", "--grace", "5s", "--", "true"],
    );
    assert_completed(code, &v, &err);
    job(
        &s,
        "gj",
        r#"["true"]"#,
        "grace = \"20s\"",
        "lease = \"30s\"",
    );
    let out = s.idem(&["run", "gj", "--date", "2026-01-02"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("[command] grace 20s is more than half of [guards] lease 30s"),
        "{err}"
    );
    assert!(!s.dir.join("jobs/ran").exists());
}

/// A name reused for another command: the time window still skips (the date is done),
/// but says the command changed, on stderr and in the report (and in `explain` for a job
/// file); `--on-change rerun` runs the changed command.
#[test]
fn a_changed_command_skipped_by_the_time_window_says_so() {
    let s = Sandbox::new("idem-exec-changed");
    let backup = |what: &str, extra: &[&str]| {
        let mut all = vec![
            "exec",
            "backup",
            "--date",
            "2026-01-02",
            "--time-window",
            "20h",
        ];
        all.extend(extra);
        all.extend(["--", "sh", "-c"]);
        let line = format!("echo {what} >> jobs/starts.log");
        all.push(&line);
        exec_json(&s, &all)
    };
    let (code, v, err) = backup("DB", &[]);
    assert_completed(code, &v, &err);
    // The same command: a plain skip.
    let (_, v, err) = backup("DB", &[]);
    assert_eq!(v["skip_reason"], "time_window");
    assert!(!err.contains("changed"), "{err}");
    // Another command under the name: skipped, and said so.
    let (code, v, err) = backup("FILES", &[]);
    assert_eq!(
        (code, v["skip_reason"].as_str()),
        (0, Some("time_window")),
        "{v}"
    );
    assert!(
        err.contains("WARN")
            && err.contains(
                "backup: skipped for 2026-01-02 by the time window, though the job changed"
            ),
        "{err}"
    );
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("the job changed since that run"),
        "{v}"
    );
    // --on-change rerun runs it.
    let (code, v, err) = backup("FILES", &["--on-change", "rerun"]);
    assert_completed(code, &v, &err);
    assert_eq!(starts(&s), ["DB", "FILES"]);
    // A job file edited after its run: `explain` says so.
    let j = job(&s, "edited", r#"["true"]"#, "", "time_window = \"20h\"");
    assert_eq!(s.run(&j, "2026-01-02").0, 0);
    job(
        &s,
        "edited",
        r#"["echo", "edited"]"#,
        "",
        "time_window = \"20h\"",
    );
    let (code, v, err) = s.json(&["explain", "edited", "--date", "2026-01-02"]);
    assert_eq!((code, v["decision"].as_str()), (0, Some("skip")), "{err}");
    assert!(
        v["detail"].as_str().unwrap().contains("the job changed"),
        "{v}"
    );
    assert!(err.contains("the job changed"), "{err}");
}

/// `--date today` (the default) is the machine's date, as the `date` command it replaces
/// reads it (`TZ`, else /etc/localtime), unless `--timezone`; the zone is recorded with the
/// run. Kiritimati (UTC+14) and Etc/GMT+12 (UTC−12) are never on the same date.
#[test]
fn exec_dates_follow_the_machines_zone() {
    use chrono::TimeZone as _;
    let s = Sandbox::new("idem-exec-tz");
    let today_in = |zone: &str| {
        let tz: chrono_tz::Tz = zone.parse().unwrap();
        tz.from_utc_datetime(&chrono::Utc::now().naive_utc())
            .date_naive()
            .to_string()
    };
    let mut scopes = Vec::new();
    for zone in ["Pacific/Kiritimati", "Etc/GMT+12"] {
        let before = today_in(zone);
        let (code, v, err) = common::parse(
            exec_command(&s, &["exec", "local", "--", "true"])
                .env("TZ", zone)
                .output()
                .unwrap(),
        );
        let after = today_in(zone);
        assert_eq!(code, 0, "{err}");
        let scope = v["scope"].as_str().unwrap().to_string();
        assert!(
            scope == before || scope == after,
            "{zone}: {scope} not {before}"
        );
        assert_eq!(v["output"]["date_zone"], zone, "{v}");
        scopes.push(scope);
    }
    assert_ne!(scopes[0], scopes[1]);
    // --timezone wins over TZ.
    let (_, v, _) = common::parse(
        exec_command(
            &s,
            &["exec", "local", "--timezone", "Etc/GMT+12", "--", "true"],
        )
        .env("TZ", "Pacific/Kiritimati")
        .output()
        .unwrap(),
    );
    assert_eq!(v["scope"], scopes[1].as_str(), "{v}");
    let out = s
        .command(&["exec", "local", "--", "true"])
        .env("TZ", "Mars/Olympus")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TZ=\"Mars/Olympus\""));
}

/// `--on-store-failure` on `exec` as on `run`: with the store unavailable, `strict` (the
/// default) runs nothing and exits 3; `best_effort` runs the program unguarded.
#[test]
fn exec_takes_on_store_failure() {
    let s = Sandbox::new("idem-exec-store");
    let store = format!("sqlite://{}/no/such/folder/idem.db", s.dir.display());
    let exec = |extra: &[&str]| {
        let mut flags = vec!["exec", "j", "--date", "2026-01-02"];
        flags.extend(extra);
        exec_with(&s, &store, &flags)
            .args(["sh", "-c", "echo ran >> jobs/starts.log"])
            .output()
            .unwrap()
    };
    let out = exec(&[]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(starts(&s).is_empty());
    let out = exec(&["--on-store-failure", "best_effort"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(starts(&s), ["ran"]);
}

/// As a container's entrypoint (PID 1 of its PID namespace, with its own /proc), idem
/// reaps the orphans the program leaves while it runs, as tini does: the program makes 20
/// and waits (up to 30 s) until no zombie is left. Needs `unshare` (root, as in CI).
#[test]
fn as_pid_1_idem_reaps_orphans_while_the_program_runs() {
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        common::skip(
            "as_pid_1_idem_reaps_orphans_while_the_program_runs: skipped, `unshare --pid \
             --fork --mount-proc` is not allowed here (run as root)"
                .to_string(),
        );
        return;
    }
    let s = Sandbox::new("idem-exec-pid1");
    script(
        &s,
        "orphans.sh",
        "#!/bin/sh\nfor i in $(seq 20); do (sleep 0 &); done\nzombies() { n=0; for f in /proc/[0-9]*/stat; do set -- $(cat \"$f\" 2>/dev/null); [ \"$3\" = Z ] && n=$((n+1)); done; echo $n; }\nfor t in $(seq 1500); do [ \"$(zombies)\" = 0 ] && break; sleep 0.02; done\necho \"$(zombies)\" > \"$(dirname \"$0\")/zombies\"\n",
    );
    let out = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            common::IDEM,
        ])
        .args([
            "exec",
            "pid1",
            "--date",
            "2026-01-02",
            "--store",
            &s.store,
            "--",
        ])
        .arg(s.dir.join("jobs/orphans.sh"))
        .current_dir(&s.dir)
        .env_remove("IDEM_STORE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(s.dir.join("jobs/zombies")).unwrap(),
        "0\n",
        "zombies piled up under idem as PID 1"
    );
}

/// On a terminal (`script` makes one), the program gets it while it runs: it reads what is
/// typed (its process group is the terminal's foreground, so reading does not stop it),
/// and Ctrl-C reaches it (exit 130).
#[test]
fn a_program_on_a_terminal_reads_it_and_gets_its_ctrl_c() {
    if Command::new("script").arg("--version").output().is_err() {
        common::skip(
            "a_program_on_a_terminal_reads_it_and_gets_its_ctrl_c: skipped, no `script` \
             (util-linux) to make a terminal"
                .to_string(),
        );
        return;
    }
    let s = Sandbox::new("idem-exec-tty");
    let on_terminal = |name: &str, program: &str, typed: &[u8]| {
        let line = format!(
            "{} exec {name} --store {} -- sh -c '{program}'; echo \"idem exited $?\"",
            common::IDEM,
            s.store
        );
        let mut child = Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .current_dir(&s.dir)
            .env_remove("IDEM_STORE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Typed once the program waits for it.
        wait_until("the program's start", Duration::from_secs(30), || {
            s.dir.join(format!("{name}.started")).exists()
        });
        {
            use std::io::Write as _;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(typed).unwrap();
            // `script` ends when its input does: keep it open until the command is done.
            wait_until("the program's end", Duration::from_secs(30), || {
                s.dir.join(format!("{name}.done")).exists()
            });
        }
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let out = on_terminal(
        "reads",
        "touch reads.started; read x; echo \"got=$x\"; touch reads.done",
        b"hello\n",
    );
    assert!(out.contains("got=hello"), "{out}");
    assert!(out.contains("idem exited 0"), "{out}");
    let out = on_terminal(
        "ctrl-c",
        "trap \"touch ctrl-c.done; exit 130\" INT; touch ctrl-c.started; while :; do sleep 0.05; done",
        b"\x03",
    );
    assert!(out.contains("idem exited 130"), "{out}");
}
