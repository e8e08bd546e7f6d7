//! `processor = "command"`: a program run per scope, behind the guards.
//!
//! ```toml
//! [command]
//! run = ["python3", "scripts/export.py", "--date", "{date}"]   # argv, no shell
//! content = ["sh", "-c", "ls -l /data/orders/\"$IDEM_DATE\"/"]  # optional: its stdout is the content
//! timeout = "2h"                                                # optional
//! grace = "30s"                                                 # optional (default 30s)
//! keep_descendants = false                                      # optional
//! cwd = "."                                                     # optional, relative to the job file
//! env = { EXPORT_BUCKET = "gs://acme-exports" }                # optional
//! ```
//!
//! * Placeholders `{date}`, `{scope}`, `{run_id}`, `{trigger}`, `{job}` and `{param.NAME}`
//!   are replaced inside each argument; every other brace reaches the program as written
//!   (`argv.rs`), and no shell ever reads the arguments. The child also gets `IDEM_JOB`,
//!   `IDEM_SCOPE`, `IDEM_DATE`, `IDEM_RUN_ID`, `IDEM_TRIGGER` and `IDEM_RESULT` in its
//!   environment.
//! * Exit 0 completes the run; any other exit (or a signal) fails it, with the exit code or
//!   signal and the last lines of the child's standard error in the ledger's error, and
//!   the status in [`ExitStatusError`] (the CLI exits with it, as `timeout(1)` does: the
//!   program's code, 128+N for signal N, 124 past `timeout`).
//! * The result file: the child may write `{"records": N, "output": {...}}` to the file
//!   named by `IDEM_RESULT`, in a folder of the run's own (mode 0700) removed however the
//!   run ends; records and output reach the ledger (records 0 without it).
//! * `content`: a command whose standard output is hashed (SHA-256, streamed) for the
//!   content-hash guard; a content command that fails fails the run before the work.
//! * No process the program starts outlives the run. The child runs in a process group of
//!   its own and idem is the subreaper of its tree (`tree.rs`): when the program exits,
//!   what it left running is stopped (SIGTERM, then SIGKILL after `grace`) before the run
//!   is recorded, unless `keep_descendants` (a job that starts a daemon). A run stopped
//!   from outside (a signal to idem, forwarded to the group as sent, a lost lease) or past
//!   `timeout` stops the whole tree the same way; `timeout + grace` bounds the program's
//!   part of the run, whatever holds its pipes. If idem itself is killed (SIGKILL), the
//!   kernel sends the direct child SIGKILL (`PR_SET_PDEATHSIG`) and a watchdog process
//!   stops the rest of the tree and removes the run's folder (`Watchdog` in the source).
//! * The program's standard input is idem's under `idem run` and `idem exec`
//!   ([`inherit_stdin`]), else empty; its standard error streams through to idem's while
//!   idem keeps only a bounded tail; its standard output goes to idem's (to idem's
//!   standard error instead when idem's standard output carries a machine-readable
//!   report: [`reserve_stdout`]).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::error::{BoxError, Error, Result};
use crate::key::Content;
use crate::model::duration::parse_duration_field;
use crate::model::{Outcome, RunRequest};
use crate::processor::{ExitStatusError, Processor};

mod argv;
mod group;
pub mod signals;
mod tree;

pub use argv::ArgText;
use argv::{parse_argv, Arg};
use group::{End, Group, Options, RunFolder};
pub use tree::forward as forward_signal;

/// The processor name of command jobs.
pub const COMMAND_PROCESSOR: &str = "command";

/// The default grace period between SIGTERM and SIGKILL.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// The exit status of a program that ran past its timeout, as `timeout(1)` gives it.
pub const TIMED_OUT: u8 = 124;
/// The exit status when the program was found but could not start.
pub const CANNOT_START: u8 = 126;
/// The exit status when the program was not found.
pub const NOT_FOUND: u8 = 127;

/// How many of its last lines the error shows.
const STDERR_TAIL_LINES: usize = 10;
/// The largest result file read.
const RESULT_FILE_MAX: u64 = 1 << 20;

static STDOUT_RESERVED: AtomicBool = AtomicBool::new(false);
static STDIN_INHERITED: AtomicBool = AtomicBool::new(false);

/// Sends the children's standard output to idem's standard error from now on: idem's own
/// standard output carries a machine-readable report (`--format json`).
pub fn reserve_stdout() {
    STDOUT_RESERVED.store(true, Ordering::Relaxed);
}

/// Gives the programs idem's standard input from now on (`idem run`, `idem exec`: a
/// wrapper passes it through); otherwise they read an empty one. Content commands always
/// read an empty one.
pub fn inherit_stdin() {
    STDIN_INHERITED.store(true, Ordering::Relaxed);
}

/// Reaps, from now on, every child of this process that ends and is not one it waits for
/// itself: what a container's PID 1 must do (`idem` calls it when it is PID 1; call it
/// from the runtime that runs the jobs).
pub fn reap_orphans() {
    tree::start_reaper();
}

/// The `[command]` table of a job file.
#[derive(Debug, Clone, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CommandConfig {
    /// The program and its arguments.
    #[serde(default)]
    pub run: Vec<ArgText>,
    /// A program whose standard output is the content.
    pub content: Option<Vec<ArgText>>,
    /// The longest a run may take (default: no limit).
    pub timeout: Option<String>,
    /// Between SIGTERM and SIGKILL (default 30s).
    pub grace: Option<String>,
    /// Leave the processes the program started running when it exits (a daemon it
    /// starts), rather than stop them; a stop from outside then reaches only its process
    /// group (default false).
    #[serde(default)]
    pub keep_descendants: bool,
    /// The working folder, relative to the job file's folder (default: that folder).
    pub cwd: Option<PathBuf>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The time zone the run's date was read in, recorded in a completed run's output as
    /// `date_zone` (`idem exec` sets it: its dates are local).
    #[serde(skip)]
    pub date_zone: Option<String>,
    /// The programs are looked for when a run starts, not when the job is read
    /// (`idem exec` sets it: a program that is not there is a failed run, exit 127, or 126
    /// when it cannot start, recorded like any other).
    #[serde(skip)]
    pub programs_at_run: bool,
}

/// A validated command job: what runs, where, for how long.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    run: Vec<Arg>,
    content: Option<Vec<Arg>>,
    timeout: Option<Duration>,
    grace: Duration,
    grace_given: bool,
    keep_descendants: bool,
    cwd: PathBuf,
    env: BTreeMap<String, String>,
    date_zone: Option<String>,
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

    /// Validates `[command]` of the job file in `job_dir` whose `[params]` are `params`:
    /// a program to run that exists and is executable, parameters that exist, durations
    /// that parse, a working folder that exists.
    pub fn new(config: &CommandConfig, job_dir: &Path, params: &toml::Table) -> Result<Self> {
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
            grace_given: config.grace.is_some(),
            keep_descendants: config.keep_descendants,
            cwd,
            env: config.env.clone(),
            date_zone: config.date_zone.clone(),
        };
        for (field, argv) in
            std::iter::once(("run", &spec.run)).chain(spec.content.iter().map(|c| ("content", c)))
        {
            if let Some(program) = argv[0].literal().filter(|_| !config.programs_at_run) {
                spec.resolve(OsStr::from_bytes(program))
                    .map_err(|e| Error::config(format!("[command] {field}: {}", e.message)))?;
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

    /// Refuses a grace period the lease cannot cover: if idem dies (SIGKILL), its watchdog
    /// stops the program's tree within `grace`, while the lease, renewed every third of its
    /// length, may have only two thirds of it left; past the lease another run may start
    /// beside the old tree. So `grace` must be at most half the lease (a margin for a slow
    /// renewal). `grace_name` and `lease_name` name the two settings in the message.
    pub fn check_lease(
        &self,
        lease: Option<Duration>,
        grace_name: &str,
        lease_name: &str,
    ) -> Result<()> {
        let Some(lease) = lease else {
            return Ok(());
        };
        if self.grace <= lease / 2 {
            return Ok(());
        }
        let show = |d: Duration| humantime::format_duration(d).to_string();
        Err(Error::config(format!(
            "{grace_name} {}{} is more than half of {lease_name} {}: if idem died, its watchdog \
             gives the program the grace period to stop, and the lease (renewed every third of \
             it) could expire first and let another run start beside it. Give {grace_name} {} \
             or less, or a {lease_name} of at least {}",
            show(self.grace),
            if self.grace_given {
                ""
            } else {
                " (the default)"
            },
            show(lease),
            show(lease / 2),
            show(self.grace * 2),
        )))
    }

    /// The path of `program`: as given when it holds a '/' (relative to the working
    /// folder), else the first executable of that name on `PATH`. Not there: exit status
    /// 127; there but not a program that can start (a folder, a file without `x`): 126.
    fn resolve(&self, program: &OsStr) -> std::result::Result<PathBuf, ExitStatusError> {
        let executable = |p: &Path| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        };
        let cannot_start = |message: String| ExitStatusError {
            status: CANNOT_START,
            message,
        };
        if program.as_bytes().contains(&b'/') {
            let path = self.cwd.join(program);
            return match std::fs::metadata(&path) {
                Err(_) => Err(ExitStatusError {
                    status: NOT_FOUND,
                    message: format!("program {program:?} not found (looked at {})", path.display()),
                }),
                Ok(m) if m.is_dir() => Err(cannot_start(format!(
                    "program {program:?} is a folder ({}), not a program",
                    path.display()
                ))),
                Ok(_) if !executable(&path) => Err(cannot_start(format!(
                    "program {program:?} is not executable ({}: chmod +x it, or run it through its interpreter)",
                    path.display()
                ))),
                Ok(_) => Ok(path),
            };
        }
        let path_var = match self.env.get("PATH") {
            Some(p) => OsString::from(p),
            None => std::env::var_os("PATH").unwrap_or_default(),
        };
        for dir in std::env::split_paths(&path_var) {
            let candidate = dir.join(program);
            if executable(&candidate) {
                return Ok(candidate);
            }
        }
        Err(ExitStatusError {
            status: NOT_FOUND,
            message: format!("program {program:?} not found on PATH"),
        })
    }

    fn argv(
        &self,
        argv: &[Arg],
        request: &RunRequest,
    ) -> std::result::Result<Vec<OsString>, String> {
        argv.iter().map(|a| a.render(request)).collect()
    }

    /// A digest of what runs (arguments, working folder, environment, content command):
    /// part of the content key, so an edited command runs again on unchanged content, and
    /// recorded with a completed run, so a time-window skip can say the command changed.
    fn version(&self) -> String {
        let text = format!(
            "{:?}|{:?}|{:?}|{:?}",
            self.run, self.content, self.cwd, self.env
        );
        let digest = Sha256::digest(text.as_bytes());
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }

    /// A command for `argv` with the job's folder, environment and the `IDEM_*`
    /// variables, in a process group of its own that gets SIGKILL if idem dies. A program
    /// that cannot be found is exit status 127, one that cannot start 126, as a shell says.
    fn command(
        &self,
        argv: &[OsString],
        request: &RunRequest,
        result: Option<&Path>,
        terminal: bool,
    ) -> std::result::Result<tokio::process::Command, ExitStatusError> {
        let program = self.resolve(&argv[0])?;
        let mut cmd = group::own_group(&program, terminal);
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
            .env_remove("IDEM_RESULT")
            .stdin(match result {
                // The program reads idem's standard input under `idem run` and `idem exec`.
                Some(_) if STDIN_INHERITED.load(Ordering::Relaxed) => {
                    std::process::Stdio::inherit()
                }
                _ => std::process::Stdio::null(),
            });
        if let Some(result) = result {
            cmd.env("IDEM_RESULT", result);
        }
        Ok(tokio::process::Command::from(cmd))
    }

    fn options(&self, request: &RunRequest, deadline: Option<Instant>) -> Options {
        Options {
            grace: self.grace,
            deadline,
            keep_descendants: self.keep_descendants,
            run_id: request.run_id.clone(),
            folder: None,
            terminal: false,
        }
    }
}

/// A command job's processor.
#[derive(Debug)]
pub struct CommandProcessor {
    name: String,
    spec: CommandSpec,
    /// Each run's deadline, from the start of its first command (the content command's,
    /// when there is one): `timeout` bounds the content command and the program together.
    deadlines: Mutex<HashMap<String, Instant>>,
}

impl CommandProcessor {
    /// The processor of the command job `name`.
    pub fn new(name: &str, spec: CommandSpec) -> Self {
        CommandProcessor {
            name: name.to_string(),
            spec,
            deadlines: Mutex::new(HashMap::new()),
        }
    }

    /// The deadline of `request`'s run (set now if it has none yet); with `last`, it is
    /// forgotten (the program, the run's last command, starts).
    fn deadline(&self, request: &RunRequest, last: bool) -> Option<Instant> {
        let timeout = self.spec.timeout?;
        let now = Instant::now();
        let mut deadlines = self.deadlines.lock().unwrap_or_else(|e| e.into_inner());
        // Runs that described their content and never ran (a skip, `explain`).
        deadlines.retain(|_, at| *at + self.spec.grace + Duration::from_secs(600) > now);
        Some(if last {
            deadlines.remove(&request.run_id).unwrap_or(now + timeout)
        } else {
            *deadlines
                .entry(request.run_id.clone())
                .or_insert(now + timeout)
        })
    }

    /// A failure of the command `what` (`"sh"`, `the content command "ls"`) as its exit
    /// status and a sentence.
    fn failure(
        &self,
        what: &str,
        ended: &group::Ended,
        status: Option<std::process::ExitStatus>,
    ) -> ExitStatusError {
        use std::os::unix::process::ExitStatusExt as _;
        let tail = stderr_suffix(&ended.stderr_tail);
        let Some(status) = status else {
            let limit = self.spec.timeout.unwrap_or_default();
            return ExitStatusError {
                status: TIMED_OUT,
                message: format!(
                    "{what} ran past [command] timeout = {} and was stopped{tail}",
                    humantime::format_duration(limit)
                ),
            };
        };
        let (code, how) = match (status.code(), status.signal()) {
            (Some(code), _) => (code, format!("exited with code {code}")),
            (None, Some(sig)) => {
                let mut how = format!("was killed by signal {sig} ({})", signals::name(sig));
                if sig == ended.forwarded {
                    how.push_str(&format!(
                        ": interrupted by {}, which idem received and forwarded",
                        signals::name(sig)
                    ));
                }
                (128 + sig, how)
            }
            _ => (1, "ended without an exit code".to_string()),
        };
        ExitStatusError {
            status: u8::try_from(code).ok().filter(|c| *c != 0).unwrap_or(1),
            message: format!("{what} {how}{tail}"),
        }
    }
}

/// The error of a program that did not start: 126, as a shell says for a program that is
/// there but cannot start. It was found before it was started, so "not found" now is its
/// interpreter (a script's `#!` line) or its loader, said so.
fn not_started(what: &str, e: std::io::Error) -> ExitStatusError {
    let hint = if e.kind() == std::io::ErrorKind::NotFound {
        " (the program is there: the interpreter its `#!` line names, or its loader, is not)"
    } else {
        ""
    };
    ExitStatusError {
        status: CANNOT_START,
        message: format!("{what} did not start: {e}{hint}"),
    }
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
        let what = format!("the content command {:?}", argv[0]);
        let cmd = self.spec.command(&argv, request, None, false)?;
        let options = self.spec.options(request, self.deadline(request, false));
        let mut group = Group::spawn(cmd, std::process::Stdio::piped(), options)
            .map_err(|e| not_started(&what, e))?;
        let stdout = group.stdout().expect("piped");
        let mut hasher = Sha256::new();
        let mut bytes: u64 = 0;
        let stop = tokio_util::sync::CancellationToken::new();
        let hashing = group::read_pipe(stdout, stop.clone(), |chunk| {
            hasher.update(chunk);
            bytes += chunk.len() as u64;
        });
        let waiting = async {
            let ended = group.wait().await;
            stop.cancel();
            ended
        };
        let ((), ended) = tokio::join!(hashing, waiting);
        let ended = ended?;
        match ended.end {
            End::Exited(status) if status.success() => {}
            End::Exited(status) => return Err(self.failure(&what, &ended, Some(status)).into()),
            End::TimedOut => return Err(self.failure(&what, &ended, None).into()),
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
        let what = format!("{:?}", argv[0]);
        let folder = RunFolder::create()
            .map_err(|e| format!("cannot make the run's folder for the result file: {e}"))?;
        let terminal = group::Terminal::wanted(STDIN_INHERITED.load(Ordering::Relaxed));
        let cmd = self
            .spec
            .command(&argv, request, Some(&folder.result_file()), terminal)?;
        let mut options = self.spec.options(request, self.deadline(request, true));
        options.folder = Some(folder);
        options.terminal = terminal;
        let group =
            Group::spawn(cmd, child_stdout(), options).map_err(|e| not_started(&what, e))?;
        let ended = group.wait().await?;
        let status = match ended.end {
            End::Exited(status) => status,
            End::TimedOut => return Err(self.failure(&what, &ended, None).into()),
        };
        if !status.success() {
            return Err(self.failure(&what, &ended, Some(status)).into());
        }
        // The folder is removed once it is read (`ended` dropped).
        let result = match &ended.folder {
            Some(folder) => read_result(&folder.result_file()),
            None => Ok(None),
        };
        drop(ended);
        let mut outcome = match result {
            Ok(Some((records, output))) => {
                let mut outcome = Outcome::records(records);
                if let Some(output) = output {
                    outcome = outcome.with_output(output);
                }
                outcome
            }
            Ok(None) => Outcome::records(0),
            Err(e) => {
                // The work is done: the run completes (a retry would do it again), and says
                // what was wrong with the result file.
                tracing::warn!("{}: {e}; recorded with 0 records", self.name);
                Outcome::records(0).with_output(serde_json::json!({ "result_file_error": e }))
            }
        };
        if let Some(zone) = &self.spec.date_zone {
            let output = outcome.output.get_or_insert_with(|| serde_json::json!({}));
            if let Some(fields) = output.as_object_mut() {
                fields
                    .entry("date_zone")
                    .or_insert_with(|| serde_json::Value::String(zone.clone()));
            }
        }
        Ok(outcome)
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
                run: run.iter().map(|s| ArgText::from(*s)).collect(),
                ..CommandConfig::default()
            },
            Path::new("."),
            &"n = 5".parse().unwrap(),
        )
    }

    #[test]
    fn bad_commands_are_refused_naming_the_problem() {
        for (bad, says) in [
            (vec!["echo", "{param.m}"], "names no parameter \"m\""),
            (vec![], "[command] run is empty"),
            (vec!["no-such-program-idem"], "not found on PATH"),
            (vec!["./nope.sh"], "not found"),
        ] {
            let e = spec(&bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        // Braces that are not idem's are the program's.
        spec(&["echo", "{dat}", "a}b", "{date"]).unwrap();
    }

    #[test]
    fn a_grace_period_over_half_the_lease_is_refused_naming_both() {
        let s = spec(&["true"]).unwrap();
        let e = s
            .check_lease(Some(Duration::from_secs(10)), "--grace", "--lease")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--grace 30s (the default) is more than half of --lease 10s")
                && e.contains("--grace 5s or less")
                && e.contains("--lease of at least 1m"),
            "{e}"
        );
        s.check_lease(Some(Duration::from_secs(60)), "g", "l")
            .unwrap();
        s.check_lease(None, "g", "l").unwrap();
    }

    #[test]
    fn the_version_of_an_unchanged_command_is_the_one_it_always_had() {
        // Part of content keys and recorded with runs: the text it digests must not change
        // with the code (the pieces print as they did when arguments were strings).
        let s = spec(&["echo", "{date}", "x"]).unwrap();
        assert_eq!(
            format!("{:?}", s.run),
            "[Arg([Text(\"echo\")]), Arg([Date]), Arg([Text(\"x\")])]"
        );
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
