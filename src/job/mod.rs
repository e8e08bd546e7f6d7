//! Declarative jobs: `jobs/*.toml`.
//!
//! Vocabulary, used the same way across the API:
//!
//! * a **job** is a TOML file ([`Job`]) with a unique `name`, naming the **processor** that
//!   does its work (`processor = "sql"`, `"cleanup"`, or a Rust
//!   [`Processor`](crate::Processor) registered in the [`Registry`](crate::Registry));
//! * in the ledger a run's `processor_name` (`RunRecord::processor`,
//!   `RunRequest::processor`) is the identity the guards key on: for a job, the job's
//!   name;
//! * a **plan** ([`plan()`]) is a job made ready to run: its runner and processor, with the
//!   caller's [`Overrides`] (mode, policy, trigger, scope, run id, cancellation) applied.
//!
//! The module: [`config`] (the typed file format), [`load`] (finding and loading files),
//! [`plan`](mod@plan) (building a run).
//!
//!
//! ```toml
//! name = "daily_sales"           # unique
//! processor = "sql"              # built-in SQL processor, or a registered Rust processor
//! schedule = "0 9 * * *"         # optional cron (5 fields, 6/7 with seconds/years, @daily)
//! timezone = "Europe/Paris"      # IANA zone of the schedule and relative dates; default UTC
//! date = "yesterday"             # default date of `idem run JOB`
//! missed = "skip"                # idem scheduler: skip (default) or catch_up missed slots
//! catch_up_limit = 3             # with catch_up: at most this many missed slots fire
//! refire_after = "5m"            # with catch_up: a failed fire's date fires again after this
//! mode = "enforce"               # enforce | shadow | off
//! store_failure = "strict"       # strict | best_effort
//! [guards]
//! lease = "1h"                   # "0s" or "off" = no lease
//! time_window = "1h"             # "0s" or absent = off
//! content_hash = "24h"           # absent = off
//! hash = "sha256"                # or "md5"
//! [sql]
//! warehouse = "sqlite://demo.db" # default: `default_warehouse_url` of the store
//! setup = "..."                  # or setup_file = "path.sql"
//! content = "SELECT ..."         # or content_file
//! process = "INSERT ..."         # or process_file
//! ```
//! Relative paths (files, `sqlite://` warehouses) resolve against the job file's folder.
//!
//! Loading validates everything that needs no database: the fields and durations, and for
//! SQL jobs the warehouse scheme and every script in its dialect, with its `@name`
//! parameters ([`Job::check`]). `run`/`explain` load only their job ([`find_job`]), so a
//! broken file never stops another job; `idem jobs` reports every bad file ([`scan_jobs`]).

pub mod config;
pub mod load;
pub mod plan;

pub use config::{
    default_warehouse_url, parse_cron, GuardName, GuardsConfig, Job, OnInProgress, SqlConfig,
    DEFAULT_LEASE,
};
pub use load::{find_job, load_jobs, scan_jobs, JobProblem, JobScan};
pub use plan::{plan, replay_spool, Connections, Overrides, Plan};

/// Checks a job name: it names log files, Cloud Run jobs and ledger rows, so it must be a
/// single, printable path segment: not empty, no `/` or backslash, no control characters, not
/// starting with `.` (so `..` and hidden files are out) or `-` (an option on a command
/// line), at most 128 characters.
pub fn validate_name(name: &str) -> crate::error::Result<()> {
    let bad = |why: &str| crate::error::Error::config(format!("invalid job name {name:?}: {why}"));
    if name.trim().is_empty() {
        return Err(bad("it is empty"));
    }
    if name.chars().count() > 128 {
        return Err(bad("it is longer than 128 characters"));
    }
    if name.starts_with('.') {
        return Err(bad("it starts with '.'"));
    }
    if name.starts_with('-') {
        return Err(bad(
            "it starts with '-' (on a command line, such as an exported crontab line, it would read as an option)",
        ));
    }
    if name != name.trim() {
        return Err(bad("it starts or ends with white space"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| matches!(c, '/' | '\\') || crate::model::is_control(*c))
    {
        let what = if crate::model::is_control(c) {
            format!("a control character ({c:?})")
        } else {
            format!("{c:?}")
        };
        return Err(bad(&format!(
            "it holds {what} (a name is one path segment of printable characters)"
        )));
    }
    Ok(())
}

/// The guard windows of every job file in `jobs_dir` (a file that does not load is passed
/// over: it cannot run, so its keys are kept by the clamp of [`crate::maintenance::cleanup::cleanup_keeping`]); an
/// unreadable folder gives none and the error, for the caller to warn about.
pub fn guard_needs(
    jobs_dir: &std::path::Path,
) -> (Vec<crate::maintenance::cleanup::GuardNeed>, Option<String>) {
    let paths = match load::job_files(jobs_dir) {
        Ok(paths) => paths,
        Err(e) => return (Vec::new(), Some(e.to_string())),
    };
    let mut needs: Vec<crate::maintenance::cleanup::GuardNeed> = Vec::new();
    for path in paths {
        let Ok(job) = Job::load(&path) else {
            continue;
        };
        let windows = [
            (job.guards.time_window, "guards.time_window"),
            (job.guards.content_hash, "guards.content_hash"),
        ];
        let Some((keep, field)) = windows
            .into_iter()
            .filter_map(|(w, f)| w.map(|w| (w, f)))
            .max_by_key(|(w, _)| *w)
        else {
            continue;
        };
        needs.push(crate::maintenance::cleanup::GuardNeed {
            processor: job.name,
            keep,
            field,
        });
    }
    needs.sort_by(|a, b| a.processor.cmp(&b.processor));
    (needs, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::duration::{parse_duration, MAX_DURATION};
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172_800));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("36525d").unwrap(), MAX_DURATION);
        for bad in ["", "h", "10", "1x", "-1h", "1 fortnight"] {
            let e = parse_duration(bad).unwrap_err().to_string();
            assert!(e.contains("bad duration"), "{bad}: {e}");
        }
    }

    #[test]
    fn overflowing_durations_are_errors_not_panics() {
        for huge in [
            "99999999d",
            "18446744073709551615s1s",
            "5124095576030432h",
            "36526d",
            "18446744073709551615s",
        ] {
            let e = parse_duration(huge).unwrap_err().to_string();
            assert!(
                e.contains("is too long: the maximum is 100 years"),
                "{huge}: {e}"
            );
        }
        // Every field says which one it is, and `now ± MAX_DURATION` is a valid time.
        for field in ["lease", "time_window", "content_hash", "wait"] {
            let toml = format!(
                "name = \"x\"\nprocessor = \"p\"\n[guards]\non_in_progress = \"wait\"\n{field} = \"99999999d\"\n"
            );
            let e = Job::parse(&toml, Path::new("jobs/x.toml"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("jobs/x.toml")
                    && e.contains(&format!(
                        "guards.{field}: duration \"99999999d\" is too long"
                    )),
                "{e}"
            );
        }
        let max = chrono::Duration::from_std(MAX_DURATION).unwrap();
        let now = chrono::Utc::now();
        assert!(chrono::Datelike::year(&(now + max)) < 9999);
        assert!(now.checked_sub_signed(max).is_some());
    }

    #[test]
    fn a_lease_too_short_for_the_heartbeat_is_rejected_with_the_minimum() {
        let job = |lease: &str| {
            Job::parse(
                &format!("name = \"x\"\nprocessor = \"p\"\n[guards]\nlease = \"{lease}\"\n"),
                Path::new("x.toml"),
            )
        };
        let e = job("999ms").unwrap_err().to_string();
        assert!(
            e.contains("guards.lease = \"999ms\" is too short: the minimum is 1s"),
            "{e}"
        );
        assert_eq!(job("1s").unwrap().lease_ttl(), Some(Duration::from_secs(1)));
        assert_eq!(job("0s").unwrap().lease_ttl(), None);
        assert_eq!(job("off").unwrap().lease_ttl(), None);
    }

    /// A job's name becomes a log file name and a Cloud Run name: `../x` must not escape
    /// the crontab's log folder (issue 21.11).
    #[test]
    fn job_names_are_one_printable_path_segment() {
        let job = |name: &str| {
            Job::parse(
                &format!("name = {name:?}\nprocessor = \"p\"\n"),
                Path::new("jobs/x.toml"),
            )
            .map(|_| ())
            .map_err(|e| e.to_string())
        };
        for bad in [
            "../x",
            "a/b",
            "a\\b",
            ".hidden",
            "..",
            "tab\there",
            "new\nline",
            " x",
            "",
            "-dash",
            "--date",
            "sales\u{202E}txt",
            "\u{2067}x",
        ] {
            let e = job(bad).unwrap_err();
            assert!(
                e.contains("jobs/x.toml") && e.contains("name"),
                "{bad:?}: {e}"
            );
        }
        for good in [
            "daily_sales",
            "daily-sales",
            "v1.2",
            "Sales EU",
            "übersicht",
        ] {
            assert!(job(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn cron_expressions() {
        assert!(parse_cron("0 9 * * *").is_ok());
        assert!(parse_cron("0 0 2 * * Sun").is_ok());
        let e = parse_cron("61 9 * * *").unwrap_err().to_string();
        assert!(e.contains("invalid cron expression \"61 9 * * *\""), "{e}");
    }

    #[test]
    fn validation_names_the_problem() {
        let p = Path::new("jobs/x.toml");
        let e = Job::parse("name = \"x\"\nprocessor = \"sql\"\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a [sql] table"), "{e}");
        let e = Job::parse(
            "name = \"x\"\nprocessor = \"p\"\n[guards]\ntime_window = \"1 fortnight\"\n",
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("guards.time_window") && e.contains("bad duration"),
            "{e}"
        );
        let e = Job::parse("name = \"x\"\nprocessor = \"p\"\ntypo = 1\n", p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("malformed job file") && e.contains("typo"),
            "{e}"
        );
        let e = Job::parse("name = \"x\"\nprocessor = \"p\"\nmode = \"loud\"\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown mode \"loud\""), "{e}");
        let e = Job::parse("name = \"x\"\nprocessor = \"p\"\n[guards]\ntime_window = \"1h\"\norder = [\"lease\"]\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("leaves it out"), "{e}");
    }

    #[test]
    fn refire_after_is_a_catch_up_jobs_and_at_least_a_second() {
        let p = Path::new("jobs/x.toml");
        let job = |fields: &str| {
            Job::parse(
                &format!("name = \"x\"\nprocessor = \"p\"\nschedule = \"0 6 * * *\"\n{fields}"),
                p,
            )
        };
        let e = job("refire_after = \"10m\"\n").unwrap_err().to_string();
        assert!(e.contains("refire_after is set but missed is not"), "{e}");
        let e = job("missed = \"catch_up\"\nrefire_after = \"500ms\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("refire_after") && e.contains("minimum is 1s"),
            "{e}"
        );
        let e = job("missed = \"catch_up\"\nrefire_after = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("refire_after") && e.contains("bad duration"),
            "{e}"
        );
        let set = job("missed = \"catch_up\"\nrefire_after = \"10m\"\n").unwrap();
        assert_eq!(
            set.scheduled().unwrap().refire_after(),
            Duration::from_secs(600)
        );
        let default = job("missed = \"catch_up\"\n").unwrap();
        assert_eq!(
            default.scheduled().unwrap().refire_after(),
            crate::schedule::DEFAULT_REFIRE_AFTER
        );
    }

    #[test]
    fn default_stack_reads_first_and_claims_last() {
        let job = Job::parse(
            "name = \"x\"\nprocessor = \"p\"\n[guards]\ntime_window = \"1h\"\ncontent_hash = \"24h\"\nhash = \"md5\"\n",
            Path::new("x.toml"),
        )
        .unwrap();
        assert_eq!(
            job.guard_stack().unwrap().names(),
            vec!["time_window", "content_hash", "lease"]
        );
        let off = Job::parse(
            "name = \"x\"\nprocessor = \"p\"\n[guards]\nlease = \"0s\"\n",
            Path::new("x.toml"),
        )
        .unwrap();
        assert!(off.guard_stack().unwrap().is_empty());
    }

    /// A fresh folder for job files.
    fn jobs_dir(files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("idem-jobs-{}", crate::new_run_id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        dir
    }

    const GOOD: &str = "name = \"good\"\nprocessor = \"p\"\n";

    #[test]
    fn find_job_reads_only_what_it_needs() {
        let dir = jobs_dir(&[
            ("good.toml", GOOD),
            ("broken.toml", "name = \"broken\"\nprocessor = \"sql\n"),
            (
                "invalid.toml",
                "name = \"invalid\"\nprocessor = \"p\"\n[guards]\nlease = \"soon\"\n",
            ),
            ("other_file.toml", "name = \"renamed\"\nprocessor = \"p\"\n"),
        ]);
        let store = "sqlite://idem.db";
        assert_eq!(find_job("good", &dir, store).unwrap().name, "good");
        // Found by its `name` key although the file is called otherwise.
        let renamed = find_job("renamed", &dir, store).unwrap();
        assert!(renamed.path.ends_with("other_file.toml"));
        // The invalid job itself is still reported with its file and field.
        let e = find_job("invalid", &dir, store).unwrap_err().to_string();
        assert!(
            e.contains("invalid.toml") && e.contains("guards.lease"),
            "{e}"
        );
        let e = find_job("broken", &dir, store).unwrap_err().to_string();
        assert!(
            e.contains("malformed job file") && e.contains("broken.toml"),
            "{e}"
        );
        // An unknown job lists the known names and says which files could not be read.
        let e = find_job("nope", &dir, store).unwrap_err().to_string();
        assert!(e.contains("unknown job \"nope\""), "{e}");
        assert!(e.contains("known: good, invalid, renamed"), "{e}");
        assert!(
            e.contains("1 file(s) could not be read") && e.contains("broken.toml"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn scan_jobs_reports_every_bad_file() {
        let dir = jobs_dir(&[
            ("a.toml", GOOD),
            ("b.toml", "name = \"b\"\nprocessor = \"sql\n"),
            (
                "c.toml",
                "name = \"c\"\nprocessor = \"p\"\n[guards]\nlease = \"99999999d\"\n",
            ),
            ("d.toml", GOOD),
        ]);
        let scan = scan_jobs(&dir, "sqlite://idem.db").unwrap();
        assert_eq!(scan.jobs.len(), 1);
        let problems: Vec<(String, &str)> = scan
            .problems
            .iter()
            .map(|p| {
                (
                    p.path.file_name().unwrap().to_string_lossy().into_owned(),
                    p.error.as_str(),
                )
            })
            .collect();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].0 == "b.toml" && problems[0].1.contains("malformed job file"));
        assert!(problems[1].0 == "c.toml" && problems[1].1.contains("guards.lease"));
        assert!(problems[2].0 == "d.toml" && problems[2].1.contains("used by both"));
        let e = load_jobs(&dir, "sqlite://idem.db").unwrap_err().to_string();
        assert!(e.starts_with("3 invalid job files in"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn sql_job(extra_guards: &str, sql: &str) -> String {
        format!("name = \"s\"\nprocessor = \"sql\"\n[guards]\n{extra_guards}\n[sql]\n{sql}\n")
    }

    #[test]
    fn sql_is_validated_at_load_naming_the_file_and_the_field() {
        let p = Path::new("jobs/s.toml");
        let load = |toml: &str, store: &str| {
            Job::parse(toml, p)
                .and_then(|j| j.check(store).map(|()| j))
                .map_err(|e| e.to_string())
        };
        let store = "sqlite://idem.db";
        // An unknown parameter, in each script.
        for field in ["setup", "content", "process"] {
            let mut sql = String::from("process = \"SELECT 1\"\n");
            if field == "process" {
                sql.clear();
            }
            sql.push_str(&format!("{field} = \"SELECT @scope, @typo\"\n"));
            let e = load(&sql_job("", &sql), store).unwrap_err();
            assert!(
                e.contains("jobs/s.toml")
                    && e.contains(&format!("[sql].{field} uses unknown parameter @typo")),
                "{e}"
            );
            assert!(
                e.contains("known: @scope, @scope_date, @run_id, @trigger"),
                "{e}"
            );
        }
        // [sql.params] keys and the built-ins are known.
        load(
            &sql_job("", "process = \"SELECT @scope, @scope_date, @run_id, @trigger, @region\"\n[sql.params]\nregion = \"eu\""),
            store,
        )
        .unwrap();
        let e = load(
            &sql_job("", "process = \"SELECT 1\"\n[sql.params]\nscope = \"x\""),
            store,
        )
        .unwrap_err();
        assert!(
            e.contains("[sql.params] sets \"scope\", a built-in parameter"),
            "{e}"
        );
        // SQL the scanner cannot read, in the warehouse's dialect.
        let e = load(&sql_job("", "process = \"SELECT 'oops\""), store).unwrap_err();
        assert!(
            e.contains("[sql].process: unterminated string starting at line 1, column 8"),
            "{e}"
        );
        let pg = "warehouse = \"postgres://u@h/db\"\nprocess = \"SELECT $f$ @nope $f$, @scope\"";
        load(&sql_job("", pg), store).unwrap();
        let sqlite = "warehouse = \"sqlite://w.db\"\nprocess = \"SELECT $f$ @nope $f$, @scope\"";
        let e = load(&sql_job("", sqlite), store).unwrap_err();
        assert!(e.contains("unknown parameter @nope"), "{e}");
        // The default warehouse takes the store's dialect.
        let e = load(
            &sql_job("", "process = \"SELECT `a\\\\` , @scope\""),
            "bigquery://p/d",
        )
        .unwrap_err();
        assert!(e.contains("[sql].process: unterminated"), "{e}");
        load(&sql_job("", "process = \"SELECT `a\\\\` , @scope\""), store).unwrap();
        // content_hash needs a content query.
        let e = load(
            &sql_job("content_hash = \"24h\"", "process = \"SELECT 1\""),
            store,
        )
        .unwrap_err();
        assert!(
            e.contains("jobs/s.toml")
                && e.contains("guards.content_hash is set but [sql] has no content"),
            "{e}"
        );
        load(
            &sql_job(
                "content_hash = \"24h\"",
                "content = \"SELECT 1\"\nprocess = \"SELECT 1\"",
            ),
            store,
        )
        .unwrap();
        // Unsupported warehouse schemes, explicit or by default.
        let e = load(
            &sql_job("", "warehouse = \"mysql://h/db\"\nprocess = \"SELECT 1\""),
            store,
        )
        .unwrap_err();
        assert!(
            e.contains("jobs/s.toml")
                && e.contains("[sql].warehouse: unsupported warehouse url \"mysql://h/db\""),
            "{e}"
        );
        let e = load(&sql_job("", "process = \"SELECT 1\""), "memory://").unwrap_err();
        assert!(
            e.contains("[sql].warehouse is not set")
                && e.contains("unsupported warehouse url \"memory://\""),
            "{e}"
        );
    }

    #[test]
    fn a_sqlite_store_defaults_the_warehouse_to_a_file_of_its_own() {
        assert_eq!(
            default_warehouse_url("sqlite://idem.db"),
            "sqlite://idem-warehouse.db"
        );
        assert_eq!(
            default_warehouse_url("sqlite:///var/lib/idem/store.sqlite?mode=rwc"),
            "sqlite:///var/lib/idem/store-warehouse.sqlite?mode=rwc"
        );
        assert_eq!(
            default_warehouse_url("sqlite://data/idem"),
            "sqlite://data/idem-warehouse"
        );
        assert_eq!(
            default_warehouse_url("sqlite://:memory:"),
            "sqlite://:memory:"
        );
        assert_eq!(
            default_warehouse_url("postgres://u@h/db"),
            "postgres://u@h/db"
        );
        let job = Job::parse(
            &sql_job("", "process = \"SELECT 1\""),
            Path::new("jobs/s.toml"),
        )
        .unwrap();
        assert_eq!(
            job.warehouse_url("sqlite://idem.db"),
            "sqlite://idem-warehouse.db"
        );
        let job = Job::parse(
            &sql_job("", "warehouse = \"sqlite://w.db\"\nprocess = \"SELECT 1\""),
            Path::new("jobs/s.toml"),
        )
        .unwrap();
        assert_eq!(job.warehouse_url("sqlite://idem.db"), "sqlite://jobs/w.db");
    }
}
