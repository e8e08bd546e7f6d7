//! [`PerProcess`]: a process-wide value of which a child made by `fork()` gets its own.
//!
//! A child made by `fork()` has one thread, and memory as it was at that instant: a lock
//! another thread of the parent held then is held forever in the child, whose first use
//! of it waits forever. The Python package forks under gunicorn, Celery prefork and
//! `multiprocessing` while other threads are inside the library (with the GIL released),
//! and a process-wide `static Mutex` of the library (the SQLite statement texts kept, the
//! pools closing, the stops sent) hung a forked child so. So the library keeps no lock,
//! and no value a process fills once, in a plain `static`: each is a [`PerProcess`], and
//! a layout test (`tests/it/layout.rs`) refuses a `static` of a lock type anywhere else in
//! `src/`.
//!
//! What a child gets is a value made fresh, as a new process would have it: what the
//! parent's value held (the parent's pools, its children's process ids, its statement
//! texts) is the parent's. The parent's value is left alone in the child, never dropped,
//! since its destructor would act on the parent's behalf.

use std::sync::atomic::{AtomicPtr, Ordering};

/// A value made at first use in each process: in a child made by `fork()`, at its first
/// use there. Lock-free: finding the value is an atomic load and a `getpid`.
///
/// ```
/// use std::sync::Mutex;
/// use idem::per_process::PerProcess;
///
/// static SEEN: PerProcess<Mutex<Vec<u32>>> = PerProcess::new(|| Mutex::new(Vec::new()));
/// SEEN.get().lock().unwrap().push(7);
/// assert_eq!(*SEEN.get().lock().unwrap(), [7]);
/// ```
pub struct PerProcess<T: 'static> {
    /// The process that made it (its id), and the value; null before the first use.
    current: AtomicPtr<(u32, T)>,
    make: fn() -> T,
}

impl<T: 'static> PerProcess<T> {
    /// A value made by `make` at first use in each process.
    pub const fn new(make: fn() -> T) -> Self {
        PerProcess {
            current: AtomicPtr::new(std::ptr::null_mut()),
            make,
        }
    }

    /// This process's value, made now if this process has none yet. Two threads making it
    /// at once each call `make`; one value is kept and the other dropped.
    pub fn get(&'static self) -> &'static T {
        let pid = std::process::id();
        let current = self.current.load(Ordering::Acquire);
        // SAFETY: a non-null pointer here was published by `publish` and is never freed.
        if let Some((made_in, value)) = unsafe { current.as_ref() } {
            if *made_in == pid {
                return value;
            }
        }
        // The value this replaces (the parent's, in a forked child) is left as it is: it
        // is the parent's. What `publish` hands back is this process's: only its threads
        // write its memory.
        let now = publish(&self.current, current, (pid, (self.make)()));
        // SAFETY: published, never freed.
        unsafe { &(*now).1 }
    }
}

/// Publishes `value` in `slot` if `slot` still holds `expected`, lock-free (a thread doing
/// it at the instant of a `fork` leaves nothing held in the child): the pointer `slot` holds
/// then, to `value` or, when another thread published first, to that thread's (and `value`
/// is dropped). What is published is never freed here: its owner frees it, if ever.
pub(crate) fn publish<T>(slot: &AtomicPtr<T>, expected: *mut T, value: T) -> *mut T {
    let mine = Box::into_raw(Box::new(value));
    match slot.compare_exchange(expected, mine, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => mine,
        Err(theirs) => {
            // SAFETY: `mine` was never published; this thread owns it.
            drop(unsafe { Box::from_raw(mine) });
            theirs
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    static HELD: PerProcess<Mutex<Vec<&'static str>>> = PerProcess::new(|| Mutex::new(Vec::new()));

    /// What a forked child's `f` returned (its exit status), or `None` if it had not
    /// ended within `deadline` (it is killed then).
    fn in_child(f: impl FnOnce() -> i32, deadline: Duration) -> Option<i32> {
        // SAFETY: the child only runs `f` (a lock, a push, a comparison) and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = f();
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        let started = Instant::now();
        let mut status = 0;
        loop {
            // SAFETY: waits for the child made above, without blocking.
            let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if done == pid {
                return Some(libc::WEXITSTATUS(status));
            }
            if started.elapsed() > deadline {
                // SAFETY: the child made above.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The lock held by another thread at the instant of the fork: the child's own is
    /// free and fresh (a plain `static Mutex` would be held forever there).
    #[test]
    fn a_child_forked_while_another_thread_holds_the_lock_gets_its_own() {
        HELD.get().lock().unwrap().push("parent");
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let guard = HELD.get().lock().unwrap();
            held_tx.send(()).unwrap();
            let _ = release_rx.recv();
            drop(guard);
        });
        held_rx.recv().unwrap();
        let child = in_child(
            || {
                let mut seen = HELD.get().lock().unwrap();
                let fresh = seen.is_empty();
                seen.push("child");
                if fresh {
                    0
                } else {
                    1
                }
            },
            Duration::from_secs(60),
        );
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!(
            child,
            Some(0),
            "the child hung (None) or saw the parent's value (1)"
        );
        assert_eq!(
            *HELD.get().lock().unwrap(),
            ["parent"],
            "the parent's value is its own"
        );
    }
}
