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
        let started = as_server_user(&bin.join("pg_ctl"))
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-o", &options, "-l"])
            .arg(dir.join("log"))
            .args(["-w", "start"])
            .stdout(Stdio::null())
            .output()
            .expect("run pg_ctl");
        if !started.status.success() {
            let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
            panic!(
                "the private server did not start: {}{log}",
                String::from_utf8_lossy(&started.stderr)
            );
        }
        Some(PrivatePostgres { dir, port, bin })
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
