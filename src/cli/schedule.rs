//! `idem schedule` (the next fire times) and `idem schedule export` (crontab lines or
//! Cloud Scheduler commands).

use super::output;
use super::{scheduled_jobs, GlobalOptions, ScheduleArgs, ScheduleCommand, EXIT_OK};
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

pub(super) fn schedule(args: ScheduleArgs, g: &GlobalOptions) -> Result<u8> {
    if let Some(ScheduleCommand::Export(e)) = args.command {
        let jobs = scheduled(e.job.as_deref(), g)?;
        let kubernetes = || -> Result<kubernetes::KubernetesOptions> {
            let o = kubernetes::KubernetesOptions {
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
            o.validate(&g.store)?;
            Ok(o)
        };
        let (kind, text) = if e.kubernetes {
            ("kubernetes", kubernetes::cron_jobs(&jobs, &kubernetes()?)?)
        } else if let Some(replicas) = e.kubernetes_scheduler {
            (
                "kubernetes_scheduler",
                kubernetes::scheduler_deployment(
                    &jobs,
                    e.job.as_deref(),
                    replicas,
                    &kubernetes()?,
                )?,
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
            output::print_json(&serde_json::json!({ "export": kind, "text": text }));
        } else {
            output::print_text(&text);
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
