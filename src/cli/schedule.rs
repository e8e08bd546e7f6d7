//! `idem schedule` (the next fire times) and `idem schedule export` (crontab lines or
//! Cloud Scheduler commands).

use clap::Args;
use clap::Subcommand;
use std::path::PathBuf;

use super::output;
use super::{scheduled_jobs, GlobalOptions, EXIT_OK};
use crate::error::{Error, Result};
use crate::schedule::{self, export, kubernetes, ScheduledJob};

/// The jobs `idem schedule` works on: `name` only (it must have a schedule), or every job
/// with a schedule.
fn scheduled(name: Option<&str>, g: &GlobalOptions) -> Result<Vec<ScheduledJob>> {
    let names: Vec<String> = name.map(str::to_string).into_iter().collect();
    scheduled_jobs(&names, g)?
        .iter()
        .map(|j| j.scheduled())
        .collect()
}

/// A flag the chosen export does not read is an error, not silently dropped (
/// `--service-account` is Cloud Run's, Kubernetes pods take `--k8s-service-account`).
fn flags_fit_the_target(e: &ExportArgs) -> Result<()> {
    let kubernetes = e.kubernetes || e.kubernetes_scheduler.is_some();
    let cloud = e.cloud_scheduler.is_some();
    let target = if kubernetes {
        "a Kubernetes export"
    } else if cloud {
        "--cloud-scheduler"
    } else {
        "--crontab"
    };
    let misplaced = [
        ("--service-account", e.service_account.is_some(), cloud),
        ("--namespace", e.namespace.is_some(), kubernetes),
        ("--jobs-configmap", e.jobs_configmap.is_some(), kubernetes),
        (
            "--k8s-service-account",
            e.k8s_service_account.is_some(),
            kubernetes,
        ),
        ("--image", e.image.is_some(), cloud || kubernetes),
        (
            "--store-secret",
            e.store_secret.is_some(),
            cloud || kubernetes,
        ),
        ("--workdir", e.workdir.is_some(), e.crontab),
    ];
    for (flag, given, read) in misplaced {
        if given && !read {
            let hint = if flag == "--service-account" && kubernetes {
                " (Kubernetes pods run as --k8s-service-account)"
            } else {
                ""
            };
            return Err(Error::input(format!(
                "{flag} is not read by {target}{hint}"
            )));
        }
    }
    Ok(())
}

/// Cloud Run and CronJobs start one runner per slot; warn of what that leaves to the job:
/// a mode that never skips (a retry or a late start runs the date again) and catch-up,
/// which only `idem scheduler` does.
fn warn_single_runner_gaps(jobs: &[ScheduledJob]) {
    for job in jobs {
        if job.mode != crate::model::Mode::Enforce {
            tracing::warn!(
                "job {}: its mode is not enforce, so guards never skip: a retried or late \
                 start runs its date again",
                job.name
            );
        }
        if job.missed != schedule::Missed::Skip {
            tracing::warn!(
                "job {}: missed = \"catch_up\" is done by `idem scheduler` only; this export \
                 fires each slot once and a missed slot stays missed (backfill it with idem run \
                 --from --to)",
                job.name
            );
        }
    }
}

/// Cloud Run cannot hand a fire's slot to the retries of its task: a retry works out its
/// date (`date = "today"`, …) when it starts. Warns of each job whose retries can start
/// on another date than their fire's: a failed attempt may run to its `--task-timeout`
/// before the next starts, so the last retry can start `timeout × --max-retries` after
/// the fire (among the job's next 1,000 fires, the first that crosses is named). Only jobs
/// with a `timeout`: one without gets a day-long task, which would warn of every job;
/// docs/scheduling.md says what that means instead.
fn warn_retries_crossing_dates(jobs: &[ScheduledJob]) -> Result<()> {
    let now = chrono::Utc::now();
    for job in jobs.iter().filter(|j| j.timeout.is_some()) {
        let (tz, cron, date) = (job.tz()?, job.cron()?, job.date_expr()?);
        let timeout = export::run_deadline(job, std::time::Duration::from_secs(30));
        let Ok(span) = chrono::Duration::from_std(timeout * export::CLOUD_RUN_RETRIES) else {
            continue;
        };
        for fire in cron.upcoming(tz, now, 1000) {
            let fire = fire.with_timezone(&chrono::Utc);
            let Some(last) = fire.checked_add_signed(span) else {
                break;
            };
            let (first_date, last_date) = (date.resolve(tz, fire)?, date.resolve(tz, last)?);
            if first_date != last_date {
                tracing::warn!(
                    "job {}: a Cloud Run retry can process another date than its fire's: the \
                     fire at {} is for {first_date}, and with --task-timeout={}s and \
                     --max-retries={} its last retry can start at {}, for {last_date} (a \
                     retry works out its date when it starts). Fire it earlier, shorten its \
                     timeout, or run it from `idem scheduler` or a Kubernetes CronJob, which \
                     pass the slot",
                    job.name,
                    fire.with_timezone(&tz).format("%Y-%m-%d %H:%M %Z"),
                    timeout.as_secs(),
                    export::CLOUD_RUN_RETRIES,
                    last.with_timezone(&tz).format("%Y-%m-%d %H:%M %Z"),
                );
                break;
            }
        }
    }
    Ok(())
}

/// Writes an export on stdout: a file users install, so a failed write (a full disk) is an
/// error, not a truncated file and exit 0. A closed pipe (`| head`) is not.
fn print_export(text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::io("write", "standard output", e))
        }
        _ => Ok(()),
    }
}

pub(super) fn schedule(args: ScheduleArgs, g: &GlobalOptions) -> Result<u8> {
    if let Some(ScheduleCommand::Export(e)) = args.command {
        flags_fit_the_target(&e)?;
        let jobs = scheduled(e.job.as_deref(), g)?;
        if !e.crontab && e.kubernetes_scheduler.is_none() {
            warn_single_runner_gaps(&jobs);
        }
        let kubernetes = || -> Result<kubernetes::KubernetesOptions> {
            let o = kubernetes::KubernetesOptions {
                store: g.store.clone(),
                image: e.image.clone().ok_or_else(|| {
                    Error::input(
                        "a Kubernetes export needs --image: the image built from the Containerfile and \
                         pushed to your registry, such as registry.example.com/idem:1.0",
                    )
                })?,
                namespace: e.namespace.clone(),
                store_secret: e
                    .store_secret
                    .clone()
                    .unwrap_or_else(|| "idem-store".to_string()),
                jobs_dir: e.image_jobs_dir.clone(),
                jobs_configmap: e.jobs_configmap.clone(),
                service_account: e.k8s_service_account.clone(),
            };
            o.validate()?;
            Ok(o)
        };
        let (kind, text) = if e.kubernetes {
            ("kubernetes", kubernetes::cron_jobs(&jobs, &kubernetes()?)?)
        } else if let Some(replicas) = e.kubernetes_scheduler {
            (
                "kubernetes_scheduler",
                kubernetes::scheduler_deployment(&jobs, replicas, &kubernetes()?)?,
            )
        } else if let Some(target) = &e.cloud_scheduler {
            warn_retries_crossing_dates(&jobs)?;
            let mut o = export::CloudSchedulerOptions::new(
                target,
                &g.store,
                e.image.clone(),
                e.service_account.clone(),
                &e.image_jobs_dir,
            )?;
            o.store_secret = e.store_secret.clone();
            ("cloud_scheduler", export::cloud_scheduler(&jobs, &o)?)
        } else {
            let workdir = match e.workdir {
                Some(w) => w,
                None => std::env::current_dir()
                    .map_err(|err| Error::input(format!("--workdir: {err}")))?,
            };
            (
                "crontab",
                export::crontab(
                    &jobs,
                    &export::CrontabOptions {
                        bin: e.idem_bin.clone(),
                        store: g.store.clone(),
                        jobs_dir: g.jobs_dir.display().to_string(),
                        workdir: workdir.display().to_string(),
                        log_dir: e.log_dir.clone(),
                    },
                )?,
            )
        };
        if g.format == output::Format::Json {
            // The export is text to paste; JSON callers get it whole, with what it is.
            let doc = serde_json::json!({ "export": kind, "text": text });
            print_export(&format!("{doc:#}\n"))?;
        } else {
            print_export(&text)?;
        }
        return Ok(EXIT_OK);
    }
    let after = match &args.after {
        Some(a) => schedule::parse_instant("--after", a)?,
        None => chrono::Utc::now(),
    };
    let jobs = scheduled(args.job.as_deref(), g)?;
    let plans = schedule::plan(&jobs, after, args.next.into())?;
    output::print_plans(&plans, g.format);
    Ok(EXIT_OK)
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct ScheduleArgs {
    /// Only this job (name in --jobs-dir or path to a .toml file).
    pub(super) job: Option<String>,
    /// How many fire times to list per job.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub(super) next: u16,
    /// List the fire times after this instant (RFC 3339) instead of after now.
    #[arg(long, value_name = "RFC3339")]
    pub(super) after: Option<String>,
    #[command(subcommand)]
    pub(super) command: Option<ScheduleCommand>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Print the scheduled jobs as crontab lines, gcloud commands or Kubernetes manifests
    /// (text).
    Export(ExportArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["crontab", "cloud_scheduler", "kubernetes", "kubernetes_scheduler"])))]
pub(crate) struct ExportArgs {
    /// Only this job.
    pub(super) job: Option<String>,
    /// Crontab lines: CRON_TZ, schedule, `idem run JOB --date EXPR --trigger scheduler`.
    #[arg(long)]
    pub(super) crontab: bool,
    /// `gcloud` commands: a Cloud Run job per idem job and the Cloud Scheduler job that
    /// starts it.
    #[arg(long, value_name = "PROJECT/REGION")]
    pub(super) cloud_scheduler: Option<String>,
    /// Crontab: the idem binary the lines run (cron's PATH is short; give a full path).
    #[arg(long, default_value = "idem")]
    pub(super) idem_bin: String,
    /// Crontab: the folder each line runs in (default: the current folder).
    #[arg(long)]
    pub(super) workdir: Option<PathBuf>,
    /// Crontab: each job appends its output to LOG_DIR/JOB.log.
    #[arg(long, default_value = "/var/log/idem")]
    pub(super) log_dir: String,
    /// Kubernetes: one batch/v1 CronJob per job (YAML for `kubectl apply -f -`).
    #[arg(long)]
    pub(super) kubernetes: bool,
    /// Kubernetes: a Deployment of N `idem scheduler` replicas instead of CronJobs (the
    /// jobs' leases keep each slot to one run).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(super) kubernetes_scheduler: Option<u32>,
    /// Cloud Scheduler and Kubernetes: the image built from the Containerfile (Cloud
    /// Scheduler's default REGION-docker.pkg.dev/PROJECT/idem/idem:latest; required for
    /// Kubernetes).
    #[arg(long)]
    pub(super) image: Option<String>,
    /// Cloud Scheduler: the service account that starts and runs the jobs
    /// (default idem@PROJECT.iam.gserviceaccount.com).
    #[arg(long)]
    pub(super) service_account: Option<String>,
    /// Cloud Scheduler and Kubernetes: the jobs folder inside the image.
    #[arg(long, default_value = "/app/jobs")]
    pub(super) image_jobs_dir: String,
    /// Cloud Scheduler and Kubernetes: read the store URL from this secret instead of
    /// printing it (Secret Manager secret for Cloud Run; Kubernetes Secret, key `url`,
    /// default idem-store).
    #[arg(long, value_name = "NAME")]
    pub(super) store_secret: Option<String>,
    /// Kubernetes: the namespace of every object.
    #[arg(long)]
    pub(super) namespace: Option<String>,
    /// Kubernetes: mount the jobs folder from this ConfigMap instead of the image's.
    #[arg(long, value_name = "NAME")]
    pub(super) jobs_configmap: Option<String>,
    /// Kubernetes: the service account the pods run as (with Workload Identity, the one
    /// bound to a Google service account for BigQuery).
    #[arg(long, value_name = "NAME")]
    pub(super) k8s_service_account: Option<String>,
}
