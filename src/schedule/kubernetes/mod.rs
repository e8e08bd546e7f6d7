//! `idem schedule export --kubernetes` and `--kubernetes-scheduler N`: manifests for a
//! Kubernetes cluster, as YAML text (golden-tested, validated against Kubernetes' own
//! schema in CI).
//!
//! * **CronJobs** (`--kubernetes`): one `batch/v1` CronJob per scheduled job, running
//!   `idem run JOB --date EXPR --trigger scheduler` in the image, in the job's zone.
//! * **A scheduler Deployment** (`--kubernetes-scheduler N`): N replicas of `idem scheduler`
//!   firing every exported job; the replicas race for each slot and the job's lease lets
//!   exactly one of them run it (the others skip, `in_progress` or `time_window`).
//!
//! Both read the store URL from a Secret (never printed) and the jobs folder from the image
//! or a ConfigMap, and both name the same image and jobs folder as the Cloud Run export.
//! Both begin with a migrate Job (`idem migrate`, one per image), and every other pod waits
//! for the schema in an init container (`idem migrate --check --wait`). The Deployment's
//! replicas serve `--listen` on port 8080 (liveness `/healthz`, readiness `/readyz`,
//! `/metrics` for Prometheus), roll one at a time (`maxUnavailable: 0`), spread over nodes,
//! and a PodDisruptionBudget lets drains take one at a time. The pods: `pod.rs`.
//!
//! How the settings follow from the job (see [`CronJobTiming`]):
//! * `concurrencyPolicy: Allow`: each fire is its own scope, and the lease already keeps
//!   two pods off one scope; `Forbid` would drop a date whenever the previous run overran.
//! * `startingDeadlineSeconds`: 10 minutes. A pod evaluates the job's `date` when it starts,
//!   so a slot the controller starts late processes the date of its start: a short window
//!   keeps that the slot's date; a slot missed for longer is dropped (a backfill redoes it).
//! * `terminationGracePeriodSeconds`: the command's grace (SIGTERM → SIGKILL of its
//!   process group) plus 30 s to record the run as interrupted and release the lease.
//! * `activeDeadlineSeconds`: with a command `timeout`, every attempt's timeout and grace;
//!   otherwise a day.
//! * `backoffLimit: 2` and a pod failure policy that fails the Job at once on exit 2 (bad
//!   usage or configuration: a retry cannot help); a failed run wrote no key, so a retry
//!   redoes it.

use std::time::Duration;

use crate::error::{Error, Result};

use super::export::{
    crontab_fields, kubernetes_name, plain_value, run_deadline, shared_store_scheme,
};
use super::ScheduledJob;

mod pod;
mod yaml;

use pod::{fail_on_usage_errors, labels, metadata, migrate_job, pod_spec, Pod};
pub use pod::{migrate_job_name, IDEM_RESOURCES, SCHEDULER_PORT, SCHEMA_RESOURCES, SCHEMA_WAIT};
use yaml::{s, secs, Yaml};

/// Where and how the manifests run idem.
#[derive(Debug, Clone)]
pub struct KubernetesOptions {
    /// The image built from the Containerfile (required: the registry is the user's).
    pub image: String,
    /// The store URL the export is for (checked, never printed: the pods read it from the
    /// Secret).
    pub store: String,
    /// `metadata.namespace` of every object, if set.
    pub namespace: Option<String>,
    /// The Secret holding the store URL under the key `url`.
    pub store_secret: String,
    /// The jobs folder inside the container (`IDEM_JOBS_DIR`).
    pub jobs_dir: String,
    /// A ConfigMap mounted at `jobs_dir` instead of the image's jobs folder.
    pub jobs_configmap: Option<String>,
    /// The Kubernetes service account the pods run as, if set.
    pub service_account: Option<String>,
}

impl KubernetesOptions {
    /// Checks the store and the names before anything is printed: a SQLite or memory store
    /// is refused (pods keep no disk between runs, and replicas would not share it), and
    /// `--image` is required.
    pub fn validate(&self) -> Result<()> {
        shared_store_scheme(&self.store, "a Kubernetes pod")?;
        plain_value("--image", &self.image)?;
        for (flag, name) in [
            ("--namespace", self.namespace.as_deref()),
            ("--store-secret", Some(self.store_secret.as_str())),
            ("--jobs-configmap", self.jobs_configmap.as_deref()),
            ("--k8s-service-account", self.service_account.as_deref()),
        ] {
            if let Some(name) = name {
                dns_label(flag, name, if flag == "--namespace" { 63 } else { 253 })?;
            }
        }
        if !self.jobs_dir.starts_with('/') {
            return Err(Error::config(format!(
                "--image-jobs-dir {:?}: the jobs folder inside the image must be an absolute path",
                self.jobs_dir
            )));
        }
        Ok(())
    }
}

/// A Kubernetes object name: lower-case letters, digits, `-` and `.` (`.` not for a
/// namespace), starting and ending with a letter or digit.
fn dns_label(flag: &str, name: &str, max: usize) -> Result<()> {
    let ok_char = |c: char| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (c == '.' && max > 63)
    };
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if name.len() > max
        || !name.chars().all(ok_char)
        || !edge(name.chars().next())
        || !edge(name.chars().last())
    {
        return Err(Error::config(format!(
            "{flag} {name:?}: not a Kubernetes name (lower-case letters, digits and '-', \
             starting and ending with a letter or digit, at most {max} characters)"
        )));
    }
    Ok(())
}

/// The CronJob settings that follow from a job's lease, grace and timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CronJobTiming {
    /// `startingDeadlineSeconds`: [`STARTING_DEADLINE`].
    pub starting_deadline: Duration,
    /// `terminationGracePeriodSeconds`: the command's grace + [`RECORD_MARGIN`].
    pub termination_grace: Duration,
    /// `activeDeadlineSeconds`: every attempt's timeout and termination grace, or a day.
    pub active_deadline: Duration,
    /// `backoffLimit`.
    pub backoff_limit: u32,
}

/// The time idem is given after SIGTERM, beyond the command's grace, to record the run as
/// interrupted and release its lease (a BigQuery call takes seconds).
pub const RECORD_MARGIN: Duration = Duration::from_secs(30);

/// How late the CronJob controller may start a slot (it was down or busy) before dropping
/// it: the pod evaluates the job's `date` when it starts, so a short window keeps it the
/// slot's date.
pub const STARTING_DEADLINE: Duration = Duration::from_secs(600);

impl CronJobTiming {
    /// The settings for `job`; an error when it has no lease (two overlapping fires of
    /// one scope would then both run).
    pub fn for_job(job: &ScheduledJob) -> Result<CronJobTiming> {
        job.lease.ok_or_else(|| {
            Error::config(format!(
                "job {}: has no lease (guards.lease); two Kubernetes Jobs of one slot (a late \
                 start, a retry) could then run the same date at once: set guards.lease",
                job.name
            ))
        })?;
        let secs = |d: Duration| Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0));
        let backoff_limit = 2;
        let termination_grace = secs(job.grace.unwrap_or_default()) + RECORD_MARGIN;
        let active_deadline = match job.timeout {
            Some(_) => run_deadline(job, RECORD_MARGIN)
                .checked_mul(backoff_limit + 1)
                .ok_or_else(|| {
                    Error::config(format!("job {}: [command] timeout is too long", job.name))
                })?,
            None => run_deadline(job, RECORD_MARGIN),
        };
        Ok(CronJobTiming {
            starting_deadline: STARTING_DEADLINE,
            termination_grace,
            active_deadline,
            backoff_limit,
        })
    }
}

fn header(out: &mut String, what: &str, o: &KubernetesOptions) {
    let example = if crate::backend::Backend::named(&o.store.to_ascii_lowercase())
        == Some(crate::backend::Backend::BigQuery)
    {
        "bigquery://PROJECT/DATASET"
    } else {
        "postgres://USER:PASSWORD@HOST/DB"
    };
    let ns = o
        .namespace
        .as_ref()
        .map(|n| format!(" --namespace={n}"))
        .unwrap_or_default();
    out.push_str(&format!(
        "# idem schedule export {what}\n\
         # Apply with: kubectl apply{ns} -f THIS_FILE\n\
         # The store URL comes from the Secret {secret:?} (key \"url\"), created once:\n\
         #   kubectl create secret generic {secret}{ns} --from-literal=url='{example}'\n",
        secret = o.store_secret
    ));
    if let Some(cm) = &o.jobs_configmap {
        out.push_str(&format!(
            "# The jobs folder comes from the ConfigMap {cm:?}, mounted at {}:\n\
             #   kubectl create configmap {cm}{ns} --from-file=jobs/\n",
            o.jobs_dir
        ));
    } else {
        out.push_str(&format!(
            "# The jobs folder is the image's {} (the Containerfile copies jobs/ there).\n",
            o.jobs_dir
        ));
    }
    out.push_str(&format!(
        "# The Job {} runs `idem migrate` for this image; every other pod waits for the schema\n\
         # first (init container `idem migrate --check --wait {SCHEMA_WAIT}`).\n",
        migrate_job_name(&o.image)
    ));
}

fn document(out: &mut String, comment: &str, object: Yaml) {
    out.push_str("---\n");
    out.push_str(comment);
    object.write(0, out);
}

/// Names every exported job's object and refuses two that would collide.
fn names(jobs: &[ScheduledJob]) -> Result<Vec<String>> {
    let mut seen: std::collections::HashMap<String, &str> = std::collections::HashMap::new();
    let mut out = Vec::new();
    for job in jobs {
        // A CronJob's Jobs add an 11-character suffix to its name, within 63.
        let name = kubernetes_name(&job.name, 52, "Kubernetes CronJob")?;
        if let Some(other) = seen.insert(name.clone(), &job.name) {
            return Err(Error::config(format!(
                "jobs {other:?} and {:?} both export as CronJob {name:?} (names are \
                 lowercased, `_` becomes `-`): the second would replace the first; rename one \
                 of them",
                job.name
            )));
        }
        out.push(name);
    }
    Ok(out)
}

/// One CronJob per job in `jobs` (those with a schedule).
pub fn cron_jobs(jobs: &[ScheduledJob], o: &KubernetesOptions) -> Result<String> {
    if jobs.is_empty() {
        return Err(Error::config(
            "no job with a schedule in the jobs folder: nothing to export",
        ));
    }
    let names = names(jobs)?;
    let mut out = String::new();
    header(&mut out, "--kubernetes", o);
    let (comment, migrate) = migrate_job(o);
    document(&mut out, &comment, migrate);
    for (job, name) in jobs.iter().zip(&names) {
        let tz = job.tz()?;
        let fields = crontab_fields(job, "a Kubernetes CronJob")?;
        let date = job.date_expr()?.to_string();
        let t = CronJobTiming::for_job(job)?;
        // The date comes from the slot, not from when a retry starts: the Job a CronJob
        // makes for a slot is named after its minute, which the pod reads from its
        // `batch.kubernetes.io/job-name` label (Kubernetes 1.27+) and Kubernetes puts into
        // the argument ($(VAR) in args).
        let args: Vec<String> = [
            "run",
            &job.name,
            "--date",
            &date,
            "--scheduled-at",
            "cronjob:$(IDEM_CRONJOB_JOB)",
            "--trigger",
            "scheduler",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        let job_name = Yaml::Map(vec![
            ("name", s("IDEM_CRONJOB_JOB")),
            (
                "valueFrom",
                Yaml::Map(vec![(
                    "fieldRef",
                    Yaml::Map(vec![(
                        "fieldPath",
                        s("metadata.labels['batch.kubernetes.io/job-name']"),
                    )]),
                )]),
            ),
        ]);
        let pod = Pod {
            args,
            extra_env: vec![job_name],
            grace: t.termination_grace,
            restart: "Never",
            probes: None,
            wait_for_schema: true,
            resources: IDEM_RESOURCES,
        };
        let pod = Yaml::Map(vec![
            ("metadata", Yaml::Map(vec![("labels", labels("job", name))])),
            ("spec", pod_spec(&pod, o, Vec::new())),
        ]);
        let job_spec = Yaml::Map(vec![
            ("backoffLimit", Yaml::Int(u64::from(t.backoff_limit))),
            ("activeDeadlineSeconds", secs(t.active_deadline)),
            ("podFailurePolicy", fail_on_usage_errors()),
            ("template", pod),
        ]);
        let cron_job = Yaml::Map(vec![
            ("apiVersion", s("batch/v1")),
            ("kind", s("CronJob")),
            ("metadata", metadata(name, "job", o, Some(&job.name))),
            (
                "spec",
                Yaml::Map(vec![
                    ("schedule", s(&fields)),
                    ("timeZone", s(tz.name())),
                    ("concurrencyPolicy", s("Allow")),
                    ("startingDeadlineSeconds", secs(t.starting_deadline)),
                    ("successfulJobsHistoryLimit", Yaml::Int(3)),
                    ("failedJobsHistoryLimit", Yaml::Int(3)),
                    (
                        "jobTemplate",
                        Yaml::Map(vec![
                            ("metadata", Yaml::Map(vec![("labels", labels("job", name))])),
                            ("spec", job_spec),
                        ]),
                    ),
                ]),
            ),
        ]);
        let comment = format!(
            "# {}: {:?} in {}, date {}, lease {}s\n",
            job.name,
            job.schedule,
            tz.name(),
            date,
            job.lease.unwrap_or_default().as_secs()
        );
        document(&mut out, &comment, cron_job);
    }
    Ok(out)
}

/// The scheduler's own `--grace` in the Deployment: how long running jobs may finish after
/// SIGTERM before idem stops them.
pub const SCHEDULER_GRACE: Duration = Duration::from_secs(30);

/// A Deployment of `replicas` `idem scheduler` processes firing `jobs`, named on its
/// command line (the pods fire those that were checked here, not whatever else the image's
/// jobs folder holds).
pub fn scheduler_deployment(
    jobs: &[ScheduledJob],
    replicas: u32,
    o: &KubernetesOptions,
) -> Result<String> {
    if jobs.is_empty() {
        return Err(Error::config(
            "no job with a schedule in the jobs folder: nothing to export",
        ));
    }
    for job in jobs {
        // Every replica fires every slot: the lease keeps them off one scope at once, the
        // time window makes the replicas that waited for it skip once it completed.
        let missing = if job.lease.is_none() {
            Some("no lease (guards.lease)")
        } else if job.time_window.is_none() {
            Some("no time window (guards.time_window)")
        } else if job.mode != crate::model::Mode::Enforce {
            Some("a mode other than enforce")
        } else {
            None
        };
        if let Some(missing) = missing {
            return Err(Error::config(format!(
                "job {}: has {missing}; each of the {replicas} scheduler replicas fires every \
                 slot, and without both guards enforced each replica would run it in turn: \
                 set guards.lease and guards.time_window with mode = \"enforce\", or export \
                 it as a CronJob (--kubernetes)",
                job.name
            )));
        }
        job.cron()?;
    }
    let command_grace = jobs
        .iter()
        .filter_map(|j| j.grace)
        .max()
        .unwrap_or_default();
    let grace = SCHEDULER_GRACE + Duration::from_secs(command_grace.as_secs()) + RECORD_MARGIN;
    let mut args = vec![
        "scheduler".to_string(),
        "--grace".to_string(),
        format!("{}s", SCHEDULER_GRACE.as_secs()),
        "--listen".to_string(),
        format!("0.0.0.0:{SCHEDULER_PORT}"),
    ];
    args.extend(jobs.iter().map(|j| j.name.clone()));
    let name = "idem-scheduler";
    let mut out = String::new();
    header(&mut out, &format!("--kubernetes-scheduler {replicas}"), o);
    let (comment, migrate) = migrate_job(o);
    document(&mut out, &comment, migrate);
    let selector = || {
        Yaml::Map(vec![(
            "matchLabels",
            Yaml::Map(vec![
                ("app.kubernetes.io/name", s("idem")),
                ("app.kubernetes.io/component", s("scheduler")),
                ("app.kubernetes.io/instance", s(name)),
            ]),
        )])
    };
    let pod = Pod {
        args,
        extra_env: Vec::new(),
        grace,
        restart: "Always",
        probes: Some(SCHEDULER_PORT),
        wait_for_schema: true,
        resources: IDEM_RESOURCES,
    };
    // Replicas on different nodes where the cluster has them (a node's loss leaves the
    // others firing), without refusing to schedule where it has not.
    let spread = Yaml::List(vec![Yaml::Map(vec![
        ("maxSkew", Yaml::Int(1)),
        ("topologyKey", s("kubernetes.io/hostname")),
        ("whenUnsatisfiable", s("ScheduleAnyway")),
        ("labelSelector", selector()),
    ])]);
    let port = SCHEDULER_PORT.to_string();
    let deployment = Yaml::Map(vec![
        ("apiVersion", s("apps/v1")),
        ("kind", s("Deployment")),
        ("metadata", metadata(name, "scheduler", o, None)),
        (
            "spec",
            Yaml::Map(vec![
                ("replicas", Yaml::Int(u64::from(replicas))),
                ("selector", selector()),
                // A rollout starts a new replica and waits for it to be ready (its store
                // reachable) before stopping an old one: never fewer replicas firing.
                (
                    "strategy",
                    Yaml::Map(vec![
                        ("type", s("RollingUpdate")),
                        (
                            "rollingUpdate",
                            Yaml::Map(vec![
                                ("maxUnavailable", Yaml::Int(0)),
                                ("maxSurge", Yaml::Int(1)),
                            ]),
                        ),
                    ]),
                ),
                (
                    "template",
                    Yaml::Map(vec![
                        (
                            "metadata",
                            Yaml::Map(vec![
                                ("labels", labels("scheduler", name)),
                                (
                                    "annotations",
                                    Yaml::Map(vec![
                                        ("prometheus.io/scrape", s("true")),
                                        ("prometheus.io/port", s(&port)),
                                        ("prometheus.io/path", s("/metrics")),
                                    ]),
                                ),
                            ]),
                        ),
                        (
                            "spec",
                            pod_spec(&pod, o, vec![("topologySpreadConstraints", spread)]),
                        ),
                    ]),
                ),
            ]),
        ),
    ]);
    let listed: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
    let comment = format!(
        "# {replicas} replicas of `idem scheduler` firing {}; each slot runs once: the \
         replicas race for the job's lease and the others skip\n",
        listed.join(", ")
    );
    document(&mut out, &comment, deployment);
    // A voluntary disruption (a node drain, an upgrade) takes one replica at a time.
    let budget = Yaml::Map(vec![
        ("apiVersion", s("policy/v1")),
        ("kind", s("PodDisruptionBudget")),
        ("metadata", metadata(name, "scheduler", o, None)),
        (
            "spec",
            Yaml::Map(vec![
                ("maxUnavailable", Yaml::Int(1)),
                ("selector", selector()),
            ]),
        ),
    ]);
    document(
        &mut out,
        "# Drains and upgrades stop one replica at a time\n",
        budget,
    );
    Ok(out)
}
