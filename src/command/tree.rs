//! The processes a program started, found through `/proc` (Linux), and stopped.
//!
//! idem makes itself a *child subreaper* (`PR_SET_CHILD_SUBREAPER`) before it starts a
//! program: a process of the program's tree whose parent exits (a backgrounded job of a
//! shell that ended, a daemon that forked twice and called `setsid`) is re-parented to
//! idem instead of to init, so the whole tree stays below idem and is found by walking
//! `/proc`: the program's process group, everything below the program, and idem's own
//! orphans of the run (marked, when several runs share one idem, by the run's
//! `IDEM_RUN_ID` in their environment). idem reaps those orphans as they end ([`start_reaper`]),
//! as an init must (and is one as a container's PID 1).
//!
//! idem's own children (the programs it waits for, its watchdogs) are registered
//! ([`own`]) so the reaper never takes their exit status from the code waiting for it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::per_process::PerProcess;

/// A process as `/proc/PID/stat` shows it.
#[derive(Debug, Clone, Copy)]
struct Proc {
    ppid: i32,
    pgrp: i32,
    /// Exited, waiting to be reaped (or being torn down).
    dead: bool,
}

/// Whether `/proc` shows idem's own PID namespace (`/proc/self` is idem's pid). Under
/// `unshare --pid` without a `/proc` of its own it shows another namespace, whose pids are
/// other processes to kill(2) and waitpid(2): then idem reaches the program's process
/// group only, by its id, and reaps through waitid(2).
fn proc_is_ours() -> bool {
    static OURS: PerProcess<bool> = PerProcess::new(|| {
        let ours = std::fs::read_link("/proc/self")
            .is_ok_and(|p| p.as_os_str() == std::process::id().to_string().as_str());
        if !ours {
            tracing::debug!(
                "/proc is another PID namespace's: only the program's process group is stopped"
            );
        }
        ours
    });
    *OURS.get()
}

/// Every process in `/proc`, by pid.
fn processes() -> BTreeMap<i32, Proc> {
    let mut all = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return all;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some(p) = stat(pid) {
            all.insert(pid, p);
        }
    }
    all
}

fn stat(pid: i32) -> Option<Proc> {
    let text = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp …`; comm may hold spaces and parentheses.
    let close = text.iter().rposition(|b| *b == b')')?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(Proc {
        ppid,
        pgrp,
        dead: matches!(state, "Z" | "X" | "x"),
    })
}

/// The `IDEM_RUN_ID` in `pid`'s environment (`/proc/PID/environ`, as it was started).
fn run_id_of(pid: i32) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ.split(|b| *b == 0).find_map(|v| {
        v.strip_prefix(b"IDEM_RUN_ID=")
            .map(|id| String::from_utf8_lossy(id).into_owned())
    })
}

/// Processes runs left running on purpose (`keep_descendants`), those still running (a pid
/// that ended is forgotten before the kernel can give it to another process).
fn kept() -> std::sync::MutexGuard<'static, HashSet<i32>> {
    static KEPT: PerProcess<Mutex<HashSet<i32>>> = PerProcess::new(Default::default);
    let mut kept = KEPT.get().lock().unwrap_or_else(|e| e.into_inner());
    kept.retain(|pid| stat(*pid).is_some_and(|p| !p.dead));
    kept
}

/// The pids idem spawned itself and waits for: the reaper leaves them alone.
fn own() -> &'static Mutex<HashSet<i32>> {
    static OWN: PerProcess<Mutex<HashSet<i32>>> = PerProcess::new(Default::default);
    OWN.get()
}

/// A running program: its process group, its run id, and the signals forwarded to it.
type Active = (i32, String, Arc<Forwarded>);

/// The signals idem forwarded to a program (0: none).
#[derive(Debug, Default)]
pub(super) struct Forwarded {
    /// The first that stops the run (its stop then sends the group no other).
    pub(super) stop: AtomicI32,
    /// The last one.
    pub(super) last: AtomicI32,
}

/// The runs whose programs run now.
fn active() -> &'static Mutex<Vec<Active>> {
    static ACTIVE: PerProcess<Mutex<Vec<Active>>> = PerProcess::new(Default::default);
    ACTIVE.get()
}

/// Spawns with `spawn` while the reaper is held off, and registers the child's pid as
/// idem's own (see [`release`]).
pub(super) fn spawn_own<T>(
    spawn: impl FnOnce() -> std::io::Result<T>,
    pid: impl Fn(&T) -> Option<u32>,
) -> std::io::Result<T> {
    let mut own = own().lock().unwrap_or_else(|e| e.into_inner());
    let spawned = spawn()?;
    if let Some(p) = pid(&spawned) {
        own.insert(p as i32);
    }
    Ok(spawned)
}

/// `pid` was waited for: it is no longer idem's to keep from the reaper.
pub(super) fn release(pid: i32) {
    own().lock().unwrap_or_else(|e| e.into_inner()).remove(&pid);
}

/// Marks the run of process group `pgid` (run id `run_id`) as running, until [`ended`];
/// the stop signal forwarded to it will be in the answer.
pub(super) fn started(pgid: i32, run_id: &str) -> Arc<Forwarded> {
    let signalled = Arc::new(Forwarded::default());
    active().lock().unwrap_or_else(|e| e.into_inner()).push((
        pgid,
        run_id.to_string(),
        Arc::clone(&signalled),
    ));
    signalled
}

/// The run of process group `pgid` is over.
pub(super) fn ended(pgid: i32) {
    active()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(g, _, _)| *g != pgid);
}

/// Sends `signal`, as this process received it, to the process group of every command
/// job's program running now; with `stops`, notes it as the signal their stop begins with
/// (the stop, when the run is then cancelled, sends the group no other). True when a
/// program got it. `idem run` and `idem exec` call it from their signal handlers
/// ([`signals`](super::signals) lists which signals and what each does).
pub fn forward(signal: libc::c_int, stops: bool) -> bool {
    let active = active().lock().unwrap_or_else(|e| e.into_inner());
    for (pgid, _, signalled) in active.iter() {
        kill_group(*pgid, signal);
        signalled.last.store(signal, Ordering::SeqCst);
        if stops {
            let _ = signalled
                .stop
                .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
    !active.is_empty()
}

/// Whether this process made itself a subreaper: a forked child is none (the kernel does
/// not pass it on) until it asks.
static SUBREAPER: PerProcess<OnceLock<bool>> = PerProcess::new(OnceLock::new);

/// Makes idem the reaper of the orphans of the programs it starts (once per process),
/// and starts reaping them. False when the kernel refused (then what leaves the
/// program's tree is re-parented to init and found only by its process group).
pub(super) fn become_subreaper() -> bool {
    let ok = *SUBREAPER.get().get_or_init(|| {
        // SAFETY: prctl with integer arguments; no memory is passed.
        let ok = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } == 0;
        if !ok {
            tracing::debug!(
                "PR_SET_CHILD_SUBREAPER: {}; orphans of the program go to init",
                std::io::Error::last_os_error()
            );
        }
        ok
    });
    start_reaper();
    ok
}

/// Whether idem is the subreaper of its programs' trees.
fn subreaper() -> bool {
    SUBREAPER.get().get().copied().unwrap_or(false)
}

/// Starts (once per runtime: the task ends with it) the task that reaps idem's children
/// that are not its own ([`spawn_own`]) as they end: the program's orphans, and as PID 1
/// any process of the container whose parent died.
pub(super) fn start_reaper() {
    /// Per process: a forked child has its own runtime, and its own reaper to start.
    static RUNNING: PerProcess<AtomicBool> = PerProcess::new(|| AtomicBool::new(false));
    /// Clears [`RUNNING`] when the task is dropped with its runtime.
    struct Running;
    impl Drop for Running {
        fn drop(&mut self) {
            RUNNING.get().store(false, Ordering::SeqCst);
        }
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if RUNNING.get().swap(true, Ordering::SeqCst) {
        return;
    }
    handle.spawn(async {
        let _running = Running;
        use tokio::signal::unix::{signal, SignalKind};
        let mut chld = signal(SignalKind::child()).ok();
        loop {
            reap();
            // A SIGCHLD, or a second at most (the signals of children that end together
            // merge into one).
            match &mut chld {
                Some(chld) => {
                    let _ = tokio::time::timeout(Duration::from_secs(1), chld.recv()).await;
                }
                None => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    });
}

/// Reaps every child of idem that has ended and is not idem's own.
pub(super) fn reap() {
    let own = own().lock().unwrap_or_else(|e| e.into_inner());
    if !proc_is_ours() {
        // The kernel names the next child that ended, without reaping it; one of idem's
        // own hides the others until it is waited for.
        loop {
            // SAFETY: waitid(2) fills the siginfo given; WNOWAIT leaves the child as it is.
            let pid = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                if libc::waitid(
                    libc::P_ALL,
                    0,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                ) != 0
                {
                    return;
                }
                info.si_pid()
            };
            if pid <= 0 || own.contains(&pid) {
                return;
            }
            // SAFETY: as below.
            unsafe {
                libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
            }
        }
    }
    for pid in children_of_self() {
        if own.contains(&pid) {
            continue;
        }
        // SAFETY: waitpid(2) on one child, without blocking; the status pointer may be null.
        unsafe {
            libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
        }
    }
}

/// idem's children: `/proc/self/task/*/children`, else a scan of `/proc`.
fn children_of_self() -> Vec<i32> {
    let mut children = Vec::new();
    let mut read_any = false;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                read_any = true;
                children.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                );
            }
        }
    }
    if read_any {
        return children;
    }
    let me = std::process::id() as i32;
    processes()
        .into_iter()
        .filter(|(_, p)| p.ppid == me)
        .map(|(pid, _)| pid)
        .collect()
}

/// A program's tree: what to look for in `/proc`.
#[derive(Debug, Clone)]
pub(super) struct Tree {
    /// The program (its process group has the same id).
    pub(super) leader: i32,
    /// The run's id (`IDEM_RUN_ID` in the program's environment).
    pub(super) run_id: String,
    /// Only the program's process group, not what left it (`keep_descendants`).
    pub(super) group_only: bool,
}

impl Tree {
    /// The processes of the tree that still run: the program, its process group and what
    /// is below them, and idem's orphans of this run with what is below them; never idem's
    /// own children (its watchdogs) nor processes a run left running on purpose
    /// ([`keep`]). With `group_only`, the program's process group alone.
    pub(super) fn members(&self) -> Vec<(i32, i32)> {
        if !proc_is_ours() {
            // The group, by its id: "running" while a process of it is.
            // SAFETY: signal 0 only checks that the group exists.
            let alive = self.leader > 0 && unsafe { libc::kill(-self.leader, 0) } == 0;
            return if alive {
                vec![(self.leader, self.leader)]
            } else {
                Vec::new()
            };
        }
        if !self.group_only && self.nothing_left() {
            return Vec::new();
        }
        let all = processes();
        let me = std::process::id() as i32;
        let mut excluded: HashSet<i32> = own()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .filter(|p| *p != self.leader)
            .collect();
        excluded.extend(kept().iter());
        excluded.insert(me);
        let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        for (pid, p) in &all {
            children.entry(p.ppid).or_default().push(*pid);
        }
        let below = |roots: Vec<i32>| {
            let mut seen = BTreeSet::new();
            let mut todo = roots;
            while let Some(pid) = todo.pop() {
                if !excluded.contains(&pid) && seen.insert(pid) {
                    todo.extend(children.get(&pid).into_iter().flatten());
                }
            }
            seen
        };
        // Everything below idem: with idem the subreaper, the whole tree is there.
        let descendants = below(children.get(&me).cloned().unwrap_or_default());
        let in_group = |pid: &i32| all.get(pid).is_some_and(|p| p.pgrp == self.leader);
        let tree: BTreeSet<i32> = if self.group_only {
            all.keys().copied().filter(in_group).collect()
        } else {
            let alone = active().lock().map(|a| a.len() <= 1).unwrap_or(false);
            let mut roots: Vec<i32> = descendants.iter().copied().filter(in_group).collect();
            if descendants.contains(&self.leader) {
                roots.push(self.leader);
            }
            for pid in children.get(&me).into_iter().flatten() {
                if *pid != self.leader
                    && descendants.contains(pid)
                    && match run_id_of(*pid) {
                        Some(id) => id == self.run_id,
                        None => alone,
                    }
                {
                    roots.push(*pid);
                }
            }
            if !subreaper() {
                // What left the tree went to init: its process group is all there is.
                roots.extend(all.keys().copied().filter(in_group));
            }
            below(roots)
        };
        tree.into_iter()
            .filter(|pid| !excluded.contains(pid))
            .filter_map(|pid| all.get(&pid).filter(|p| !p.dead).map(|p| (pid, p.pgrp)))
            .collect()
    }

    /// Whether the tree is surely empty, without reading all of `/proc`: its process group
    /// is gone and idem has no child but its own (with idem the subreaper, what the program
    /// left is either in its group or below a child of idem). The usual end of a run.
    fn nothing_left(&self) -> bool {
        if !subreaper() {
            return false;
        }
        // SAFETY: signal 0 only checks that the group exists.
        if self.leader > 0 && unsafe { libc::kill(-self.leader, 0) } == 0 {
            return false;
        }
        let own = own().lock().unwrap_or_else(|e| e.into_inner());
        let kept = kept();
        children_of_self()
            .iter()
            .all(|pid| own.contains(pid) || kept.contains(pid))
    }

    /// Leaves the tree's processes running on purpose (`keep_descendants`): no later run
    /// stops them.
    pub(super) fn keep(&self) {
        let members = self.members();
        kept().extend(members.into_iter().map(|(pid, _)| pid));
    }

    /// Stops the tree: `signal` to the program's process group (unless `group_signalled`:
    /// it has it already) and to every other member; once the program is gone, SIGTERM to
    /// what is left (a shell's background jobs ignore SIGINT and SIGQUIT); SIGKILL to
    /// those still running at `deadline`. Returns once none runs, or (a process that
    /// cannot die, stuck in the kernel) a second after the SIGKILL, with the pids left.
    pub(super) async fn stop(
        &self,
        signal: libc::c_int,
        group_signalled: bool,
        deadline: Instant,
    ) -> Vec<i32> {
        let first = self.members();
        if first.is_empty() {
            return Vec::new();
        }
        // Who got `signal`, and who SIGTERM; the group's members get it once, through
        // the group.
        let mut signalled: HashSet<i32> = HashSet::new();
        let mut termed: HashSet<i32> = HashSet::new();
        // Whether the program's group has `signal`: a process of the group that starts
        // after it, while the program runs, is the program's own doing as it stops (a
        // trap's cleanup) and is not signalled again; SIGKILL at `deadline` bounds it.
        let mut group_has_it = group_signalled;
        if first.iter().any(|(_, pgrp)| *pgrp == self.leader) {
            if !group_signalled {
                kill_group(self.leader, signal);
            }
            group_has_it = true;
            signalled.extend(
                first
                    .iter()
                    .filter(|(_, pgrp)| *pgrp == self.leader)
                    .map(|(pid, _)| *pid),
            );
        }
        if signal == libc::SIGTERM {
            termed.clone_from(&signalled);
        }
        loop {
            reap();
            let members = self.members();
            if members.is_empty() {
                return Vec::new();
            }
            let leader_gone = !members.iter().any(|(pid, _)| *pid == self.leader);
            for (pid, pgrp) in &members {
                let the_programs_own = group_has_it && *pgrp == self.leader && !leader_gone;
                if signalled.insert(*pid) && !the_programs_own {
                    kill(*pid, signal);
                    if signal == libc::SIGTERM {
                        termed.insert(*pid);
                    }
                }
                if leader_gone && termed.insert(*pid) {
                    kill(*pid, libc::SIGTERM);
                }
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let give_up = Instant::now() + Duration::from_secs(1);
        loop {
            let members = self.members();
            if members.iter().any(|(_, pgrp)| *pgrp == self.leader) {
                kill_group(self.leader, libc::SIGKILL);
            }
            for (pid, _) in &members {
                kill(*pid, libc::SIGKILL);
            }
            reap();
            if members.is_empty() || Instant::now() >= give_up {
                return members.into_iter().map(|(pid, _)| pid).collect();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Signals process group `pgid`.
pub(super) fn kill_group(pgid: i32, signal: libc::c_int) {
    if pgid > 0 {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

fn kill(pid: i32, signal: libc::c_int) {
    if pid > 0 {
        // SAFETY: kill(2) on one process; no memory is touched.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}
