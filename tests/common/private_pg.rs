//! A private PostgreSQL server for one test (its own data folder and port), for what the
//! shared server must not be used for: a small `max_connections`, restarts. Started with
//! the machine's PostgreSQL binaries (`/usr/lib/postgresql/*/bin`), as the `postgres` user
//! when the test runs as root (the server refuses to run as root); stopped on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A running private server.
pub struct PrivatePostgres {
    pub dir: PathBuf,
    pub port: u16,
    bin: PathBuf,
    /// The server's options (`pg_ctl -o`), for [`PrivatePostgres::start_again`].
    options: String,
}

fn binaries() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_ctl").exists())
        .collect();
    found.sort();
    found.pop()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `program args…`, as the `postgres` user when this process is root.
fn as_server_user(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl PrivatePostgres {
    /// A fresh server with `settings` (`-c NAME=VALUE` each), or `None` after saying why it
    /// is skipped (no PostgreSQL binaries, or they would not start).
    pub fn start(test: &str, settings: &[&str]) -> Option<PrivatePostgres> {
        let Some(bin) = binaries() else {
            super::skip(format!(
                "skipped {test}: no PostgreSQL server binaries under /usr/lib/postgresql"
            ));
            return None;
        };
        let dir = std::env::temp_dir().join(format!("idem-private-pg-{}", idem::new_run_id()));
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            let _ = Command::new("chown").arg("postgres").arg(&dir).status();
        }
        let init = as_server_user(&bin.join("initdb"))
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(dir.join("data"))
            .stdout(Stdio::null())
            .output()
            .expect("run initdb");
        if !init.status.success() {
            super::skip(format!(
                "skipped {test}: initdb failed: {}",
                String::from_utf8_lossy(&init.stderr)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            return None;
        }
        let port = free_port();
        let mut options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            dir.display()
        );
        for s in settings {
            options.push_str(&format!(" -c {s}"));
        }
        let server = PrivatePostgres {
            dir,
            port,
            bin,
            options,
        };
        server.start_again();
        Some(server)
    }

    /// Starts the (stopped) server again, on the same port and data; panics if it fails.
    pub fn start_again(&self) {
        let started = as_server_user(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-o", &self.options, "-l"])
            .arg(self.dir.join("log"))
            .args(["-w", "start"])
            .stdout(Stdio::null())
            .output()
            .expect("run pg_ctl");
        if !started.status.success() {
            let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
            panic!(
                "the private server did not start: {}{log}",
                String::from_utf8_lossy(&started.stderr)
            );
        }
    }

    /// Stops the server (fast: its clients are disconnected); [`start_again`] restarts it.
    ///
    /// [`start_again`]: PrivatePostgres::start_again
    pub fn stop(&self) {
        let stopped = as_server_user(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "fast", "-w", "stop"])
            .stdout(Stdio::null())
            .output()
            .expect("run pg_ctl");
        assert!(
            stopped.status.success(),
            "the private server did not stop: {}",
            String::from_utf8_lossy(&stopped.stderr)
        );
    }

    /// The URL of database `postgres` on it.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = as_server_user(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private PgBouncer in front of a [`PrivatePostgres`], in transaction pooling mode.
pub struct PrivatePgBouncer {
    dir: PathBuf,
    pub port: u16,
    pid_file: PathBuf,
}

impl PrivatePgBouncer {
    /// PgBouncer (Debian's `pgbouncer`) in `pool_mode = transaction` with `pool_size` server
    /// connections, or `None` after saying why it is skipped.
    pub fn start(test: &str, server: &PrivatePostgres, pool_size: u32) -> Option<Self> {
        let Some(bin) = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
        else {
            super::skip(format!(
                "skipped {test}: no pgbouncer (Debian package pgbouncer; .ci/run installs it)"
            ));
            return None;
        };
        let dir = std::env::temp_dir().join(format!("idem-pgbouncer-{}", idem::new_run_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let pid_file = dir.join("pgbouncer.pid");
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\n* = host=127.0.0.1 port={server_port}\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
                 auth_type = trust\nauth_file = {users}\npool_mode = transaction\n\
                 max_client_conn = 2000\ndefault_pool_size = {pool_size}\nunix_socket_dir =\n\
                 logfile = {log}\npidfile = {pid}\n",
                server_port = server.port,
                users = dir.join("users.txt").display(),
                log = dir.join("pgbouncer.log").display(),
                pid = pid_file.display(),
            ),
        )
        .unwrap();
        if is_root() {
            let _ = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(&dir)
                .status();
        }
        let started = as_server_user(&bin)
            .arg("-d")
            .arg(dir.join("pgbouncer.ini"))
            .output()
            .expect("run pgbouncer");
        assert!(
            started.status.success(),
            "pgbouncer did not start: {}",
            String::from_utf8_lossy(&started.stderr)
        );
        // Daemonized: ready once it accepts connections.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "pgbouncer never listened on {port}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Some(PrivatePgBouncer {
            dir,
            port,
            pid_file,
        })
    }

    /// The URL of database `postgres` through it, as idem is told of a transaction pooler.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?pgbouncer=true",
            self.port
        )
    }
}

impl Drop for PrivatePgBouncer {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(&self.pid_file) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
