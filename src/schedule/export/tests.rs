//! The exports' unit tests.
use super::*;

fn job(lease: Option<u64>) -> ScheduledJob {
    ScheduledJob {
        name: "daily_sales".into(),
        schedule: "0 6 * * *".into(),
        lease: lease.map(Duration::from_secs),
        ..Default::default()
    }
}

#[test]
fn retries_fit_inside_the_lease() {
    let r = CloudRetry::for_job(&job(Some(3600))).unwrap();
    assert_eq!(r.attempt_deadline, Duration::from_secs(900));
    assert_eq!(r.max_retry_duration, Duration::from_secs(1800));
    assert!(r.max_retry_duration + r.attempt_deadline < Duration::from_secs(3600));
    let long = CloudRetry::for_job(&job(Some(86_400))).unwrap();
    assert_eq!(long.attempt_deadline, Duration::from_secs(1800));
    assert!(CloudRetry::for_job(&job(Some(60))).is_ok());
    let e = CloudRetry::for_job(&job(Some(59))).unwrap_err().to_string();
    assert!(e.contains("guards.lease = 59s is too short"), "{e}");
    let e = CloudRetry::for_job(&job(None)).unwrap_err().to_string();
    assert!(e.contains("has no lease"), "{e}");
}

/// Cloud Scheduler retries until both the attempt count and the retry duration are
/// reached: with every attempt timing out, the last retry starts after the count's
/// attempts (each a deadline and a backoff) or one backoff after the duration, whichever
/// is later. Either way within three quarters of the lease (the old policy, 3 attempts
/// backing off up to the deadline, reached 1.5 leases).
#[test]
fn the_last_retry_starts_within_three_quarters_of_the_lease_by_either_limit() {
    for lease in [60, 61, 119, 600, 3600, 7200, 86_400, 7 * 86_400] {
        let r = CloudRetry::for_job(&job(Some(lease))).unwrap();
        let lease = Duration::from_secs(lease);
        let by_count = (r.attempt_deadline + r.max_backoff) * r.max_retry_attempts;
        let by_duration = r.max_retry_duration + r.max_backoff;
        let latest = by_count.max(by_duration);
        assert!(
            latest <= lease * 3 / 4,
            "lease {lease:?}: a retry may start at {latest:?} ({r:?})"
        );
        assert!((1..=5).contains(&r.max_retry_attempts), "{r:?}");
        assert!(r.min_backoff <= r.max_backoff && r.max_backoff <= r.attempt_deadline);
    }
    assert_eq!(
        CloudRetry::for_job(&job(Some(3600)))
            .unwrap()
            .max_retry_attempts,
        2
    );
}

#[test]
fn names_and_lists() {
    assert_eq!(cloud_run_name("Daily_Sales").unwrap(), "idem-daily-sales");
    assert!(cloud_run_name("sales/eu").is_err());
    assert_eq!(gcloud_list(&["a", "b"]), "a,b");
    assert_eq!(gcloud_list(&["a,b", "c"]), "^|^a,b|c");
    assert_eq!(
        parse_project_region("my-proj/us-central1").unwrap(),
        ("my-proj".to_string(), "us-central1".to_string())
    );
    for bad in ["my-proj", "/us", "p/", "p/r/x", "P q/r"] {
        assert!(parse_project_region(bad).is_err(), "{bad}");
    }
}

#[test]
fn seconds_cannot_be_exported() {
    let mut j = job(Some(3600));
    j.schedule = "*/10 * * * * *".into();
    let o = CrontabOptions {
        bin: "idem".into(),
        store: "sqlite://idem.db".into(),
        jobs_dir: "jobs".into(),
        workdir: "/srv".into(),
        log_dir: "/var/log/idem".into(),
    };
    let e = crontab(&[j], &o).unwrap_err().to_string();
    assert!(
        e.contains(
            "uses seconds, years or extensions (L, W, #, ?, +), which crontab cannot express"
        ),
        "{e}"
    );
}

fn cloud_options() -> CloudSchedulerOptions {
    CloudSchedulerOptions {
        project: "p".into(),
        region: "europe-west1".into(),
        image: "img".into(),
        service_account: "sa@p.iam.gserviceaccount.com".into(),
        store: "bigquery://p/idem".into(),
        jobs_dir: "/app/jobs".into(),
        store_secret: None,
    }
}

/// `daily-sales` and `daily_sales` would both be `idem-daily-sales` (issue 21.9).
#[test]
fn colliding_cloud_names_are_refused_naming_both_jobs() {
    let mut a = job(Some(3600));
    a.name = "daily-sales".into();
    let b = job(Some(3600));
    let e = cloud_scheduler(&[a.clone(), b], &cloud_options())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"daily-sales\" and \"daily_sales\"") && e.contains("idem-daily-sales"),
        "{e}"
    );
    assert!(cloud_scheduler(&[a], &cloud_options()).is_ok());
}

/// An export schedules what idem lists, or refuses (issue 21.8).
#[test]
fn day_fields_other_crons_read_differently_are_refused_outside_crontab() {
    let mut j = job(Some(3600));
    j.schedule = "0 9 */2 * MON".into();
    let e = cloud_scheduler(std::slice::from_ref(&j), &cloud_options())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("day-of-month \"*/2\" and day-of-week \"MON\""),
        "{e}"
    );
    let o = CrontabOptions {
        bin: "idem".into(),
        store: "sqlite://idem.db".into(),
        jobs_dir: "jobs".into(),
        workdir: "/srv".into(),
        log_dir: "/var/log/idem".into(),
    };
    // cronie reads them as idem does.
    assert!(crontab(std::slice::from_ref(&j), &o)
        .unwrap()
        .contains("0 9 */2 * MON"));
    for fine in ["0 9 * * MON", "0 9 1,15 * MON", "0 9 */2 * *"] {
        j.schedule = fine.into();
        assert!(
            cloud_scheduler(std::slice::from_ref(&j), &cloud_options()).is_ok(),
            "{fine}"
        );
    }
}
