//! The BigQuery store and warehouse against a real BigQuery API implementation: the local
//! emulator (`.ci/bqemulator.sh`, see docs/bigquery.md), plus a tiny local HTTP responder
//! for API failure shapes the emulator does not produce.
//!
//! Every test needs `IDEM_TEST_BIGQUERY_URL` (e.g.
//! `bigquery://idem-test/idem_local?endpoint=http://127.0.0.1:PORT`) and skips with a
//! message when it is unset. Tests share the emulator, so each uses its own processor names,
//! tables and (where it breaks things) its own dataset.
//!
//! The emulator serialises DML, so BigQuery's concurrent-update conflicts cannot happen on
//! it; the conflict tests inject the error real BigQuery returns through the store's fault
//! hook.
#![cfg(feature = "bigquery")]

mod common;

/// One module, so `cargo test bigquery` selects these tests as it does the BigQuery
/// conformance checks.
mod bigquery {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use chrono::Utc;
    use idem::backend::bigquery::{ApiError, BigQueryUrl, FaultFuture, FaultHook};
    use idem::guard::{GuardStack, LeaseGuard};
    use idem::store::bigquery::{BigQueryStore, FIND_KEYS_SQL};
    use idem::store::migrations::BIGQUERY as MIGRATIONS;
    use idem::store::prelude::*;
    use idem::store::{ClaimRequest, DynStore, Finish, KeyLookup};
    use idem::warehouse::{prepare, BigQueryWarehouse, Dialect, Warehouse};
    use idem::{
        async_trait, scope_key, BoxError, Error, KeyKind, KeyRecord, Outcome, Processor,
        RunRequest, RunStatus, Runner, SkipReason,
    };
    use serde_json::Value;

    use super::common::Sandbox;

    /// The emulator URL, or `None` after saying why the test is skipped (in CI, with
    /// `IDEM_REQUIRE_SERVICES=1`, a missing URL fails the test instead).
    fn bigquery_url(test: &str) -> Option<String> {
        super::common::service_url(
            "IDEM_TEST_BIGQUERY_URL",
            &format!("bigquery::{test}"),
            super::common::BIGQUERY_HOW,
        )
    }

    macro_rules! require_bigquery {
        ($test:expr) => {
            match bigquery_url($test) {
                Some(url) => url,
                None => return,
            }
        };
    }

    fn unique(prefix: &str) -> String {
        format!("{prefix}_{}", &idem::new_run_id().replace('-', "")[..10])
    }

    /// The same URL with another dataset.
    fn with_dataset(url: &str, dataset: &str) -> String {
        let parsed = BigQueryUrl::parse(url).unwrap();
        let query = url.split_once('?').map(|(_, q)| q).unwrap_or("");
        format!("bigquery://{}/{dataset}?{query}", parsed.project)
    }

    fn table(url: &str, name: &str) -> String {
        BigQueryUrl::parse(url).unwrap().table(name)
    }

    /// Runs statements through the BigQuery warehouse (no parameters).
    async fn exec(url: &str, sql: &str) {
        let w = BigQueryWarehouse::connect(url).await.unwrap();
        let statements = prepare(sql, Dialect::BigQuery).unwrap();
        w.execute(&statements, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    async fn rows(url: &str, sql: &str) -> Vec<Value> {
        let w = BigQueryWarehouse::connect(url).await.unwrap();
        let statement = &prepare(sql, Dialect::BigQuery).unwrap()[0];
        w.query(statement, &Default::default()).await.unwrap()
    }

    /// A SQL job on BigQuery: sums `src` into `out` for the scope's day.
    struct SalesJob {
        src: String,
        out: String,
    }

    impl SalesJob {
        /// Names fresh tables; the store is opened first so the dataset exists.
        async fn new(url: &str) -> Self {
            BigQueryStore::connect(url).await.expect("open the store");
            SalesJob {
                src: table(url, &unique("src")),
                out: table(url, &unique("out")),
            }
        }

        fn process(&self) -> String {
            format!(
            "DELETE FROM {out} WHERE day = @scope_date; \
             INSERT INTO {out} (day, qty) SELECT day, SUM(qty) FROM {src} WHERE day = @scope_date GROUP BY day",
            out = self.out,
            src = self.src
        )
        }

        fn toml(&self, name: &str, url: &str, guards: &str, process: &str) -> String {
            let name = toml::Value::String(name.to_string()).to_string();
            format!(
                r#"
name = {name}
processor = "sql"
[guards]
{guards}
[sql]
warehouse = "{url}"
setup = """
CREATE TABLE IF NOT EXISTS {src} (day DATE, item STRING, qty INT64);
CREATE TABLE IF NOT EXISTS {out} (day DATE, qty INT64)
"""
content = "SELECT item, qty FROM {src} WHERE day = @scope_date ORDER BY item"
process = """{process}"""
"#,
                src = self.src,
                out = self.out,
            )
        }

        async fn add(&self, url: &str, day: &str, item: &str, qty: i64) {
            exec(
                url,
                &format!(
                    "CREATE TABLE IF NOT EXISTS {src} (day DATE, item STRING, qty INT64); \
                 INSERT INTO {src} (day, item, qty) VALUES (DATE '{day}', '{item}', {qty})",
                    src = self.src
                ),
            )
            .await;
        }

        async fn total(&self, url: &str, day: &str) -> Option<i64> {
            rows(
                url,
                &format!("SELECT qty FROM {} WHERE day = DATE '{day}'", self.out),
            )
            .await
            .first()
            .and_then(|r| r["qty"].as_i64())
        }
    }

    fn status(v: &Value) -> &str {
        v["status"].as_str().unwrap_or("?")
    }

    async fn scope_key_found(url: &str, processor: &str, scope: &str) -> Option<KeyRecord> {
        let store = BigQueryStore::connect(url).await.unwrap();
        store
            .find_keys(&[KeyLookup {
                key: scope_key(processor, scope),
                kind: KeyKind::Scope,
                since: Utc::now() - chrono::Duration::days(1),
            }])
            .await
            .unwrap()
            .pop()
            .flatten()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sql_job_runs_once_then_skips_by_time_window() {
        let url = require_bigquery!("sql_job_runs_once_then_skips_by_time_window");
        let sandbox = Sandbox::with_store("idem-bq", &url);
        let job = SalesJob::new(&url).await;
        job.add(&url, "2025-11-18", "ball", 3).await;
        job.add(&url, "2025-11-18", "bat", 4).await;
        job.add(&url, "2025-11-19", "ball", 100).await;
        let name = unique("daily_sales");
        let path = sandbox.write_job(
            "sales",
            &job.toml(&name, &url, "time_window = \"1h\"", &job.process()),
        );

        let (code, first, stderr) = sandbox.run(&path, "2025-11-18");
        assert_eq!(code, 0, "{first}\n{stderr}");
        assert_eq!(status(&first), "completed", "{first}");
        assert_eq!(first["recorded"], true);
        assert_eq!(
            job.total(&url, "2025-11-18").await,
            Some(7),
            "@scope_date bound as a DATE parameter selects the day"
        );

        let (code, second, stderr) = sandbox.run(&path, "2025-11-18");
        assert_eq!(code, 0, "a skip is a success: {second}\n{stderr}");
        assert_eq!(status(&second), "skipped", "{second}");
        assert_eq!(second["skip_reason"], "time_window");
        assert_eq!(second["previous_run"]["run_id"], first["run_id"]);

        // The ledger on BigQuery has both runs, newest first.
        let (code, runs, _) = sandbox.json(&["runs", "--job", &name]);
        assert_eq!(code, 0);
        let statuses: Vec<&str> = runs
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["status"].as_str().unwrap())
            .collect();
        assert_eq!(statuses, vec!["skipped", "completed"]);
        assert!(scope_key_found(&url, &name, "2025-11-18").await.is_some());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failing_sql_records_a_failed_run_and_no_key_then_the_fix_runs() {
        let url =
            require_bigquery!("failing_sql_records_a_failed_run_and_no_key_then_the_fix_runs");
        let sandbox = Sandbox::with_store("idem-bq", &url);
        let job = SalesJob::new(&url).await;
        job.add(&url, "2025-11-18", "ball", 5).await;
        let name = unique("failing");
        let missing = table(&url, &unique("missing"));
        let broken = format!(
        "INSERT INTO {missing} (day, qty) SELECT day, SUM(qty) FROM {} WHERE day = @scope_date GROUP BY day",
        job.src
    );
        let path = sandbox.write_job(
            "failing",
            &job.toml(&name, &url, "time_window = \"1h\"", &broken),
        );

        let (code, failed, stderr) = sandbox.run(&path, "2025-11-18");
        assert_eq!(code, 1, "a failed run exits 1: {failed}\n{stderr}");
        assert_eq!(status(&failed), "failed");
        let error = failed["error"].as_str().unwrap();
        assert!(
            error.contains("sql process failed") && error.contains("Not found"),
            "the warehouse's error is reported: {error}"
        );
        assert_eq!(failed["recorded"], true);
        let (_, runs, _) = sandbox.json(&["runs", "--job", &name, "--status", "failed"]);
        assert_eq!(runs.as_array().unwrap().len(), 1, "{runs}");
        assert!(
            scope_key_found(&url, &name, "2025-11-18").await.is_none(),
            "a failed run writes no key"
        );

        // Fixed: the retry is not blocked and completes.
        sandbox.write_job(
            "failing",
            &job.toml(&name, &url, "time_window = \"1h\"", &job.process()),
        );
        let (code, fixed, stderr) = sandbox.run(&path, "2025-11-18");
        assert_eq!(code, 0, "{fixed}\n{stderr}");
        assert_eq!(status(&fixed), "completed");
        assert_eq!(job.total(&url, "2025-11-18").await, Some(5));
        assert!(scope_key_found(&url, &name, "2025-11-18").await.is_some());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn content_hash_skips_unchanged_source_and_runs_on_change() {
        let url = require_bigquery!("content_hash_skips_unchanged_source_and_runs_on_change");
        let sandbox = Sandbox::with_store("idem-bq", &url);
        let job = SalesJob::new(&url).await;
        job.add(&url, "2025-11-18", "ball", 3).await;
        let name = unique("hashed");
        let path = sandbox.write_job(
            "hashed",
            &job.toml(
                &name,
                &url,
                "time_window = \"0s\"\ncontent_hash = \"24h\"\nhash = \"md5\"",
                &job.process(),
            ),
        );

        let (code, first, stderr) = sandbox.run(&path, "2025-11-18");
        assert_eq!(
            (code, status(&first)),
            (0, "completed"),
            "{first}\n{stderr}"
        );
        let key = first["processing_key"].as_str().unwrap().to_string();
        assert_eq!(key.len(), 32, "md5 keys are 32 hex characters");

        let (code, same, _) = sandbox.run(&path, "2025-11-18");
        assert_eq!((code, status(&same)), (0, "skipped"), "{same}");
        assert_eq!(same["skip_reason"], "duplicate_content_hash");
        assert_eq!(same["processing_key"], key.as_str());
        assert_eq!(same["previous_run"]["run_id"], first["run_id"]);

        // Another day's rows are not this scope's content.
        job.add(&url, "2025-11-19", "bat", 9).await;
        let (_, still, _) = sandbox.run(&path, "2025-11-18");
        assert_eq!(still["skip_reason"], "duplicate_content_hash", "{still}");

        job.add(&url, "2025-11-18", "bat", 4).await;
        let (code, changed, stderr) = sandbox.run(&path, "2025-11-18");
        assert_eq!(
            (code, status(&changed)),
            (0, "completed"),
            "{changed}\n{stderr}"
        );
        assert_ne!(changed["processing_key"], key.as_str());
        assert_eq!(job.total(&url, "2025-11-18").await, Some(7));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn processor_names_and_scopes_with_quotes_and_unicode_round_trip() {
        let url =
            require_bigquery!("processor_names_and_scopes_with_quotes_and_unicode_round_trip");
        let sandbox = Sandbox::with_store("idem-bq", &url);
        let job = SalesJob::new(&url).await;
        job.add(&url, "2025-11-18", "ball", 1).await;
        let name = format!(
            "it's; \"q\" -- DROP TABLE processing_runs; — ünïcødé 🎉 {}",
            unique("n")
        );
        let scope = "2025-11-18'; DELETE FROM processing_keys; --/ñ";
        let path = sandbox.write_job(
            "quoted",
            &job.toml(&name, &url, "time_window = \"1h\"", &job.process()),
        );
        let path = path.to_str().unwrap();
        let run = |s: &Sandbox| s.json(&["run", path, "--date", "2025-11-18", "--scope", scope]);

        let (code, first, stderr) = run(&sandbox);
        assert_eq!(
            (code, status(&first)),
            (0, "completed"),
            "{first}\n{stderr}"
        );
        assert_eq!(first["job"], name.as_str());
        let (code, runs, _) = sandbox.json(&["runs", "--job", &name, "--scope", scope]);
        assert_eq!(code, 0);
        let runs = runs.as_array().unwrap();
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!(runs[0]["processor"], name.as_str(), "byte-exact round trip");
        assert_eq!(runs[0]["scope"], scope);

        let (_, second, _) = run(&sandbox);
        assert_eq!(second["skip_reason"], "time_window", "{second}");
        let key = scope_key_found(&url, &name, scope)
            .await
            .expect("key found");
        assert_eq!(key.processor, name);
        assert_eq!(key.scope, scope);
    }

    /// The per-run check filters on the partition column of `processing_keys` and answers every
    /// lookup of a run in one API round trip.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_check_query_prunes_partitions_and_is_one_round_trip() {
        // The SQL, checked against the schema (no emulator needed for this part).
        let ddl = MIGRATIONS[0].sql;
        let keys_table = &ddl[ddl.find("processing_keys` (").unwrap()..];
        let keys_table = &keys_table[..keys_table.find(';').unwrap()];
        let partition = keys_table
            .split("PARTITION BY DATE(")
            .nth(1)
            .and_then(|s| s.split(')').next())
            .expect("processing_keys is partitioned by the date of a column");
        assert_eq!(partition, "processed_at");
        assert!(
            FIND_KEYS_SQL.contains(&format!("WHERE k.{partition} >= @oldest_since")),
            "the check filters on the partition column with a constant: {FIND_KEYS_SQL}"
        );
        assert!(keys_table.contains("CLUSTER BY processing_key, processor_name"));
        assert!(FIND_KEYS_SQL.contains("k.processing_key IN UNNEST(@keys)"));

        let url = require_bigquery!("the_check_query_prunes_partitions_and_is_one_round_trip");
        let store = BigQueryStore::connect(&url).await.unwrap();
        assert!(store
            .find_keys_sql()
            .contains("WHERE k.processed_at >= @oldest_since"));
        let p = unique("check");
        let now = chrono::DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).unwrap();
        let run_id = idem::new_run_id();
        let mut run =
            idem::store::conformance::run_record(&p, "s", &run_id, RunStatus::Completed, now);
        run.processing_key = Some(unique("content"));
        let keys = vec![
            idem::store::conformance::key_record(
                &scope_key(&p, "s"),
                KeyKind::Scope,
                &p,
                "s",
                &run_id,
                now,
            ),
            idem::store::conformance::key_record(
                run.processing_key.as_deref().unwrap(),
                KeyKind::Content,
                &p,
                "s",
                &run_id,
                now,
            ),
        ];
        store
            .finish(&Finish {
                run: run.clone(),
                keys,
                lease: None,
            })
            .await
            .unwrap();
        let lookups = vec![
            KeyLookup {
                key: scope_key(&p, "s"),
                kind: KeyKind::Scope,
                since: now - chrono::Duration::hours(1),
            },
            KeyLookup {
                key: run.processing_key.clone().unwrap(),
                kind: KeyKind::Content,
                since: now - chrono::Duration::hours(24),
            },
            KeyLookup {
                key: unique("absent"),
                kind: KeyKind::Content,
                since: now - chrono::Duration::hours(24),
            },
        ];
        let before = store.api_calls();
        let found = store.find_keys(&lookups).await.unwrap();
        assert_eq!(
            store.api_calls() - before,
            1,
            "one round trip for all guards"
        );
        assert_eq!(
            found[0].as_ref().map(|k| k.run_id.as_str()),
            Some(run_id.as_str())
        );
        assert_eq!(found[1].as_ref().map(|k| k.kind), Some(KeyKind::Content));
        assert!(found[2].is_none());
    }

    /// A query error reported as HTTP 200 + `errors[]` (the emulator's shape) is an error,
    /// never "no rows".
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn query_errors_in_the_response_body_are_idem_errors() {
        let url = require_bigquery!("query_errors_in_the_response_body_are_idem_errors");
        let own = with_dataset(&url, &unique("idem_broken"));
        let store = BigQueryStore::connect(&own).await.unwrap();
        exec(
            &own,
            &format!("DROP TABLE {}", table(&own, "processing_keys")),
        )
        .await;
        let lookup = KeyLookup {
            key: unique("k"),
            kind: KeyKind::Scope,
            since: Utc::now() - chrono::Duration::hours(1),
        };
        match store.find_keys(&[lookup]).await {
            // BigQuery answered (the table is gone): refused, not unreachable.
            Err(e @ Error::StoreRejected { .. }) => {
                let m = e.to_string();
                assert!(
                    m.contains("bigquery find_keys failed")
                        && m.contains("notFound")
                        && m.contains("processing_keys"),
                    "{m}"
                );
            }
            other => panic!("a missing table must be an error, not {other:?}"),
        }
        // The warehouse reports a missing dataset the same way (accessDenied on the emulator).
        let w = BigQueryWarehouse::connect(&url).await.unwrap();
        let bad = &prepare(
            &format!(
                "SELECT * FROM {} WHERE x = @scope",
                table(&with_dataset(&url, "no_such_dataset_x"), "t")
            ),
            Dialect::BigQuery,
        )
        .unwrap()[0];
        let mut params = idem::warehouse::Params::new();
        params.insert("scope".into(), "2025-11-18".into());
        let e = w.query(bad, &params).await.unwrap_err();
        assert!(e.contains("bigquery warehouse.query failed"), "{e}");
        let syntax = &prepare("SELEC 1", Dialect::BigQuery).unwrap()[0];
        let e = w.query(syntax, &params).await.unwrap_err();
        assert!(
            e.contains("invalidQuery") && e.contains("Syntax error"),
            "{e}"
        );
    }

    /// A tiny HTTP server answering every request with `respond(method, path)`.
    fn responder(respond: impl Fn(&str, &str) -> (u16, String) + Send + 'static) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => break None,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break Some(p + 4);
                    }
                };
                let Some(head_end) = head_end else { continue };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())
                            .flatten()
                    })
                    .unwrap_or(0);
                while buf.len() < head_end + length {
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let mut first = head.lines().next().unwrap_or("").split_whitespace();
                let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
                let (code, body) = respond(method, path);
                let kind = if body.starts_with('{') {
                    "application/json; charset=UTF-8"
                } else {
                    "text/html"
                };
                let _ = write!(
                stream,
                "HTTP/1.1 {code} X\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            }
        });
        format!("http://{addr}")
    }

    fn table_list() -> String {
        let tables: Vec<String> = [
            "processing_keys",
            "processing_runs",
            "processing_leases",
            "event_keys",
        ]
        .iter()
        .map(|t| {
            format!(r#"{{"tableReference":{{"projectId":"p","datasetId":"d","tableId":"{t}"}}}}"#)
        })
        .collect();
        format!(
            r#"{{"kind":"bigquery#tableList","tables":[{}],"totalItems":4}}"#,
            tables.join(",")
        )
    }

    fn google_error(code: u16, reason: &str, message: &str) -> String {
        format!(
            r#"{{"error":{{"code":{code},"message":"{message}","errors":[{{"domain":"global","reason":"{reason}","message":"{message}"}}],"status":"INVALID_ARGUMENT"}}}}"#
        )
    }

    /// HTTP error statuses (real BigQuery's shape for SQL errors), errors[] on a 200 and bodies
    /// that are not BigQuery JSON all become clear idem errors, in the library and in the CLI.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn http_errors_and_odd_answers_are_idem_errors() {
        // Runs without the emulator: the responder is local. Still skips without the URL so
        // the whole file behaves the same way.
        let url = require_bigquery!("http_errors_and_odd_answers_are_idem_errors");
        drop(url);
        // 1. Tables exist; every query answers HTTP 400 like real BigQuery.
        let endpoint = responder(|method, path| {
            if method == "GET" && path.contains("/tables") {
                (200, table_list())
            } else {
                (
                    400,
                    google_error(
                        400,
                        "invalidQuery",
                        "Unrecognized name: procesed_at at [3:9]",
                    ),
                )
            }
        });
        let store_url = format!("bigquery://p/d?endpoint={endpoint}");
        let store = BigQueryStore::connect(&store_url).await.unwrap();
        let lookup = KeyLookup {
            key: "k".into(),
            kind: KeyKind::Scope,
            since: Utc::now(),
        };
        let e = store
            .find_keys(std::slice::from_ref(&lookup))
            .await
            .unwrap_err();
        assert!(e.is_store_failure(), "{e:?}");
        assert_eq!(
        e.to_string(),
        format!("store {store_url} rejected the find_keys statement: bigquery find_keys failed: HTTP 400 (invalidQuery): Unrecognized name: procesed_at at [3:9]")
    );
        let e = store
            .claim(&ClaimRequest {
                processor: "p",
                scope: "s",
                run_id: "r",
                ttl: Duration::from_secs(60),
                now: Utc::now(),
            })
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("bigquery claim.read failed: HTTP 400"),
            "{e}"
        );

        // The CLI: a run under `strict` fails before processing with exit 3 and the message.
        let sandbox = Sandbox::with_store("idem-bq", &store_url);
        let path = sandbox.write_job(
        "j",
        "name = \"j\"\nprocessor = \"sql\"\n[guards]\ntime_window = \"1h\"\n[sql]\nwarehouse = \"sqlite://w.db\"\nprocess = \"SELECT 1\"\n",
    );
        let out = sandbox.idem(&["run", path.to_str().unwrap(), "--date", "2025-11-18"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(3),
            "a store that refuses the check exits 3: {stderr}"
        );
        assert!(
            stderr.contains("bigquery find_keys failed: HTTP 400 (invalidQuery)"),
            "{stderr}"
        );

        // 2. HTTP 200 with errors[] (the emulator's shape), deterministic here.
        let endpoint = responder(|method, path| {
            if method == "GET" && path.contains("/tables") {
                (200, table_list())
            } else {
                (
                200,
                r#"{"kind":"bigquery#queryResponse","jobComplete":true,"schema":{"fields":[]},"rows":[],"totalRows":"0","errors":[{"reason":"invalidQuery","message":"boom","location":"query"}]}"#.to_string(),
            )
            }
        });
        let store = BigQueryStore::connect(&format!("bigquery://p/d?endpoint={endpoint}"))
            .await
            .unwrap();
        let e = store
            .find_keys(std::slice::from_ref(&lookup))
            .await
            .unwrap_err();
        assert!(
        e.to_string().ends_with(
            "bigquery find_keys failed: the query returned errors (invalidQuery): boom [at query]"
        ),
        "{e}"
    );
        let e = store.runs(&Default::default()).await.unwrap_err();
        assert!(e.to_string().contains("bigquery runs failed"), "{e}");

        // 3. Something that is not the BigQuery API (a proxy's HTML page) on the first call.
        let endpoint = responder(|_, _| (502, "<html>Bad Gateway</html>".to_string()));
        let e = BigQueryStore::connect(&format!("bigquery://p/d?endpoint={endpoint}"))
            .await
            .unwrap_err();
        assert!(e.is_store_failure());
        assert!(
        e.to_string()
            .contains("bigquery migrate.check failed: unexpected answer from the API: the response body is not a BigQuery API answer"),
        "{e}"
    );

        // 4. Permission denied on the cheap check: exit 3 from `idem migrate`, with the reason.
        let endpoint = responder(|_, _| {
            (
                403,
                google_error(
                    403,
                    "accessDenied",
                    "Access Denied: Dataset p:d: Permission bigquery.tables.list denied",
                ),
            )
        });
        let denied = format!("bigquery://p/d?endpoint={endpoint}");
        let out = sandbox
            .command_with_store(&["migrate"], &denied)
            .output()
            .expect("run idem");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{stderr}");
        assert!(
            stderr.contains("HTTP 403 (accessDenied): Access Denied: Dataset p:d"),
            "{stderr}"
        );

        // 5. Nobody listening.
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let e = BigQueryStore::connect(&format!("bigquery://p/d?endpoint=http://{closed}"))
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("bigquery migrate.check failed: no answer from the API"),
            "{e}"
        );
    }

    /// Counts process calls; succeeds.
    #[derive(Debug, Default)]
    struct Counting {
        calls: AtomicUsize,
    }

    #[async_trait]
    impl Processor for Counting {
        fn name(&self) -> &str {
            "counting"
        }
        async fn process(&self, _: &RunRequest) -> Result<Outcome, BoxError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::records(1))
        }
    }

    fn hook(f: impl Fn(&str) -> Option<FaultFuture> + Send + Sync + 'static) -> FaultHook {
        Arc::new(move |op: &str| f(op).unwrap_or_else(|| Box::pin(async { None })))
    }

    fn lease_runner(store: Arc<DynStore>) -> Runner {
        Runner::new(
            store,
            GuardStack::builder()
                .guard(LeaseGuard::new(Duration::from_secs(600)))
                .build(),
        )
    }

    /// A concurrent-update conflict on the claim means the claim was lost: the run skips with
    /// `in_progress` and names the winner; it never fails. The emulator cannot produce the
    /// conflict, so it is injected: when the claim's UPDATE is about to run, a competing run
    /// claims first, and the UPDATE answers with BigQuery's conflict error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_injected_claim_conflict_is_in_progress_not_a_failure() {
        let url = require_bigquery!("an_injected_claim_conflict_is_in_progress_not_a_failure");
        let competitor: Arc<DynStore> = Arc::new(BigQueryStore::connect(&url).await.unwrap());
        let processor_name = unique("conflict");
        let winner = idem::new_run_id();
        let injected = Arc::new(AtomicUsize::new(0));
        let store = {
            let (competitor, name, winner, injected) = (
                competitor.clone(),
                processor_name.clone(),
                winner.clone(),
                injected.clone(),
            );
            BigQueryStore::connect(&url)
                .await
                .unwrap()
                .with_fault_hook(hook(move |op| {
                    if op != "claim.take" || injected.fetch_add(1, Ordering::SeqCst) > 0 {
                        return None;
                    }
                    let (competitor, name, winner) =
                        (competitor.clone(), name.clone(), winner.clone());
                    Some(Box::pin(async move {
                        let won = competitor
                            .claim(&ClaimRequest {
                                processor: &name,
                                scope: "2025-11-18",
                                run_id: &winner,
                                ttl: Duration::from_secs(600),
                                now: Utc::now(),
                            })
                            .await
                            .expect("competing claim");
                        assert!(matches!(won, idem::store::Claim::Acquired(_)));
                        Some(ApiError::concurrent_update(
                            "claim.take",
                            "idem-test:idem.processing_leases",
                        ))
                    }) as FaultFuture)
                }))
        };
        let store: Arc<DynStore> = Arc::new(store);
        let processor = Counting::default();
        let request = RunRequest::new(
            processor_name.clone(),
            idem::parse_date("2025-11-18").unwrap(),
        );
        let report = lease_runner(store.clone())
            .run(&processor, request)
            .await
            .expect("a conflict is not an error");
        assert_eq!(
            injected.load(Ordering::SeqCst),
            1,
            "the conflict was injected"
        );
        assert_eq!(report.status, RunStatus::Skipped, "{report:?}");
        assert_eq!(report.skip_reason, Some(SkipReason::InProgress));
        assert_eq!(
            report.previous_run.as_ref().map(|p| p.run_id.as_str()),
            Some(winner.as_str()),
            "the skip names the run that won"
        );
        assert_eq!(processor.calls.load(Ordering::SeqCst), 0);
        assert!(report.recorded, "the skipped run is in the ledger");
    }

    /// Conflicts on every claim round with nobody holding the lease: still `in_progress`, not a
    /// run failure. A conflict on the fenced release at the end of a run is sent again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn persistent_claim_conflicts_skip_and_release_conflicts_are_retried() {
        let url =
            require_bigquery!("persistent_claim_conflicts_skip_and_release_conflicts_are_retried");
        let takes = Arc::new(AtomicUsize::new(0));
        let store: Arc<DynStore> = {
            let takes = takes.clone();
            Arc::new(
                BigQueryStore::connect(&url)
                    .await
                    .unwrap()
                    .with_fault_hook(hook(move |op| {
                        (op == "claim.take").then(|| {
                            takes.fetch_add(1, Ordering::SeqCst);
                            Box::pin(async {
                                Some(ApiError::concurrent_update(
                                    "claim.take",
                                    "p:d.processing_leases",
                                ))
                            }) as FaultFuture
                        })
                    })),
            )
        };
        let processor = Counting::default();
        let name = unique("always_conflicting");
        let report = lease_runner(store)
            .run(
                &processor,
                RunRequest::new(name.clone(), idem::parse_date("2025-11-18").unwrap()),
            )
            .await
            .expect("conflicts are not errors");
        assert!(
            takes.load(Ordering::SeqCst) >= 2,
            "the claim was tried again"
        );
        assert_eq!(report.status, RunStatus::Skipped, "{report:?}");
        assert_eq!(report.skip_reason, Some(SkipReason::InProgress));
        assert!(
            report
                .detail
                .as_deref()
                .unwrap_or("")
                .contains("concurrent update"),
            "{report:?}"
        );
        assert_eq!(processor.calls.load(Ordering::SeqCst), 0);

        // One conflict on the release in finish: sent again, the run completes and is recorded.
        let releases = Arc::new(AtomicUsize::new(0));
        let store: Arc<DynStore> = {
            let releases = releases.clone();
            Arc::new(
                BigQueryStore::connect(&url)
                    .await
                    .unwrap()
                    .with_fault_hook(hook(move |op| {
                        (op == "finish.release" && releases.fetch_add(1, Ordering::SeqCst) == 0)
                            .then(|| {
                                Box::pin(async {
                                    Some(ApiError::concurrent_update(
                                        "finish.release",
                                        "p:d.processing_leases",
                                    ))
                                }) as FaultFuture
                            })
                    })),
            )
        };
        let report = lease_runner(store.clone())
            .run(
                &processor,
                RunRequest::new(name.clone(), idem::parse_date("2025-11-18").unwrap()),
            )
            .await
            .unwrap();
        assert_eq!(
            releases.load(Ordering::SeqCst),
            2,
            "released on the second try"
        );
        assert_eq!(report.status, RunStatus::Completed, "{report:?}");
        assert!(report.recorded);
        assert!(store
            .lease_holder(&name, "2025-11-18", Utc::now())
            .await
            .unwrap()
            .is_none());
    }

    /// `finish` is several statements on BigQuery; the lease stays held until the keys are
    /// written, so a run claiming the scope in between sees `in_progress`, and one claiming
    /// after it sees the keys.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_lease_is_held_until_the_keys_are_written() {
        let url = require_bigquery!("the_lease_is_held_until_the_keys_are_written");
        let other: Arc<DynStore> = Arc::new(BigQueryStore::connect(&url).await.unwrap());
        let name = unique("ordered");
        let seen = Arc::new(std::sync::Mutex::new(None));
        let store: Arc<DynStore> = {
            let (other, name, seen) = (other.clone(), name.clone(), seen.clone());
            Arc::new(
                BigQueryStore::connect(&url)
                    .await
                    .unwrap()
                    .with_fault_hook(hook(move |op| {
                        (op == "finish.keys").then(|| {
                            let (other, name, seen) = (other.clone(), name.clone(), seen.clone());
                            Box::pin(async move {
                                let claim = other
                                    .claim(&ClaimRequest {
                                        processor: &name,
                                        scope: "2025-11-18",
                                        run_id: "intruder",
                                        ttl: Duration::from_secs(60),
                                        now: Utc::now(),
                                    })
                                    .await
                                    .unwrap();
                                *seen.lock().unwrap() = Some(claim);
                                None
                            }) as FaultFuture
                        })
                    })),
            )
        };
        let guards = GuardStack::builder()
            .guard(idem::guard::TimeWindowGuard::new(Duration::from_secs(3600)))
            .guard(LeaseGuard::new(Duration::from_secs(600)))
            .build();
        let date = idem::parse_date("2025-11-18").unwrap();
        let report = Runner::new(store, guards.clone())
            .run(&Counting::default(), RunRequest::new(name.clone(), date))
            .await
            .unwrap();
        assert_eq!(report.status, RunStatus::Completed, "{report:?}");
        match seen.lock().unwrap().take() {
            Some(idem::store::Claim::Held(h)) => assert_eq!(h.run_id, report.run_id),
            other => panic!("a claim while the keys are written must be held, got {other:?}"),
        }
        let next = Runner::new(other, guards)
            .run(&Counting::default(), RunRequest::new(name, date))
            .await
            .unwrap();
        assert_eq!(next.skip_reason, Some(SkipReason::TimeWindow), "{next:?}");
    }

    /// `idem migrate` creates the dataset and tables; running it again is a no-op; with
    /// `partition_expiration_days` it also sets the expiration.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn migrate_creates_the_dataset_and_is_idempotent() {
        let url = require_bigquery!("migrate_creates_the_dataset_and_is_idempotent");
        let fresh = format!(
            "{}&partition_expiration_days=30",
            with_dataset(&url, &unique("idem_migrate"))
        );
        let sandbox = Sandbox::with_store("idem-bq", &fresh);
        for _ in 0..2 {
            let (code, out, stderr) = sandbox.json(&["migrate"]);
            assert_eq!(code, 0, "{out}\n{stderr}");
            assert_eq!(out["migrated"], true);
        }
        for t in [
            "processing_keys",
            "processing_runs",
            "processing_leases",
            "event_keys",
        ] {
            let n = rows(
                &fresh,
                &format!("SELECT COUNT(*) AS n FROM {}", table(&fresh, t)),
            )
            .await;
            assert_eq!(n[0]["n"], 0, "{t}");
        }
    }

    /// Statements per run (each is one API round trip and, on demand, bills at least 10 MB):
    /// documented in docs/bigquery.md, guarded here so a change shows up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn statements_per_run() {
        let url = require_bigquery!("statements_per_run");
        let store = Arc::new(BigQueryStore::connect(&url).await.unwrap());
        let guards = GuardStack::builder()
            .guard(idem::guard::TimeWindowGuard::new(Duration::from_secs(3600)))
            .guard(LeaseGuard::new(Duration::from_secs(600)))
            .build();
        let runner = Runner::new(store.clone() as Arc<DynStore>, guards).heartbeat(false);
        let processor = Counting::default();
        let name = unique("cost");
        let date = idem::parse_date("2025-11-18").unwrap();

        // First run of a scope: check, claim (read, create the lease row, take), re-check,
        // fence, ledger row, keys, release.
        let before = store.api_calls();
        let first = runner
            .run(&processor, RunRequest::new(name.clone(), date))
            .await
            .unwrap();
        assert_eq!(first.status, RunStatus::Completed);
        assert_eq!(store.api_calls() - before, 9);

        // Skipped by the time window: the check and the ledger row.
        let before = store.api_calls();
        let second = runner
            .run(&processor, RunRequest::new(name.clone(), date))
            .await
            .unwrap();
        assert_eq!(second.skip_reason, Some(SkipReason::TimeWindow));
        assert_eq!(store.api_calls() - before, 2);

        // Skipped in_progress: the check, the lease read, the ledger row.
        store
            .claim(&ClaimRequest {
                processor: &name,
                scope: "2025-11-19",
                run_id: "holder",
                ttl: Duration::from_secs(600),
                now: Utc::now(),
            })
            .await
            .unwrap();
        let before = store.api_calls();
        let held = runner
            .run(
                &processor,
                RunRequest::new(name.clone(), idem::parse_date("2025-11-19").unwrap()),
            )
            .await
            .unwrap();
        assert_eq!(held.skip_reason, Some(SkipReason::InProgress));
        assert_eq!(store.api_calls() - before, 3);
    }
}

/// Issue 7, item 5, on BigQuery: every column and every value's type reach the content key.
#[cfg(feature = "bigquery")]
mod bigquery_content {
    use idem::backend::bigquery::BigQueryUrl;
    use idem::store::bigquery::BigQueryStore;
    use idem::warehouse::{prepare, BigQueryWarehouse, Dialect, Warehouse};
    use serde_json::Value;

    use super::common::{toml_str, Sandbox};

    /// The content query reads a one-row table the test recreates with another column
    /// type; each definition used to encode like the one before it
    /// (`duplicate_content_hash`): NUMERIC `1.5` and the STRING of its text, FLOAT64 NaN and
    /// STRING `'NaN'`, BYTES and the STRING of their base64, DATE and the STRING of it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_type_change_reaches_the_content_key() {
        let Some(url) = super::common::service_url(
            "IDEM_TEST_BIGQUERY_URL",
            "bigquery::every_type_change_reaches_the_content_key",
            super::common::BIGQUERY_HOW,
        ) else {
            return;
        };
        BigQueryStore::connect(&url).await.expect("open the store");
        let table = BigQueryUrl::parse(&url)
            .unwrap()
            .table(&format!("typed_{}", &idem::new_run_id()[..8]));
        let warehouse = BigQueryWarehouse::connect(&url).await.unwrap();
        let sandbox = Sandbox::new("idem-bq");
        let job = sandbox.write_job(
            "typed",
            &format!(
                "name = \"typed\"\nprocessor = \"sql\"\n[guards]\ntime_window = \"0s\"\n\
                 content_hash = \"24h\"\n[sql]\nwarehouse = {}\ncontent = {}\nprocess = \"SELECT 1\"\n",
                toml_str(&url),
                toml_str(&format!("SELECT * FROM {table}")),
            ),
        );
        let mut keys: Vec<Value> = Vec::new();
        for (ty, value) in [
            // The text of each value as BigQuery sends it, and as the emulator does.
            ("NUMERIC", "NUMERIC '1.5'"),
            ("STRING", "'1.500000000'"),
            ("STRING", "'1.5'"),
            ("FLOAT64", "CAST('NaN' AS FLOAT64)"),
            ("STRING", "'nan'"),
            ("STRING", "'NaN'"),
            ("BYTES", "b'ab'"),
            ("STRING", "'YWI='"),
            ("DATE", "DATE '2025-11-18'"),
            ("STRING", "'2025-11-18'"),
            ("INT64", "NULL"),
        ] {
            let statements = prepare(
                &format!(
                    "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (v {ty}); \
                     INSERT INTO {table} (v) VALUES ({value})"
                ),
                Dialect::BigQuery,
            )
            .unwrap();
            warehouse
                .execute(&statements, &Default::default())
                .await
                .unwrap();
            let (code, run, stderr) = sandbox.run(&job, "2025-11-18");
            assert_eq!(code, 0, "{ty} {value}: {run}\n{stderr}");
            assert_eq!(run["status"], "completed", "{ty} {value}: {run}");
            assert!(
                !keys.contains(&run["processing_key"]),
                "{ty} {value}: a key seen before {run}"
            );
            keys.push(run["processing_key"].clone());
            let (_, again, _) = sandbox.run(&job, "2025-11-18");
            assert_eq!(
                again["skip_reason"], "duplicate_content_hash",
                "{ty} {value}: {again}"
            );
        }
    }
}
