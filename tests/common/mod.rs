//! Helpers shared by the integration tests.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

/// The URL of a service a test needs, from the environment variable `var`.
///
/// When it is unset the test is skipped: a message says which variable to set, and the
/// skip is appended to the file `IDEM_SKIP_LOG` names (CI counts them). With
/// `IDEM_REQUIRE_SERVICES=1` (set by `.ci/run`) a missing service fails the test instead,
/// so nothing is silently skipped in CI.
#[allow(dead_code)]
pub fn service_url(var: &str, test: &str, how: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            skip(format!("skipped {test}: {var} is not set ({how})"));
            None
        }
    }
}

/// Says why a test is skipped and logs it to `IDEM_SKIP_LOG`; under
/// `IDEM_REQUIRE_SERVICES=1` panics instead (see [`service_url`]).
#[allow(dead_code)]
pub fn skip(message: String) {
    if std::env::var("IDEM_REQUIRE_SERVICES").as_deref() == Ok("1") {
        panic!("{message}, but IDEM_REQUIRE_SERVICES=1 requires it");
    }
    eprintln!("{message}");
    if let Ok(path) = std::env::var("IDEM_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{message}");
        }
    }
}

/// How to get a Postgres URL.
#[allow(dead_code)]
pub const POSTGRES_HOW: &str =
    "set it to postgres://USER@HOST:PORT/DATABASE, a database the tests may fill";

/// How to get a BigQuery emulator URL.
#[allow(dead_code)]
pub const BIGQUERY_HOW: &str = "start the emulator: .ci/bqemulator.sh install && \
     URL=$(.ci/bqemulator.sh start) and set it to bigquery://idem-test/idem_local?endpoint=$URL";

/// The Postgres test database (`IDEM_TEST_POSTGRES_URL`) for `test`, or `None` after
/// saying why it is skipped (see [`service_url`]).
#[allow(dead_code)]
pub fn postgres_url(test: &str) -> Option<String> {
    service_url("IDEM_TEST_POSTGRES_URL", test, POSTGRES_HOW)
}

/// The BigQuery emulator (`IDEM_TEST_BIGQUERY_URL`) for `test`, or `None` after saying
/// why it is skipped (see [`service_url`]).
#[allow(dead_code)]
pub fn bigquery_url(test: &str) -> Option<String> {
    service_url("IDEM_TEST_BIGQUERY_URL", test, BIGQUERY_HOW)
}

/// How to get a Redis URL.
#[allow(dead_code)]
pub const REDIS_HOW: &str =
    "set it to redis://HOST:PORT of a redis >= 7 the tests may write to (under fresh key prefixes)";

/// The Redis test server (`IDEM_TEST_REDIS_URL`) for `test`, or `None` after saying why it
/// is skipped (see [`service_url`]).
#[allow(dead_code)]
pub fn redis_url(test: &str) -> Option<String> {
    service_url("IDEM_TEST_REDIS_URL", test, REDIS_HOW)
}

/// A schema or a database of one test's own on the shared test Postgres, for a test whose
/// statements would reach other tests' rows or connections there (`idem cleanup --keep
/// 0s`, dropping every connection to the database): the integration tests share one
/// process and run beside each other. Dropped with everything in it when this guard is
/// dropped, also when the test panics.
#[cfg(feature = "postgres")]
#[allow(dead_code)]
pub struct PgScratch {
    /// `IDEM_TEST_POSTGRES_URL` narrowed to the schema or the database.
    pub url: String,
    admin: String,
    drop: String,
}

#[cfg(feature = "postgres")]
#[allow(dead_code)]
impl PgScratch {
    /// A new schema `PREFIX_<id>` on the database of `url`; `url` gets it as its search path.
    pub fn schema(url: &str, prefix: &str) -> Self {
        let name = format!("{prefix}_{}", &idem::new_run_id()[..12]).replace('-', "");
        Self::admin(url, &format!("CREATE SCHEMA {name}")).unwrap();
        let sep = if url.contains('?') { '&' } else { '?' };
        PgScratch {
            url: format!("{url}{sep}options[search_path]={name}"),
            admin: url.to_string(),
            drop: format!("DROP SCHEMA IF EXISTS {name} CASCADE"),
        }
    }

    /// A new database `PREFIX_<id>` on the server of `url` (created through `url`'s
    /// database); `url` with its path changed to it.
    pub fn database(url: &str, prefix: &str) -> Self {
        let name = format!("{prefix}_{}", &idem::new_run_id()[..12]).replace('-', "");
        Self::admin(url, &format!("CREATE DATABASE {name}")).unwrap();
        let mut scratch = url::Url::parse(url).expect("IDEM_TEST_POSTGRES_URL is a url");
        scratch.set_path(&format!("/{name}"));
        PgScratch {
            url: scratch.to_string(),
            admin: url.to_string(),
            drop: format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        }
    }

    /// Runs `sql` on a connection of its own to `url`.
    fn admin(url: &str, sql: &str) -> Result<(), String> {
        use sqlx::Connection;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let mut conn = sqlx::PgConnection::connect(url)
                .await
                .map_err(|e| format!("connect to {url}: {e}"))?;
            let done = sqlx::raw_sql(sql).execute(&mut conn).await;
            let _ = conn.close().await;
            done.map(|_| ()).map_err(|e| format!("{sql}: {e}"))
        })
    }
}

#[cfg(feature = "postgres")]
impl Drop for PgScratch {
    fn drop(&mut self) {
        if let Err(e) = Self::admin(&self.admin, &self.drop) {
            eprintln!("could not drop a test's scratch Postgres: {e}");
        }
    }
}

/// A private PostgreSQL server for one test (a small `max_connections`, restarts).
#[allow(dead_code)]
pub mod private_pg;

/// A throwaway TLS Redis server (its own `redis-server`, certificates made with `openssl`).
#[cfg(feature = "redis")]
#[allow(dead_code)]
pub mod redis_tls;

/// Fresh key prefixes on the shared test Redis, and deleting their keys.
#[cfg(feature = "redis")]
#[allow(dead_code)]
pub mod redis {
    /// `url` with a fresh `?prefix=idem-test-<id>:`, and a guard that deletes every key
    /// under that prefix when dropped (also when the test panics).
    pub fn fresh_prefix_url(url: &str) -> (String, PrefixCleanup) {
        let prefix = format!("idem-test-{}:", idem::new_run_id());
        let mut parsed = url::Url::parse(url).expect("IDEM_TEST_REDIS_URL is a url");
        parsed.query_pairs_mut().append_pair("prefix", &prefix);
        let cleanup = PrefixCleanup {
            url: url.to_string(),
            prefix,
        };
        (parsed.to_string(), cleanup)
    }

    /// Deletes the keys under a prefix on drop (`SCAN MATCH prefix*` + `DEL`).
    pub struct PrefixCleanup {
        pub url: String,
        pub prefix: String,
    }

    impl PrefixCleanup {
        /// Deletes the keys now; returns how many.
        pub fn delete_keys(&self) -> redis::RedisResult<usize> {
            let client = redis::Client::open(self.url.as_str())?;
            let mut conn = client.get_connection()?;
            let pattern = format!("{}*", self.prefix);
            let mut cursor: u64 = 0;
            let mut deleted = 0;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query(&mut conn)?;
                if !keys.is_empty() {
                    deleted += redis::cmd("DEL").arg(&keys).query::<usize>(&mut conn)?;
                }
                if next == 0 {
                    return Ok(deleted);
                }
                cursor = next;
            }
        }
    }

    impl Drop for PrefixCleanup {
        fn drop(&mut self) {
            if let Err(e) = self.delete_keys() {
                eprintln!("could not delete test keys {}*: {e}", self.prefix);
            }
        }
    }
}

/// The `idem` binary under test.
#[allow(dead_code)]
pub const IDEM: &str = env!("CARGO_BIN_EXE_idem");

/// The name libtest lists test `name` under when it is in the module whose
/// `module_path!()` is `module` (that path without the crate's name), for a test that runs
/// this binary again with `--exact`.
#[allow(dead_code)]
pub fn libtest_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{name}"),
        None => name.to_string(),
    }
}

/// A temp folder to run `idem` in: job files go in `dir/jobs/` (also the `--jobs-dir`),
/// `store` is the `--store` URL. The folder is removed on drop.
#[allow(dead_code)]
pub struct Sandbox {
    pub dir: PathBuf,
    pub store: String,
}

#[allow(dead_code)]
impl Sandbox {
    /// A folder named `PREFIX-RUN_ID` whose store is a SQLite file inside it.
    pub fn new(prefix: &str) -> Self {
        let dir = Self::make_dir(prefix);
        let store = format!("sqlite://{}", dir.join("idem.db").display());
        Sandbox { dir, store }
    }

    /// A folder named `PREFIX-RUN_ID` whose store is `store`.
    pub fn with_store(prefix: &str, store: &str) -> Self {
        Sandbox {
            dir: Self::make_dir(prefix),
            store: store.to_string(),
        }
    }

    /// The days a test job wrote to table `out` of the warehouse `jobs/wh.db`, in order
    /// (none when the file or the table does not exist yet).
    #[allow(dead_code)]
    pub fn warehouse_days(&self) -> Vec<String> {
        let path = self.dir.join("jobs/wh.db");
        if !path.exists() {
            return Vec::new();
        }
        let url = format!("sqlite://{}", path.display());
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let w = idem::warehouse::open_warehouse(&url).await.unwrap();
            let st = idem::backend::prepare(
                "SELECT day FROM out ORDER BY day",
                idem::backend::Dialect::Sqlite,
            )
            .unwrap();
            match w.query(&st[0], &Default::default()).await {
                Ok(rows) => rows
                    .iter()
                    .map(|r| r["day"].as_str().unwrap().to_string())
                    .collect(),
                Err(e) if e.contains("no such table") => Vec::new(),
                Err(e) => panic!("{e}"),
            }
        })
    }

    fn make_dir(prefix: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", idem::new_run_id()));
        std::fs::create_dir_all(dir.join("jobs")).expect("create the sandbox");
        dir
    }

    /// Writes `jobs/NAME.toml` and returns its path.
    pub fn write_job(&self, name: &str, toml: &str) -> PathBuf {
        let path = self.dir.join("jobs").join(format!("{name}.toml"));
        std::fs::write(&path, toml).expect("write job");
        path
    }

    /// `idem ARGS --store STORE --jobs-dir DIR/jobs`, from the folder, without the
    /// caller's `IDEM_STORE`, `IDEM_BIGQUERY_ENDPOINT`, `IDEM_SCHEDULER_LISTEN` and
    /// `RUST_LOG`.
    pub fn command(&self, args: &[&str]) -> Command {
        self.command_with_store(args, &self.store)
    }

    /// [`Sandbox::command`] with another store.
    pub fn command_with_store(&self, args: &[&str], store: &str) -> Command {
        let mut c = Command::new(IDEM);
        c.args(args)
            .arg("--store")
            .arg(store)
            .arg("--jobs-dir")
            .arg(self.dir.join("jobs"))
            .current_dir(&self.dir)
            .env_remove("IDEM_STORE")
            .env_remove("IDEM_BIGQUERY_ENDPOINT")
            .env_remove("IDEM_SCHEDULER_LISTEN")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        c
    }

    /// `idem ARGS --format json` with stdout and stderr captured, ready to spawn; read the
    /// child with [`wait`].
    pub fn json_command(&self, args: &[&str]) -> Command {
        let mut all = args.to_vec();
        all.extend(["--format", "json"]);
        let mut c = self.command(&all);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }

    /// Runs `idem ARGS` to the end.
    pub fn idem(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run idem")
    }

    /// Runs `idem ARGS --format json`: (exit code, stdout as JSON, stderr).
    pub fn json(&self, args: &[&str]) -> (i32, Value, String) {
        parse(self.json_command(args).output().expect("run idem"))
    }

    /// Runs `idem run JOB --date DATE --format json`.
    pub fn run(&self, job: &Path, date: &str) -> (i32, Value, String) {
        let job = job.to_str().expect("a UTF-8 job path");
        self.json(&["run", job, "--date", date])
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Exit code, stdout parsed as JSON, stderr; panics with both when stdout is not JSON.
#[allow(dead_code)]
pub fn parse(out: Output) -> (i32, Value, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout:?}\nstderr: {stderr}"));
    (out.status.code().unwrap_or(-1), value, stderr)
}

/// Waits for a child started from [`Sandbox::json_command`] and [`parse`]s its output.
#[allow(dead_code)]
pub fn wait(child: Child) -> (i32, Value, String) {
    parse(child.wait_with_output().expect("wait for idem"))
}

/// A child's stderr, read line by line on a thread of its own: a test waits for the line
/// that says the child reached a state ([`until`](Self::until)) instead of guessing how
/// long that takes, and reads the rest once the child ended ([`rest`](Self::rest)).
#[allow(dead_code)]
pub struct StderrWatch {
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

#[allow(dead_code)]
impl StderrWatch {
    /// Takes `child`'s stderr (spawned with `Stdio::piped()`).
    pub fn of(child: &mut Child) -> Self {
        use std::io::BufRead;
        let stderr = child.stderr.take().expect("stderr piped");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        StderrWatch {
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line holding `needle`; panics with what was seen when the stream ends
    /// first, or after two minutes (a hang, not a slow machine).
    pub fn until(&mut self, needle: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(e) => panic!(
                    "no line with {needle:?} ({e}); stderr: {}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Everything the child wrote to stderr, once it has ended.
    pub fn rest(mut self) -> String {
        self.seen.extend(self.lines.iter());
        self.seen.join("\n")
    }
}

/// A TOML basic string (JSON string escapes are valid TOML).
#[allow(dead_code)]
pub fn toml_str(s: &str) -> String {
    serde_json::to_string(s).expect("string")
}

/// Runs `idem --store STORE --jobs-dir jobs schedule export ARGS` in `dir` (paths relative, as the golden
/// files expect).
#[allow(dead_code)]
pub fn export(dir: &Path, store: &str, args: &[&str]) -> Output {
    Command::new(IDEM)
        .args(["--store", store, "--jobs-dir", "jobs", "schedule", "export"])
        .args(args)
        .current_dir(dir)
        .env_remove("IDEM_STORE")
        .env_remove("IDEM_JOBS_DIR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run idem")
}

/// Compares an export with `tests/golden/NAME` (`IDEM_UPDATE_GOLDEN=1` rewrites it).
#[allow(dead_code)]
pub fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var("IDEM_UPDATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (IDEM_UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(
        actual,
        expected,
        "the export differs from {} (IDEM_UPDATE_GOLDEN=1 rewrites it)",
        path.display()
    );
}

/// Waits (up to `limit`, a bound for a stuck test, not a measure) until `done` holds,
/// looking `every` so long.
#[allow(dead_code)]
pub fn wait_until(
    what: &str,
    limit: std::time::Duration,
    every: std::time::Duration,
    mut done: impl FnMut() -> bool,
) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what} never happened");
        std::thread::sleep(every);
    }
}
