//! Deploying as a user would (issue 23): `idem schedule export --kubernetes` and
//! `--kubernetes-scheduler N` equal their golden files (tests/golden/; `IDEM_UPDATE_GOLDEN=1`
//! rewrites them), validate against Kubernetes' own schema with an independent tool
//! (`kubernetes-validate` from PyPI, `IDEM_TEST_K8S_VALIDATOR`), name the same image and jobs
//! folder as the Cloud Run export, refuse what would run a slot twice; and the Deployment's
//! replicas, as `idem scheduler` processes on Postgres with the exported arguments, complete
//! every scope exactly once.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{export, golden, Sandbox, IDEM};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).to_string()
}

fn sql_job(name: &str, extra: &str, guards: &str) -> String {
    format!(
        r#"
name = "{name}"
processor = "sql"
{extra}
[guards]
{guards}
[sql]
warehouse = "sqlite://wh.db"
setup = "CREATE TABLE IF NOT EXISTS out (job TEXT, day TEXT)"
process = "INSERT INTO out VALUES ('{name}', @scope)"
"#
    )
}

/// A SQL job in Los Angeles, one in Paris on weekdays, and a command job with a timeout and
/// a grace period (they set the pods' deadlines).
fn deploy_jobs(s: &Sandbox) {
    s.write_job(
        "sales",
        &sql_job(
            "daily_sales",
            "schedule = \"0 9 * * *\"\ntimezone = \"America/Los_Angeles\"\ndate = \"yesterday\"",
            "lease = \"10m\"\ntime_window = \"1h\"",
        ),
    );
    s.write_job(
        "events",
        &sql_job(
            "hourly_events",
            "schedule = \"0 5 * * * MON-FRI\"\ntimezone = \"Europe/Paris\"",
            "lease = \"2h\"\ntime_window = \"30m\"",
        ),
    );
    s.write_job(
        "export",
        r#"
name = "export_orders"
processor = "command"
schedule = "30 6 * * *"
date = "yesterday"
[guards]
lease = "30m"
time_window = "20h"
[command]
run = ["sh", "-c", "echo {date}"]
timeout = "2h"
grace = "45s"
"#,
    );
}

const STORE: &str = "postgres://idem@db.internal/idem";
const IMAGE: &str = "europe-west1-docker.pkg.dev/my-project/idem/idem:1.4.0";

#[test]
fn kubernetes_cron_jobs_equal_the_golden_file() {
    let s = Sandbox::new("idem-k8s-golden");
    deploy_jobs(&s);
    let out = export(&s.dir, STORE, &["--kubernetes", "--image", IMAGE]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let yaml = text(&out.stdout);
    golden("kubernetes.yaml", &yaml);
    // The store URL is never printed: it comes from the Secret.
    assert!(!yaml.contains("db.internal"), "{yaml}");
    // The command job's pods get its grace plus time to record, and every attempt's
    // timeout; the SQL jobs a day.
    assert!(yaml.contains("terminationGracePeriodSeconds: 75"), "{yaml}");
    assert!(
        yaml.contains(&format!("activeDeadlineSeconds: {}", 3 * (7200 + 75))),
        "{yaml}"
    );
    let with = export(
        &s.dir,
        STORE,
        &[
            "--kubernetes",
            "--image",
            IMAGE,
            "--namespace",
            "batch",
            "--jobs-configmap",
            "idem-jobs",
            "--store-secret",
            "warehouse-store",
            "--k8s-service-account",
            "idem-runner",
        ],
    );
    assert_eq!(with.status.code(), Some(0), "{}", text(&with.stderr));
    golden("kubernetes-configmap.yaml", &text(&with.stdout));
}

#[test]
fn kubernetes_scheduler_deployment_equals_the_golden_file() {
    let s = Sandbox::new("idem-k8s-golden-deploy");
    deploy_jobs(&s);
    let out = export(
        &s.dir,
        STORE,
        &["--kubernetes-scheduler", "3", "--image", IMAGE],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let yaml = text(&out.stdout);
    golden("kubernetes-scheduler.yaml", &yaml);
    assert!(yaml.contains("replicas: 3"), "{yaml}");
    // The scheduler's grace, the longest command grace, and time to record.
    assert!(
        yaml.contains("terminationGracePeriodSeconds: 105"),
        "{yaml}"
    );
}

/// The values of `key: "..."` lines (the exports quote every string).
fn values(yaml: &str, key: &str) -> Vec<String> {
    yaml.lines()
        .filter_map(|l| l.trim().strip_prefix(&format!("{key}: ")))
        .map(|v| serde_json::from_str::<String>(v).unwrap_or_else(|_| v.to_string()))
        .collect()
}

#[test]
fn every_export_names_the_same_image_and_jobs_folder() {
    let s = Sandbox::new("idem-k8s-same");
    deploy_jobs(&s);
    let cloud = export(
        &s.dir,
        STORE,
        &[
            "--cloud-scheduler",
            "my-project/europe-west1",
            "--image",
            IMAGE,
        ],
    );
    let cron_jobs = export(&s.dir, STORE, &["--kubernetes", "--image", IMAGE]);
    let deployment = export(
        &s.dir,
        STORE,
        &["--kubernetes-scheduler", "2", "--image", IMAGE],
    );
    for out in [&cloud, &cron_jobs, &deployment] {
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let cloud = text(&cloud.stdout);
    // The migrate step and three jobs.
    assert_eq!(
        cloud.matches(&format!("--image={IMAGE}")).count(),
        4,
        "{cloud}"
    );
    assert_eq!(
        cloud.matches("IDEM_JOBS_DIR=/app/jobs").count(),
        4,
        "{cloud}"
    );
    let migrate = cloud.find("--args=migrate").expect("a migrate step");
    let executed = cloud.find("gcloud run jobs execute idem-migrate").unwrap();
    let first_job = cloud.find("--args='run,").unwrap();
    assert!(migrate < executed && executed < first_job, "{cloud}");
    assert!(cloud[executed..first_job].contains("--wait"), "{cloud}");
    for yaml in [text(&cron_jobs.stdout), text(&deployment.stdout)] {
        let images = values(&yaml, "image");
        assert!(
            !images.is_empty() && images.iter().all(|i| i == IMAGE),
            "{yaml}"
        );
        assert!(yaml.contains("- name: \"IDEM_JOBS_DIR\"\n"), "{yaml}");
        assert!(
            values(&yaml, "value")
                .iter()
                .all(|v| v == "/app/jobs" || v == "json"),
            "{yaml}"
        );
        assert!(
            yaml.contains("- name: \"IDEM_LOG_FORMAT\"\n") && yaml.contains("value: \"json\""),
            "the pods log JSON lines: {yaml}"
        );
        // Every pod: no API token, the image's user and group; every container: a
        // read-only root with the working folder (the spool) and /tmp on volumes of its
        // own, requests and a memory limit.
        let pods = yaml.matches("\n      containers:").count()
            + yaml.matches("\n          containers:").count();
        assert_eq!(pods, yaml.matches("restartPolicy:").count(), "{yaml}");
        // Pod Security `restricted`, field by field: non-root with the runtime's seccomp
        // profile per pod; per container no privilege escalation and every capability
        // dropped; volumes of the allowed kinds only (emptyDir, configMap).
        for line in [
            "runAsNonRoot: true",
            "type: \"RuntimeDefault\"",
            "automountServiceAccountToken: false",
            "runAsUser: 10001",
            "runAsGroup: 10001",
            "fsGroup: 10001",
        ] {
            assert_eq!(yaml.matches(line).count(), pods, "{line}: {yaml}");
        }
        // One migrate Job, named after the image; every other pod waits for the schema.
        assert_eq!(yaml.matches("kind: \"Job\"").count(), 1, "{yaml}");
        let waits = yaml.matches("- name: \"wait-for-schema\"").count();
        assert_eq!(waits, pods - 1, "{yaml}");
        assert_eq!(
            yaml.matches("- \"migrate\"\n").count(),
            pods,
            "a migrate Job and a check before every other pod: {yaml}"
        );
        assert_eq!(yaml.matches("- \"--check\"\n").count(), waits, "{yaml}");
        let containers = pods + waits;
        assert_eq!(yaml.matches("emptyDir: {}").count(), 2 * pods, "{yaml}");
        assert_eq!(yaml.matches("volumes:").count(), pods, "{yaml}");
        assert!(!yaml.contains("hostPath") && !yaml.contains("privileged: true"));
        for line in [
            "allowPrivilegeEscalation: false",
            "- \"ALL\"",
            "readOnlyRootFilesystem: true",
            "mountPath: \"/var/lib/idem\"",
            "mountPath: \"/tmp\"",
            "requests:",
            "limits:",
        ] {
            assert_eq!(yaml.matches(line).count(), containers, "{line}: {yaml}");
        }
    }
    // The scheduler's replicas are probed on the paths `--listen` serves, roll one at a
    // time, spread over nodes, and a budget keeps drains to one at a time.
    let deployment = text(&deployment.stdout);
    for line in [
        "- \"--listen\"\n        - \"0.0.0.0:8080\"",
        "path: \"/healthz\"",
        "path: \"/readyz\"",
        "maxUnavailable: 0",
        "topologyKey: \"kubernetes.io/hostname\"",
        "kind: \"PodDisruptionBudget\"",
    ] {
        assert_eq!(deployment.matches(line).count(), 1, "{line}: {deployment}");
    }
    // A CronJob's pod dates its run by its Job's slot (the Job name's minute), not by when
    // a retry starts.
    assert!(
        cron_yaml_has_slot_env(&text(&cron_jobs.stdout)),
        "{}",
        text(&cron_jobs.stdout)
    );
    // Each CronJob runs what the Cloud Run job of the same name runs (with its slot).
    let cron_yaml = text(&cron_jobs.stdout);
    for (name, job) in [
        ("idem-daily-sales", "daily_sales"),
        ("idem-export-orders", "export_orders"),
    ] {
        assert!(
            cloud.contains(&format!("gcloud run jobs deploy {name}")),
            "{cloud}"
        );
        assert!(
            cloud.contains(&format!(
                "--args='run,{job},--date,yesterday,--trigger,scheduler'"
            )),
            "{cloud}"
        );
        assert!(
            cron_yaml.contains(&format!("name: \"{name}\"")),
            "{cron_yaml}"
        );
        assert!(
            cron_yaml.contains(&format!(
                "- \"run\"\n            - \"{job}\"\n            - \"--date\"\n            - \"yesterday\"\n            - \"--scheduled-at\"\n            - \"cronjob:$(IDEM_CRONJOB_JOB)\"\n            - \"--trigger\"\n            - \"scheduler\"\n"
            )),
            "{cron_yaml}"
        );
    }
    // With --store-secret the Cloud Run job reads the store from Secret Manager too.
    let secret = export(
        &s.dir,
        STORE,
        &[
            "--cloud-scheduler",
            "my-project/europe-west1",
            "--store-secret",
            "idem-store",
        ],
    );
    assert_eq!(secret.status.code(), Some(0), "{}", text(&secret.stderr));
    let secret = text(&secret.stdout);
    assert!(!secret.contains("db.internal"), "{secret}");
    assert_eq!(
        secret
            .matches("--set-secrets='IDEM_STORE=idem-store:latest'")
            .count(),
        4,
        "{secret}"
    );
    assert!(
        secret.contains("roles/secretmanager.secretAccessor"),
        "{secret}"
    );
}

#[test]
fn an_empty_jobs_folder_a_full_disk_and_single_runner_gaps_are_said() {
    let s = Sandbox::new("idem-k8s-edges");
    for args in [
        vec!["--kubernetes", "--image", IMAGE],
        vec!["--kubernetes-scheduler", "2", "--image", IMAGE],
    ] {
        let out = export(&s.dir, STORE, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            text(&out.stderr)
                .contains("no job with a schedule in the jobs folder: nothing to export"),
            "{}",
            text(&out.stderr)
        );
    }
    deploy_jobs(&s);
    // A full disk is an error, not a truncated file and exit 0.
    let full = Command::new(IDEM)
        .args(["--store", STORE, "--jobs-dir", "jobs", "schedule", "export"])
        .args(["--kubernetes", "--image", IMAGE])
        .current_dir(&s.dir)
        .env_remove("IDEM_STORE")
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    assert_ne!(full.status.code(), Some(0));
    assert!(
        text(&full.stderr).contains("standard output"),
        "{}",
        text(&full.stderr)
    );
    // One runner per slot: shadow mode and catch-up are warned about, not refused.
    s.write_job(
        "shadow",
        &sql_job(
            "shadowed",
            "schedule = \"0 3 * * *\"\nmode = \"shadow\"\nmissed = \"catch_up\"",
            "lease = \"10m\"",
        ),
    );
    for args in [
        vec!["--kubernetes", "--image", IMAGE],
        vec!["--cloud-scheduler", "p/europe-west1"],
    ] {
        let out = export(&s.dir, STORE, &args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(
            err.contains("job shadowed: its mode is not enforce"),
            "{err}"
        );
        assert!(
            err.contains("job shadowed: missed = \"catch_up\" is done by `idem scheduler` only"),
            "{err}"
        );
    }
}

#[test]
fn cloud_run_jobs_get_a_task_timeout_retries_and_a_script_that_runs_again() {
    let s = Sandbox::new("idem-k8s-cloud");
    deploy_jobs(&s);
    let out = export(&s.dir, STORE, &["--cloud-scheduler", "p/europe-west1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let script = text(&out.stdout);
    // The command job: its timeout, its grace and 30 s to record; the others a day.
    assert!(script.contains("--task-timeout=7275s"), "{script}");
    assert_eq!(
        script.matches("--task-timeout=86400s").count(),
        2,
        "{script}"
    );
    assert_eq!(script.matches("--max-retries=2").count(), 3, "{script}");
    // Create the scheduler job, or update it: the script runs again for each release.
    assert_eq!(
        script
            .matches(
                "then verb=update; else verb=create; fi\ngcloud scheduler jobs \"$verb\" http "
            )
            .count(),
        3,
        "{script}"
    );
    assert!(!script.contains("jobs create http"), "{script}");
    // A retry works out its date when it starts: a job with a timeout whose last retry
    // can start on another date than its fire is named. The command job's cannot (two
    // 2 h attempts after 06:30); the SQL jobs have no timeout (said in the docs rather
    // than warned of for every job).
    let err = text(&out.stderr);
    let crossing = "a Cloud Run retry can process another date than its fire's";
    assert!(!err.contains(crossing), "{err}");
    // A command job at 23:30 in Paris with a 3 h timeout: its first retry is after
    // midnight, on the next date.
    s.write_job(
        "nightly",
        r#"
name = "nightly"
processor = "command"
schedule = "30 23 * * *"
timezone = "Europe/Paris"
date = "today"
[guards]
lease = "30m"
[command]
run = ["true"]
timeout = "3h"
"#,
    );
    let out = export(&s.dir, STORE, &["--cloud-scheduler", "p/europe-west1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("job nightly: "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains(crossing), "{line}");
    assert!(line.contains(" 23:30 CE"), "the fire, in its zone: {line}");
    assert!(line.contains("--max-retries=2"), "{line}");
}

#[test]
fn kubernetes_exports_refuse_what_would_lose_or_double_a_run() {
    let s = Sandbox::new("idem-k8s-refuse");
    deploy_jobs(&s);
    let refused = |store: &str, args: &[&str], what: &str| {
        let out = export(&s.dir, store, args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stdout)
        );
        assert!(out.stdout.is_empty(), "{args:?}: nothing printed on error");
        let err = text(&out.stderr);
        assert!(err.contains(what), "{args:?}: {err}");
    };
    refused(
        "sqlite://idem.db",
        &["--kubernetes", "--image", IMAGE],
        "a Kubernetes pod keeps no disk between runs",
    );
    refused(STORE, &["--kubernetes"], "needs --image");
    refused(
        STORE,
        &[
            "--kubernetes",
            "--image",
            IMAGE,
            "--namespace",
            "Batch_Jobs",
        ],
        "--namespace \"Batch_Jobs\": not a Kubernetes name",
    );
    refused(
        STORE,
        &["--kubernetes-scheduler", "0", "--image", IMAGE],
        "0 is not in 1..=100",
    );
    refused(
        STORE,
        &[
            "--kubernetes",
            "--kubernetes-scheduler",
            "2",
            "--image",
            IMAGE,
        ],
        "cannot be used with",
    );
    // A job without a time window: every replica would run its slot in turn.
    s.write_job(
        "nowindow",
        &sql_job(
            "no_window",
            "schedule = \"0 3 * * *\"",
            "lease = \"10m\"\ntime_window = \"0s\"",
        ),
    );
    refused(
        STORE,
        &["--kubernetes-scheduler", "2", "--image", IMAGE],
        "job no_window: has no time window",
    );
    // As a CronJob (one Job per slot) it is fine.
    let out = export(&s.dir, STORE, &["--kubernetes", "--image", IMAGE]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Shadow mode never skips: refused for replicas too.
    s.write_job(
        "nowindow",
        &sql_job(
            "no_window",
            "schedule = \"0 3 * * *\"\nmode = \"shadow\"",
            "lease = \"10m\"\ntime_window = \"1h\"",
        ),
    );
    refused(
        STORE,
        &["--kubernetes-scheduler", "2", "--image", IMAGE],
        "has a mode other than enforce",
    );
    // No lease: two Jobs of one slot could run one date at once.
    s.write_job(
        "nowindow",
        &sql_job("no_window", "schedule = \"0 3 * * *\"", "lease = \"0s\""),
    );
    refused(
        STORE,
        &["--kubernetes", "--image", IMAGE],
        "job no_window: has no lease",
    );
    // A store the pods could not share or open.
    for store in ["redis://127.0.0.1", "file:///tmp/x", ""] {
        refused(
            store,
            &["--kubernetes", "--image", IMAGE],
            "needs a postgres:// or bigquery:// store",
        );
        refused(
            store,
            &["--cloud-scheduler", "p/europe-west1"],
            "needs a postgres:// or bigquery:// store",
        );
    }
    // Values that would break the printed commands or comments.
    refused(
        STORE,
        &[
            "--kubernetes",
            "--image",
            "registry.example.com/idem:1.0\nrm -rf /",
        ],
        "--image \"registry.example.com/idem:1.0\\nrm -rf /\": holds '\\n'",
    );
    refused(
        STORE,
        &["--cloud-scheduler", "p/europe-west1", "--image", ""],
        "--image is empty",
    );
    refused(
        STORE,
        &[
            "--cloud-scheduler",
            "p/europe-west1",
            "--store-secret",
            "a b",
        ],
        "--store-secret \"a b\": holds ' '",
    );
    // A flag the export does not read is an error, not dropped.
    refused(
        STORE,
        &["--kubernetes", "--image", IMAGE, "--service-account", "sa@p.iam.gserviceaccount.com"],
        "--service-account is not read by a Kubernetes export (Kubernetes pods run as --k8s-service-account)",
    );
    refused(
        STORE,
        &[
            "--cloud-scheduler",
            "p/europe-west1",
            "--namespace",
            "batch",
        ],
        "--namespace is not read by --cloud-scheduler",
    );
    refused(
        STORE,
        &["--crontab", "--image", IMAGE],
        "--image is not read by --crontab",
    );
    // Two jobs whose names collide as Kubernetes names.
    s.write_job(
        "nowindow",
        &sql_job("daily-sales", "schedule = \"0 3 * * *\"", "lease = \"10m\""),
    );
    refused(
        STORE,
        &["--kubernetes", "--image", IMAGE],
        "both export as CronJob \"idem-daily-sales\"",
    );
}

/// Every golden manifest passes Kubernetes' own OpenAPI schema, strictly (no unknown field),
/// for the oldest release with CronJob time zones (1.27) and the newest the tool knows.
#[test]
fn exported_manifests_validate_against_the_kubernetes_schema() {
    let Some(validator) = common::service_url(
        "IDEM_TEST_K8S_VALIDATOR",
        "exported_manifests_validate_against_the_kubernetes_schema",
        "set IDEM_TEST_K8S_VALIDATOR to a `kubernetes-validate` executable (pip install \
         kubernetes-validate; .ci/run does)",
    ) else {
        return;
    };
    let s = Sandbox::new("idem-k8s-validate");
    deploy_jobs(&s);
    let mut files = Vec::new();
    for (name, args) in [
        ("cronjobs.yaml", vec!["--kubernetes", "--image", IMAGE]),
        (
            "configmap.yaml",
            vec![
                "--kubernetes",
                "--image",
                IMAGE,
                "--namespace",
                "batch",
                "--jobs-configmap",
                "idem-jobs",
                "--k8s-service-account",
                "idem-runner",
            ],
        ),
        (
            "deployment.yaml",
            vec!["--kubernetes-scheduler", "3", "--image", IMAGE],
        ),
    ] {
        let out = export(&s.dir, STORE, &args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let path = s.dir.join(name);
        std::fs::write(&path, &out.stdout).unwrap();
        files.push(path);
    }
    for version in ["1.27.0", "1.37.0"] {
        let out = Command::new(&validator)
            .args(["--strict", "--kubernetes-version", version])
            .args(&files)
            .output()
            .expect("run kubernetes-validate");
        let report = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{version}: {report}");
        // (A migrate Job + 3 CronJobs) twice, then a migrate Job, the Deployment and its
        // disruption budget, each named as passing.
        assert_eq!(
            report.matches(" passed for resource ").count(),
            11,
            "{report}"
        );
    }
    // The validator is not a rubber stamp: a misspelt field fails it.
    let bad = std::fs::read_to_string(&files[0])
        .unwrap()
        .replace("backoffLimit:", "backofLimit:");
    let bad_path = s.dir.join("bad.yaml");
    std::fs::write(&bad_path, bad).unwrap();
    let out = Command::new(&validator)
        .args(["--strict"])
        .arg(&bad_path)
        .output()
        .expect("run kubernetes-validate");
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stdout).contains("backofLimit"),
        "{}",
        text(&out.stdout)
    );
}

/// The args of the exported Deployment's `idem` container.
fn deployment_args(yaml: &str) -> Vec<String> {
    let mut lines = yaml
        .lines()
        .skip_while(|l| *l != "kind: \"Deployment\"")
        .skip_while(|l| l.trim() != "- name: \"idem\"")
        .skip_while(|l| l.trim() != "args:")
        .skip(1);
    let mut args = Vec::new();
    for line in lines.by_ref() {
        match line.trim().strip_prefix("- ") {
            Some(v) if v.starts_with('"') => args.push(serde_json::from_str(v).unwrap()),
            _ => break,
        }
    }
    args
}

/// The Deployment's replicas as processes: two `idem scheduler`s with the exported
/// arguments and environment (store from `IDEM_STORE`, jobs from `IDEM_JOBS_DIR`) on one
/// Postgres store fire three every-second jobs (two dates, a SQL and a command job) until
/// 30 fires are recorded: every scope completes exactly once, its work ran once, every
/// other fire is a skip that says why.
#[test]
fn two_scheduler_replicas_on_postgres_complete_every_scope_exactly_once() {
    let Some(url) = common::service_url(
        "IDEM_TEST_POSTGRES_URL",
        "two_scheduler_replicas_on_postgres_complete_every_scope_exactly_once",
        common::POSTGRES_HOW,
    ) else {
        return;
    };
    let s = Sandbox::with_store("idem-k8s-replicas", &url);
    let tag = &idem::new_run_id()[..8];
    let guards = "lease = \"1m\"\ntime_window = \"1h\"";
    let today = format!("today_{tag}");
    let yesterday = format!("yesterday_{tag}");
    let command = format!("command_{tag}");
    s.write_job(
        &today,
        &sql_job(&today, "schedule = \"* * * * * *\"", guards),
    );
    s.write_job(
        &yesterday,
        &sql_job(
            &yesterday,
            "schedule = \"* * * * * *\"\ndate = \"yesterday\"",
            guards,
        ),
    );
    s.write_job(
        &command,
        &format!(
            r#"
name = "{command}"
processor = "command"
schedule = "* * * * * *"
[guards]
{guards}
[command]
run = ["sh", "-c", "sleep 0.3; echo {{scope}} >> done.txt"]
"#
        ),
    );
    let exported = s
        .command(&[
            "schedule",
            "export",
            "--kubernetes-scheduler",
            "2",
            "--image",
            "idem:test",
        ])
        .output()
        .unwrap();
    assert_eq!(
        exported.status.code(),
        Some(0),
        "{}",
        text(&exported.stderr)
    );
    let args = deployment_args(&text(&exported.stdout));
    // The pods fire the jobs the export checked, by name.
    let mut named = args[5..].to_vec();
    named.sort();
    let mut expected = vec![command.clone(), today.clone(), yesterday.clone()];
    expected.sort();
    assert_eq!(
        &args[..5],
        ["scheduler", "--grace", "30s", "--listen", "0.0.0.0:8080"],
        "{args:?}"
    );
    assert_eq!(named, expected, "{args:?}");
    // Two replicas on one machine: each its own free port (in a pod, each its own IP).
    let mut args = args;
    args[4] = "127.0.0.1:0".to_string();
    assert_eq!(s.idem(&["migrate"]).status.code(), Some(0));
    let replica = || {
        Command::new(IDEM)
            .args(&args)
            .env("IDEM_STORE", &url)
            .env("IDEM_JOBS_DIR", s.dir.join("jobs"))
            .env_remove("RUST_LOG")
            .current_dir(&s.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start idem scheduler")
    };
    let replicas = [replica(), replica()];
    // Two replicas firing three jobs every second: 30 fires, ten times the scopes,
    // take some 15 s. Stopped once the ledger holds them, not after a fixed time.
    let fires_recorded = || -> usize {
        [&today, &yesterday, &command]
            .iter()
            .map(|job| {
                let (_, v, _) = s.json(&["runs", "--job", job, "--limit", "0"]);
                v.as_array().map_or(0, Vec::len)
            })
            .sum()
    };
    common::wait_until(
        "30 fires recorded",
        Duration::from_secs(300),
        Duration::from_millis(250),
        || fires_recorded() >= 30,
    );
    for r in &replicas {
        // SAFETY: kill(2) on a child we started and have not waited for.
        unsafe { libc::kill(r.id() as libc::pid_t, libc::SIGTERM) };
    }
    for r in replicas {
        let started = Instant::now();
        let out = r.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(started.elapsed() < Duration::from_secs(60), "{err}");
        assert!(err.contains("fire "), "each replica fired: {err}");
        assert!(err.contains("listening on 127.0.0.1:"), "{err}");
    }
    let mut completions: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut fires = 0;
    for job in [&today, &yesterday, &command] {
        let (code, v, err) = s.json(&["runs", "--job", job, "--limit", "0"]);
        assert_eq!(code, 0, "{err}");
        let runs = v.as_array().cloned().unwrap_or_default();
        fires += runs.len();
        for r in &runs {
            assert_eq!(r["trigger"], "scheduler", "{r}");
            match r["status"].as_str() {
                Some("completed") => {
                    *completions
                        .entry((job.to_string(), r["scope"].as_str().unwrap().to_string()))
                        .or_default() += 1;
                }
                Some("skipped") => assert!(
                    r["skip_reason"] == "time_window" || r["skip_reason"] == "in_progress",
                    "{r}"
                ),
                _ => panic!("a fire neither completed nor skipped: {r}"),
            }
        }
    }
    // Each job has one scope (its date): three scopes, each completed exactly once.
    assert_eq!(completions.len(), 3, "{completions:?}");
    assert!(completions.values().all(|n| *n == 1), "{completions:?}");
    assert!(fires >= 30, "only {fires} fires recorded");
    // The work itself ran once per scope.
    let days = s.warehouse_days();
    assert_eq!(days.len(), 2, "{days:?}");
    let done = std::fs::read_to_string(s.dir.join("jobs/done.txt")).unwrap_or_default();
    assert_eq!(done.lines().count(), 1, "{done}");
}

/// Whether every CronJob pod reads its Job's name from the pod label into
/// `IDEM_CRONJOB_JOB`.
fn cron_yaml_has_slot_env(yaml: &str) -> bool {
    let cron_jobs = yaml.matches("kind: \"CronJob\"").count();
    cron_jobs > 0
        && yaml.matches("- name: \"IDEM_CRONJOB_JOB\"").count() == cron_jobs
        && yaml
            .matches("fieldPath: \"metadata.labels['batch.kubernetes.io/job-name']\"")
            .count()
            == cron_jobs
}

/// `idem migrate --check` on the SQLite default: exit 1 while the file has no schema (and
/// the file is not created), 0 after `idem migrate`, a waiting check ending 0 once a
/// migration has run beside it, and `--wait` without `--check` or with a bad duration a
/// usage error.
#[test]
fn migrate_check_reads_the_schema_and_writes_nothing() {
    let s = Sandbox::new("idem-migrate-check");
    let file = s.dir.join("idem.db");
    let check = |args: &[&str]| common::parse(s.json_command(args).output().unwrap());
    let (code, doc, stderr) = check(&["migrate", "--check"]);
    assert_eq!(code, 1, "{doc}\n{stderr}");
    assert_eq!(doc["current"], false);
    assert_eq!(doc["version"], 0);
    assert!(!file.exists(), "a check creates no ledger");
    let waiting = s
        .json_command(&["migrate", "--check", "--wait", "2m"])
        .spawn()
        .unwrap();
    let (code, doc, _) = check(&["migrate"]);
    assert_eq!(
        (code, doc["migrated"].clone()),
        (0, serde_json::json!(true))
    );
    let (code, doc, stderr) = common::wait(waiting);
    assert_eq!(code, 0, "{doc}\n{stderr}");
    assert_eq!(doc["current"], true);
    assert_eq!(doc["version"], doc["latest"]);
    let (code, doc, _) = check(&["migrate", "--check"]);
    assert_eq!((code, doc["current"].clone()), (0, serde_json::json!(true)));
    for bad in [
        &["migrate", "--wait", "1m"][..],
        &["migrate", "--check", "--wait", "soon"],
    ] {
        let out = s.command(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
    }
}
