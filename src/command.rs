//! `processor = "command"`: a program run per scope, behind the guards.
//!
//! ```toml
//! [command]
//! run = ["python3", "scripts/export.py", "--date", "{date}"]   # argv, no shell
//! content = ["sh", "-c", "ls -l /data/orders/{date}/"]          # optional: its stdout is the content
//! timeout = "2h"                                                # optional
//! grace = "30s"                                                 # optional (default 30s)
//! cwd = "."                                                     # optional, relative to the job file
//! env = { EXPORT_BUCKET = "gs://acme-exports" }                # optional
//! ```
//!
//! * Placeholders `{date}`, `{scope}`, `{run_id}`, `{trigger}`, `{job}` and `{param.NAME}`
//!   are replaced inside each argument (`{{` and `}}` are literal braces); no shell ever
//!   reads the arguments. The child also gets `IDEM_JOB`, `IDEM_SCOPE`, `IDEM_DATE`,
//!   `IDEM_RUN_ID`, `IDEM_TRIGGER` and `IDEM_RESULT` in its environment.
//! * Exit 0 completes the run; any other exit (or a signal) fails it, with the exit code or
//!   signal and the last lines of the child's standard error in the ledger's error.
//! * The result file: the child may write `{"records": N, "output": {...}}` to the file
//!   named by `IDEM_RESULT`; records and output reach the ledger (records 0 without it).
//! * `content`: a command whose standard output is hashed (SHA-256, streamed) for the
//!   content-hash guard; a content command that fails fails the run before the work.
//! * The child runs in a process group of its own. A run stopped from outside (a signal to
//!   idem, a lost lease) or past `timeout` sends SIGTERM to the whole group and SIGKILL
//!   after `grace`; the runner waits for that before it records the run. If idem itself is
//!   killed (SIGKILL), the kernel sends the direct child SIGKILL (`PR_SET_PDEATHSIG`) and a
//!   watchdog process stops the rest of the group (`Watchdog` in the source).
//! * The child's standard error streams through to idem's while idem keeps only a bounded
//!   tail; its standard output goes to idem's (to idem's standard error instead when idem's
//!   standard output carries a machine-readable report: [`reserve_stdout`]).

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::error::{BoxError, Error, Result};
use crate::key::Content;
use crate::model::duration::parse_duration_field;
use crate::model::{Outcome, RunRequest};
use crate::processor::Processor;

/// The processor name of command jobs.
pub const COMMAND_PROCESSOR: &str = "command";

/// The default grace period between SIGTERM and SIGKILL.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// How much of the child's standard error is kept for the ledger's error.
const STDERR_TAIL_BYTES: usize = 4096;
/// How many of its last lines the error shows.
const STDERR_TAIL_LINES: usize = 10;
/// The largest result file read.
const RESULT_FILE_MAX: u64 = 1 << 20;

static STDOUT_RESERVED: AtomicBool = AtomicBool::new(false);

/// Sends the children's standard output to idem's standard error from now on: idem's own
/// standard output carries a machine-readable report (`--format json`).
pub fn reserve_stdout() {
    STDOUT_RESERVED.store(true, Ordering::Relaxed);
}

/// The `[command]` table of a job file.
#[derive(Debug, Clone, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CommandConfig {
    /// The program and its arguments.
    #[serde(default)]
    pub run: Vec<String>,
    /// A program whose standard output is the content.
    pub content: Option<Vec<String>>,
    /// The longest a run may take (default: no limit).
    pub timeout: Option<String>,
    /// Between SIGTERM and SIGKILL (default 30s).
    pub grace: Option<String>,
    /// The working folder, relative to the job file's folder (default: that folder).
    pub cwd: Option<PathBuf>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// A validated command job: what runs, where, for how long.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    run: Vec<Arg>,
    content: Option<Vec<Arg>>,
    timeout: Option<Duration>,
    grace: Duration,
    cwd: PathBuf,
    env: BTreeMap<String, String>,
}

impl CommandSpec {
    /// The longest a run may take (`None`: no limit).
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Between SIGTERM and SIGKILL when the program is stopped.
    pub fn grace(&self) -> Duration {
        self.grace
    }
}

/// One argument: literal text and placeholders.
#[derive(Debug, Clone, PartialEq)]
struct Arg(Vec<Piece>);

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Date,
    Scope,
    RunId,
    Trigger,
    Job,
    Param(String),
}

impl Arg {
    fn parse(field: &str, s: &str) -> Result<Arg> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut chars = s.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    text.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    let mut closed = false;
                    for c in chars.by_ref() {
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        name.push(c);
                    }
                    if !closed {
                        return Err(Error::config(format!(
                            "{field}: {s:?} opens a placeholder it does not close (a literal brace is {{{{)"
                        )));
                    }
                    let piece = match name.as_str() {
                        "date" => Piece::Date,
                        "scope" => Piece::Scope,
                        "run_id" => Piece::RunId,
                        "trigger" => Piece::Trigger,
                        "job" => Piece::Job,
                        other => match other.strip_prefix("param.") {
                            Some(p) if !p.is_empty() => Piece::Param(p.to_string()),
                            _ => {
                                return Err(Error::config(format!(
                                    "{field}: unknown placeholder {{{other}}} in {s:?} (known: \
                                     {{date}}, {{scope}}, {{run_id}}, {{trigger}}, {{job}}, \
                                     {{param.NAME}}; a literal brace is {{{{)"
                                )))
                            }
                        },
                    };
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    pieces.push(piece);
                }
                '}' => {
                    return Err(Error::config(format!(
                        "{field}: {s:?} has a '}}' that closes nothing (a literal brace is }}}})"
                    )))
                }
                c => text.push(c),
            }
        }
        if !text.is_empty() || pieces.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Arg(pieces))
    }

    /// The literal text, when the argument has no placeholder.
    fn literal(&self) -> Option<&str> {
        match self.0.as_slice() {
            [Piece::Text(t)] => Some(t),
            _ => None,
        }
    }

    fn params(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|p| match p {
            Piece::Param(name) => Some(name.as_str()),
            _ => None,
        })
    }

    fn render(&self, request: &RunRequest) -> std::result::Result<String, String> {
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Date => out.push_str(&crate::model::time::day_text(request.scope_date)),
                Piece::Scope => out.push_str(&request.scope),
                Piece::RunId => out.push_str(&request.run_id),
                Piece::Trigger => out.push_str(request.trigger.as_str()),
                Piece::Job => out.push_str(&request.processor),
                Piece::Param(name) => match request.params.get(name) {
                    Some(serde_json::Value::String(s)) => out.push_str(s),
                    Some(serde_json::Value::Null) | None => {
                        return Err(format!(
                            "{{param.{name}}}: no parameter {name:?} ([params] or --param)"
                        ))
                    }
                    Some(other) => out.push_str(&other.to_string()),
                },
            }
        }
        Ok(out)
    }
}

impl CommandSpec {
    /// Validates `[command]` of the job file in `job_dir` whose `[params]` are `params`:
    /// a program to run that exists and is executable, known placeholders, durations that
    /// parse, a working folder that exists.
    pub fn new(config: &CommandConfig, job_dir: &Path, params: &toml::Table) -> Result<Self> {
        let parse_argv = |field: &str, argv: &[String]| -> Result<Vec<Arg>> {
            if argv.is_empty() || argv[0].is_empty() {
                return Err(Error::config(format!(
                    "[command] {field} is empty: give the program and its arguments, as a list \
                     ([\"python3\", \"export.py\", \"{{date}}\"])"
                )));
            }
            argv.iter()
                .map(|a| Arg::parse(&format!("[command] {field}"), a))
                .collect()
        };
        let run = parse_argv("run", &config.run)?;
        let content = match &config.content {
            Some(argv) => Some(parse_argv("content", argv)?),
            None => None,
        };
        let timeout = match &config.timeout {
            Some(t) => {
                let d = parse_duration_field("[command] timeout", t)?;
                if d.is_zero() {
                    return Err(Error::config(
                        "[command] timeout = \"0s\": a run needs some time; leave timeout out for no limit",
                    ));
                }
                Some(d)
            }
            None => None,
        };
        let grace = match &config.grace {
            Some(g) => parse_duration_field("[command] grace", g)?,
            None => DEFAULT_GRACE,
        };
        let cwd = match &config.cwd {
            Some(c) if c.is_absolute() => c.clone(),
            Some(c) => job_dir.join(c),
            None => job_dir.to_path_buf(),
        };
        // Absolute: the program's path is resolved against it, and a relative one would be
        // read again from inside the folder the child starts in.
        let cwd = std::path::absolute(&cwd).unwrap_or(cwd);
        if !cwd.is_dir() {
            return Err(Error::config(format!(
                "[command] cwd: {} is not a folder",
                cwd.display()
            )));
        }
        for name in config.env.keys() {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(Error::config(format!(
                    "[command] env: {name:?} is not a variable name"
                )));
            }
        }
        let spec = CommandSpec {
            run,
            content,
            timeout,
            grace,
            cwd,
            env: config.env.clone(),
        };
        for (field, argv) in
            std::iter::once(("run", &spec.run)).chain(spec.content.iter().map(|c| ("content", c)))
        {
            if let Some(program) = argv[0].literal() {
                spec.resolve(program)
                    .map_err(|e| Error::config(format!("[command] {field}: {e}")))?;
            }
            for arg in argv {
                for name in arg.params() {
                    if !params.contains_key(name) {
                        return Err(Error::config(format!(
                            "[command] {field}: {{param.{name}}} names no parameter {name:?} \
                             (set it in [params]; idem exec takes --param {name}=VALUE)"
                        )));
                    }
                }
            }
        }
        Ok(spec)
    }

    /// The path of `program`: as given when it holds a '/' (relative to the working
    /// folder), else the first executable of that name on `PATH`.
    fn resolve(&self, program: &str) -> std::result::Result<PathBuf, String> {
        let executable = |p: &Path| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        };
        if program.contains('/') {
            let path = self.cwd.join(program);
            return match std::fs::metadata(&path) {
                Err(_) => Err(format!("program {program:?} not found (looked at {})", path.display())),
                Ok(_) if !executable(&path) => Err(format!(
                    "program {program:?} is not executable ({}: chmod +x it, or run it through its interpreter)",
                    path.display()
                )),
                Ok(_) => Ok(path),
            };
        }
        let path_var = self
            .env
            .get("PATH")
            .cloned()
            .or_else(|| std::env::var("PATH").ok())
            .unwrap_or_default();
        for dir in std::env::split_paths(&path_var) {
            let candidate = dir.join(program);
            if executable(&candidate) {
                return Ok(candidate);
            }
        }
        Err(format!("program {program:?} not found on PATH"))
    }

    fn argv(&self, argv: &[Arg], request: &RunRequest) -> std::result::Result<Vec<String>, String> {
        argv.iter().map(|a| a.render(request)).collect()
    }

    /// A digest of what runs (arguments, working folder, environment, content command):
    /// part of the content key, so an edited command runs again on unchanged content.
    fn version(&self) -> String {
        let text = format!(
            "{:?}|{:?}|{:?}|{:?}",
            self.run, self.content, self.cwd, self.env
        );
        let digest = Sha256::digest(text.as_bytes());
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }

    /// A `std` command for `argv` with the job's folder, environment and the `IDEM_*`
    /// variables, in a process group of its own that gets SIGKILL if idem dies.
    fn command(
        &self,
        argv: &[String],
        request: &RunRequest,
        result: Option<&Path>,
    ) -> std::result::Result<tokio::process::Command, String> {
        let program = self.resolve(&argv[0])?;
        let mut cmd = std::process::Command::new(program);
        cmd.args(&argv[1..])
            .current_dir(&self.cwd)
            .envs(&self.env)
            .env("IDEM_JOB", &request.processor)
            .env("IDEM_SCOPE", &request.scope)
            .env(
                "IDEM_DATE",
                crate::model::time::day_text(request.scope_date),
            )
            .env("IDEM_RUN_ID", &request.run_id)
            .env("IDEM_TRIGGER", request.trigger.as_str())
            .stdin(std::process::Stdio::null())
            .process_group(0);
        if let Some(result) = result {
            cmd.env("IDEM_RESULT", result);
        }
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: between fork and exec the closure calls only async-signal-safe functions
        // (prctl, getppid, _exit) and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // idem died before the prctl: nothing would kill this child later.
                if libc::getppid() != parent {
                    libc::_exit(137);
                }
                Ok(())
            });
        }
        Ok(tokio::process::Command::from(cmd))
    }
}

/// A command job's processor.
#[derive(Debug)]
pub struct CommandProcessor {
    name: String,
    spec: CommandSpec,
}

impl CommandProcessor {
    /// The processor of the command job `name`.
    pub fn new(name: &str, spec: CommandSpec) -> Self {
        CommandProcessor {
            name: name.to_string(),
            spec,
        }
    }
}

/// A running child's process group: dropped before the child was waited for (the run was
/// stopped from outside), it stops the group in the background (SIGTERM, then SIGKILL
/// after the grace period) and the runner waits for that before recording the run.
struct Group {
    child: Option<tokio::process::Child>,
    pgid: libc::pid_t,
    grace: Duration,
    watchdog: Option<Watchdog>,
}

/// A small `/bin/sh` process, outside the child's group and beside idem, that stops the
/// group (SIGTERM, then SIGKILL after the grace period) if idem dies without saying so: it
/// waits on a pipe only idem holds, and end of file without `done` means idem is gone
/// (SIGKILL, a crash). `PR_SET_PDEATHSIG` reaches the direct child only; this reaches what
/// it started too (a shell script's commands). Without `/bin/sh` there is no watchdog and
/// the direct child's death signal is all.
struct Watchdog {
    process: std::process::Child,
}

impl Watchdog {
    const SCRIPT: &'static str = "trap '' INT TERM HUP
if read -r line && [ \"$line\" = done ]; then exit 0; fi
kill -s TERM -- \"-$1\" 2>/dev/null || exit 0
sleep \"$2\"
kill -s KILL -- \"-$1\" 2>/dev/null
exit 0";

    fn start(pgid: libc::pid_t, grace: Duration) -> Option<Watchdog> {
        if pgid <= 0 {
            return None;
        }
        let secs = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
        let spawned = std::process::Command::new("/bin/sh")
            .args(["-c", Self::SCRIPT, "idem-watchdog"])
            .arg(pgid.to_string())
            .arg(secs.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn();
        match spawned {
            Ok(process) => Some(Watchdog { process }),
            Err(e) => {
                tracing::debug!("no watchdog for the command's process group: {e}");
                None
            }
        }
    }

    /// idem is alive and done with the group: the watchdog exits without a signal.
    fn release(mut self) {
        use std::io::Write as _;
        if let Some(mut stdin) = self.process.stdin.take() {
            let _ = stdin.write_all(b"done\n");
        }
        let _ = self.process.wait();
    }
}

impl Group {
    fn spawn(
        mut cmd: tokio::process::Command,
        grace: Duration,
        stdout: std::process::Stdio,
    ) -> std::io::Result<Group> {
        cmd.stdout(stdout).stderr(std::process::Stdio::piped());
        let child = cmd.spawn()?;
        let pgid = child.id().map_or(0, |id| id as libc::pid_t);
        Ok(Group {
            child: Some(child),
            pgid,
            grace,
            watchdog: Watchdog::start(pgid, grace),
        })
    }

    fn child(&mut self) -> &mut tokio::process::Child {
        self.child
            .as_mut()
            .expect("a group's child until it is stopped")
    }

    /// Stops the whole group: SIGTERM, up to `grace` for it to go, then SIGKILL.
    async fn stop(pgid: libc::pid_t, mut child: tokio::process::Child, grace: Duration) {
        if pgid <= 0 {
            return;
        }
        signal_group(pgid, libc::SIGTERM);
        let deadline = tokio::time::Instant::now() + grace;
        let _ = tokio::time::timeout_at(deadline, child.wait()).await;
        // The child is gone (or out of time); others of its group may not be.
        while group_alive(pgid) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if group_alive(pgid) {
            signal_group(pgid, libc::SIGKILL);
        }
        let _ = child.wait().await;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let watchdog = self.watchdog.take();
        if let Some(child) = self.child.take() {
            let (pgid, grace) = (self.pgid, self.grace);
            crate::backend::send_stop(
                async move {
                    Group::stop(pgid, child, grace).await;
                    if let Some(w) = watchdog {
                        w.release();
                    }
                },
                grace + Duration::from_secs(2),
            );
        } else if let Some(w) = watchdog {
            w.release();
        }
    }
}

fn signal_group(pgid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
    unsafe {
        libc::kill(-pgid, signal);
    }
}

/// Whether any process of the group is still running. Members that are idem's own children
/// and have ended are reaped first: when idem is PID 1 (a container's entrypoint), the
/// program's orphaned children are re-parented to it, and a zombie still counts as a member
/// of its group for `kill(-pgid, 0)`, so without this the group would seem alive until the
/// grace period ran out.
fn group_alive(pgid: libc::pid_t) -> bool {
    loop {
        // SAFETY: waitpid(2) on the group's members that are our children, without
        // blocking; the status pointer may be null.
        let reaped = unsafe { libc::waitpid(-pgid, std::ptr::null_mut(), libc::WNOHANG) };
        if reaped <= 0 {
            break;
        }
    }
    // SAFETY: signal 0 only checks that the group exists.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// What an exit status says, for the ledger.
fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig} ({})", signal_name(sig)),
        _ => "ended without an exit code".to_string(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGKILL => "SIGKILL",
        libc::SIGINT => "SIGINT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGPIPE => "SIGPIPE",
        _ => "signal",
    }
}

/// The last lines of `tail`.
fn last_lines(tail: &[u8]) -> String {
    // A run of control characters (a NUL cannot even be stored in a Postgres text)
    // becomes one U+FFFD.
    let mut text = String::new();
    for c in String::from_utf8_lossy(tail).chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            if !text.ends_with('\u{fffd}') {
                text.push('\u{fffd}');
            }
        } else {
            text.push(c);
        }
    }
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..].join("\n")
}

/// Copies the child's standard error to idem's as it comes, keeping the last
/// [`STDERR_TAIL_BYTES`].
async fn pass_stderr(mut from: tokio::process::ChildStderr) -> Vec<u8> {
    use std::io::Write as _;
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let _ = std::io::stderr().write_all(&buf[..n]);
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 2 * STDERR_TAIL_BYTES {
                    tail.drain(..tail.len() - STDERR_TAIL_BYTES);
                }
            }
        }
    }
    if tail.len() > STDERR_TAIL_BYTES {
        tail.drain(..tail.len() - STDERR_TAIL_BYTES);
    }
    tail
}

fn child_stdout() -> std::process::Stdio {
    if STDOUT_RESERVED.load(Ordering::Relaxed) {
        use std::os::fd::AsFd as _;
        if let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() {
            return std::process::Stdio::from(fd);
        }
    }
    std::process::Stdio::inherit()
}

/// Reads the result file: `{"records": N, "output": {...}}`, both optional.
fn read_result(
    path: &Path,
) -> std::result::Result<Option<(i64, Option<serde_json::Value>)>, String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(file, RESULT_FILE_MAX + 1),
        &mut text,
    )
    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if text.len() as u64 > RESULT_FILE_MAX {
        return Err(format!(
            "the result file is larger than {RESULT_FILE_MAX} bytes"
        ));
    }
    if text.trim().is_empty() {
        return Ok(None);
    }
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("the result file is not JSON: {e}"))?;
    let Some(obj) = v.as_object() else {
        return Err(
            "the result file is not a JSON object ({\"records\": N, \"output\": {...}})".into(),
        );
    };
    if let Some(k) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "records" | "output"))
    {
        return Err(format!(
            "the result file has an unknown field {k:?} (known: records, output)"
        ));
    }
    let records = match obj.get("records") {
        None | Some(serde_json::Value::Null) => 0,
        Some(r) => r.as_i64().filter(|n| *n >= 0).ok_or_else(|| {
            format!("the result file's records is {r}: expected a whole number ≥ 0")
        })?,
    };
    Ok(Some((records, obj.get("output").cloned())))
}

#[async_trait]
impl Processor for CommandProcessor {
    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> String {
        self.spec.version()
    }

    async fn describe(
        &self,
        request: &RunRequest,
    ) -> std::result::Result<Option<Content>, BoxError> {
        let Some(content) = &self.spec.content else {
            return Ok(None);
        };
        let argv = self.spec.argv(content, request)?;
        let mut cmd = self.spec.command(&argv, request, None)?;
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("the content command {:?} did not start: {e}", argv[0]))?;
        let pgid = child.id().map_or(0, |id| id as libc::pid_t);
        let mut group = Group {
            child: None,
            pgid,
            grace: self.spec.grace,
            watchdog: None,
        };
        let mut stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        group.child = Some(child);
        let err_task = tokio::spawn(pass_stderr(stderr));
        let mut hasher = Sha256::new();
        let mut bytes: u64 = 0;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = stdout.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            bytes += n as u64;
        }
        let status = group.child().wait().await?;
        group.child = None;
        let tail = err_task.await.unwrap_or_default();
        if !status.success() {
            return Err(format!(
                "the content command {:?} {}{}",
                argv[0],
                describe_exit(status),
                stderr_suffix(&tail)
            )
            .into());
        }
        let digest: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(Some(Content::new().checksum(digest).field("bytes", bytes)))
    }

    async fn process(&self, request: &RunRequest) -> std::result::Result<Outcome, BoxError> {
        let argv = self.spec.argv(&self.spec.run, request)?;
        let result_path = std::env::temp_dir().join(format!(
            "idem-result-{}-{}.json",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let cmd = self.spec.command(&argv, request, Some(&result_path))?;
        let mut group = Group::spawn(cmd, self.spec.grace, child_stdout())
            .map_err(|e| format!("{:?} did not start: {e}", argv[0]))?;
        let stderr = group.child().stderr.take().expect("piped");
        let err_task = tokio::spawn(pass_stderr(stderr));
        let waited = match self.spec.timeout {
            Some(limit) => match tokio::time::timeout(limit, group.child().wait()).await {
                Ok(status) => status,
                Err(_) => {
                    let child = group.child.take().expect("running");
                    Group::stop(group.pgid, child, group.grace).await;
                    let tail = err_task.await.unwrap_or_default();
                    let _ = std::fs::remove_file(&result_path);
                    return Err(format!(
                        "{:?} ran past [command] timeout = {} and was stopped{}",
                        argv[0],
                        humantime::format_duration(limit),
                        stderr_suffix(&tail)
                    )
                    .into());
                }
            },
            None => group.child().wait().await,
        };
        group.child = None;
        let status = waited?;
        let tail = err_task.await.unwrap_or_default();
        let result = read_result(&result_path);
        let _ = std::fs::remove_file(&result_path);
        if !status.success() {
            return Err(format!(
                "{:?} {}{}",
                argv[0],
                describe_exit(status),
                stderr_suffix(&tail)
            )
            .into());
        }
        match result {
            Ok(Some((records, output))) => {
                let mut outcome = Outcome::records(records);
                if let Some(output) = output {
                    outcome = outcome.with_output(output);
                }
                Ok(outcome)
            }
            Ok(None) => Ok(Outcome::records(0)),
            Err(e) => {
                // The work is done: the run completes (a retry would do it again), and says
                // what was wrong with the result file.
                tracing::warn!("{}: {e}; recorded with 0 records", self.name);
                Ok(Outcome::records(0).with_output(serde_json::json!({ "result_file_error": e })))
            }
        }
    }
}

fn stderr_suffix(tail: &[u8]) -> String {
    let lines = last_lines(tail);
    if lines.is_empty() {
        String::new()
    } else {
        format!("; last lines of its stderr:\n{lines}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(run: &[&str]) -> Result<CommandSpec> {
        CommandSpec::new(
            &CommandConfig {
                run: run.iter().map(|s| s.to_string()).collect(),
                ..CommandConfig::default()
            },
            Path::new("."),
            &"n = 5".parse().unwrap(),
        )
    }

    #[test]
    fn placeholders_are_replaced_per_argument_and_unknown_ones_refused() {
        let s = spec(&[
            "echo",
            "{date}",
            "x{{y}}z",
            "{job}:{scope}:{trigger}",
            "{param.n}",
        ])
        .unwrap();
        let mut r = RunRequest::new("j", chrono::NaiveDate::from_ymd_opt(2026, 1, 2).unwrap());
        r.params = serde_json::json!({"n": 5});
        let argv = s.argv(&s.run, &r).unwrap();
        assert_eq!(
            argv,
            ["echo", "2026-01-02", "x{y}z", "j:2026-01-02:manual", "5"]
        );
        r.params = serde_json::json!({});
        assert!(s
            .argv(&s.run, &r)
            .unwrap_err()
            .contains("no parameter \"n\""));
        for (bad, says) in [
            (vec!["echo", "{dat}"], "unknown placeholder {dat}"),
            (vec!["echo", "{date"], "does not close"),
            (vec!["echo", "a}b"], "closes nothing"),
            (vec!["echo", "{param.m}"], "names no parameter \"m\""),
            (vec![], "[command] run is empty"),
            (vec!["no-such-program-idem"], "not found on PATH"),
            (vec!["./nope.sh"], "not found"),
        ] {
            let e = spec(&bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn result_files_are_read_or_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("idem-result-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("r.json");
        let read = |text: &str| {
            std::fs::write(&f, text).unwrap();
            read_result(&f)
        };
        assert_eq!(
            read(r#"{"records": 3, "output": {"a": 1}}"#).unwrap(),
            Some((3, Some(serde_json::json!({"a": 1}))))
        );
        assert_eq!(read("").unwrap(), None);
        assert!(read(r#"{"records": -1}"#)
            .unwrap_err()
            .contains("records is -1"));
        assert!(read(r#"{"rows": 1}"#)
            .unwrap_err()
            .contains("unknown field \"rows\""));
        assert!(read("nope").unwrap_err().contains("not JSON"));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read_result(&f).unwrap(), None);
    }
}
