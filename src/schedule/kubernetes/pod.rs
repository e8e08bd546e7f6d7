//! The pods of the Kubernetes exports: labels, the `idem` container every pod runs, the
//! init container that waits for the schema, and the migrate Job.
//!
//! Every pod is what Pod Security's `restricted` level asks, with the image's user and
//! group (10001) said outright: a read-only root filesystem (the working folder, where the
//! spool lives, and `/tmp` are `emptyDir` volumes), no API token, every capability dropped.
//!
//! Resources (see docs/deploy.md): each container *requests* what idem needs to schedule
//! and record runs ([`IDEM_RESOURCES`]); memory has a *limit* (a leak or a runaway command
//! restarts the pod instead of starving its node), CPU has none (a throttled scheduler
//! ticks late and misses its liveness probe; a request is what the scheduler reserves).
//! A command job runs its program inside this container: raise the memory limit to what
//! the program needs.

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::yaml::{s, secs, Yaml};
use super::KubernetesOptions;

/// The port `idem scheduler --listen` serves its probes and metrics on in the Deployment.
pub const SCHEDULER_PORT: u64 = 8080;

/// How long a pod's init container waits for the migrate Job to bring the schema up to
/// date (`idem migrate --check --wait`).
pub const SCHEMA_WAIT: &str = "10m";

/// CPU request, memory request and memory limit of a container running jobs.
pub const IDEM_RESOURCES: (&str, &str, &str) = ("100m", "128Mi", "512Mi");

/// The same for a container that only reads or migrates the schema.
pub const SCHEMA_RESOURCES: (&str, &str, &str) = ("10m", "32Mi", "128Mi");

pub(super) fn labels(component: &str, name: &str) -> Yaml {
    Yaml::Map(vec![
        ("app.kubernetes.io/name", s("idem")),
        ("app.kubernetes.io/component", s(component)),
        ("app.kubernetes.io/instance", s(name)),
    ])
}

pub(super) fn metadata(
    name: &str,
    component: &str,
    o: &KubernetesOptions,
    job: Option<&str>,
) -> Yaml {
    let mut m = vec![("name", s(name))];
    if let Some(ns) = &o.namespace {
        m.push(("namespace", s(ns)));
    }
    m.push(("labels", labels(component, name)));
    if let Some(job) = job {
        m.push(("annotations", Yaml::Map(vec![("idem/job", s(job))])));
    }
    Yaml::Map(m)
}

/// What a pod runs besides what every pod shares.
pub(super) struct Pod {
    /// The `idem` container's arguments.
    pub args: Vec<String>,
    /// Environment beyond the store, the jobs folder and the log format.
    pub extra_env: Vec<Yaml>,
    /// `terminationGracePeriodSeconds`.
    pub grace: Duration,
    /// `restartPolicy`.
    pub restart: &'static str,
    /// `Some(port)` for the scheduler: the port named `http`, probed on `/healthz` and
    /// `/readyz`.
    pub probes: Option<u64>,
    /// Whether an init container waits for the schema first (every pod but the migrate
    /// Job's).
    pub wait_for_schema: bool,
    /// The `idem` container's resources.
    pub resources: (&'static str, &'static str, &'static str),
}

/// One container of the image: `args`, the store from the Secret, the jobs folder, JSON
/// logs, the restricted security context and the pod's volumes.
fn container(
    name: &str,
    pod: &Pod,
    args: &[String],
    o: &KubernetesOptions,
) -> Vec<(&'static str, Yaml)> {
    let mut env = vec![
        Yaml::Map(vec![
            ("name", s("IDEM_STORE")),
            (
                "valueFrom",
                Yaml::Map(vec![(
                    "secretKeyRef",
                    Yaml::Map(vec![("name", s(&o.store_secret)), ("key", s("url"))]),
                )]),
            ),
        ]),
        Yaml::Map(vec![
            ("name", s("IDEM_JOBS_DIR")),
            ("value", s(&o.jobs_dir)),
        ]),
        // One JSON object per line, each at its severity (Cloud Logging on GKE files plain
        // stderr as ERROR whatever it says).
        Yaml::Map(vec![("name", s("IDEM_LOG_FORMAT")), ("value", s("json"))]),
    ];
    let main = name == "idem";
    if main {
        env.extend(pod.extra_env.iter().map(Yaml::clone));
    }
    let (cpu, memory, memory_limit) = if main {
        pod.resources
    } else {
        SCHEMA_RESOURCES
    };
    let mut c = vec![
        ("name", s(name)),
        ("image", s(&o.image)),
        ("args", Yaml::List(args.iter().map(|a| s(a)).collect())),
        ("env", Yaml::List(env)),
        (
            "resources",
            Yaml::Map(vec![
                (
                    "requests",
                    Yaml::Map(vec![("cpu", s(cpu)), ("memory", s(memory))]),
                ),
                ("limits", Yaml::Map(vec![("memory", s(memory_limit))])),
            ]),
        ),
        (
            "securityContext",
            Yaml::Map(vec![
                ("allowPrivilegeEscalation", Yaml::Bool(false)),
                ("readOnlyRootFilesystem", Yaml::Bool(true)),
                (
                    "capabilities",
                    Yaml::Map(vec![("drop", Yaml::List(vec![s("ALL")]))]),
                ),
            ]),
        ),
    ];
    if let (true, Some(port)) = (main, pod.probes) {
        c.push((
            "ports",
            Yaml::List(vec![Yaml::Map(vec![
                ("name", s("http")),
                ("containerPort", Yaml::Int(port)),
                ("protocol", s("TCP")),
            ])]),
        ));
        let probe = |path: &str, timeout: u64| {
            Yaml::Map(vec![
                (
                    "httpGet",
                    Yaml::Map(vec![("path", s(path)), ("port", s("http"))]),
                ),
                ("periodSeconds", Yaml::Int(10)),
                ("timeoutSeconds", Yaml::Int(timeout)),
                ("failureThreshold", Yaml::Int(3)),
            ])
        };
        // Alive while the loop ticks (at least every 10 s); ready while the store answers
        // (within 2 s), so a rollout waits for replicas that can reach it.
        c.push(("livenessProbe", probe("/healthz", 3)));
        c.push(("readinessProbe", probe("/readyz", 5)));
    }
    // What idem writes (the spool of results the store could not take, under the working
    // folder; temporary files) goes to volumes of the pod's own.
    let mount = |name: &str, path: &str, read_only: bool| {
        let mut m = vec![("name", s(name)), ("mountPath", s(path))];
        if read_only {
            m.push(("readOnly", Yaml::Bool(true)));
        }
        Yaml::Map(m)
    };
    let mut mounts = vec![
        mount("work", "/var/lib/idem", false),
        mount("tmp", "/tmp", false),
    ];
    if o.jobs_configmap.is_some() {
        mounts.push(mount("jobs", &o.jobs_dir, true));
    }
    c.push(("volumeMounts", Yaml::List(mounts)));
    c
}

/// The pod spec every export shares.
pub(super) fn pod_spec(pod: &Pod, o: &KubernetesOptions, extra: Vec<(&'static str, Yaml)>) -> Yaml {
    let mut spec = vec![("restartPolicy", s(pod.restart))];
    if let Some(sa) = &o.service_account {
        spec.push(("serviceAccountName", s(sa)));
    }
    spec.push(("terminationGracePeriodSeconds", secs(pod.grace)));
    // idem never calls the Kubernetes API: no token in the pod.
    spec.push(("automountServiceAccountToken", Yaml::Bool(false)));
    spec.push((
        "securityContext",
        Yaml::Map(vec![
            ("runAsNonRoot", Yaml::Bool(true)),
            ("runAsUser", Yaml::Int(10001)),
            ("runAsGroup", Yaml::Int(10001)),
            ("fsGroup", Yaml::Int(10001)),
            (
                "seccompProfile",
                Yaml::Map(vec![("type", s("RuntimeDefault"))]),
            ),
        ]),
    ));
    if pod.wait_for_schema {
        // Nothing runs on a schema older than this image's: the pod waits for the migrate
        // Job (its init container exits non-zero while the schema is behind).
        let check: Vec<String> = ["migrate", "--check", "--wait", SCHEMA_WAIT]
            .iter()
            .map(|a| a.to_string())
            .collect();
        spec.push((
            "initContainers",
            Yaml::List(vec![Yaml::Map(container(
                "wait-for-schema",
                pod,
                &check,
                o,
            ))]),
        ));
    }
    spec.push((
        "containers",
        Yaml::List(vec![Yaml::Map(container("idem", pod, &pod.args, o))]),
    ));
    let empty_dir =
        |name: &str| Yaml::Map(vec![("name", s(name)), ("emptyDir", Yaml::Map(Vec::new()))]);
    let mut volumes = vec![empty_dir("work"), empty_dir("tmp")];
    if let Some(cm) = &o.jobs_configmap {
        volumes.push(Yaml::Map(vec![
            ("name", s("jobs")),
            ("configMap", Yaml::Map(vec![("name", s(cm))])),
        ]));
    }
    spec.push(("volumes", Yaml::List(volumes)));
    spec.extend(extra);
    Yaml::Map(spec)
}

/// The migrate Job's name: one per image (`idem-migrate-` and 10 hex digits of the image's
/// SHA-256), so applying the export with a new image starts a new Job instead of failing
/// on the old one's immutable template; a finished Job is deleted after a day.
pub fn migrate_job_name(image: &str) -> String {
    let digest = Sha256::digest(image.as_bytes());
    let hex: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
    format!("idem-migrate-{hex}")
}

/// The Job running `idem migrate` once per image, before the pods that wait for it.
pub(super) fn migrate_job(o: &KubernetesOptions) -> (String, Yaml) {
    let name = migrate_job_name(&o.image);
    let pod = Pod {
        args: vec!["migrate".to_string()],
        extra_env: Vec::new(),
        grace: Duration::from_secs(30),
        restart: "Never",
        probes: None,
        wait_for_schema: false,
        resources: SCHEMA_RESOURCES,
    };
    let job = Yaml::Map(vec![
        ("apiVersion", s("batch/v1")),
        ("kind", s("Job")),
        ("metadata", metadata(&name, "migrate", o, None)),
        (
            "spec",
            Yaml::Map(vec![
                // A store still starting: tried again, with Kubernetes' backoff.
                ("backoffLimit", Yaml::Int(6)),
                ("activeDeadlineSeconds", Yaml::Int(1800)),
                ("ttlSecondsAfterFinished", Yaml::Int(86400)),
                ("podFailurePolicy", fail_on_usage_errors()),
                (
                    "template",
                    Yaml::Map(vec![
                        (
                            "metadata",
                            Yaml::Map(vec![("labels", labels("migrate", &name))]),
                        ),
                        ("spec", pod_spec(&pod, o, Vec::new())),
                    ]),
                ),
            ]),
        ),
    ]);
    let comment = format!(
        "# {name}: `idem migrate` once for this image (the pods below wait for it); re-applied \
         with a new image, a new Job\n"
    );
    (comment, job)
}

/// A pod failure policy failing the Job at once on exit 2 (bad usage or configuration: a
/// retry cannot help).
pub(super) fn fail_on_usage_errors() -> Yaml {
    Yaml::Map(vec![(
        "rules",
        Yaml::List(vec![Yaml::Map(vec![
            ("action", s("FailJob")),
            (
                "onExitCodes",
                Yaml::Map(vec![
                    ("containerName", s("idem")),
                    ("operator", s("In")),
                    ("values", Yaml::List(vec![Yaml::Int(2)])),
                ]),
            ),
            // Required (empty) by the 1.26–1.27 schema; later ones omit it.
            ("onPodConditions", Yaml::List(Vec::new())),
        ])]),
    )])
}
