use super::*;
use crate::schedule::parse_instant;

fn utc(s: &str) -> DateTime<Utc> {
    parse_instant("--after", s).unwrap()
}

fn job(name: &str, schedule: &str, tz: &str, missed: Missed) -> ScheduledJob {
    ScheduledJob {
        name: name.into(),
        schedule: schedule.into(),
        timezone: Some(tz.into()),
        missed,
        ..Default::default()
    }
}

fn slots(due: &Due) -> Vec<String> {
    due.fires.iter().map(|f| f.slot.to_rfc3339()).collect()
}

#[test]
fn an_on_time_slot_fires_once_with_its_zones_date() {
    let mut p = Planner::new(
        &[ScheduledJob {
            date: Some("yesterday".into()),
            ..job("daily", "0 9 * * *", "America/Los_Angeles", Missed::Skip)
        }],
        utc("2026-03-06T12:00:00Z"),
    )
    .unwrap();
    assert_eq!(p.next_wake(), Some(utc("2026-03-06T17:00:00Z")));
    assert_eq!(p.due(utc("2026-03-06T16:59:59Z")).unwrap(), Due::default());
    let due = p.due(utc("2026-03-06T17:00:00.200Z")).unwrap();
    assert_eq!(slots(&due), ["2026-03-06T17:00:00+00:00"]);
    assert_eq!(due.fires[0].local, "2026-03-06T09:00:00-08:00");
    assert_eq!(due.fires[0].date.to_string(), "2026-03-05");
    assert!(!due.fires[0].catch_up);
    assert!(due.dropped.is_empty());
    // Not again.
    assert_eq!(p.due(utc("2026-03-06T17:00:30Z")).unwrap(), Due::default());
    assert_eq!(p.next_wake(), Some(utc("2026-03-07T17:00:00Z")));
}

#[test]
fn after_a_stall_skip_drops_the_missed_slots_and_fires_the_next_one() {
    let mut p = Planner::new(
        &[job("hourly", "0 * * * *", "UTC", Missed::Skip)],
        utc("2026-01-01T10:30:00Z"),
    )
    .unwrap();
    // Stalled until 13:10: 11:00, 12:00 and 13:00 are all missed (13:00 is 10 min late).
    let due = p.due(utc("2026-01-01T13:10:00Z")).unwrap();
    assert!(due.fires.is_empty(), "{due:?}");
    assert_eq!(
        due.dropped,
        [Dropped {
            job: "hourly".into(),
            count: 3,
            first: utc("2026-01-01T11:00:00Z"),
            last: utc("2026-01-01T13:00:00Z"),
        }]
    );
    assert_eq!(p.next_wake(), Some(utc("2026-01-01T14:00:00Z")));
    // A short stall: the latest slot is still on time, the older one is dropped.
    let due = p.due(utc("2026-01-01T15:00:40Z")).unwrap();
    assert_eq!(slots(&due), ["2026-01-01T15:00:00+00:00"]);
    assert_eq!(due.dropped[0].count, 1);
    assert_eq!(due.dropped[0].first, utc("2026-01-01T14:00:00Z"));
}

#[test]
fn after_a_stall_catch_up_fires_the_most_recent_missed_slots_oldest_first_within_the_bound() {
    let mut p = Planner::new(
        &[job(
            "daily",
            "0 6 * * *",
            "UTC",
            Missed::CatchUp { limit: 2 },
        )],
        utc("2026-01-01T05:30:00Z"),
    )
    .unwrap();
    // Stalled until 4 January 07:10: the 1st to the 4th are missed (the 4th by 70 min).
    let due = p.due(utc("2026-01-04T07:10:00Z")).unwrap();
    assert_eq!(
        slots(&due),
        ["2026-01-03T06:00:00+00:00", "2026-01-04T06:00:00+00:00"]
    );
    assert!(due.fires.iter().all(|f| f.catch_up));
    assert_eq!(due.dropped[0].count, 2);
    assert_eq!(due.dropped[0].first, utc("2026-01-01T06:00:00Z"));
    assert_eq!(due.dropped[0].last, utc("2026-01-02T06:00:00Z"));
    // Two missed and one on time: the bound counts missed slots only.
    let due = p.due(utc("2026-01-07T06:00:05Z")).unwrap();
    assert_eq!(
        slots(&due),
        [
            "2026-01-05T06:00:00+00:00",
            "2026-01-06T06:00:00+00:00",
            "2026-01-07T06:00:00+00:00"
        ]
    );
    assert_eq!(
        due.fires
            .iter()
            .map(|f| f.date.to_string())
            .collect::<Vec<_>>(),
        ["2026-01-05", "2026-01-06", "2026-01-07"]
    );
    assert_eq!(
        due.fires.iter().map(|f| f.catch_up).collect::<Vec<_>>(),
        [true, true, false]
    );
    assert!(due.dropped.is_empty());
}

#[test]
fn catch_up_fires_once_per_date_when_the_schedule_is_finer_than_the_scope() {
    // Hourly slots, each processing today's date: after a stall every missed slot of
    // one date is one fire (the newest), never several fires of one scope at once.
    let mut p = Planner::new(
        &[job(
            "hourly",
            "0 * * * *",
            "UTC",
            Missed::CatchUp { limit: 3 },
        )],
        utc("2026-01-01T10:30:00Z"),
    )
    .unwrap();
    let due = p.due(utc("2026-01-01T13:10:00Z")).unwrap();
    assert_eq!(slots(&due), ["2026-01-01T13:00:00+00:00"]);
    assert!(due.fires[0].catch_up);
    assert!(due.dropped.is_empty(), "{due:?}");
    // The on-time fire covers the missed slots of its own date.
    let due = p.due(utc("2026-01-01T16:00:05Z")).unwrap();
    assert_eq!(slots(&due), ["2026-01-01T16:00:00+00:00"]);
    assert!(!due.fires[0].catch_up);
    assert!(due.dropped.is_empty(), "{due:?}");
    // Across midnight: one catch-up fire for the 1st, the on-time one for the 2nd.
    let due = p.due(utc("2026-01-02T02:00:10Z")).unwrap();
    assert_eq!(
        due.fires
            .iter()
            .map(|f| (f.slot.to_rfc3339(), f.date.to_string(), f.catch_up))
            .collect::<Vec<_>>(),
        [
            (
                "2026-01-01T23:00:00+00:00".into(),
                "2026-01-01".into(),
                true
            ),
            (
                "2026-01-02T02:00:00+00:00".into(),
                "2026-01-02".into(),
                false
            ),
        ]
    );
    assert!(due.dropped.is_empty(), "{due:?}");

    // Every second, a fixed date: a ten-second stall is one fire, and the bound
    // counts dates, so older dates beyond it are dropped with all their slots.
    let mut p = Planner::new(
        &[ScheduledJob {
            date: Some("2025-11-18".into()),
            ..job(
                "secondly",
                "* * * * * *",
                "UTC",
                Missed::CatchUp { limit: 1 },
            )
        }],
        utc("2026-01-01T00:00:00Z"),
    )
    .unwrap();
    let due = p.due(utc("2026-01-01T00:00:10.5Z")).unwrap();
    assert_eq!(slots(&due), ["2026-01-01T00:00:10+00:00"]);
    assert!(due.dropped.is_empty(), "{due:?}");
    let mut p = Planner::new(
        &[job(
            "twice_a_day",
            "0 */12 * * *",
            "UTC",
            Missed::CatchUp { limit: 1 },
        )],
        utc("2026-01-01T00:30:00Z"),
    )
    .unwrap();
    // Slots on the 1st (12:00), 2nd (00:00, 12:00), 3rd (00:00, 12:00), 4th (00:00,
    // an hour late): all missed; the bound keeps one date, the 4th.
    let due = p.due(utc("2026-01-04T01:00:00Z")).unwrap();
    assert_eq!(slots(&due), ["2026-01-04T00:00:00+00:00"]);
    assert_eq!(due.fires[0].date.to_string(), "2026-01-04");
    assert!(due.fires[0].catch_up);
    assert_eq!(due.dropped.len(), 1);
    assert_eq!(due.dropped[0].count, 5);
    assert_eq!(due.dropped[0].first, utc("2026-01-01T12:00:00Z"));
    assert_eq!(due.dropped[0].last, utc("2026-01-03T12:00:00Z"));
}

#[test]
fn on_start_catch_up_fires_missed_slots_and_skip_drops_them_with_a_warning() {
    let now = utc("2026-01-05T10:00:00Z");
    let jobs = [
        ScheduledJob {
            date: Some("yesterday".into()),
            ..job("c", "0 6 * * *", "UTC", Missed::CatchUp { limit: 3 })
        },
        job("s", "0 6 * * *", "UTC", Missed::Skip),
    ];
    let mut p = Planner::new(&jobs, now).unwrap();
    let last = utc("2026-01-01T06:00:01Z");
    p.resume_after("c", last);
    p.resume_after("s", last);
    let due = p.due(now).unwrap();
    let fired: Vec<(&str, String)> = due
        .fires
        .iter()
        .map(|f| (f.job.as_str(), f.date.to_string()))
        .collect();
    // 2, 3, 4 and 5 January were missed; the bound keeps the three most recent.
    assert_eq!(
        fired,
        [
            ("c", "2026-01-02".to_string()),
            ("c", "2026-01-03".to_string()),
            ("c", "2026-01-04".to_string())
        ]
    );
    // `skip` drops its four missed slots, and says so (issue 21.3b).
    let dropped: Vec<(&str, u64)> = due
        .dropped
        .iter()
        .map(|d| (d.job.as_str(), d.count))
        .collect();
    assert_eq!(dropped, [("c", 1), ("s", 4)]);
    assert_eq!(p.next_wake(), Some(utc("2026-01-06T06:00:00Z")));
}

/// A slot that falls due while the scheduler connects to its stores at start fires on
/// time, however long the connect took (issue 21.10).
#[test]
fn a_slot_due_during_a_slow_start_is_on_time() {
    let created = utc("2026-01-05T05:59:00Z");
    let jobs = [job("s", "0 6 * * *", "UTC", Missed::Skip)];
    let mut p = Planner::new(&jobs, created).unwrap();
    // The stores took five minutes to answer.
    let began = utc("2026-01-05T06:04:00Z");
    p.begin(began);
    let due = p.due(began).unwrap();
    assert_eq!(due.fires.len(), 1, "{due:?}");
    assert!(!due.fires[0].catch_up && due.dropped.is_empty(), "{due:?}");
    // Without the slow start it would have been missed.
    let mut q = Planner::new(&jobs, created).unwrap();
    let due = q.due(began).unwrap();
    assert!(due.fires.is_empty() && due.dropped.len() == 1, "{due:?}");
}

/// Wakes the planner at each slot (as the loop does) from `start` to `end`; the fires.
fn drive(p: &mut Planner, start: &str, end: &str) -> Vec<Fire> {
    let end = utc(end);
    let mut fires = Vec::new();
    let mut now = utc(start);
    loop {
        fires.extend(p.due(now).unwrap().fires);
        match p.next_wake() {
            Some(t) if t <= end => now = t + chrono::Duration::milliseconds(3),
            _ => return fires,
        }
    }
}

#[test]
fn a_daily_two_thirty_fires_once_on_each_2026_dst_day_with_a_fake_clock() {
    let mut p = Planner::new(
        &[job("d", "30 2 * * *", "America/Los_Angeles", Missed::Skip)],
        utc("2026-03-06T00:00:00Z"),
    )
    .unwrap();
    let fires = drive(&mut p, "2026-03-06T00:00:00Z", "2026-03-10T00:00:00Z");
    let local: Vec<(&str, String)> = fires
        .iter()
        .map(|f| (f.local.as_str(), f.date.to_string()))
        .collect();
    assert_eq!(
        local,
        [
            ("2026-03-06T02:30:00-08:00", "2026-03-06".to_string()),
            ("2026-03-07T02:30:00-08:00", "2026-03-07".to_string()),
            // 02:30 does not exist: the first instant after the gap, once.
            ("2026-03-08T03:00:00-07:00", "2026-03-08".to_string()),
            ("2026-03-09T02:30:00-07:00", "2026-03-09".to_string()),
        ]
    );
    let mut p = Planner::new(
        &[job("d", "30 1 * * *", "America/Los_Angeles", Missed::Skip)],
        utc("2026-10-31T00:00:00Z"),
    )
    .unwrap();
    let fires = drive(&mut p, "2026-10-31T00:00:00Z", "2026-11-03T00:00:00Z");
    let local: Vec<&str> = fires.iter().map(|f| f.local.as_str()).collect();
    // 01:30 happens twice on 1 November: it fires on the first pass only.
    assert_eq!(
        local,
        [
            "2026-10-31T01:30:00-07:00",
            "2026-11-01T01:30:00-07:00",
            "2026-11-02T01:30:00-08:00",
        ]
    );
}

#[test]
fn every_second_fires_each_second() {
    let mut p = Planner::new(
        &[job("s", "* * * * * *", "UTC", Missed::Skip)],
        utc("2026-01-01T00:00:00.500Z"),
    )
    .unwrap();
    let fires = drive(&mut p, "2026-01-01T00:00:00.500Z", "2026-01-01T00:00:03Z");
    assert_eq!(
        fires
            .iter()
            .map(|f| f.slot.to_rfc3339())
            .collect::<Vec<_>>(),
        [
            "2026-01-01T00:00:01+00:00",
            "2026-01-01T00:00:02+00:00",
            "2026-01-01T00:00:03+00:00"
        ]
    );
}

#[test]
fn missed_policy_fields_are_validated() {
    assert_eq!(Missed::parse(None, None).unwrap(), Missed::Skip);
    assert_eq!(Missed::parse(Some("skip"), None).unwrap(), Missed::Skip);
    assert_eq!(
        Missed::parse(Some("catch_up"), None).unwrap(),
        Missed::CatchUp {
            limit: DEFAULT_CATCH_UP_LIMIT
        }
    );
    assert_eq!(
        Missed::parse(Some("catch_up"), Some(7)).unwrap(),
        Missed::CatchUp { limit: 7 }
    );
    let e = |m: Option<&str>, l| Missed::parse(m, l).unwrap_err().to_string();
    assert!(e(Some("later"), None).contains("missed = \"later\": expected"));
    assert!(e(None, Some(3)).contains("catch_up_limit is set but missed is not"));
    assert!(e(Some("catch_up"), Some(0)).contains("catch_up_limit = 0: expected 1 to 1000"));
}

struct Fixed(DateTime<Utc>);
impl Clock for Fixed {
    fn now(&self) -> DateTime<Utc> {
        self.0
    }
}

/// Catch-up fires of one job run one at a time, oldest date first, even when an older
/// date takes longer; another job's fires run beside them (issue 21.3d: they ran
/// concurrently and finished newest first).
#[tokio::test]
async fn catch_up_fires_of_a_job_complete_oldest_first_one_at_a_time() {
    let now = utc("2026-01-05T10:00:00Z");
    let clock = Arc::new(Fixed(now));
    let jobs = [
        ScheduledJob {
            date: Some("yesterday".into()),
            ..job("c", "0 6 * * *", "UTC", Missed::CatchUp { limit: 4 })
        },
        ScheduledJob {
            date: Some("yesterday".into()),
            ..job("d", "0 6 * * *", "UTC", Missed::CatchUp { limit: 4 })
        },
    ];
    let mut p = Planner::new(&jobs, now).unwrap();
    p.resume_after("c", utc("2026-01-01T06:00:01Z"));
    p.resume_after("d", utc("2026-01-01T06:00:01Z"));
    let (stop_tx, _) = tokio::sync::watch::channel(None::<String>);
    let log = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let overlapped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fire = {
        let (log, running, overlapped) = (log.clone(), running.clone(), overlapped.clone());
        move |f: Fire| {
            let (log, running, overlapped) = (log.clone(), running.clone(), overlapped.clone());
            async move {
                use std::sync::atomic::Ordering::SeqCst;
                if f.job == "c" && running.fetch_add(1, SeqCst) > 0 {
                    overlapped.store(true, SeqCst);
                }
                // The oldest date is the slowest: out of order if they ran at once.
                let ms = match f.date.to_string().as_str() {
                    "2026-01-01" | "2026-01-02" => 120,
                    "2026-01-03" => 60,
                    _ => 0,
                };
                tokio::time::sleep(Duration::from_millis(ms)).await;
                log.lock().unwrap().push(format!("{} {}", f.job, f.date));
                if f.job == "c" {
                    running.fetch_sub(1, SeqCst);
                }
            }
        }
    };
    let shutdown = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        "SIGTERM"
    };
    let summary = run_loop(
        &mut p,
        clock,
        fire,
        shutdown,
        Duration::from_secs(5),
        stop_tx,
        &Heartbeat::default(),
    )
    .await
    .unwrap();
    assert_eq!(summary.fired, 8);
    assert!(!overlapped.load(std::sync::atomic::Ordering::SeqCst));
    let log = log.lock().unwrap().clone();
    let of = |job: &str| -> Vec<String> {
        log.iter()
            .filter(|l| l.starts_with(job))
            .map(|l| l[2..].to_string())
            .collect()
    };
    let dates = ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"];
    assert_eq!(of("c"), dates);
    assert_eq!(of("d"), dates);
    // The two jobs ran side by side: d's first date finished before c's last.
    let pos = |l: &str| log.iter().position(|x| x == l).unwrap();
    assert!(pos("d 2026-01-01") < pos("c 2026-01-04"), "{log:?}");
}

#[tokio::test]
async fn the_loop_fires_due_slots_and_stops_running_fires_after_the_grace_period() {
    // A fake clock just after a slot: that slot fires at once; the loop then waits.
    let clock = Arc::new(Fixed(utc("2026-01-01T06:00:00.100Z")));
    let mut p = Planner::new(
        &[job("j", "0 6 * * *", "UTC", Missed::Skip)],
        utc("2026-01-01T05:59:59Z"),
    )
    .unwrap();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(None::<String>);
    let (fired_tx, mut fired_rx) = tokio::sync::mpsc::unbounded_channel();
    let fire = move |f: Fire| {
        let mut stop = stop_rx.clone();
        let fired = fired_tx.clone();
        async move {
            let _ = fired.send(f.slot);
            // A fire that runs until told to stop.
            let message = stop.wait_for(Option::is_some).await.unwrap().clone();
            let _ = fired.send(utc("2000-01-01T00:00:00Z"));
            assert!(message.unwrap().starts_with("interrupted by SIGTERM"));
        }
    };
    let shutdown = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        "SIGTERM"
    };
    let summary = run_loop(
        &mut p,
        clock,
        fire,
        shutdown,
        Duration::from_millis(50),
        stop_tx,
        &Heartbeat::default(),
    )
    .await
    .unwrap();
    assert_eq!(fired_rx.recv().await, Some(utc("2026-01-01T06:00:00Z")));
    assert_eq!(fired_rx.recv().await, Some(utc("2000-01-01T00:00:00Z")));
    assert_eq!(
        summary,
        LoopSummary {
            fired: 1,
            dropped: 0,
            interrupted: 1
        }
    );
}

#[test]
fn a_date_fired_again_goes_first_once_and_only_for_catch_up_jobs() {
    let now = utc("2026-01-05T10:00:00Z");
    let jobs = [
        ScheduledJob {
            date: Some("yesterday".into()),
            ..job(
                "c",
                "0 6 * * *",
                "Europe/Paris",
                Missed::CatchUp { limit: 3 },
            )
        },
        job("s", "0 6 * * *", "UTC", Missed::Skip),
    ];
    let mut p = Planner::new(&jobs, now).unwrap();
    let day = |s: &str| s.parse::<NaiveDate>().unwrap();
    // The 3rd's fire was interrupted; asked twice, fired once.
    p.refire("c", utc("2026-01-04T05:00:00Z"), day("2026-01-03"));
    p.refire("c", utc("2026-01-04T05:00:00Z"), day("2026-01-03"));
    p.refire("s", utc("2026-01-04T06:00:00Z"), day("2026-01-03"));
    p.refire("nosuch", utc("2026-01-04T06:00:00Z"), day("2026-01-03"));
    let due = p.due(now).unwrap();
    assert_eq!(due.fires.len(), 1, "{due:?}");
    let f = &due.fires[0];
    assert_eq!(
        (f.job.as_str(), f.date.to_string(), f.catch_up),
        ("c", "2026-01-03".into(), true)
    );
    assert_eq!(f.local, "2026-01-04T06:00:00+01:00");
    assert!(p.due(now).unwrap().fires.is_empty(), "not again");
    // A date this tick fires anyway is not fired twice, and older refires go first.
    let mut p = Planner::new(&jobs, utc("2026-01-05T04:59:59Z")).unwrap();
    p.refire("c", utc("2026-01-05T05:00:00Z"), day("2026-01-04"));
    p.refire("c", utc("2026-01-03T05:00:00Z"), day("2026-01-02"));
    let due = p.due(utc("2026-01-05T05:00:01Z")).unwrap();
    let dates: Vec<String> = due.fires.iter().map(|f| f.date.to_string()).collect();
    assert_eq!(dates, ["2026-01-02", "2026-01-04"]);
    assert!(!due.fires[1].catch_up, "the 4th is the on-time fire");
}
