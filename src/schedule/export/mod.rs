//! `idem schedule export`: crontab lines and Cloud Scheduler commands for the scheduled jobs.
//!
//! Both are plain text, exact and deterministic (golden-tested), so a diff of the export
//! shows what changes in production.
//!
//! * **crontab**: per job a `CRON_TZ=` line (the zone the next line's schedule is read in,
//!   honoured by cronie and every cron derived from Vixie cron 4) and one line that runs
//!   `idem run JOB --date EXPR --trigger scheduler` from the working folder, appending its
//!   output to `LOG_DIR/JOB.log`. `%` is escaped as `\%` (cron turns a bare `%` into a
//!   newline). The date expression is evaluated by idem in the job's zone, so the date is
//!   right even on a cron that ignores `CRON_TZ` (only the firing hour would move).
//! * **Cloud Scheduler**: per job a `gcloud run jobs deploy` of a Cloud Run job that runs
//!   `idem run JOB --date EXPR --trigger scheduler`, and a `gcloud scheduler jobs create
//!   http` that starts it through the Cloud Run Admin API (`…/jobs/NAME:run`) with an OAuth
//!   token, in the job's zone, with an attempt deadline and retries bounded by the job's
//!   lease (see [`CloudRetry`]).

use std::time::Duration;

use crate::backend::Backend;
use crate::error::{Error, Result};

use super::ScheduledJob;

/// Where and how the crontab lines run idem.
#[derive(Debug, Clone)]
pub struct CrontabOptions {
    /// The idem binary (cron's `PATH` is short: an absolute path is safest).
    pub bin: String,
    /// The store URL every line passes with `--store`.
    pub store: String,
    /// The jobs folder every line passes with `--jobs-dir`.
    pub jobs_dir: String,
    /// The folder each line `cd`s into first (relative paths in the store URL and jobs
    /// folder resolve against it).
    pub workdir: String,
    /// Each job appends its output to `LOG_DIR/JOB.log`.
    pub log_dir: String,
}

/// The store an export for many machines may name: Postgres or BigQuery (every runner must
/// reach it; a SQLite file or memory stays on one machine). `target` names the export.
pub fn shared_store_scheme(store: &str, target: &str) -> Result<&'static str> {
    let scheme = Backend::scheme(store).to_ascii_lowercase();
    match Backend::named(&store.to_ascii_lowercase()) {
        Some(Backend::Postgres) => Ok("postgres"),
        Some(Backend::BigQuery) => Ok("bigquery"),
        Some(Backend::Sqlite | Backend::Memory) => Err(Error::config(format!(
            "--store {scheme}: {target} keeps no disk between runs and its runners share none; \
             export with a postgres:// or bigquery:// store"
        ))),
        _ => Err(Error::config(format!(
            "--store {:?}: {target} needs a postgres:// or bigquery:// store that every \
             runner reaches",
            crate::backend::RedactedUrl::new(store)
        ))),
    }
}

/// A store URL as an export may print it: without its password, which the export says
/// where to keep instead (an export is read by people, and a crontab line is shown by `ps`
/// to every local user).
#[derive(Clone, PartialEq, Eq)]
pub struct ExportedStore {
    /// The URL without its password (`user:PASSWORD@` and `?password=` taken out).
    pub url: String,
    /// The URL held a password: Postgres reads it from `PGPASSWORD` or `~/.pgpass` instead
    /// (sqlx reads both, as libpq does).
    pub had_password: bool,
}

impl std::fmt::Debug for ExportedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportedStore")
            .field("url", &crate::backend::RedactedUrl::new(&self.url))
            .field("had_password", &self.had_password)
            .finish()
    }
}

impl ExportedStore {
    /// Takes the password out of `store`. A password on anything but a Postgres URL, or
    /// another secret (`sslpassword`, a token…), has no place to go that idem reads: a
    /// config error naming the part, without its value.
    pub fn new(store: &str) -> Result<ExportedStore> {
        let mut url = store.to_string();
        let mut had_password = false;
        if let Some((scheme, rest)) = store.split_once("://") {
            if !["sqlite", "memory"].contains(&scheme.to_ascii_lowercase().as_str()) {
                let (before_query, query) = match rest.split_once('?') {
                    Some((b, q)) => (b, Some(q)),
                    None => (rest, None),
                };
                let mut kept = format!("{scheme}://");
                match before_query.rsplit_once('@') {
                    Some((userinfo, host)) => {
                        let user = match userinfo.split_once(':') {
                            Some((user, _)) => {
                                had_password = true;
                                user
                            }
                            None => userinfo,
                        };
                        if !user.is_empty() {
                            kept.push_str(user);
                            kept.push('@');
                        }
                        kept.push_str(host);
                    }
                    None => kept.push_str(before_query),
                }
                if let Some(query) = query {
                    kept.push('?');
                    kept.push_str(query);
                }
                url = kept;
                loop {
                    let (rest, value) = crate::backend::take_param(&url, "password");
                    if value.is_none() {
                        break;
                    }
                    had_password = true;
                    url = rest;
                }
            }
        }
        let postgres = matches!(
            crate::backend::Backend::of(&url.to_ascii_lowercase()),
            Some(crate::backend::Backend::Postgres)
        );
        if had_password && !postgres {
            return Err(Error::config(format!(
                "--store {}: holds a password, which an export would print; give it a URL \
                 without one (or --store-secret where the export takes one)",
                crate::backend::RedactedUrl::new(store)
            )));
        }
        if let Some(name) = url
            .split_once('?')
            .into_iter()
            .flat_map(|(_, q)| q.split('&'))
            .map(|part| part.split_once('=').map_or(part, |(k, _)| k))
            .find(|k| crate::backend::is_secret_param(k) && *k != "sslkey")
        {
            return Err(Error::config(format!(
                "--store {}: the parameter {name:?} holds a secret, which an export would \
                 print and cannot keep elsewhere; give the store without it (or \
                 --store-secret where the export takes one)",
                crate::backend::RedactedUrl::new(store)
            )));
        }
        Ok(ExportedStore { url, had_password })
    }
}

/// A flag value printed into a command or a manifest: not empty, no white space or control
/// characters (a line break would end a comment or a command).
pub fn plain_value(flag: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::config(format!("{flag} is empty")));
    }
    if let Some(c) = value
        .chars()
        .find(|c| c.is_whitespace() || crate::model::is_control(*c))
    {
        return Err(Error::config(format!(
            "{flag} {value:?}: holds {c:?}; give it without white space or control characters"
        )));
    }
    Ok(())
}

/// The longest a run of `job` may take on a platform that stops it (a Cloud Run task, a
/// Kubernetes pod), `stop` included: its command `timeout` and grace plus `stop`, else a day.
pub fn run_deadline(job: &ScheduledJob, stop: Duration) -> Duration {
    match job.timeout {
        Some(t) => {
            let secs =
                |d: Duration| Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0));
            secs(t) + secs(job.grace.unwrap_or_default()) + stop
        }
        None => Duration::from_secs(86_400),
    }
}

/// Quotes a word for `sh` (unchanged when it needs no quotes).
fn sh(word: &str) -> Result<String> {
    shlex::try_quote(word).map(|q| q.into_owned()).map_err(|_| {
        Error::config(format!(
            "{word:?} cannot be passed to sh (it has a NUL byte)"
        ))
    })
}

pub(super) fn crontab_fields(job: &ScheduledJob, target: &str) -> Result<String> {
    let fields = job.cron()?.crontab_fields().ok_or_else(|| {
        Error::config(format!(
            "job {}: schedule {:?} uses seconds, years or extensions (L, W, #, ?, +), which \
             {target} cannot express; use a standard 5-field expression",
            job.name, job.schedule
        ))
    })?;
    if target != "crontab" {
        // cronie reads the day fields as idem does (a field starting with `*` ANDs them);
        // other cron implementations disagree when such a field is not a bare `*` and the
        // other one is restricted (`*/2` with `MON`): refuse rather than export a
        // schedule that fires on other days than `idem schedule` lists.
        let f: Vec<&str> = fields.split_whitespace().collect();
        let (dom, dow) = (f[2], f[4]);
        let starred = |d: &str| d.starts_with('*') && d != "*";
        if (starred(dom) && dow != "*") || (starred(dow) && dom != "*") {
            return Err(Error::config(format!(
                "job {}: schedule {:?} combines day-of-month {dom:?} and day-of-week {dow:?}, \
                 which idem and cronie read as both (a field starting with `*` ANDs them) but \
                 {target} may read as either; write the day fields so that one is `*`, or \
                 both are lists",
                job.name, job.schedule
            )));
        }
    }
    Ok(fields)
}

/// The crontab text for `jobs` (those with a schedule).
pub fn crontab(jobs: &[ScheduledJob], o: &CrontabOptions) -> Result<String> {
    let mut out = String::from(
        "# idem schedule export --crontab\n\
         # CRON_TZ sets the time zone of the schedule on the line below it (cronie, Vixie cron 4).\n\
         SHELL=/bin/sh\n",
    );
    let store = ExportedStore::new(&o.store)?;
    if store.had_password {
        out.push_str(
            "# The store's password is not on these lines (ps shows a command line to every local\n\
             # user): idem reads it as libpq does. Put it in ~/.pgpass of the user this crontab\n\
             # belongs to (a line HOST:PORT:DATABASE:USER:PASSWORD, chmod 600), or add a line\n\
             # PGPASSWORD=... at the top of this crontab (readable by its owner only; cron passes\n\
             # it in the environment).\n",
        );
    }
    for job in jobs {
        let tz = job.tz()?;
        let fields = crontab_fields(job, "crontab")?;
        let date = job.date_expr()?;
        let log = format!("{}/{}.log", o.log_dir.trim_end_matches('/'), job.name);
        let words = [
            o.bin.as_str(),
            "--store",
            &store.url,
            "--jobs-dir",
            &o.jobs_dir,
            "run",
            &job.name,
            "--date",
            &date.to_string(),
            "--trigger",
            "scheduler",
        ];
        let command = format!(
            "cd {} && {} >> {} 2>&1",
            sh(&o.workdir)?,
            words
                .iter()
                .map(|w| sh(w))
                .collect::<Result<Vec<_>>>()?
                .join(" "),
            sh(&log)?
        );
        if command.contains('\n') || command.contains('\r') {
            return Err(Error::config(format!(
                "job {}: a crontab line cannot hold a line break",
                job.name
            )));
        }
        out.push_str(&format!(
            "\n# {}: {:?} in {}, date {}\nCRON_TZ={}\n{} {}\n",
            job.name,
            job.schedule,
            tz.name(),
            date,
            tz.name(),
            fields,
            command.replace('%', "\\%")
        ));
    }
    Ok(out)
}

/// Where the Cloud Run jobs and Cloud Scheduler jobs go.
#[derive(Debug, Clone)]
pub struct CloudSchedulerOptions {
    /// Google Cloud project.
    pub project: String,
    /// Region of the Cloud Run job and of the Cloud Scheduler job.
    pub region: String,
    /// Container image with idem and the jobs folder.
    pub image: String,
    /// Service account the scheduler calls Cloud Run as (needs `run.jobs.run`), also the
    /// identity the job runs as.
    pub service_account: String,
    /// The store URL (set as `IDEM_STORE` in the container).
    pub store: String,
    /// The jobs folder inside the image (set as `IDEM_JOBS_DIR`).
    pub jobs_dir: String,
    /// A Secret Manager secret holding the store URL: `IDEM_STORE` comes from it
    /// (`--set-secrets`) instead of being printed in the command.
    pub store_secret: Option<String>,
}

impl CloudSchedulerOptions {
    /// Options for `--cloud-scheduler PROJECT/REGION` with the store `store`; `image`
    /// defaults to `REGION-docker.pkg.dev/PROJECT/idem/idem:latest` and `service_account`
    /// to `idem@PROJECT.iam.gserviceaccount.com`. A SQLite or memory store is refused: a
    /// Cloud Run job keeps no disk between executions.
    pub fn new(
        target: &str,
        store: &str,
        image: Option<String>,
        service_account: Option<String>,
        jobs_dir: &str,
    ) -> Result<CloudSchedulerOptions> {
        let (project, region) = parse_project_region(target)?;
        shared_store_scheme(store, "a Cloud Run job")?;
        if let Some(image) = &image {
            plain_value("--image", image)?;
        }
        if let Some(sa) = &service_account {
            plain_value("--service-account", sa)?;
        }
        plain_value("--image-jobs-dir", jobs_dir)?;
        Ok(CloudSchedulerOptions {
            image: image
                .unwrap_or_else(|| format!("{region}-docker.pkg.dev/{project}/idem/idem:latest")),
            service_account: service_account
                .unwrap_or_else(|| format!("idem@{project}.iam.gserviceaccount.com")),
            project,
            region,
            store: store.to_string(),
            jobs_dir: jobs_dir.to_string(),
            store_secret: None,
        })
    }
}

/// The Secret Manager secret a Cloud Run job reads the store's password from (as
/// `PGPASSWORD`) when the store URL holds one and no `--store-secret` is given.
pub const PASSWORD_SECRET: &str = "idem-store-password";

/// Parses `PROJECT/REGION`.
pub fn parse_project_region(s: &str) -> Result<(String, String)> {
    let ok = |p: &str| {
        !p.is_empty()
            && p.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b':' || b == b'.'
            })
    };
    match s.split_once('/') {
        Some((project, region)) if ok(project) && ok(region) && !region.contains(':') => {
            Ok((project.to_string(), region.to_string()))
        }
        _ => Err(Error::config(format!(
            "--cloud-scheduler {s:?}: expected PROJECT/REGION, such as my-project/us-central1"
        ))),
    }
}

/// Cloud Scheduler's attempt deadline and retry policy for a job with a lease.
///
/// A scheduler attempt that times out may still have started an execution, and its retry
/// starts another one. Every execution that one slot can start must find the first one's
/// lease held (so it skips as `in_progress`, or, once the first completed, as
/// `time_window`), even without a heartbeat. So all attempts of a slot must start within
/// one lease of the first. Cloud Scheduler retries until *both* `--max-retry-attempts` and
/// `--max-retry-duration` are reached, so each bounds the last retry's start on its own:
/// the attempt deadline is a quarter of the lease, the retry duration half a lease (a
/// retry scheduled just before it starts one backoff later: by three quarters), and the
/// backoff is at most 30 s, so that attempts × (deadline + backoff) stays within three
/// quarters of the lease too; each execution then starts, at the latest, by one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloudRetry {
    /// `--attempt-deadline`: lease / 4, at most 30 min (Cloud Scheduler's limit).
    pub attempt_deadline: Duration,
    /// `--max-retry-duration`: lease / 2.
    pub max_retry_duration: Duration,
    /// `--min-backoff`: the smaller of 30 s and the attempt deadline.
    pub min_backoff: Duration,
    /// `--max-backoff`: the same as the min (a constant backoff).
    pub max_backoff: Duration,
    /// `--max-retry-attempts`: as many as start within three quarters of the lease when
    /// every attempt times out (3/4 lease / (deadline + backoff)), 1 to 5.
    pub max_retry_attempts: u32,
}

/// A Cloud Run task's longest `--task-timeout`.
const MAX_TASK_TIMEOUT: Duration = Duration::from_secs(168 * 3600);

/// Cloud Run retries of a failed task (`--max-retries`): a failed run wrote no key, so a
/// retry redoes it; Cloud Scheduler retries only its call that starts the execution.
pub const CLOUD_RUN_RETRIES: u32 = 2;

/// Cloud Scheduler's shortest attempt deadline.
const MIN_ATTEMPT_DEADLINE: Duration = Duration::from_secs(15);
/// Cloud Scheduler's longest attempt deadline for HTTP targets.
const MAX_ATTEMPT_DEADLINE: Duration = Duration::from_secs(1800);

impl CloudRetry {
    /// The policy for `job`; an error when it has no lease or one too short.
    pub fn for_job(job: &ScheduledJob) -> Result<CloudRetry> {
        let lease = job.lease.ok_or_else(|| {
            Error::config(format!(
                "job {}: has no lease (guards.lease); a Cloud Scheduler retry could then run \
                 the same date twice at once: set guards.lease to at least 1m",
                job.name
            ))
        })?;
        let secs = |d: Duration| Duration::from_secs(d.as_secs());
        let attempt_deadline = secs(lease / 4).min(MAX_ATTEMPT_DEADLINE);
        if attempt_deadline < MIN_ATTEMPT_DEADLINE {
            return Err(Error::config(format!(
                "job {}: guards.lease = {}s is too short for Cloud Scheduler: its attempt \
                 deadline is at least 15s and must be at most a quarter of the lease; set \
                 guards.lease to at least 1m",
                job.name,
                lease.as_secs()
            )));
        }
        let backoff = attempt_deadline.min(Duration::from_secs(30));
        let attempts = (lease * 3 / 4).as_secs() / (attempt_deadline + backoff).as_secs();
        Ok(CloudRetry {
            attempt_deadline,
            max_retry_duration: secs(lease / 2),
            min_backoff: backoff,
            max_backoff: backoff,
            max_retry_attempts: attempts.clamp(1, 5) as u32,
        })
    }
}

/// A Cloud Run job name: lower-case letters, digits and hyphens, starting with a letter,
/// at most 63 characters.
pub fn cloud_run_name(job: &str) -> Result<String> {
    kubernetes_name(job, 63, "Cloud Run job")
}

/// `idem-` and the job's name lower-cased, `_`, `.` and spaces as `-`: a name Cloud Run
/// and Kubernetes take (at most `max` characters); `what` names the object in errors.
pub(super) fn kubernetes_name(job: &str, max: usize, what: &str) -> Result<String> {
    let mut name = String::from("idem-");
    for c in job.chars() {
        match c {
            'a'..='z' | '0'..='9' => name.push(c),
            'A'..='Z' => name.push(c.to_ascii_lowercase()),
            '-' | '_' | '.' | ' ' => name.push('-'),
            _ => {
                return Err(Error::config(format!(
                    "job {job}: its name has {c:?}, which a {what} name cannot hold"
                )))
            }
        }
    }
    let name = name.trim_end_matches('-').to_string();
    if name.len() > max {
        return Err(Error::config(format!(
            "job {job}: the {what} name {name} is longer than {max} characters"
        )));
    }
    Ok(name)
}

/// A gcloud list flag value (`a,b,c`), switching to gcloud's `^DELIM^` form when an item
/// has a comma.
fn gcloud_list(items: &[&str]) -> String {
    if !items.iter().any(|i| i.contains(',')) {
        return items.join(",");
    }
    let delim = ['|', ';', '#', '~', '@']
        .into_iter()
        .find(|d| !items.iter().any(|i| i.contains(*d)))
        .unwrap_or('\u{1}');
    format!("^{delim}^{}", items.join(&delim.to_string()))
}

fn flag(name: &str, value: &str) -> Result<String> {
    Ok(format!("--{name}={}", sh(value)?))
}

/// The Cloud Run job running `idem migrate` in the exported script.
pub const MIGRATE_JOB: &str = "idem-migrate";

/// The `gcloud` commands for `jobs` (those with a schedule): `idem migrate` run and waited
/// for, then each job's Cloud Run job and Cloud Scheduler trigger.
pub fn cloud_scheduler(jobs: &[ScheduledJob], o: &CloudSchedulerOptions) -> Result<String> {
    let mut out = format!(
        "#!/bin/sh\n\
         # idem schedule export --cloud-scheduler\n\
         # Build and push the image once (the Containerfile at the root of idem's repository):\n\
         #   gcloud artifacts repositories create idem --repository-format=docker --location={region} --project={project}\n\
         #   gcloud auth configure-docker {region}-docker.pkg.dev\n\
         #   docker build -f Containerfile -t {image} . && docker push {image}\n\
         # The service account {sa} needs:\n\
         #   roles/run.invoker on the project (Cloud Scheduler starts the Cloud Run jobs as it)\n",
        region = o.region,
        project = o.project,
        image = o.image,
        sa = o.service_account,
    );
    if Backend::named(&o.store) == Some(Backend::BigQuery) {
        out.push_str(
            "#   roles/bigquery.jobUser on the project, roles/bigquery.dataEditor on the store's dataset\n",
        );
    }
    // Without --store-secret the URL is printed: without its password, which the jobs
    // read as PGPASSWORD from a Secret Manager secret instead.
    let store = match &o.store_secret {
        Some(_) => None,
        None => Some(ExportedStore::new(&o.store)?),
    };
    let password_secret = store
        .as_ref()
        .is_some_and(|s| s.had_password)
        .then_some(PASSWORD_SECRET);
    if let Some(secret) = &o.store_secret {
        plain_value("--store-secret", secret)?;
        out.push_str(&format!(
            "#   roles/secretmanager.secretAccessor on the secret {secret} (the store URL)\n"
        ));
    }
    if let Some(secret) = password_secret {
        out.push_str(&format!(
            "#   roles/secretmanager.secretAccessor on the secret {secret} (the store's password)\n\
             # The store's password is not printed: the jobs read it as PGPASSWORD from the Secret\n\
             # Manager secret {secret}, created once:\n\
             #   printf '%s' \"$PASSWORD\" | gcloud secrets create {secret} --data-file=- --project={project}\n\
             # (or keep the whole store URL in a secret and export with --store-secret NAME)\n",
            project = o.project
        ));
    }
    out.push_str("set -e\n");
    // What every Cloud Run job of the script shares: the image, its account, the store and
    // the jobs folder (the store's URL or secret, the password's secret).
    let run_job = |run_name: &str, args: &[&str]| -> Result<Vec<String>> {
        let mut deploy = vec![
            format!("gcloud run jobs deploy {run_name}"),
            flag("project", &o.project)?,
            flag("region", &o.region)?,
            flag("image", &o.image)?,
            flag("service-account", &o.service_account)?,
            flag("command", "idem")?,
            flag("args", &gcloud_list(args))?,
        ];
        match &o.store_secret {
            None => {
                let url = store.as_ref().map_or(o.store.as_str(), |s| s.url.as_str());
                deploy.push(flag(
                    "set-env-vars",
                    &gcloud_list(&[
                        &format!("IDEM_STORE={url}"),
                        &format!("IDEM_JOBS_DIR={}", o.jobs_dir),
                        "IDEM_LOG_FORMAT=json",
                    ]),
                )?);
                if let Some(secret) = password_secret {
                    deploy.push(flag("set-secrets", &format!("PGPASSWORD={secret}:latest"))?);
                }
            }
            Some(secret) => {
                deploy.push(flag(
                    "set-env-vars",
                    &gcloud_list(&[
                        &format!("IDEM_JOBS_DIR={}", o.jobs_dir),
                        "IDEM_LOG_FORMAT=json",
                    ]),
                )?);
                deploy.push(flag("set-secrets", &format!("IDEM_STORE={secret}:latest"))?);
            }
        }
        Ok(deploy)
    };
    // Migrations are a step of the release: run once and waited for before any job is
    // deployed (the script stops if it fails), not on a job's first use.
    let mut migrate = run_job(MIGRATE_JOB, &["migrate"])?;
    migrate.extend([
        "--task-timeout=1800s".to_string(),
        "--tasks=1".to_string(),
        "--max-retries=3".to_string(),
    ]);
    out.push_str(&format!(
        "\n# The store's schema, brought up to date by this image before any job is deployed\n{}\n{}\n",
        migrate.join(" \\\n  "),
        [
            format!("gcloud run jobs execute {MIGRATE_JOB}"),
            flag("project", &o.project)?,
            flag("region", &o.region)?,
            "--wait".to_string(),
        ]
        .join(" \\\n  ")
    ));
    let mut names: std::collections::HashMap<String, &str> = std::collections::HashMap::new();
    for job in jobs {
        let run_name = cloud_run_name(&job.name)?;
        if run_name == MIGRATE_JOB {
            return Err(Error::config(format!(
                "job {:?} would export as Cloud Run job {run_name:?}, the script's own `idem \
                 migrate` step: rename the job",
                job.name
            )));
        }
        if let Some(other) = names.insert(run_name.clone(), &job.name) {
            return Err(Error::config(format!(
                "jobs {other:?} and {:?} both export as Cloud Run job and Cloud Scheduler job \
                 {run_name:?} (names are lowercased, `_` becomes `-`): the second would replace \
                 the first; rename one of them",
                job.name
            )));
        }
    }
    for job in jobs {
        let tz = job.tz()?;
        let fields = crontab_fields(job, "Cloud Scheduler")?;
        let date = job.date_expr()?.to_string();
        let retry = CloudRetry::for_job(job)?;
        let run_name = cloud_run_name(&job.name)?;
        let s = |d: Duration| format!("{}s", d.as_secs());
        let mut deploy = run_job(
            &run_name,
            &["run", &job.name, "--date", &date, "--trigger", "scheduler"],
        )?;
        let task_timeout = run_deadline(job, Duration::from_secs(30));
        if task_timeout > MAX_TASK_TIMEOUT {
            return Err(Error::config(format!(
                "job {}: [command] timeout and grace come to {}s, more than a Cloud Run task may \
                 run (168h)",
                job.name,
                task_timeout.as_secs()
            )));
        }
        deploy.push(format!("--task-timeout={}", s(task_timeout)));
        deploy.push("--tasks=1".to_string());
        deploy.push(format!("--max-retries={CLOUD_RUN_RETRIES}"));
        let uri = format!(
            "https://{region}-run.googleapis.com/apis/run.googleapis.com/v1/namespaces/{project}/jobs/{run_name}:run",
            region = o.region,
            project = o.project
        );
        // Create the scheduler job, or update it when it exists: the script runs again for
        // every release and every change of schedule.
        let exists = format!(
            "if gcloud scheduler jobs describe {run_name} {} {} >/dev/null 2>&1; then verb=update; else verb=create; fi",
            flag("project", &o.project)?,
            flag("location", &o.region)?
        );
        let create = [
            format!("gcloud scheduler jobs \"$verb\" http {run_name}"),
            flag("project", &o.project)?,
            flag("location", &o.region)?,
            flag("schedule", &fields)?,
            flag("time-zone", tz.name())?,
            flag("uri", &uri)?,
            "--http-method=POST".to_string(),
            flag("oauth-service-account-email", &o.service_account)?,
            "--oauth-token-scope=https://www.googleapis.com/auth/cloud-platform".to_string(),
            format!("--attempt-deadline={}", s(retry.attempt_deadline)),
            format!("--max-retry-attempts={}", retry.max_retry_attempts),
            format!("--max-retry-duration={}", s(retry.max_retry_duration)),
            format!("--min-backoff={}", s(retry.min_backoff)),
            format!("--max-backoff={}", s(retry.max_backoff)),
            flag("description", &format!("idem job {}", job.name))?,
        ];
        out.push_str(&format!(
            "\n# {}: {:?} in {}, date {}, lease {}\n{}\n{}\n{}\n",
            job.name,
            job.schedule,
            tz.name(),
            date,
            s(job.lease.unwrap_or_default()),
            deploy.join(" \\\n  "),
            exists,
            create.join(" \\\n  ")
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
