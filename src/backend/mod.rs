//! Connection plumbing that stores and warehouses share: which backend a URL names, URLs
//! without their passwords, the dialect-true SQL scanner, and per-backend connection
//! options and errors. A leaf: it knows nothing of stores, warehouses or runs.

#[cfg(feature = "bigquery")]
pub mod bigquery;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
pub mod retry;
pub mod script;
pub mod shared;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use script::{prepare, Dialect, Statement};

/// The backends a URL can name, from its scheme alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `memory://`: in-process, for tests and experiments (stores only).
    Memory,
    /// `sqlite://PATH`.
    Sqlite,
    /// `postgres://…` or `postgresql://…`.
    Postgres,
    /// `bigquery://PROJECT/DATASET`.
    BigQuery,
    /// `redis://HOST[:PORT][/DB]` or `rediss://…` (TLS): event keys only.
    Redis,
}

impl Backend {
    /// The backend `url` names, if this build supports it (nothing is opened).
    pub fn of(url: &str) -> Option<Backend> {
        Backend::named(url).filter(|b| b.built())
    }

    /// The backend `url`'s scheme names, whether or not this build supports it: for a URL
    /// another machine will use (an export's store). The one table from URL schemes to
    /// backends (`tests/it/layout.rs` holds the rest of `src/` to it).
    pub fn named(url: &str) -> Option<Backend> {
        match Backend::scheme(url) {
            "memory" => Some(Backend::Memory),
            "sqlite" => Some(Backend::Sqlite),
            "postgres" | "postgresql" => Some(Backend::Postgres),
            "bigquery" => Some(Backend::BigQuery),
            "redis" | "rediss" => Some(Backend::Redis),
            _ => None,
        }
    }

    /// A URL's scheme as written (`""` when it has no `://`).
    pub fn scheme(url: &str) -> &str {
        url.split_once("://").map_or("", |(scheme, _)| scheme)
    }

    /// Whether this build has the backend (its cargo feature).
    pub fn built(self) -> bool {
        match self {
            Backend::Memory => true,
            Backend::Sqlite => cfg!(feature = "sqlite"),
            Backend::Postgres => cfg!(feature = "postgres"),
            Backend::BigQuery => cfg!(feature = "bigquery"),
            Backend::Redis => cfg!(feature = "redis"),
        }
    }

    /// The path (and `?query`) of a `sqlite://` URL; `None` for any other URL.
    pub fn sqlite_path(url: &str) -> Option<&str> {
        match Backend::named(url) {
            Some(Backend::Sqlite) => url.split_once("://").map(|(_, rest)| rest),
            _ => None,
        }
    }

    /// The SQL dialect of a warehouse on this backend (`None` for memory and Redis).
    pub fn dialect(self) -> Option<Dialect> {
        match self {
            Backend::Memory | Backend::Redis => None,
            Backend::Sqlite => Some(Dialect::Sqlite),
            Backend::Postgres => Some(Dialect::Postgres),
            Backend::BigQuery => Some(Dialect::BigQuery),
        }
    }
}

pub use crate::redact::{is_secret_param, redact_url, RedactedUrl};

/// How many connections a store's pool may hold, when its URL does not say
/// (`?max_connections=N`): per backend, since what a connection costs differs (SQLite has
/// one writer at a time; a Postgres server has a connection limit shared by every client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSize {
    /// Connections of a SQLite pool.
    pub sqlite: u32,
    /// Connections of a Postgres pool.
    pub postgres: u32,
}

impl PoolSize {
    /// One run in a process (`idem run`, `idem exec`, the ledger's readers): one
    /// connection, which the run's heartbeat and its work share.
    pub const ONE_RUN: PoolSize = PoolSize {
        sqlite: 1,
        postgres: 1,
    };
    /// Many runs sharing one store in a process (a scheduler's jobs, a parallel backfill, a
    /// Python program's processors): still SQLite's one writer; a few Postgres connections.
    pub const SHARED: PoolSize = PoolSize {
        sqlite: 1,
        postgres: 4,
    };
    /// An event gate's batches side by side: one reading while another writes on SQLite,
    /// one transaction per connection on Postgres.
    pub const EVENTS: PoolSize = PoolSize {
        sqlite: 2,
        postgres: 4,
    };
}

/// The query parameter of a store URL that sets its pool's size.
pub const MAX_CONNECTIONS_PARAM: &str = "max_connections";

/// `url` without its `max_connections` query parameter (which idem reads and the drivers
/// do not know), and that parameter's value. Other parameters are kept byte for byte.
pub fn take_max_connections(url: &str) -> Result<(String, Option<u32>), String> {
    take_count(url, MAX_CONNECTIONS_PARAM, "connections")
}

/// `url` without the query parameter `name`, and its value: a whole number of `what`, at
/// least 1, or an error that says so.
pub fn take_count(url: &str, name: &str, what: &str) -> Result<(String, Option<u32>), String> {
    let (url, value) = take_param(url, name);
    let Some(raw) = value else {
        return Ok((url, None));
    };
    let n: u32 =
        raw.trim().parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
            format!("{name}={raw:?}: expected a whole number of {what}, at least 1")
        })?;
    Ok((url, Some(n)))
}

/// `url` without the query parameter `name` (idem's own, which the drivers do not know),
/// and its last value, percent-decoded. Other parameters are kept byte for byte.
pub fn take_param(url: &str, name: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), None);
    };
    let mut kept = Vec::new();
    let mut value = None;
    for part in query.split('&') {
        let (key, raw) = part.split_once('=').unwrap_or((part, ""));
        if percent_encoding::percent_decode_str(key).decode_utf8_lossy() != name {
            kept.push(part);
            continue;
        }
        value = Some(
            percent_encoding::percent_decode_str(raw)
                .decode_utf8_lossy()
                .into_owned(),
        );
    }
    let url = match kept.is_empty() {
        true => base.to_string(),
        false => format!("{base}?{}", kept.join("&")),
    };
    (url, value)
}

/// A cancellation or stop being sent in the background (see [`send_cancel`]): done once
/// its task ended (or was dropped with the runtime), and how long it may take at most
/// beyond a waiter's timeout (a command job's process group stopping within its grace
/// period: see [`send_stop`]).
#[derive(Clone)]
struct Stopping {
    done: tokio::sync::watch::Receiver<bool>,
    bound: std::time::Duration,
}

impl Stopping {
    fn finished(&self) -> bool {
        *self.done.borrow() || self.done.has_changed().is_err()
    }
}

type StoppingList = std::sync::Arc<std::sync::Mutex<Vec<Stopping>>>;

/// Every stop sent in this process, for [`cancels_sent`] outside any run (the process's
/// last wait before it exits). This process's own: a forked child's are its own
/// ([`PerProcess`](crate::per_process::PerProcess)).
static PENDING_CANCELS: crate::per_process::PerProcess<std::sync::Mutex<Vec<Stopping>>> =
    crate::per_process::PerProcess::new(Default::default);

tokio::task_local! {
    /// The stops sent on behalf of the run being driven in this task
    /// ([`with_own_cancels`]): what that run's [`cancels_sent`] waits for, and nothing of
    /// another run's.
    static RUN_CANCELS: StoppingList;
}

/// Runs `run` with a list of its own for the stops sent while it runs (including while
/// its futures are dropped): [`cancels_sent`] called within waits for those only, so one
/// run of a scheduler or a parallel backfill never takes (and so never skips waiting for)
/// another's.
pub async fn with_own_cancels<F: std::future::Future>(run: F) -> F::Output {
    RUN_CANCELS.scope(StoppingList::default(), run).await
}

/// Sends, in the background, the cancellation of a statement whose future was dropped
/// (from a `Drop`, which cannot wait); [`cancels_sent`] waits for it.
#[cfg_attr(not(any(feature = "postgres", feature = "bigquery")), allow(dead_code))]
pub(crate) fn send_cancel(cancel: impl std::future::Future<Output = ()> + Send + 'static) {
    send_stop(cancel, std::time::Duration::ZERO);
}

/// Like [`send_cancel`], for work that may take up to `bound` ([`cancels_sent`] waits that
/// long for it whatever its own timeout): a command job's process group being stopped
/// (SIGTERM, its grace period, SIGKILL).
pub(crate) fn send_stop(
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    bound: std::time::Duration,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("no runtime to stop dropped work on");
        return;
    };
    let (tx, done) = tokio::sync::watch::channel(false);
    runtime.spawn(async move {
        stop.await;
        let _ = tx.send(true);
    });
    let stopping = Stopping { done, bound };
    let push = |list: &mut Vec<Stopping>| {
        list.retain(|s| !s.finished());
        list.push(stopping.clone());
    };
    let _ = RUN_CANCELS.try_with(|run| push(&mut run.lock().unwrap_or_else(|e| e.into_inner())));
    push(
        &mut PENDING_CANCELS
            .get()
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
    );
}

/// Waits, up to `timeout`, until the cancellations of the warehouse statements dropped so
/// far were sent. When a run is interrupted (a signal, a lost lease, the scheduler's grace
/// period) its processor's future is dropped, but on Postgres the statement would go on
/// running on the server: the warehouse cancels it (`pg_cancel_backend`) from a fresh
/// connection, and the runner waits here, so the process does not exit (and the run is
/// not recorded as interrupted, its lease released) before the cancel was sent.
/// Within [`with_own_cancels`] (a run), it waits for that run's only; outside, for every
/// one of the process. Returns at once when nothing is pending.
pub async fn cancels_sent(timeout: std::time::Duration) {
    let take = |list: &std::sync::Mutex<Vec<Stopping>>| {
        let mut list = list.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|s| !s.finished());
        std::mem::take(&mut *list)
    };
    let pending = RUN_CANCELS
        .try_with(|run| take(run))
        .unwrap_or_else(|_| take(PENDING_CANCELS.get()));
    if pending.is_empty() {
        return;
    }
    let timeout = pending.iter().map(|s| s.bound).fold(timeout, std::cmp::max);
    let all = async {
        for mut s in pending {
            let _ = s.done.wait_for(|done| *done).await;
        }
    };
    if tokio::time::timeout(timeout, all).await.is_err() {
        tracing::warn!(
            "the cancellation of an interrupted warehouse statement was not sent within {timeout:?}; it may still be running"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{
        cancels_sent, redact_url, send_stop, take_max_connections, with_own_cancels, RedactedUrl,
    };

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_waits_for_its_own_stops_and_never_takes_another_runs() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        use std::time::Duration;
        // Run B's stop is pending (it ends only when released); run A, stopped after it,
        // waits: for its own stop only. Before, A took B's too (waiting out B's bound),
        // and B, finding nothing left, went on before its stop ended.
        let (release_b, b_released) = tokio::sync::oneshot::channel::<()>();
        let b_stopped = Arc::new(AtomicBool::new(false));
        let (b_sent, b_registered) = tokio::sync::oneshot::channel::<()>();
        let (go_b, b_go) = tokio::sync::oneshot::channel::<()>();
        let stopped = Arc::clone(&b_stopped);
        let run_b = tokio::spawn(with_own_cancels(async move {
            send_stop(
                async move {
                    let _ = b_released.await;
                    stopped.store(true, Ordering::SeqCst);
                },
                Duration::from_secs(600),
            );
            let _ = b_sent.send(());
            let _ = b_go.await;
            cancels_sent(Duration::from_secs(2)).await;
        }));
        b_registered.await.unwrap();
        let a_stopped = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&a_stopped);
        // A's wait would last B's bound (600 s) if it took B's stop.
        let run_a = with_own_cancels(async move {
            send_stop(
                async move { stopped.store(true, Ordering::SeqCst) },
                Duration::ZERO,
            );
            cancels_sent(Duration::from_secs(2)).await;
        });
        tokio::time::timeout(Duration::from_secs(30), run_a)
            .await
            .expect("run A waited for run B's stop");
        assert!(
            a_stopped.load(Ordering::SeqCst),
            "A's own stop was waited for"
        );
        assert!(!b_stopped.load(Ordering::SeqCst));
        go_b.send(()).unwrap();
        let releaser = tokio::spawn(async move {
            tokio::task::yield_now().await;
            let _ = release_b.send(());
        });
        run_b.await.unwrap();
        assert!(
            b_stopped.load(Ordering::SeqCst),
            "B returned before its own stop ended"
        );
        releaser.await.unwrap();
    }

    #[test]
    fn max_connections_is_read_and_taken_out_of_the_url() {
        assert_eq!(
            take_max_connections("sqlite://idem.db").unwrap(),
            ("sqlite://idem.db".to_string(), None)
        );
        assert_eq!(
            take_max_connections("postgres://u@h/db?max_connections=8").unwrap(),
            ("postgres://u@h/db".to_string(), Some(8))
        );
        assert_eq!(
            take_max_connections(
                "postgres://u@h/db?sslmode=require&max_connections=2&password=a%26b"
            )
            .unwrap(),
            (
                "postgres://u@h/db?sslmode=require&password=a%26b".to_string(),
                Some(2)
            )
        );
        for bad in ["0", "-1", "many", "", "99999999999"] {
            let e =
                take_max_connections(&format!("sqlite://x.db?max_connections={bad}")).unwrap_err();
            assert!(e.contains("max_connections"), "{e}");
        }
    }

    #[test]
    fn redact_url_hides_only_the_password() {
        assert_eq!(
            redact_url("postgres://idem:s3cret@db.example:5432/idem?sslmode=require"),
            "postgres://idem:***@db.example:5432/idem?sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://idem@127.0.0.1/idem"),
            "postgres://idem@127.0.0.1/idem"
        );
        assert_eq!(redact_url("sqlite://state.db"), "sqlite://state.db");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn redacted_urls_never_hold_a_secret() {
        let cases = [
            (
                "postgres://u@h/db?password=s3cret&sslmode=disable",
                "postgres://u@h/db?password=***&sslmode=disable",
            ),
            (
                "postgresql://u@h/db?sslmode=require&sslpassword=s3cret&max_connections=2",
                "postgresql://u@h/db?sslmode=require&sslpassword=***&max_connections=2",
            ),
            // URLs no parser accepts: a port out of range, a bad IPv6 host, a password
            // with an unescaped `@` and `/`.
            (
                "postgres://u:s3cret@h:999999/db",
                "postgres://u:***@h:999999/db",
            ),
            (
                "postgres://u:s3cret@[zz::1]/db",
                "postgres://u:***@[zz::1]/db",
            ),
            ("postgres://u:s3/c@ret@h/db", "postgres://u:***@h/db"),
            ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
            (
                "bigquery://p/d?endpoint=http%3A%2F%2Fu%3As3cret%40h%3A9050&location=US",
                "bigquery://p/d?endpoint=***&location=US",
            ),
            (
                "bigquery://p/d?credentials=s3cret&access_token=s3cret&Api%4Bey=s3cret",
                "bigquery://p/d?credentials=***&access_token=***&Api%4Bey=***",
            ),
        ];
        for (url, shown) in cases {
            let redacted = RedactedUrl::new(url);
            assert_eq!(redacted.to_string(), shown, "{url}");
            assert!(!format!("{redacted:?}").contains("s3cret"), "{url}");
            assert_eq!(redact_url(shown), shown, "redacting twice changes nothing");
        }
    }
}
