//! Finding and loading job files: one job by name ([`find_job`]), every job of a folder
//! ([`load_jobs`], [`scan_jobs`]).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::config::{de, Job};
use crate::error::{Error, Result};

impl Job {
    /// Reads and validates a job file.
    pub fn load(path: &Path) -> Result<Job> {
        let text =
            std::fs::read_to_string(path).map_err(|e| Error::io("read job file", path, e))?;
        Job::parse(&text, path)
    }

    /// Parses and validates job TOML (`path` is used for messages and relative paths).
    pub fn parse(text: &str, path: &Path) -> Result<Job> {
        Self::parse_adjusted(text, path, |_| {})
    }

    /// [`parse`](Self::parse), with `adjust` applied to the job before it is validated
    /// (what a job file cannot say: `idem exec` sets its command's date zone, and that
    /// its program is looked for when the run starts).
    pub(crate) fn parse_adjusted(
        text: &str,
        path: &Path,
        adjust: impl FnOnce(&mut Job),
    ) -> Result<Job> {
        let mut job: Job =
            toml::from_str(text).map_err(|e| match e.message().strip_prefix(de::BAD_VALUE) {
                // A field's value its parser refused: reported like the other checks.
                Some(message) => Error::config(format!("job file {}: {message}", path.display())),
                None => Error::config(format!(
                    "malformed job file {}: {}",
                    path.display(),
                    e.to_string().trim_end()
                )),
            })?;
        job.path = path.to_path_buf();
        adjust(&mut job);
        job.validate()
            .map_err(|e| Error::config(format!("job file {}: {e}", path.display())))?;
        Ok(job)
    }
}

/// Finds a job by name in `jobs_dir`, or loads it from a `.toml` path, and validates it for
/// `store_url` ([`Job::load`], then [`Job::check`]).
///
/// Only what is needed is read, so a broken job file never stops another job: first
/// `JOBS_DIR/NAME.toml` (when its `name` is NAME); otherwise the file whose `name` is NAME,
/// found by reading only the `name` key of each `*.toml`. Only that file is fully loaded
/// and validated. `idem jobs` ([`scan_jobs`]) validates every file (and reports a name
/// used by two files, where this takes `NAME.toml`).
pub fn find_job(name_or_path: &str, jobs_dir: &Path, store_url: &str) -> Result<Job> {
    let job = find_job_file(name_or_path, jobs_dir)?;
    job.check(store_url)?;
    Ok(job)
}

fn find_job_file(name_or_path: &str, jobs_dir: &Path) -> Result<Job> {
    let as_path = Path::new(name_or_path);
    if name_or_path.ends_with(".toml") || as_path.components().count() > 1 {
        if !as_path.exists() {
            return Err(Error::config(format!(
                "job file {name_or_path} does not exist"
            )));
        }
        return Job::load(as_path);
    }
    // The file named after the job, when it is that job (a file that cannot even be read
    // as TOML is reported: it is most likely the one meant).
    let named = jobs_dir.join(format!("{name_or_path}.toml"));
    if named.is_file() && read_job_name(&named)?.as_deref() == Some(name_or_path) {
        return Job::load(&named);
    }
    let mut names = Vec::new();
    let mut unreadable = Vec::new();
    let mut found: Vec<PathBuf> = Vec::new();
    for path in job_files(jobs_dir)? {
        match read_job_name(&path) {
            Ok(Some(name)) if name == name_or_path => found.push(path),
            Ok(Some(name)) => names.push(name),
            Ok(None) => unreadable.push(format!("{}: no name", path.display())),
            Err(e) => unreadable.push(e.to_string()),
        }
    }
    match found.as_slice() {
        [one] => Job::load(one),
        [] => {
            names.sort();
            let mut message = format!(
                "unknown job {name_or_path:?} in {} (known: {})",
                jobs_dir.display(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            );
            if !unreadable.is_empty() {
                message.push_str(&format!(
                    "; {} file(s) could not be read: {}",
                    unreadable.len(),
                    unreadable.join("; ")
                ));
            }
            Err(Error::config(message))
        }
        [first, second, ..] => Err(duplicate_name(name_or_path, first, second)),
    }
}

fn duplicate_name(name: &str, first: &Path, second: &Path) -> Error {
    Error::config(format!(
        "job name {name:?} is used by both {} and {}",
        first.display(),
        second.display()
    ))
}

/// The `name` of a job file, reading nothing else of it (`None` when it has none).
fn read_job_name(path: &Path) -> Result<Option<String>> {
    #[derive(Deserialize)]
    struct NameOnly {
        name: Option<toml::Value>,
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io("read job file", path, e))?;
    let doc: NameOnly = toml::from_str(&text).map_err(|e| {
        Error::config(format!(
            "malformed job file {}: {}",
            path.display(),
            e.to_string().trim_end()
        ))
    })?;
    Ok(doc.name.and_then(|v| v.as_str().map(str::to_string)))
}

/// The `*.toml` files of a folder, sorted.
pub(crate) fn job_files(jobs_dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(jobs_dir).map_err(|e| {
        Error::config(format!(
            "cannot read jobs folder {}: {e} (set --jobs-dir)",
            jobs_dir.display()
        ))
    })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    Ok(paths)
}

/// A job file that failed validation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobProblem {
    /// The file.
    pub path: PathBuf,
    /// What is wrong (the message names the file and the field).
    pub error: String,
}

/// Every job file of a folder: the valid jobs (sorted by name) and every problem.
#[derive(Debug, Clone, Default)]
pub struct JobScan {
    /// The jobs that loaded and validated.
    pub jobs: Vec<Job>,
    /// One entry per invalid file, in file order (a name used twice is a problem of the
    /// second file).
    pub problems: Vec<JobProblem>,
}

/// Loads and validates every `*.toml` job in a folder for `store_url`, collecting every
/// problem instead of stopping at the first; fails only when the folder cannot be read.
pub fn scan_jobs(jobs_dir: &Path, store_url: &str) -> Result<JobScan> {
    let mut scan = JobScan::default();
    for path in job_files(jobs_dir)? {
        let job = match Job::load(&path).and_then(|job| job.check(store_url).map(|()| job)) {
            Ok(job) => job,
            Err(e) => {
                scan.problems.push(JobProblem {
                    path,
                    error: e.to_string(),
                });
                continue;
            }
        };
        if let Some(i) = scan.jobs.iter().position(|j| j.name == job.name) {
            // As `idem run NAME` does, `NAME.toml` is the job and the other file the clash.
            let named = |j: &Job| j.path.file_stem().is_some_and(|s| s == j.name.as_str());
            let (kept, clash) = if named(&job) && !named(&scan.jobs[i]) {
                let other = std::mem::replace(&mut scan.jobs[i], job);
                (scan.jobs[i].path.clone(), other.path)
            } else {
                (scan.jobs[i].path.clone(), job.path)
            };
            scan.problems.push(JobProblem {
                error: duplicate_name(&scan.jobs[i].name, &kept, &clash).to_string(),
                path: clash,
            });
            continue;
        }
        scan.jobs.push(job);
    }
    scan.jobs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(scan)
}

/// Every `*.toml` job in a folder, sorted by name, validated for `store_url`; any invalid
/// file (or a name used twice) is an error listing every problem.
pub fn load_jobs(jobs_dir: &Path, store_url: &str) -> Result<Vec<Job>> {
    let scan = scan_jobs(jobs_dir, store_url)?;
    match scan.problems.as_slice() {
        [] => Ok(scan.jobs),
        [one] => Err(Error::config(&one.error)),
        many => Err(Error::config(format!(
            "{} invalid job files in {}:\n  {}",
            many.len(),
            jobs_dir.display(),
            many.iter()
                .map(|p| p.error.as_str())
                .collect::<Vec<_>>()
                .join("\n  ")
        ))),
    }
}
