//! A running program: its process group and tree, its watchdog, its standard error, its
//! result folder, and how it is stopped.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::tree::{self, Tree};

/// How much of the child's standard error is kept for the ledger's error.
const STDERR_TAIL_BYTES: usize = 4096;

/// How long idem waits for a program to go after SIGKILL before it gives up on it (a
/// process stuck in the kernel).
const AFTER_KILL: Duration = Duration::from_secs(1);

/// How the program ended.
#[derive(Debug)]
pub(super) enum End {
    /// It exited (or died of a signal) on its own.
    Exited(std::process::ExitStatus),
    /// It ran past its deadline and was stopped.
    TimedOut,
}

/// What [`Group::wait`] saw.
#[derive(Debug)]
pub(super) struct Ended {
    pub(super) end: End,
    /// The last bytes of its standard error.
    pub(super) stderr_tail: Vec<u8>,
    /// The last signal idem forwarded to it (0: none), for the error.
    pub(super) forwarded: libc::c_int,
    /// Its folder, to read the result file from (removed when dropped).
    pub(super) folder: Option<RunFolder>,
}

/// What a program is started with, besides its command.
pub(super) struct Options {
    /// Between the stop signal and SIGKILL.
    pub(super) grace: Duration,
    /// When it is stopped (`timeout`), if ever.
    pub(super) deadline: Option<Instant>,
    /// Leave what it started running when it exits (and stop only its process group).
    pub(super) keep_descendants: bool,
    /// Its run's id (`IDEM_RUN_ID`).
    pub(super) run_id: String,
    /// Its private folder (the result file), removed once it is stopped.
    pub(super) folder: Option<RunFolder>,
    /// It has the terminal ([`Terminal`]), to be taken back when it ends.
    pub(super) terminal: bool,
}

/// A program idem started, in a process group of its own, and everything it started: a
/// `Group` dropped before it was waited for (the run was stopped from outside: a signal,
/// a lost lease) stops the whole tree in the background (the stop signal, then SIGKILL
/// after the grace period) and the runner waits for that before recording the run.
pub(super) struct Group {
    child: Option<tokio::process::Child>,
    tree: Tree,
    options: Options,
    watchdog: Option<Watchdog>,
    signalled: Arc<tree::Forwarded>,
    stderr: Option<tokio::task::JoinHandle<Vec<u8>>>,
    stop_reading: CancellationToken,
}

impl Group {
    /// Starts `cmd` (its standard output as given; its standard error through idem's,
    /// keeping a tail) in a process group of its own, under a watchdog.
    pub(super) fn spawn(
        mut cmd: tokio::process::Command,
        stdout: std::process::Stdio,
        options: Options,
    ) -> std::io::Result<Group> {
        tree::become_subreaper();
        cmd.stdout(stdout).stderr(std::process::Stdio::piped());
        // The watchdog first: idem killed at any point after the program starts leaves a
        // watchdog to stop it (started after, a SIGKILL between the two left the program's
        // children running).
        let mut watchdog = Watchdog::start(
            options.grace,
            &options.run_id,
            options.folder.as_ref().map(|f| f.path.as_path()),
        );
        let mut child = match tree::spawn_own(|| cmd.spawn(), |c| c.id()) {
            Ok(child) => child,
            Err(e) => {
                if let Some(w) = watchdog.take() {
                    w.release();
                }
                return Err(e);
            }
        };
        let leader = child.id().map_or(0, |id| id as i32);
        watchdog = watchdog.and_then(|w| w.watch(leader));
        let stop_reading = CancellationToken::new();
        let stderr = child
            .stderr
            .take()
            .map(|e| tokio::spawn(pass_stderr(e, stop_reading.clone())));
        let signalled = tree::started(leader, &options.run_id);
        Ok(Group {
            child: Some(child),
            tree: Tree {
                leader,
                run_id: options.run_id.clone(),
                group_only: options.keep_descendants,
            },
            options,
            watchdog,
            signalled,
            stderr,
            stop_reading,
        })
    }

    /// The program's standard output, when it was piped.
    pub(super) fn stdout(&mut self) -> Option<tokio::process::ChildStdout> {
        self.child.as_mut().and_then(|c| c.stdout.take())
    }

    /// Waits until the program ends or its deadline passes (then stops it), stops what it
    /// left running, and stops reading its standard error: `deadline + grace` bounds all
    /// of it, whatever holds the pipe.
    pub(super) async fn wait(mut self) -> std::io::Result<Ended> {
        let grace = self.options.grace;
        let deadline = self.options.deadline;
        // The child stays in `self` until the end: a wait dropped half way (the run was
        // stopped from outside) leaves its stop to `Drop`.
        let child = self
            .child
            .as_mut()
            .expect("a group's child until it is waited for");
        let waited = match deadline {
            Some(deadline) => tokio::select! {
                status = child.wait() => Some(status),
                _ = tokio::time::sleep_until(deadline) => None,
            },
            None => Some(child.wait().await),
        };
        let end = match waited {
            Some(status) => {
                let status = status?;
                if self.options.keep_descendants {
                    self.tree.keep();
                } else {
                    let mut by = Instant::now() + grace;
                    if let Some(deadline) = deadline {
                        by = by.min(deadline + grace);
                    }
                    warn_left(&self.tree.stop(libc::SIGTERM, false, by).await);
                }
                End::Exited(status)
            }
            None => {
                let by = Instant::now() + grace;
                warn_left(&self.tree.stop(libc::SIGTERM, false, by).await);
                if let Some(child) = self.child.as_mut() {
                    let _ = tokio::time::timeout(AFTER_KILL, child.wait()).await;
                }
                End::TimedOut
            }
        };
        self.child = None;
        tree::release(self.tree.leader);
        let stderr_tail = self.finish().await;
        Ok(Ended {
            end,
            stderr_tail,
            forwarded: self.signalled.last.load(Ordering::SeqCst),
            folder: self.options.folder.take(),
        })
    }

    /// Once the tree is stopped: no more reading (what the pipe holds is read first), the
    /// watchdog let go.
    async fn finish(&mut self) -> Vec<u8> {
        tree::ended(self.tree.leader);
        if std::mem::take(&mut self.options.terminal) {
            Terminal::take_back();
        }
        self.stop_reading.cancel();
        let tail = match self.stderr.take() {
            Some(task) => task.await.unwrap_or_default(),
            None => Vec::new(),
        };
        if let Some(w) = self.watchdog.take() {
            w.release();
        }
        tail
    }
}

fn warn_left(left: &[i32]) {
    if !left.is_empty() {
        tracing::warn!(
            "processes {left:?} of the program did not end after SIGKILL (stuck in the kernel?); idem goes on without them"
        );
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Stopped from outside: the tree goes in the background, and the runner waits.
        let tree = self.tree.clone();
        let grace = self.options.grace;
        let signalled = self.signalled.stop.load(Ordering::SeqCst);
        let mut rest = Group {
            child: None,
            tree: self.tree.clone(),
            options: Options {
                grace,
                deadline: None,
                keep_descendants: self.options.keep_descendants,
                run_id: String::new(),
                folder: self.options.folder.take(),
                terminal: self.options.terminal,
            },
            watchdog: self.watchdog.take(),
            signalled: Arc::clone(&self.signalled),
            stderr: self.stderr.take(),
            stop_reading: self.stop_reading.clone(),
        };
        crate::backend::send_stop(
            async move {
                let (signal, group_signalled) = match signalled {
                    0 => (libc::SIGTERM, false),
                    s => (s, true),
                };
                // The program is waited for as the tree stops: once it ends it is no
                // longer counted (nor, as PID 1, left a zombie of its group).
                let by = Instant::now() + grace;
                let (left, _) = tokio::join!(
                    tree.stop(signal, group_signalled, by),
                    tokio::time::timeout_at(by + AFTER_KILL, child.wait())
                );
                warn_left(&left);
                tree::release(tree.leader);
                rest.finish().await;
                // The result folder goes last, once nothing can write there.
                rest.options.folder.take();
            },
            grace + AFTER_KILL + Duration::from_secs(1),
        );
    }
}

/// A run's private folder (mode 0700, a fresh name under [`RunFolder::parent`]): the
/// result file lives there. Removed when dropped; by the watchdog if idem dies.
#[derive(Debug)]
pub(super) struct RunFolder {
    path: PathBuf,
}

impl RunFolder {
    /// Where run folders go: `TMPDIR` when it is set; else a folder in memory,
    /// `XDG_RUNTIME_DIR` or `/dev/shm`, when there is one to write to; else the temporary
    /// folder. On a disk mounted with `discard` (as many cloud disks are), removing a
    /// folder waits for the device to discard its block: milliseconds on every run.
    fn parent() -> PathBuf {
        if std::env::var_os("TMPDIR").is_some_and(|t| !t.is_empty()) {
            return std::env::temp_dir();
        }
        let writable = |p: &Path| {
            let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
                return false;
            };
            // SAFETY: access(2) reads the NUL-terminated path given.
            p.is_dir() && unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0
        };
        std::env::var_os("XDG_RUNTIME_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .into_iter()
            .chain([PathBuf::from("/dev/shm")])
            .find(|p| writable(p))
            .unwrap_or_else(std::env::temp_dir)
    }

    pub(super) fn create() -> std::io::Result<RunFolder> {
        use std::os::unix::fs::DirBuilderExt as _;
        let path = Self::parent().join(format!("idem-run-{}", uuid::Uuid::new_v4().simple()));
        // `create`, not `create_all`: the name must be new (nothing planted there first).
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(RunFolder { path })
    }

    /// The result file's path.
    pub(super) fn result_file(&self) -> PathBuf {
        self.path.join("result.json")
    }
}

impl Drop for RunFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A small `/bin/sh` process, outside the program's group and beside idem, that stops the
/// program's tree (SIGTERM, then SIGKILL after the grace period) and removes the run's
/// folder if idem dies without saying so: it waits on a pipe only idem holds, and end of
/// file without `done` means idem is gone (SIGKILL, a crash). It is started before the
/// program, and told the program's process group once it runs ([`Watchdog::watch`]); idem
/// gone before that, it stops what holds the run's id. The tree is the program's process
/// group and every process whose environment holds the run's `IDEM_RUN_ID` (GNU or
/// busybox `grep -z` over `/proc/*/environ`), so what left the group goes too.
/// `PR_SET_PDEATHSIG` reaches the direct child only. Without `/bin/sh` there is no
/// watchdog and the direct child's death signal is all.
struct Watchdog {
    process: std::process::Child,
}

impl Watchdog {
    const SCRIPT: &'static str = r#"trap '' HUP INT QUIT TERM USR1 USR2 ALRM PIPE
read -r group || group=
if [ "$group" = done ]; then exit 0; fi
if read -r line && [ "$line" = done ]; then exit 0; fi
marker="IDEM_RUN_ID=$2"
tree() { grep -slzxF -- "$marker" /proc/[0-9]*/environ 2>/dev/null | sed -e 's,^/proc/,,' -e 's,/environ$,,'; }
kill -s TERM -- ${group:+"-$group"} $(tree) 2>/dev/null
sleep "$1"
kill -s KILL -- ${group:+"-$group"} $(tree) 2>/dev/null
if [ -n "$3" ]; then rm -rf -- "$3"; fi
exit 0"#;

    fn start(grace: Duration, run_id: &str, folder: Option<&Path>) -> Option<Watchdog> {
        let secs = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args(["-c", Self::SCRIPT, "idem-watchdog"])
            .arg(secs.to_string())
            .arg(run_id)
            .arg(folder.map(Path::as_os_str).unwrap_or_default())
            .env_remove("IDEM_RUN_ID")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0);
        match tree::spawn_own(|| cmd.spawn(), |c| Some(c.id())) {
            Ok(process) => Some(Watchdog { process }),
            Err(e) => {
                tracing::debug!("no watchdog for the command's process group: {e}");
                None
            }
        }
    }

    /// Tells the watchdog the program's process group `pgid`; `None` (released) when there
    /// is no group to watch or the watchdog cannot be told.
    fn watch(mut self, pgid: i32) -> Option<Watchdog> {
        use std::io::Write as _;
        let told = pgid > 0
            && self
                .process
                .stdin
                .as_mut()
                .is_some_and(|stdin| writeln!(stdin, "{pgid}").is_ok());
        if told {
            Some(self)
        } else {
            self.release();
            None
        }
    }

    /// idem is alive and done with the group: the watchdog exits without a signal. It
    /// reads `done` before the end of its pipe however soon idem exits, so idem does not
    /// wait for it: the reaper ([`tree`]) takes its exit status, or init once idem is gone.
    fn release(mut self) {
        use std::io::Write as _;
        if let Some(mut stdin) = self.process.stdin.take() {
            let _ = stdin.write_all(b"done\n");
        }
        tree::release(self.process.id() as i32);
        tree::reap();
    }
}

/// Copies the child's standard error to idem's as it comes, keeping the last
/// [`STDERR_TAIL_BYTES`].
async fn pass_stderr(from: tokio::process::ChildStderr, stop: CancellationToken) -> Vec<u8> {
    let mut tail: Vec<u8> = Vec::new();
    read_pipe(from, stop, |chunk| {
        use std::io::Write as _;
        let _ = std::io::stderr().write_all(chunk);
        tail.extend_from_slice(chunk);
        if tail.len() > 2 * STDERR_TAIL_BYTES {
            tail.drain(..tail.len() - STDERR_TAIL_BYTES);
        }
    })
    .await;
    if tail.len() > STDERR_TAIL_BYTES {
        tail.drain(..tail.len() - STDERR_TAIL_BYTES);
    }
    tail
}

/// Hands what comes out of the pipe `from` to `chunk`, until end of file or `stop`; after
/// `stop`, what the pipe holds already is read, and no more: a process outside the
/// program's tree may hold the pipe open forever, and idem does not wait for it.
pub(super) async fn read_pipe<R>(mut from: R, stop: CancellationToken, mut chunk: impl FnMut(&[u8]))
where
    R: tokio::io::AsyncRead + std::os::fd::AsRawFd + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => chunk(&buf[..n]),
            },
            _ = stop.cancelled() => break,
        }
    }
    // tokio keeps the pipe non-blocking: a read of an empty pipe that a process outside
    // the tree holds says EAGAIN rather than wait.
    let fd = from.as_raw_fd();
    loop {
        // SAFETY: read(2) into a buffer of the length given, on a descriptor `from` owns.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return;
        }
        chunk(&buf[..n as usize]);
    }
}

/// The command for `program` in a process group of its own, that gets SIGKILL if idem
/// dies before it. With `terminal`, the group becomes the terminal's foreground group
/// ([`Terminal`]).
pub(super) fn own_group(program: &Path, terminal: bool) -> std::process::Command {
    let mut cmd = std::process::Command::new(program);
    cmd.process_group(0);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec the closure calls only async-signal-safe functions
    // (prctl, getppid, _exit, sigemptyset, sigaddset, sigprocmask, tcsetpgrp, getpid) and
    // allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // idem died before the prctl: nothing would kill this child later.
            if libc::getppid() != parent {
                libc::_exit(137);
            }
            if terminal {
                with_sigttou_blocked(|| {
                    libc::tcsetpgrp(0, libc::getpid());
                });
            }
            Ok(())
        });
    }
    cmd
}

/// Runs `f` with SIGTTOU blocked: a process outside the terminal's foreground group may
/// then set it (tcsetpgrp) rather than be stopped.
fn with_sigttou_blocked(f: impl FnOnce()) {
    // SAFETY: the sets are initialised by sigemptyset before use; sigprocmask only reads
    // and writes them.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::sigprocmask(libc::SIG_BLOCK, &block, &mut old);
        f();
        libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

/// The program reads idem's standard input, and that is a terminal of which idem is in
/// the foreground: the program's group (its own, so that its tree can be stopped) is made
/// the terminal's foreground while it runs (else reading would stop it, SIGTTIN; and the
/// terminal's Ctrl-C reaches it directly), and idem takes the terminal back after it.
#[derive(Debug)]
pub(super) struct Terminal;

impl Terminal {
    /// Whether the program should have the terminal (see [`Terminal`]).
    pub(super) fn wanted(stdin_inherited: bool) -> bool {
        // SAFETY: isatty, tcgetpgrp and getpgrp only read the process's state.
        stdin_inherited && unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
    }

    /// Takes the terminal back for idem's process group.
    fn take_back() {
        // SAFETY: tcsetpgrp on idem's standard input, with SIGTTOU blocked as it requires
        // outside the foreground group.
        with_sigttou_blocked(|| unsafe {
            libc::tcsetpgrp(0, libc::getpgrp());
        });
    }
}
