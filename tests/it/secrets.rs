//! No password is ever printed (issue 33, items 7 and 8): a store or warehouse URL's
//! secret, however it is given (`user:PASSWORD@`, `?password=`, `sslpassword`), never
//! reaches an error, a gate summary, `--stats-format json`, the ledger (`idem runs`) or an
//! export; a URL that does not parse is never echoed.

use crate::common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use common::{export, postgres_url, toml_str, Sandbox, IDEM};

/// The password every URL here carries; no output may hold it.
const SECRET: &str = "S3cretPw0rd";

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn assert_no_secret(what: &str, text: &str) {
    assert!(
        !text.contains(SECRET),
        "{what} prints the password:\n{text}"
    );
}

/// `url` with `?password=SECRET` added (the test server trusts: any password connects).
fn with_password_param(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}password={SECRET}")
}

/// `idem ARGS --store STORE` in a fresh folder, `stdin` as its input.
fn idem(store: &str, args: &[&str], stdin: &str) -> Output {
    let s = Sandbox::new("idem-secrets");
    let mut child = Command::new(IDEM)
        .args(args)
        .args(["--store", store])
        .current_dir(&s.dir)
        .env_remove("IDEM_STORE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run idem");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().expect("wait for idem")
}

/// (`connect_timeout=1`: a refused port is retried for that long, not the default 5 s.)
#[test]
fn an_unreachable_store_is_named_without_its_password() {
    for store in [
        format!("postgres://idem@127.0.0.1:1/idem?connect_timeout=1&password={SECRET}"),
        format!("postgres://idem@127.0.0.1:1/idem?sslmode=disable&sslpassword={SECRET}&connect_timeout=1"),
        format!("postgres://idem:{SECRET}@127.0.0.1:1/idem?connect_timeout=1"),
    ] {
        let out = idem(&store, &["runs"], "");
        assert_eq!(out.status.code(), Some(3), "{}", text(&out));
        assert!(
            text(&out).contains("store postgres://idem") && text(&out).contains("unavailable"),
            "the error still names the store: {}",
            text(&out)
        );
        assert_no_secret("runs on an unreachable store", &text(&out));
    }
    let store = format!("postgres://idem@127.0.0.1:1/idem?password={SECRET}&connect_timeout=1");
    let gate = idem(&store, &["gate", "--key", "id"], "{\"id\":1}\n");
    assert_eq!(gate.status.code(), Some(3), "{}", text(&gate));
    assert_no_secret("gate on an unreachable store", &text(&gate));
}

#[test]
fn a_store_url_that_does_not_parse_names_the_wrong_part_not_the_url() {
    for (store, part) in [
        (
            format!("postgres://idem:{SECRET}@127.0.0.1:999999/idem"),
            "invalid port number",
        ),
        (
            format!("postgres://idem:{SECRET}@[zz::1]/idem"),
            "invalid IPv6 address",
        ),
        (
            format!("bigquery://idem:{SECRET}@project/dataset"),
            "project id",
        ),
    ] {
        let out = idem(&store, &["runs"], "");
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains(part), "{part}: {}", text(&out));
        assert_no_secret("a bad store url", &text(&out));
    }
}

#[test]
fn a_gate_over_postgres_with_a_password_parameter_never_prints_it() {
    let Some(url) = postgres_url("secrets::gate_password_parameter") else {
        return;
    };
    let store = with_password_param(&url);
    let namespace = format!("secrets-{}", idem::new_run_id());
    for stats in ["human", "json"] {
        let out = idem(
            &store,
            &[
                "gate",
                "--key",
                "id",
                "--namespace",
                &namespace,
                "--stats-format",
                stats,
            ],
            "{\"id\":1}\n{\"id\":2}\n",
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("password=***"),
            "the summary names the store, redacted ({stats}): {stderr}"
        );
        assert_no_secret(&format!("the gate's {stats} summary"), &text(&out));
    }
}

#[test]
fn a_failing_sql_job_on_a_warehouse_with_a_password_records_no_secret() {
    let Some(url) = postgres_url("secrets::warehouse_password") else {
        return;
    };
    let s = Sandbox::new("idem-secrets-wh");
    let job = s.write_job(
        "broken",
        &format!(
            "name = \"broken\"\nprocessor = \"sql\"\n[sql]\nwarehouse = {}\nprocess = \"SELECT * FROM idem_secrets_no_such_table\"\n",
            toml_str(&with_password_param(&url))
        ),
    );
    let (code, run, stderr) = s.run(&job, "2025-11-18");
    assert_eq!(code, 1, "{run} {stderr}");
    assert_no_secret("the failed run", &format!("{run}{stderr}"));
    let (code, runs, stderr) = s.json(&["runs"]);
    assert_eq!(code, 0, "{stderr}");
    let runs = runs.to_string();
    assert!(
        runs.contains("idem_secrets_no_such_table") && runs.contains("password=***"),
        "the ledger keeps the error, naming the warehouse redacted: {runs}"
    );
    assert_no_secret("idem runs --format json", &runs);
}

fn scheduled_jobs() -> Sandbox {
    let s = Sandbox::new("idem-secrets-export");
    s.write_job(
        "daily",
        "name = \"daily\"\nprocessor = \"sql\"\nschedule = \"@daily\"\n[guards]\nlease = \"10m\"\n[sql]\nwarehouse = \"sqlite://wh.db\"\nprocess = \"SELECT 1\"\n",
    );
    s
}

#[test]
fn a_crontab_export_keeps_the_password_off_its_lines_and_says_where_it_goes() {
    let s = scheduled_jobs();
    for store in [
        format!("postgres://idem:{SECRET}@db.internal/idem?sslmode=require"),
        format!("postgres://idem@db.internal/idem?password={SECRET}&sslmode=require"),
    ] {
        let out = export(&s.dir, &store, &["--crontab", "--workdir", "/srv/idem"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert_no_secret("the crontab export", &text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("--store 'postgres://idem@db.internal/idem?sslmode=require'"),
            "the line names the store without its password: {stdout}"
        );
        assert!(
            stdout.contains("~/.pgpass") && stdout.contains("PGPASSWORD"),
            "the export says where the password goes: {stdout}"
        );
    }
}

#[test]
fn a_cloud_scheduler_export_reads_the_password_from_secret_manager() {
    let s = scheduled_jobs();
    let store = format!("postgres://idem@10.0.0.5/idem?password={SECRET}");
    let out = export(
        &s.dir,
        &store,
        &["--cloud-scheduler", "my-project/us-central1"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_no_secret("the Cloud Scheduler export", &text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("IDEM_STORE=postgres://idem@10.0.0.5/idem,")
            && stdout.contains("--set-secrets='PGPASSWORD=idem-store-password:latest'")
            && stdout.contains("gcloud secrets create idem-store-password"),
        "the password comes from Secret Manager as PGPASSWORD: {stdout}"
    );
    // With --store-secret the URL is not printed at all.
    let out = export(
        &s.dir,
        &store,
        &[
            "--cloud-scheduler",
            "my-project/us-central1",
            "--store-secret",
            "idem-store",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_no_secret(
        "the Cloud Scheduler export with --store-secret",
        &text(&out),
    );
    // Kubernetes reads the whole URL from a Secret.
    let out = export(
        &s.dir,
        &store,
        &["--kubernetes", "--image", "registry.example.com/idem:1.0"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_no_secret("the Kubernetes export", &text(&out));
}

#[test]
fn an_export_refuses_a_secret_it_has_no_safe_place_for_without_printing_it() {
    let s = scheduled_jobs();
    let store = format!("postgres://idem@db.internal/idem?sslpassword={SECRET}");
    for args in [
        vec!["--crontab"],
        vec!["--cloud-scheduler", "my-project/us-central1"],
    ] {
        let out = export(&s.dir, &store, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains("\"sslpassword\""),
            "the error names the parameter: {}",
            text(&out)
        );
        assert_no_secret("a refused export", &text(&out));
    }
}
