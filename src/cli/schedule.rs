//! `idem schedule` (the next fire times) and `idem schedule export` (crontab lines or
//! Cloud Scheduler commands).

use super::output;
use super::{scheduled_jobs, GlobalOptions, ScheduleArgs, ScheduleCommand, EXIT_OK};
use crate::error::{Error, Result};
use crate::schedule::{self, export, ScheduledJob};

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
        let text = match &e.cloud_scheduler {
            Some(target) => export::cloud_scheduler(
                &jobs,
                &export::CloudSchedulerOptions::new(
                    target,
                    &g.store,
                    e.image.clone(),
                    e.service_account.clone(),
                    &e.image_jobs_dir,
                )?,
            )?,
            None => {
                let workdir = match e.workdir {
                    Some(w) => w,
                    None => std::env::current_dir()
                        .map_err(|err| Error::input(format!("--workdir: {err}")))?,
                };
                export::crontab(
                    &jobs,
                    &export::CrontabOptions {
                        bin: e.idem_bin.clone(),
                        store: g.store.clone(),
                        jobs_dir: g.jobs_dir.display().to_string(),
                        workdir: workdir.display().to_string(),
                        log_dir: e.log_dir.clone(),
                    },
                )?
            }
        };
        if g.format == output::Format::Json {
            // The export is text to paste; JSON callers get it whole, with what it is.
            let kind = if e.cloud_scheduler.is_some() {
                "cloud_scheduler"
            } else {
                "crontab"
            };
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
