//! `idem schedule` (the next fire times) and `idem schedule export` (crontab lines or
//! Cloud Scheduler commands).

use super::output;
use super::{scheduled_jobs, ExportArgs, GlobalOptions, ScheduleArgs, ScheduleCommand, EXIT_OK};
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
