//! `idem exec NAME [guards] -- PROGRAM ARGS…`: a crontab line's program behind the guards,
//! with no job file. It runs exactly as a command job called NAME would (the same ledger,
//! `runs` and `report`): the flags are written into a job in memory and validated as a
//! job file is.

use super::output;
use super::{cancel_on_signals, ExecArgs, GlobalOptions};
use crate::error::{Error, Result};
use crate::job::{plan, Job, Overrides};
use crate::model::Trigger;
use crate::processor::Registry;

impl ExecArgs {
    /// The job the flags describe, validated as a job file would be; errors name the flag.
    fn job(&self) -> Result<Job> {
        let mut guards = toml::Table::new();
        let put = |table: &mut toml::Table, key: &str, value: &Option<String>| {
            if let Some(v) = value {
                table.insert(key.to_string(), toml::Value::String(v.clone()));
            }
        };
        put(&mut guards, "time_window", &self.time_window);
        put(&mut guards, "content_hash", &self.content_hash);
        put(&mut guards, "lease", &self.lease);
        let mut command = toml::Table::new();
        command.insert(
            "run".into(),
            toml::Value::Array(
                self.argv
                    .iter()
                    .map(|a| toml::Value::String(a.clone()))
                    .collect(),
            ),
        );
        if let Some(content) = &self.content {
            let argv = shlex::split(content)
                .filter(|a| !a.is_empty())
                .ok_or_else(|| {
                    Error::input(format!(
                        "--content {content:?}: not a command line (unbalanced quotes?); it is \
                     split like a shell's words but no shell runs it"
                    ))
                })?;
            command.insert(
                "content".into(),
                toml::Value::Array(argv.into_iter().map(toml::Value::String).collect()),
            );
        }
        put(&mut command, "timeout", &self.timeout);
        put(&mut command, "grace", &self.grace);
        let mut job = toml::Table::new();
        job.insert("name".into(), toml::Value::String(self.name.clone()));
        job.insert(
            "processor".into(),
            toml::Value::String(crate::command::COMMAND_PROCESSOR.into()),
        );
        job.insert(
            "date".into(),
            toml::Value::String(self.date.clone().unwrap_or_else(|| "today".into())),
        );
        put(&mut job, "timezone", &self.timezone);
        if !self.param.is_empty() {
            let params: toml::Table = self
                .param
                .iter()
                .map(|(k, v)| (k.clone(), toml::Value::String(v.clone())))
                .collect();
            job.insert("params".into(), toml::Value::Table(params));
        }
        job.insert("guards".into(), toml::Value::Table(guards));
        job.insert("command".into(), toml::Value::Table(command));
        let text = toml::to_string(&job)
            .map_err(|e| Error::input(format!("idem exec {}: {e}", self.name)))?;
        // A job "file" that names the command line: errors read `job file <idem exec NAME>: …`,
        // and the program runs in the current folder.
        let path = format!("<idem exec {}>", self.name);
        Job::parse(&text, std::path::Path::new(&path)).map_err(|e| {
            Error::config(e.to_string().replacen(
                &format!("job file {path}"),
                &format!("idem exec {}", self.name),
                1,
            ))
        })
    }
}

/// `idem exec`: one run of the program through the guards, recorded like `idem run`'s.
pub(super) async fn exec(args: &ExecArgs, g: &GlobalOptions, registry: &Registry) -> Result<u8> {
    if let Some(path) = &args.metrics_file {
        super::refuse_to_overwrite("--metrics-file", path, &[], &g.store)?;
    }
    let job = args.job()?;
    let cancel = cancel_on_signals()?;
    let overrides = Overrides {
        mode: args.mode,
        store_failure: None,
        trigger: Some(args.trigger.unwrap_or(Trigger::Manual)),
        scope: args.scope.clone(),
        run_id: args.run_id.clone(),
        cancel: Some(cancel),
        spool: true,
        params: args.param.iter().cloned().collect(),
        connections: None,
    };
    let date = job.run_date(None, args.scheduled_at.as_deref(), chrono::Utc::now())?;
    let request = overrides.request(&job, date)?;
    let plan = plan(&job, registry, &g.store, overrides).await?;
    let report = plan.runner.run(&*plan.processor, request).await?;
    output::print_report(&report, g.format);
    if let Some(path) = &args.metrics_file {
        super::metrics::write_atomically(path, &super::metrics::run_metrics(&report))?;
    }
    Ok(report.exit_code())
}
