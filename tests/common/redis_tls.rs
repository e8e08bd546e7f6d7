//! A `redis-server` of the test's own that speaks TLS only, with a certificate signed by a
//! throwaway CA, both made with the `openssl` command line in a temp folder. Killed and
//! removed on drop.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running TLS-only Redis on 127.0.0.1.
pub struct TlsRedis {
    /// The TLS port (the server listens on no plain port).
    pub port: u16,
    /// The PEM file of the CA that signed the server's certificate.
    pub ca: PathBuf,
    dir: PathBuf,
    child: Child,
}

/// Whether `program` can be run (`program ARG` exits, whatever its status).
fn runs(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn run(dir: &Path, program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A port nobody listens on right now (the OS's pick; it could be taken again before
/// redis-server binds it, so [`TlsRedis::start`] tries a few).
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a free port");
    listener.local_addr().unwrap().port()
}

impl TlsRedis {
    /// Makes the CA and the server certificate (for `127.0.0.1` and `localhost`) and starts
    /// `redis-server` on a free TLS port, waiting until it accepts connections. `None`
    /// after saying why (see [`super::skip`]) when `redis-server` or `openssl` is missing.
    pub fn start(test: &str) -> Option<TlsRedis> {
        for (tool, arg) in [("redis-server", "--version"), ("openssl", "version")] {
            if !runs(tool, arg) {
                super::skip(format!(
                    "skipped {test}: `{tool}` is not installed (the TLS test runs its own \
                     redis-server with certificates made by openssl)"
                ));
                return None;
            }
        }
        let dir = std::env::temp_dir().join(format!("idem-redis-tls-{}", idem::new_run_id()));
        std::fs::create_dir_all(&dir).expect("create the TLS folder");
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509", "-days", "2", "-subj", "/CN=idem test CA"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        run(&dir, "openssl", &ca);
        let mut csr = vec!["req", "-subj", "/CN=localhost"];
        csr.extend(ec);
        csr.extend(["-keyout", "server.key", "-out", "server.csr"]);
        run(&dir, "openssl", &csr);
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
             basicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        run(
            &dir,
            "openssl",
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-set_serial",
                "2",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "server.pem",
            ],
        );
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            let log = dir.join(format!("redis-{port}.log"));
            let mut child = Command::new("redis-server")
                .args(["--port", "0", "--bind", "127.0.0.1", "--tls-port"])
                .arg(port.to_string())
                .args([
                    "--tls-cert-file",
                    "server.pem",
                    "--tls-key-file",
                    "server.key",
                    "--tls-ca-cert-file",
                    "ca.pem",
                    "--tls-auth-clients",
                    "no",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                ])
                .arg(&dir)
                .arg("--logfile")
                .arg(&log)
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-server");
            if wait_ready(&mut child, port) {
                return Some(TlsRedis {
                    port,
                    ca: dir.join("ca.pem"),
                    dir,
                    child,
                });
            }
            // Exited (the port was taken meanwhile?) or never listened: try another port.
            let _ = child.kill();
            let _ = child.wait();
            last_log = std::fs::read_to_string(&log).unwrap_or_default();
        }
        let _ = std::fs::remove_dir_all(&dir);
        panic!("redis-server --tls-port did not start (5 ports tried); its log:\n{last_log}");
    }
}

/// Waits up to 10 s for `child` to accept TCP connections on `port`; false when it exited
/// or did not.
fn wait_ready(child: &mut Child, port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
