//! `idem cleanup` as a user meets it: counts per table, `--dry-run` reports the same counts
//! and deletes nothing, ledger rows a kept key points at stay, bad flags exit 2.

use serde_json::{json, Value};

use crate::{bq_limits, common};

use common::Sandbox;

fn job(name: &str) -> String {
    format!(
        r#"
name = "{name}"
processor = "sql"
[guards]
time_window = "1h"
[sql]
warehouse = "sqlite://wh.db"
setup = "CREATE TABLE IF NOT EXISTS out (day TEXT)"
process = "INSERT INTO out SELECT @scope WHERE @scope <> '2026-01-03' UNION ALL SELECT abs(-9223372036854775807 - 1) WHERE @scope = '2026-01-03'"
"#
    )
}

fn decision(s: &Sandbox, date: &str) -> String {
    let (_, e, err) = s.json(&["explain", "daily", "--date", date]);
    e["decision"]
        .as_str()
        .unwrap_or_else(|| panic!("{e} {err}"))
        .to_string()
}

fn ledger(s: &Sandbox) -> Vec<String> {
    let (code, v, err) = s.json(&["runs", "--limit", "0"]);
    assert_eq!(code, 0, "{err}");
    let mut scopes: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["scope"].as_str().unwrap(),
                r["status"].as_str().unwrap()
            )
        })
        .collect();
    scopes.sort();
    scopes
}

fn cleanup(s: &Sandbox, args: &[&str]) -> Value {
    let mut all = vec!["cleanup"];
    all.extend(args);
    let (code, v, err) = s.json(&all);
    assert_eq!(code, 0, "{err}");
    v
}

#[test]
fn cleanup_counts_per_table_the_dry_run_deletes_nothing_and_kept_keys_keep_their_runs() {
    let s = Sandbox::new("idem-cleanup");
    s.write_job("daily", &job("daily"));
    for d in ["2026-01-01", "2026-01-02", "2026-01-03"] {
        s.json(&["run", "daily", "--date", d]);
    }
    assert_eq!(
        ledger(&s),
        [
            "2026-01-01 completed",
            "2026-01-02 completed",
            "2026-01-03 failed"
        ]
    );

    // Keys kept an hour, the ledger not at all: only the failed run (no key) goes.
    let dry = cleanup(&s, &["--keep", "1h", "--keep-runs", "0s", "--dry-run"]);
    assert_eq!(dry["dry_run"], true);
    let expect = json!({"processing_keys": 0, "processing_runs": 1, "processing_leases": 0, "event_keys": 0});
    assert_eq!(dry["tables"], expect, "{dry}");
    assert_eq!(ledger(&s).len(), 3, "a dry run deletes nothing");
    let done = cleanup(&s, &["--keep", "1h", "--keep-runs", "0s"]);
    assert_eq!(done["tables"], expect, "{done}");
    assert_eq!(
        ledger(&s),
        ["2026-01-01 completed", "2026-01-02 completed"],
        "runs a kept key points at stay"
    );
    assert_eq!(decision(&s, "2026-01-01"), "skip");

    // Nothing kept: every key and run goes (the leases were released at once, so their
    // rows expired). The keys are made two hours old first: inside the job's 1 h time
    // window cleanup keeps them whatever --keep says.
    for scope in ["2026-01-01", "2026-01-02"] {
        let two_hours_ago = (chrono::Utc::now() - chrono::Duration::hours(2)).timestamp_micros();
        store_sql(&s, AGE_KEYS, two_hours_ago, scope);
    }
    let dry = cleanup(
        &s,
        &[
            "--keep",
            "0s",
            "--keep-runs",
            "0s",
            "--dry-run",
            "--batch",
            "1",
        ],
    );
    let counts = dry["tables"].clone();
    assert_eq!(counts["processing_keys"], 2, "{dry}");
    assert_eq!(counts["processing_runs"], 2, "{dry}");
    assert_eq!(
        store_sql(
            &s,
            "SELECT count(*) FROM processing_keys WHERE ?1 = ?1 AND scope = ?2",
            0,
            "2026-01-01"
        ),
        1,
        "a dry run deletes nothing"
    );
    let out = s.idem(&[
        "cleanup",
        "--keep",
        "0s",
        "--keep-runs",
        "0s",
        "--batch",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("deleted from sqlite://"), "{text}");
    for (table, n) in [
        ("processing_keys", &counts["processing_keys"]),
        ("processing_runs", &counts["processing_runs"]),
        ("processing_leases", &counts["processing_leases"]),
        ("event_keys", &counts["event_keys"]),
    ] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(table))
            .unwrap_or_else(|| panic!("{table}: {text}"));
        assert_eq!(
            line.split_whitespace().nth(1).unwrap(),
            n.to_string(),
            "the dry run's count: {text}"
        );
    }
    assert!(ledger(&s).is_empty());
    assert_eq!(decision(&s, "2026-01-01"), "run");
}

#[test]
fn bad_cleanup_flags_exit_2_and_delete_nothing() {
    let s = Sandbox::new("idem-cleanup-bad");
    s.write_job("daily", &job("daily"));
    s.json(&["run", "daily", "--date", "2026-01-01"]);
    for (args, expect) in [
        (
            vec!["cleanup", "--keep-runs", "soon"],
            "--keep-runs: bad duration",
        ),
        (vec!["cleanup", "--batch", "0"], "--batch"),
    ] {
        let out = s.idem(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
    assert_eq!(ledger(&s).len(), 1);
}

/// Runs one statement on the SQLite store file, binding `micros` and `scope`; returns the
/// rows changed (or counted, for a SELECT count).
/// Makes the keys of scope `?2` as old as if processed at `?1`: their processing instant
/// and their own retention (`keep_until`, written as processing instant + window) move
/// back together.
const AGE_KEYS: &str = "UPDATE processing_keys SET keep_until = keep_until - (processed_at - ?1), \
     processed_at = ?1 WHERE scope = ?2";

fn store_sql(s: &Sandbox, sql: &str, micros: i64, scope: &str) -> i64 {
    let url = format!("{}?mode=rw", s.store);
    let sql = sql.to_string();
    let scope = scope.to_string();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
            let q = || sqlx::query(&sql).bind(micros).bind(&scope);
            let n = if sql.starts_with("SELECT") {
                sqlx::query_scalar::<_, i64>(&sql)
                    .bind(micros)
                    .bind(&scope)
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            } else {
                q().execute(&pool).await.unwrap().rows_affected() as i64
            };
            pool.close().await;
            n
        })
}

#[test]
fn the_shipped_cleanup_job_deletes_exactly_what_is_past_retention_and_runs_once_a_window() {
    let s = Sandbox::new("idem-cleanup-job");
    s.write_job("daily", &job("daily"));
    for d in ["2026-01-01", "2026-01-02", "2026-01-04"] {
        let (code, _, err) = s.json(&["run", "daily", "--date", d]);
        assert_eq!(code, 0, "{err}");
    }
    // The shipped job, with ledger rows kept 35 days so the aged runs go too.
    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("jobs/cleanup.toml"),
    )
    .unwrap();
    assert!(shipped.contains("keep = \"30d\""), "{shipped}");
    s.write_job(
        "cleanup",
        &shipped.replace("keep_runs = \"90d\"", "keep_runs = \"35d\""),
    );

    // Two dates' keys, runs and leases become 40 days old; 2026-01-04 stays new.
    let old = (chrono::Utc::now() - chrono::Duration::days(40)).timestamp_micros();
    let mut aged = [0i64; 3];
    for scope in ["2026-01-01", "2026-01-02"] {
        aged[0] += store_sql(&s, AGE_KEYS, old, scope);
        for (i, table, column) in [
            (1, "processing_runs", "started_at"),
            (2, "processing_leases", "expires_at"),
        ] {
            aged[i] += store_sql(
                &s,
                &format!("UPDATE {table} SET {column} = ?1 WHERE scope = ?2"),
                old,
                scope,
            );
        }
    }
    assert_eq!(aged, [2, 2, 2], "one key, one run and one lease per date");

    let (code, report, err) = s.json(&["run", "cleanup"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(report["status"], "completed", "{report}");
    assert_eq!(report["records_processed"], 6, "{report}");
    assert_eq!(
        report["output"]["tables"],
        json!({"processing_keys": 2, "processing_runs": 2, "processing_leases": 2, "event_keys": 0}),
        "{report}"
    );
    let count = |table: &str, scope: &str| {
        store_sql(
            &s,
            &format!("SELECT count(*) FROM {table} WHERE ?1 = ?1 AND scope = ?2"),
            0,
            scope,
        )
    };
    for scope in ["2026-01-01", "2026-01-02"] {
        assert_eq!(count("processing_keys", scope), 0, "{scope}");
        assert_eq!(count("processing_runs", scope), 0, "{scope}");
    }
    assert_eq!(
        count("processing_keys", "2026-01-04"),
        1,
        "the new key stays"
    );
    assert_eq!(
        decision(&s, "2026-01-04"),
        "skip",
        "the new key still guards"
    );
    assert_eq!(decision(&s, "2026-01-01"), "run", "the old key is gone");

    // The clean is in the ledger like any run; a second one in the window is skipped.
    let (code, again, err) = s.json(&["run", "cleanup"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(again["status"], "skipped", "{again}");
    assert_eq!(again["skip_reason"], "time_window", "{again}");
    let (_, runs, _) = s.json(&["runs", "--job", "cleanup", "--limit", "0"]);
    let statuses: Vec<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses.len(), 2, "{runs}");
    assert!(statuses.contains(&"completed") && statuses.contains(&"skipped"));
    assert_eq!(
        ledger(&s)
            .iter()
            .filter(|l| l.contains("2026-01-04"))
            .count(),
        1
    );
}

#[test]
fn a_cleanup_job_with_a_bad_parameter_exits_2_naming_it() {
    let s = Sandbox::new("idem-cleanup-job-bad");
    s.write_job(
        "cleanup",
        "name = \"cleanup\"\nprocessor = \"cleanup\"\n[params]\nkeep = \"a month\"\n",
    );
    let out = s.idem(&["run", "cleanup", "--date", "2026-01-01"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("params.keep"), "{err}");
}

#[test]
fn partition_expiration_is_set_in_whole_days_on_bigquery_only() {
    let s = Sandbox::new("idem-cleanup-partitions");
    assert_eq!(s.json(&["migrate"]).0, 0);
    // Other stores have no partitions: their JSON has no partition section, and asking to
    // set an expiration is a usage error naming the store kind.
    let v = cleanup(&s, &[]);
    assert!(v.get("partition_expiration").is_none(), "{v}");
    let (code, _, err) = s.json(&["cleanup", "--set-partition-expiration", "30d"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("needs a BigQuery store; sqlite"), "{err}");
    // The value is checked before the store is asked: whole days, 1 to 36500, or none.
    for bad in ["36h", "0d", "36501d", "30", "30d; DROP TABLE x", "-1d"] {
        let arg = format!("--set-partition-expiration={bad}");
        let out = s.idem(&["cleanup", &arg]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--set-partition-expiration"), "{bad}: {err}");
    }
    let out = s.idem(&["cleanup", "--set-partition-expiration", "30d", "--dry-run"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn partition_expiration_reads_the_tables_time_partitioning() {
    use idem::store::PartitionExpiration;
    let days = |p: Option<Option<&str>>| {
        let e = PartitionExpiration::from_api("processing_keys", p);
        (e.partitioned, e.days)
    };
    assert_eq!(days(Some(Some("2592000000"))), (true, Some(30.0)));
    assert_eq!(days(Some(None)), (true, None));
    assert_eq!(days(Some(Some("0"))), (true, None));
    assert_eq!(days(None), (false, None));
}

/// On BigQuery: `idem cleanup` reports each partitioned table's expiration and
/// `--set-partition-expiration` runs `ALTER TABLE … SET OPTIONS` on all three: the days
/// on `processing_keys` and `processing_runs`, none on `event_keys` (an event key lives by
/// its TTL, never by its partition's age). The emulator accepts the DDL but keeps no
/// partitioning (`tables.get` shows none, so the report says no expiration): the test
/// sends the store's calls through a proxy that records each statement, and checks the
/// statements sent; against BigQuery it checks the days reported too.
#[test]
fn bigquery_cleanup_sets_and_reports_partition_expiration() {
    let Some(url) = common::bigquery_url("bigquery_cleanup_sets_and_reports_partition_expiration")
    else {
        return;
    };
    let dataset = format!("idem_parts_{}", &idem::new_run_id().replace('-', "")[..10]);
    let (base, query) = url.split_once('?').unwrap_or((&url, ""));
    let project = base
        .trim_start_matches("bigquery://")
        .split('/')
        .next()
        .unwrap();
    let store = format!("bigquery://{project}/{dataset}?{query}");
    let emulator = bq_limits::endpoint_of(&store);
    // The recording proxy, on a runtime of its own that serves it while idem runs.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let proxy = emulator.as_ref().map(|upstream| {
        let mut limits = bq_limits::Limits::bigquery(std::time::Duration::ZERO);
        limits.record_sql = true;
        rt.block_on(bq_limits::Simulator::start(upstream, limits))
    });
    let store = proxy.as_ref().map_or(store.clone(), |p| p.url(&store));
    let s = Sandbox::with_store("idem-cleanup-bq-parts", &store);
    let (code, _, err) = s.json(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    let tables = ["event_keys", "processing_keys", "processing_runs"];
    let names = |v: &Value| {
        let mut n: Vec<String> = v["partition_expiration"]
            .as_object()
            .unwrap_or_else(|| panic!("{v}"))
            .keys()
            .cloned()
            .collect();
        n.sort();
        n
    };
    // The ALTER statements sent since the last call, as (table, days), sorted.
    let altered = || -> Vec<(String, String)> {
        let proxy = proxy.as_ref().unwrap();
        let sql = proxy.stats().sql;
        proxy.reset_stats();
        let mut out: Vec<(String, String)> = sql
            .iter()
            .filter_map(|q| {
                let rest = q.strip_prefix("ALTER TABLE `")?;
                let (table, rest) = rest.split_once('`')?;
                let days = rest
                    .strip_prefix(" SET OPTIONS (partition_expiration_days = ")?
                    .strip_suffix(')')?;
                Some((table.to_string(), days.to_string()))
            })
            .collect();
        out.sort();
        out
    };
    let expected = |days: &str| -> Vec<(String, String)> {
        tables
            .iter()
            .map(|t| {
                let days = if *t == "event_keys" { "NULL" } else { days };
                (format!("{project}.{dataset}.{t}"), days.to_string())
            })
            .collect()
    };
    if proxy.is_some() {
        altered();
    }
    let v = cleanup(&s, &[]);
    assert_eq!(names(&v), tables, "{v}");
    assert_eq!(v["keys_deleted"], 0, "{v}");
    if proxy.is_some() {
        assert_eq!(altered(), [], "a plain cleanup alters nothing");
    }

    let set = cleanup(&s, &["--set-partition-expiration", "30d"]);
    assert_eq!(names(&set), tables, "{set}");
    if proxy.is_some() {
        assert_eq!(altered(), expected("30"), "{set}");
        for t in tables {
            assert!(
                set["partition_expiration"][t].is_null(),
                "the emulator keeps no partitioning: {set}"
            );
        }
    } else {
        assert_eq!(
            set["partition_expiration"]["processing_keys"],
            json!(30.0),
            "{set}"
        );
        assert_eq!(
            set["partition_expiration"]["processing_runs"],
            json!(30.0),
            "{set}"
        );
        assert!(set["partition_expiration"]["event_keys"].is_null(), "{set}");
    }
    let off = cleanup(&s, &["--set-partition-expiration", "none"]);
    for t in tables {
        assert!(off["partition_expiration"][t].is_null(), "{off}");
    }
    if proxy.is_some() {
        assert_eq!(altered(), expected("NULL"), "{off}");
    }
    let (code, out, err) = s.json(&["cleanup", "--set-partition-expiration", "30d"]);
    assert_eq!(code, 0, "{out} {err}");
    let human = s.idem(&["cleanup", "--keep", "30d"]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("partition expiration:"), "{text}");
}

/// `idem gate --input FILE --key id` on the sandbox's store: the verdict of each line.
fn gate_verdicts(s: &Sandbox, lines: &str) -> Vec<String> {
    let input = s.dir.join("events.ndjson");
    std::fs::write(&input, lines).unwrap();
    let out = s
        .command(&["gate", "--input", input.to_str().unwrap(), "--key", "id"])
        .output()
        .expect("run idem gate");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["verdict"].to_string())
        .collect()
}

/// Cleanup never deletes what a guard or a gate still needs (issue 21.2): a gate key with
/// no TTL (the gate's default) outlives `--keep`, and a job whose time window is longer
/// than `--keep` keeps its keys for the window; the output says what it kept and why.
#[test]
fn cleanup_keeps_gate_keys_without_ttl_and_keys_inside_a_longer_guard_window() {
    let s = Sandbox::new("idem-cleanup-needs");
    s.write_job("daily", &job("daily"));
    s.write_job(
        "monthly",
        &job("monthly").replace("time_window = \"1h\"", "time_window = \"40d\""),
    );
    for (name, date) in [("daily", "2026-01-02"), ("monthly", "2026-01-01")] {
        let (code, _, err) = s.json(&["run", name, "--date", date]);
        assert_eq!(code, 0, "{err}");
    }
    assert_eq!(
        gate_verdicts(&s, "{\"id\":\"pay-1\",\"amount\":5}\n"),
        ["\"new\""]
    );
    // Everything becomes 35 days old (the gate key 35 days since first seen).
    let old = (chrono::Utc::now() - chrono::Duration::days(35)).timestamp_micros();
    for scope in ["2026-01-01", "2026-01-02"] {
        store_sql(&s, AGE_KEYS, old, scope);
    }
    assert_eq!(
        store_sql(
            &s,
            "UPDATE event_keys SET first_seen = ?1 WHERE ?2 = ?2",
            old,
            ""
        ),
        1
    );
    let out = s
        .json_command(&["cleanup", "--keep", "30d"])
        .output()
        .unwrap();
    let (code, report, err) = common::parse(out);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        report["keys_deleted"], 1,
        "only daily's key: {report}\n{err}"
    );
    assert_eq!(report["event_keys_deleted"], 0, "{report}");
    assert!(
        err.contains("kept keys of monthly for 40d (guards.time_window is longer than --keep 30d)"),
        "{err}"
    );
    let explain = |job: &str, date: &str| {
        let (_, e, err) = s.json(&["explain", job, "--date", date]);
        e["decision"]
            .as_str()
            .unwrap_or_else(|| panic!("{e} {err}"))
            .to_string()
    };
    assert_eq!(
        explain("monthly", "2026-01-01"),
        "skip",
        "inside its 40-day window"
    );
    assert_eq!(
        explain("daily", "2026-01-02"),
        "run",
        "past --keep and its 1 h window"
    );
    assert_eq!(
        gate_verdicts(&s, "{\"id\":\"pay-1\",\"amount\":5}\n"),
        ["\"replay\""],
        "a 35-day-old payment is still a replay"
    );
}

/// A key carries its own retention (issue 37.2): an `idem exec` job has no job file for
/// cleanup to read its window from, yet `cleanup --keep 1s` keeps its key for the 40 days
/// of its `--time-window`, and the date is skipped again afterwards; a key past its window
/// goes. The jobs folder holds no job file.
#[test]
fn cleanup_keeps_an_exec_jobs_key_for_its_own_window_without_a_job_file() {
    let s = Sandbox::new("idem-cleanup-exec");
    let exec = |name: &str, date: &str, window: &str| {
        let out = s.idem(&[
            "exec",
            name,
            "--date",
            date,
            "--time-window",
            window,
            "--",
            "true",
        ]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, _, err) = exec("monthly_export", "2026-01-01", "40d");
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = exec("hourly_export", "2026-01-01", "1h");
    assert_eq!(code, Some(0), "{err}");
    // Both keys become 35 days old: inside the 40-day window, past the hour.
    let old = (chrono::Utc::now() - chrono::Duration::days(35)).timestamp_micros();
    assert_eq!(store_sql(&s, AGE_KEYS, old, "2026-01-01"), 2);
    let out = s
        .json_command(&["cleanup", "--keep", "1s"])
        .output()
        .unwrap();
    let (code, report, err) = common::parse(out);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        report["keys_deleted"], 1,
        "only hourly's key: {report}\n{err}"
    );
    let (code, text, err) = exec("monthly_export", "2026-01-01", "40d");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        text.starts_with("skipped monthly_export for 2026-01-01 (time_window"),
        "the 40-day window still holds after cleanup: {text}{err}"
    );
    let (code, text, err) = exec("hourly_export", "2026-01-01", "1h");
    assert_eq!(code, Some(0), "{err}");
    assert!(text.starts_with("completed hourly_export"), "{text}{err}");
}
