//! The signals idem passes on to the program, and their names.

use crate::per_process::PerProcess;

/// The signals that stop a run: idem forwards each to the program's process group as it
/// came, gives the program `grace` to end, then SIGKILL, and records the run interrupted.
pub const STOPPING: [libc::c_int; 4] = [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM];

/// Every signal idem handles while it runs a job: each whose default action would end
/// idem (so none can end it unrecorded), but those the kernel sends a process about its
/// own faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS), SIGKILL, which
/// no process can handle, and SIGPIPE, which idem ignores (see docs/command-jobs.md). A
/// signal of [`STOPPING`] stops the run; any other is only forwarded to the program, which
/// decides: a run whose program dies of it is recorded interrupted, one whose program
/// handles it goes on. With no program running (a SQL job, or before the program starts)
/// every one of them stops the run.
pub fn handled() -> Vec<libc::c_int> {
    let mut all = vec![
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGTERM,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGVTALRM,
        libc::SIGPROF,
        libc::SIGIO,
        libc::SIGPWR,
        libc::SIGXCPU,
        libc::SIGXFSZ,
        libc::SIGSTKFLT,
    ];
    all.extend(libc::SIGRTMIN()..=libc::SIGRTMAX());
    all
}

/// `SIGHUP`, `SIGRTMIN+3`, …: the name of signal `sig`.
pub fn name(sig: libc::c_int) -> &'static str {
    static NAMES: PerProcess<Vec<&'static str>> = PerProcess::new(|| {
        (0..=libc::SIGRTMAX())
            .map(|n| -> &'static str {
                match n {
                    libc::SIGHUP => "SIGHUP",
                    libc::SIGINT => "SIGINT",
                    libc::SIGQUIT => "SIGQUIT",
                    libc::SIGILL => "SIGILL",
                    libc::SIGTRAP => "SIGTRAP",
                    libc::SIGABRT => "SIGABRT",
                    libc::SIGBUS => "SIGBUS",
                    libc::SIGFPE => "SIGFPE",
                    libc::SIGKILL => "SIGKILL",
                    libc::SIGUSR1 => "SIGUSR1",
                    libc::SIGSEGV => "SIGSEGV",
                    libc::SIGUSR2 => "SIGUSR2",
                    libc::SIGPIPE => "SIGPIPE",
                    libc::SIGALRM => "SIGALRM",
                    libc::SIGTERM => "SIGTERM",
                    libc::SIGSTKFLT => "SIGSTKFLT",
                    libc::SIGCHLD => "SIGCHLD",
                    libc::SIGCONT => "SIGCONT",
                    libc::SIGSTOP => "SIGSTOP",
                    libc::SIGTSTP => "SIGTSTP",
                    libc::SIGTTIN => "SIGTTIN",
                    libc::SIGTTOU => "SIGTTOU",
                    libc::SIGURG => "SIGURG",
                    libc::SIGXCPU => "SIGXCPU",
                    libc::SIGXFSZ => "SIGXFSZ",
                    libc::SIGVTALRM => "SIGVTALRM",
                    libc::SIGPROF => "SIGPROF",
                    libc::SIGWINCH => "SIGWINCH",
                    libc::SIGIO => "SIGIO",
                    libc::SIGPWR => "SIGPWR",
                    libc::SIGSYS => "SIGSYS",
                    n if n == libc::SIGRTMIN() => "SIGRTMIN",
                    n if n > libc::SIGRTMIN() => {
                        Box::leak(format!("SIGRTMIN+{}", n - libc::SIGRTMIN()).into_boxed_str())
                    }
                    _ => "signal",
                }
            })
            .collect()
    });
    let names = NAMES.get();
    usize::try_from(sig)
        .ok()
        .and_then(|i| names.get(i))
        .copied()
        .unwrap_or("signal")
}

/// The number of the signal named `name` (as [`name`] spells it).
pub fn number(name: &str) -> Option<libc::c_int> {
    (1..=libc::SIGRTMAX()).find(|n| self::name(*n) == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_agree() {
        for sig in handled() {
            assert_eq!(number(name(sig)), Some(sig), "{}", name(sig));
        }
        assert_eq!(name(libc::SIGHUP), "SIGHUP");
        assert_eq!(number("SIGTERM"), Some(15));
        assert_eq!(name(libc::SIGRTMIN() + 2), "SIGRTMIN+2");
        assert_eq!(number("interrupted"), None);
    }
}
