//! The BigQuery store and warehouse against a real BigQuery API implementation: the local
//! emulator (`.ci/bqemulator.sh`, see docs/bigquery.md), plus a tiny local HTTP responder
//! for API failure shapes the emulator does not produce. The scenarios every store shares
//! (SQL jobs, odd strings, the content key) are in `tests/it/scenarios.rs`.
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

#[path = "common/bq_limits.rs"]
mod bq_limits;
#[path = "common/fleet.rs"]
mod fleet;

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
    use idem::store::{ClaimRequest, DynStore, Finish, KeyLookup, RunFilter};
    use idem::warehouse::{prepare, BigQueryWarehouse, Dialect, Warehouse};
    use idem::{
        async_trait, scope_key, BoxError, Error, KeyKind, Outcome, Processor, RunRequest,
        RunStatus, Runner, SkipReason,
    };
    use serde_json::Value;

    use super::common::Sandbox;

    /// Another run ("holder") takes the lease of `scope` for ten minutes.
    async fn hold(store: &dyn LeaseStore, name: &str, scope: &str) {
        store
            .claim(&ClaimRequest {
                processor: name,
                scope,
                run_id: "holder",
                ttl: Duration::from_secs(600),
                now: Utc::now(),
            })
            .await
            .unwrap();
    }

    /// The emulator is one process. Each test at the model drives a fleet of runs through
    /// it, and several fleets side by side slow its answers past the latency the model
    /// adds (a claim then waits out its 300 s answer timeout): what is measured would be
    /// the emulator's load, not the modelled BigQuery. They take turns; the other tests
    /// still run beside them.
    static AT_THE_MODEL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// The emulator URL, or `None` after saying why the test is skipped (in CI, with
    /// `IDEM_REQUIRE_SERVICES=1`, a missing URL fails the test instead).
    fn bigquery_url(test: &str) -> Option<String> {
        super::common::bigquery_url(&format!("bigquery::{test}"))
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

    /// Issue 35: a lookup of a run id idem made for a run (`RunRequest::new`) reads only the
    /// ledger partitions from a day before the time in the id (a UUID v7); a caller's id
    /// is looked up in the whole
    /// ledger. So a caller's id recorded 10 days ago is still refused
    /// (`DuplicateRunId`, nothing written), an id idem made and finished twice (a re-sent
    /// finish) is recorded once, and `runs` finds each by its id.
    #[tokio::test]
    async fn run_id_lookups_find_an_old_callers_id_and_record_idems_once() {
        let url = require_bigquery!("run_id_lookups_find_an_old_callers_id_and_record_idems_once");
        let store = BigQueryStore::connect(&url).await.unwrap();
        let p = unique("runid");
        let now = chrono::DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).unwrap();
        // A completed run's finish (with its scope key when `keyed`; a skip's row alone,
        // the single-statement insert, when not).
        let finish = |id: &str, scope: &str, at, keyed: bool| {
            let mut run =
                idem::store::conformance::run_record(&p, scope, id, RunStatus::Completed, at);
            if !keyed {
                run.status = RunStatus::Skipped;
                run.skip_reason = Some(SkipReason::TimeWindow);
            }
            let key = idem::store::conformance::key_record(
                &scope_key(&p, scope),
                KeyKind::Scope,
                &p,
                scope,
                id,
                at,
            );
            Finish {
                run,
                keys: if keyed { vec![key] } else { vec![] },
                lease: None,
            }
        };
        let duplicate = |r: idem::Result<()>| {
            assert!(matches!(r, Err(Error::DuplicateRunId { .. })), "{r:?}");
        };
        let caller = unique("orchestrator");
        let old = now - chrono::Duration::days(10);
        store
            .finish(&finish(&caller, "s1", old, false))
            .await
            .unwrap();
        duplicate(store.finish(&finish(&caller, "s2", now, true)).await);
        // Another row with the id of a skip's row: the lookup, bounded to the partitions
        // from a day before the id's time, finds it.
        let made_id = || RunRequest::new("x", idem::parse_date("2025-01-01").unwrap()).run_id;
        let made = made_id();
        store
            .finish(&finish(&made, "s3", now, false))
            .await
            .unwrap();
        duplicate(store.finish(&finish(&made, "s3b", now, false)).await);

        // A completed run's finish sent twice: recorded once.
        let made_too = made_id();
        let twice = finish(&made_too, "s4", now, true);
        store.finish(&twice).await.unwrap();
        store.finish(&twice).await.unwrap();
        let all = store
            .runs(&RunFilter {
                processor: Some(p.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        let ids: Vec<&str> = all.iter().map(|r| r.run_id.as_str()).collect();
        for id in [&caller, &made, &made_too] {
            assert_eq!(
                ids.iter().filter(|i| **i == id.as_str()).count(),
                1,
                "{ids:?}"
            );
            let by_id = store
                .runs(&RunFilter {
                    run_id: Some(id.clone()),
                    ..Default::default()
                })
                .await
                .unwrap();
            assert_eq!(by_id.len(), 1, "{id}");
        }
        assert_eq!(all.iter().find(|r| r.run_id == caller).unwrap().scope, "s1");
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
        let tables: Vec<String> = idem::store::bigquery::tables()
            .map(|t| {
                format!(
                    r#"{{"tableReference":{{"projectId":"p","datasetId":"d","tableId":"{t}"}}}}"#
                )
            })
            .collect();
        format!(
            r#"{{"kind":"bigquery#tableList","tables":[{}],"totalItems":{}}}"#,
            tables.join(","),
            tables.len()
        )
    }

    /// A table with the marker columns of the latest migration (what the schema check reads:
    /// `event_keys.expires_at`, `processing_keys.keep_until`), answered for every table.
    fn event_keys_table() -> String {
        r#"{"kind":"bigquery#table","tableReference":{"projectId":"p","datasetId":"d","tableId":"event_keys"},"schema":{"fields":[{"name":"namespace","type":"STRING"},{"name":"event_key","type":"STRING"},{"name":"first_seen","type":"TIMESTAMP"},{"name":"batch_id","type":"STRING"},{"name":"fingerprint","type":"STRING"},{"name":"decision","type":"STRING"},{"name":"expires_at","type":"TIMESTAMP"},{"name":"keep_until","type":"TIMESTAMP"}]}}"#.to_string()
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
            if method == "GET" && path.contains("/tables/") {
                (200, event_keys_table())
            } else if method == "GET" && path.contains("/tables") {
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
                .contains("bigquery claim.take failed: HTTP 400"),
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
            if method == "GET" && path.contains("/tables/") {
                (200, event_keys_table())
            } else if method == "GET" && path.contains("/tables") {
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
            2,
            "the conflict was injected once, and the claim sent again found the lease held"
        );
        assert_eq!(report.status, RunStatus::Skipped, "{report:?}");
        assert_eq!(report.skip_reason, Some(SkipReason::InProgress));
        assert_eq!(
            report.previous_run.as_ref().map(|p| p.run_id.as_str()),
            Some(winner.as_str()),
            "the skip names the run that won"
        );
        assert_eq!(processor.calls.load(Ordering::SeqCst), 0);
        assert!(report.recorded(), "the skipped run is in the ledger");
    }

    /// The event gate's MERGE (which re-marks expired keys, so it can lose a
    /// concurrent-update conflict on BigQuery) is sent again after a conflict: the batch is
    /// marked once, every key `new`, and marking it again answers `replay`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_event_merge_that_lost_a_conflict_is_sent_again() {
        let url = require_bigquery!("an_event_merge_that_lost_a_conflict_is_sent_again");
        let injected = Arc::new(AtomicUsize::new(0));
        let store = {
            let injected = injected.clone();
            BigQueryStore::connect(&url)
                .await
                .unwrap()
                .with_fault_hook(hook(move |op| {
                    if op != "check_and_mark" || injected.fetch_add(1, Ordering::SeqCst) > 0 {
                        return None;
                    }
                    Some(Box::pin(async move {
                        Some(ApiError::concurrent_update(
                            "check_and_mark",
                            "idem-test:idem.event_keys",
                        ))
                    }) as FaultFuture)
                }))
        };
        let namespace = unique("events");
        let marks: Vec<idem::store::EventMark> = (0..3)
            .map(|i| idem::store::EventMark {
                key: format!("e{i}"),
                fingerprint: Some(format!("f{i}")),
                ttl: None,
                decision: None,
            })
            .collect();
        let first = store
            .check_and_mark(&namespace, &marks, Utc::now())
            .await
            .expect("a conflict is sent again, not an error");
        assert_eq!(injected.load(Ordering::SeqCst), 2, "sent twice");
        assert!(
            first
                .iter()
                .all(|v| matches!(v, idem::store::EventVerdict::New)),
            "{first:?}"
        );
        let again = store
            .check_and_mark(&namespace, &marks, Utc::now())
            .await
            .unwrap();
        assert!(
            again
                .iter()
                .all(|v| matches!(v, idem::store::EventVerdict::Replay { .. })),
            "{again:?}"
        );
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

        // One conflict on the finish (a transaction: ledger row, keys, release): sent again
        // whole, the run completes and is recorded.
        let releases = Arc::new(AtomicUsize::new(0));
        let store: Arc<DynStore> = {
            let releases = releases.clone();
            Arc::new(
                BigQueryStore::connect(&url)
                    .await
                    .unwrap()
                    .with_fault_hook(hook(move |op| {
                        (op == "finish" && releases.fetch_add(1, Ordering::SeqCst) == 0).then(
                            || {
                                Box::pin(async {
                                    Some(ApiError::concurrent_update(
                                        "finish",
                                        "p:d.processing_leases",
                                    ))
                                }) as FaultFuture
                            },
                        )
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
        assert!(report.recorded());
        assert!(store
            .lease_holder(&name, "2025-11-18", Utc::now())
            .await
            .unwrap()
            .is_none());
    }

    /// `finish` is one transaction on BigQuery (ledger row, keys, release): a run claiming
    /// the scope just before it sees `in_progress`, and one claiming after it sees the keys.
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
                        (op == "finish").then(|| {
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

    /// `idem migrate` creates the dataset and every table (the sixteen lease shards too);
    /// running it again keeps what the tables hold; with `partition_expiration_days` it
    /// also sets the expiration (tests/it/cleanup.rs checks the statements).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn migrate_creates_the_dataset_and_is_idempotent() {
        let url = require_bigquery!("migrate_creates_the_dataset_and_is_idempotent");
        let fresh = format!(
            "{}&partition_expiration_days=30",
            with_dataset(&url, &unique("idem_migrate"))
        );
        let sandbox = Sandbox::with_store("idem-bq", &fresh);
        let count = |t: String| {
            let fresh = fresh.clone();
            async move {
                rows(
                    &fresh,
                    &format!("SELECT COUNT(*) AS n FROM {}", table(&fresh, &t)),
                )
                .await[0]["n"]
                    .clone()
            }
        };
        let (code, out, stderr) = sandbox.json(&["migrate"]);
        assert_eq!(code, 0, "{out}\n{stderr}");
        let tables: Vec<String> = [
            "processing_keys",
            "processing_runs",
            "processing_leases",
            "event_keys",
        ]
        .into_iter()
        .map(String::from)
        .chain((0..16).map(|i| format!("processing_leases_{i:02}")))
        .collect();
        for t in &tables {
            assert_eq!(count(t.clone()).await, 0, "{t} exists, empty");
        }
        // A key written between the two migrations survives the second.
        let input = sandbox.dir.join("event.ndjson");
        std::fs::write(&input, "{\"id\":\"pay-1\",\"amount\":5}\n").unwrap();
        let gate = || {
            let out = sandbox
                .command(&["gate", "--key", "id", "--input", input.to_str().unwrap()])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let record: Value = serde_json::from_slice(&out.stdout).unwrap();
            record["verdict"].as_str().unwrap().to_string()
        };
        assert_eq!(gate(), "new");
        let (code, out, stderr) = sandbox.json(&["migrate"]);
        assert_eq!(code, 0, "{out}\n{stderr}");
        assert_eq!(count("event_keys".into()).await, 1, "the key is kept");
        assert_eq!(gate(), "replay", "the key still marks the event");
        for t in tables.iter().filter(|t| *t != "event_keys") {
            assert_eq!(count(t.clone()).await, 0, "{t}");
        }
    }

    /// A dataset at schema 10 (today's `processing_keys`, without `keep_until`) holding a key
    /// the older build wrote: `idem migrate --check` calls it behind (exit 1), `idem migrate`
    /// adds the column and keeps the key (its `keep_until` empty, so cleanup treats it as it
    /// did) and its date still skips; a key written after the upgrade carries its window, and
    /// a claim on the upgraded lease shards records its holder.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dataset_at_schema_10_upgrades_and_keys_then_carry_their_window() {
        let url =
            require_bigquery!("a_dataset_at_schema_10_upgrades_and_keys_then_carry_their_window");
        let url = with_dataset(&url, &unique("idem_v10"));
        let sandbox = Sandbox::with_store("idem-bq-v10", &url);
        let (code, out, stderr) = sandbox.json(&["migrate"]);
        assert_eq!(code, 0, "{out}\n{stderr}");
        // Back to schema 10: processing_keys as 0001 made it and the lease shards as 0009
        // made them (no migration before 0011 changed either).
        let keys = table(&url, "processing_keys");
        let parsed = BigQueryUrl::parse(&url).unwrap();
        let render = |sql: &str| {
            sql.replace("{project}", &parsed.project)
                .replace("{dataset}", &parsed.dataset)
        };
        let ddl = MIGRATIONS[0].sql;
        let create = &ddl[ddl
            .find("CREATE TABLE IF NOT EXISTS `{project}.{dataset}.processing_keys`")
            .unwrap()..];
        let create = &create[..create.find(';').unwrap()];
        exec(&url, &format!("DROP TABLE {keys}")).await;
        exec(&url, &render(create)).await;
        let shards = MIGRATIONS.iter().find(|m| m.version == 9).unwrap().sql;
        for i in 0..16 {
            exec(
                &url,
                &format!(
                    "DROP TABLE {}",
                    table(&url, &format!("processing_leases_{i:02}"))
                ),
            )
            .await;
        }
        exec(&url, &render(shards)).await;
        let name = unique("old_job");
        let job = format!(
            "name = \"{name}\"\nprocessor = \"command\"\n[guards]\ntime_window = \"40d\"\n\
             [command]\nrun = [\"true\"]\n"
        );
        sandbox.write_job("old", &job);
        let old_key = scope_key(&name, "2025-11-18");
        exec(
            &url,
            &format!(
                "INSERT INTO {keys} (processing_key, kind, processor_name, scope, scope_date, \
                 processed_at, entity_count, metadata, run_id) VALUES ('{old_key}', 'scope', \
                 '{name}', '2025-11-18', DATE '2025-11-18', CURRENT_TIMESTAMP(), NULL, NULL, 'old-run')"
            ),
        )
        .await;
        let (code, out, stderr) = sandbox.json(&["migrate", "--check"]);
        assert_eq!(code, 1, "behind: {out}\n{stderr}");
        let (code, out, stderr) = sandbox.json(&["migrate"]);
        assert_eq!(code, 0, "{out}\n{stderr}");
        let (code, out, stderr) = sandbox.json(&["migrate", "--check"]);
        assert_eq!(code, 0, "current: {out}\n{stderr}");
        let (code, v, err) = sandbox.json(&["run", &name, "--date", "2025-11-18"]);
        assert_eq!(
            (code, v["skip_reason"].as_str()),
            (0, Some("time_window")),
            "the old key still skips its date: {v} {err}"
        );
        let (code, v, err) = sandbox.json(&["run", &name, "--date", "2025-11-19"]);
        assert_eq!(
            (code, v["status"].as_str()),
            (0, Some("completed")),
            "{v} {err}"
        );
        let found = rows(
            &url,
            &format!(
                "SELECT scope, CAST(TIMESTAMP_DIFF(keep_until, processed_at, HOUR) AS STRING) AS h \
                 FROM {keys} ORDER BY scope"
            ),
        )
        .await;
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0]["h"], Value::Null, "the old key: {found:?}");
        assert_eq!(found[1]["h"], "960", "the new key, kept 40 days: {found:?}");
        let store = BigQueryStore::connect(&url).await.unwrap();
        hold(&store, &name, "2025-11-20").await;
        let open = store.open_leases(Some(&name)).await.unwrap();
        assert_eq!(open.len(), 1, "{open:?}");
        assert_eq!(open[0].host.as_deref(), Some(idem::model::host_name()));
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

        // First run of a scope: the check with the lease row (one query), the claim with
        // the re-check after it (one script: create the row, take it, read the keys), the
        // finish (one transaction: release, ledger row, keys).
        let before = store.api_calls();
        let first = runner
            .run(&processor, RunRequest::new(name.clone(), date))
            .await
            .unwrap();
        assert_eq!(first.status, RunStatus::Completed);
        assert_eq!(store.api_calls() - before, 3);

        // Skipped by the time window: the check and the ledger row.
        let before = store.api_calls();
        let second = runner
            .run(&processor, RunRequest::new(name.clone(), date))
            .await
            .unwrap();
        assert_eq!(second.skip_reason, Some(SkipReason::TimeWindow));
        assert_eq!(store.api_calls() - before, 2);

        // Skipped in_progress: the check (which read the lease row too) and the ledger row.
        hold(&*store, &name, "2025-11-19").await;
        let before = store.api_calls();
        let held = runner
            .run(
                &processor,
                RunRequest::new(name.clone(), idem::parse_date("2025-11-19").unwrap()),
            )
            .await
            .unwrap();
        assert_eq!(held.skip_reason, Some(SkipReason::InProgress));
        assert_eq!(
            held.previous_run.as_ref().map(|p| p.run_id.as_str()),
            Some("holder")
        );
        assert_eq!(store.api_calls() - before, 2);
    }

    /// The rows of `sql` run at `url` itself (behind no simulator), as text.
    async fn rows_as_text(url: &str, sql: &str) -> Vec<Vec<String>> {
        rows(url, sql)
            .await
            .into_iter()
            .map(|row| {
                row.as_object()
                    .map(|o| o.values().map(|v| v.to_string()).collect())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Claims `scopes` brand-new scopes of processor `name`, scope `i` by `claimers(i)`
    /// runs at once, `wave` scopes at a time; answers how many claims acquired each scope,
    /// and the number of claims.
    async fn claim_new_scopes_together(
        store: Arc<BigQueryStore>,
        name: &str,
        scopes: usize,
        claimers: impl Fn(usize) -> usize,
        wave: usize,
    ) -> (Vec<usize>, usize) {
        let mut acquired = vec![0usize; scopes];
        let mut claims = 0;
        for wave in (0..scopes).collect::<Vec<_>>().chunks(wave.max(1)) {
            let mut tasks = tokio::task::JoinSet::new();
            for &i in wave {
                for c in 0..claimers(i) {
                    claims += 1;
                    let (store, name) = (store.clone(), name.to_string());
                    tasks.spawn(async move {
                        let scope = format!("scope-{i:04}");
                        let run_id = format!("run-{i:04}-{c}");
                        let claim = store
                            .claim(&ClaimRequest {
                                processor: &name,
                                scope: &scope,
                                run_id: &run_id,
                                ttl: Duration::from_secs(3600),
                                now: Utc::now(),
                            })
                            .await;
                        (i, claim)
                    });
                }
            }
            while let Some(joined) = tasks.join_next().await {
                let (i, claim) = joined.unwrap();
                match claim {
                    Ok(idem::store::Claim::Acquired(_)) => acquired[i] += 1,
                    Ok(idem::store::Claim::Held(_)) => {}
                    Err(e) => panic!("scope {i}: the claim failed: {e}"),
                }
            }
        }
        (acquired, claims)
    }

    /// The scopes of processor `name` whose lease rows name two or more unexpired holders
    /// (each of which the fenced finish accepts), read at `url` directly.
    async fn scopes_with_two_holders(url: &str, name: &str) -> Vec<Vec<String>> {
        let mut found = Vec::new();
        for shard in 0..16 {
            let leases = table(url, &format!("processing_leases_{shard:02}"));
            found.extend(
                rows_as_text(
                    url,
                    &format!(
                        "SELECT scope, COUNT(DISTINCT holder_run_id) AS holders FROM {leases} \
                         WHERE processor_name = '{name}' AND holder_run_id IS NOT NULL \
                         AND expires_at > CURRENT_TIMESTAMP() GROUP BY scope \
                         HAVING COUNT(DISTINCT holder_run_id) > 1"
                    ),
                )
                .await,
            );
        }
        found
    }

    /// A smoke test against a real BigQuery project, compiled only with the
    /// `bigquery-real` feature (CI has no Google credentials): `IDEM_TEST_BIGQUERY_REAL=
    /// PROJECT/DATASET cargo test --features bigquery-real --test bigquery real_project`,
    /// with Application Default Credentials. It runs the
    /// store conformance suite there, then 200 brand-new scopes claimed by 4 runs at once
    /// each: one holder per scope, as the model predicts. Use a dataset of its own: it is
    /// created if missing, and the suite writes, purges and cleans up test rows in it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg(feature = "bigquery-real")]
    async fn a_real_project_settles_the_model() {
        use idem::store::conformance as check;
        let target = std::env::var("IDEM_TEST_BIGQUERY_REAL")
            .expect("set IDEM_TEST_BIGQUERY_REAL=PROJECT/DATASET (a dataset of its own)");
        let url = format!("bigquery://{target}");
        let store: Arc<DynStore> = idem::store::open(&url).await.expect("open the store");
        check::claim_excludes_and_release_frees(&*store).await;
        check::expired_lease_is_taken_over_and_fenced(&*store).await;
        check::concurrent_claims_have_one_winner(store.clone()).await;
        check::renew_extends_lease(&*store).await;
        check::keys_only_on_success(&*store).await;
        check::key_windows_and_latest_row(&*store).await;
        check::ledger_queries(&*store).await;
        check::strings_round_trip(&*store).await;
        check::taken_run_id_is_refused_and_changes_nothing(&*store).await;
        check::purge_and_cleanup(&*store).await;
        check::capabilities_hold_across_instances(&url).await;
        let events = idem::store::open_event_keys(&url)
            .await
            .expect("open the event-key store");
        check::event_keys_batch(&*events).await;
        check::event_dedup_replay_and_conflict(&*events).await;
        check::event_dedup_ttl(&*events).await;
        check::event_cursor(&*events).await;
        let name = unique("real");
        let bq = Arc::new(BigQueryStore::connect(&url).await.unwrap());
        let (acquired, claims) = claim_new_scopes_together(bq, &name, 200, |_| 4, 200).await;
        let two = scopes_with_two_holders(&url, &name).await;
        let twice = acquired.iter().filter(|&&n| n > 1).count();
        let none = acquired.iter().filter(|&&n| n == 0).count();
        eprintln!(
            "real project: 200 new scopes, {claims} claims: {twice} acquired twice, {} with two \
             holders, {none} acquired by none",
            two.len()
        );
        assert_eq!((twice, two.len()), (0, 0), "{two:?}");
    }

    /// A brand-new scope claimed by 2–5 runs at once, for many scopes, at the *model* of
    /// BigQuery (`bq_model.rs`: a script runs statement by statement, each statement its own
    /// snapshot and commit, INSERTs never conflicting, concurrent UPDATEs of a lease table
    /// conflicting and re-run): never two holders. Counted two ways: the claims that
    /// answered "acquired" per scope, and the runs a scope's lease rows name as unexpired
    /// holders (each of which the fenced finish would accept). The claim before the fix
    /// (create a free row, then `UPDATE … WHERE this row is free`) gave 2 holders to a
    /// scope whose two creating INSERTs both committed before either UPDATE's snapshot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn new_scopes_claimed_together_get_one_holder_at_the_model() {
        let _turn = AT_THE_MODEL.lock().await;
        let url = require_bigquery!("new_scopes_claimed_together_get_one_holder_at_the_model");
        let url = with_dataset(&url, &unique("idem_model"));
        BigQueryStore::connect(&url).await.unwrap();
        let upstream = super::bq_limits::endpoint_of(&url).expect("an emulator endpoint");
        let env = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(default)
        };
        let scopes = env("IDEM_TEST_MODEL_SCOPES", 100) as usize;
        let latency = Duration::from_millis(env("IDEM_TEST_MODEL_LATENCY_MS", 300));
        let mut limits = super::bq_limits::Limits::bigquery(latency);
        limits.statements = true;
        let sim = super::bq_limits::Simulator::start(&upstream, limits).await;
        let store = Arc::new(BigQueryStore::connect_lazy(&sim.url(&url)).await.unwrap());
        let name = unique("model");
        // Scopes claimed in small waves (every claimer of a scope at once): the model's
        // latencies, not the emulator's queue (one process, ~40 statements a second), must
        // decide the order in which statements of different claims meet.
        let wave = env("IDEM_TEST_MODEL_WAVE", 4) as usize;
        let (acquired, claims) =
            claim_new_scopes_together(store, &name, scopes, |i| 2 + i % 4, wave).await;
        let held_by_two = scopes_with_two_holders(&url, &name).await;
        let stats = sim.stats();
        let two_acquired: Vec<usize> = (0..scopes).filter(|&i| acquired[i] > 1).collect();
        let none = acquired.iter().filter(|&&n| n == 0).count();
        eprintln!(
            "model: {scopes} new scopes, {claims} claims, {} DML latency: {} scopes acquired \
             by 2+ claims, {} scopes with 2+ holders in the lease table, {none} scopes \
             acquired by none; {} child statements, {} conflict re-runs, {} conflict \
             failures, {} quota refusals",
            humantime::format_duration(latency),
            two_acquired.len(),
            held_by_two.len(),
            stats.child_statements,
            stats.conflict_reruns,
            stats.conflict_failures,
            stats.quota_failures,
        );
        assert!(
            stats.child_statements > claims as u64,
            "the model ran scripts statement by statement"
        );
        assert!(
            two_acquired.is_empty(),
            "scopes acquired twice: {two_acquired:?}"
        );
        assert!(
            held_by_two.is_empty(),
            "scopes with two holders: {held_by_two:?}"
        );
        assert_eq!(none, 0, "every new scope was acquired by one of its claims");
    }

    /// 40 runs whose leases all live in one lease table, fired at once (plus 4 concurrent
    /// duplicates: twice as many statements as the table runs and queues), at the model
    /// (each statement of a script its own job, 100 ms per DML statement in CI,
    /// `IDEM_TEST_MODEL_LATENCY_MS` to change): every run's finish is recorded. The finish
    /// is a script, not a transaction, so its statements wait in the table's queue with the
    /// claims of the other 39 scopes, and one refused for a full queue is sent again for as
    /// long as its lease holds. The finish as a transaction (before) was cancelled whenever
    /// another claim or release committed on the table during its ~1 s, and given up after
    /// its conflict retries — after the work was done.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn finishes_on_one_busy_lease_table_queue_and_are_never_cancelled_at_the_model() {
        let _turn = AT_THE_MODEL.lock().await;
        let url = require_bigquery!(
            "finishes_on_one_busy_lease_table_queue_and_are_never_cancelled_at_the_model"
        );
        let url = with_dataset(&url, &unique("idem_shard"));
        BigQueryStore::connect(&url).await.unwrap();
        let upstream = super::bq_limits::endpoint_of(&url).expect("an emulator endpoint");
        let latency = Duration::from_millis(
            std::env::var("IDEM_TEST_MODEL_LATENCY_MS")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(100),
        );
        let mut limits = super::bq_limits::Limits::bigquery(latency);
        limits.statements = true;
        let sim = super::bq_limits::Simulator::start(&upstream, limits).await;
        let fleet = super::fleet::Fleet {
            runs: 44,
            duplicates: 4,
            jobs: 4,
            work: Duration::from_millis(100),
            lease: Duration::from_secs(3600),
            prefix: unique("shard"),
            spread: Duration::ZERO,
            one_shard: Some(5),
            only_shards: None,
        };
        let report = super::fleet::fire(&fleet, &url, &sim).await;
        eprintln!("{}", report.summary());
        assert!(
            report.failures.is_empty(),
            "{} runs failed, e.g. {:?}",
            report.failures.len(),
            report.failures.iter().take(3).collect::<Vec<_>>()
        );
        assert_eq!(report.completed, 40);
        assert!(
            report.wrong_completions.is_empty(),
            "{:?}",
            report.wrong_completions
        );
        assert_eq!(report.double_work, 0);
        // Before: 35 finish transactions were cancelled in a fleet of 66 runs (their
        // re-sends got through at 100 ms per statement; at BigQuery's ~1 s they are given
        // up).
        assert_eq!(report.sim.transactions_cancelled, 0, "nothing to cancel");
    }

    /// A fleet fired at once, against BigQuery's DML limits (the limits simulator in front
    /// of the emulator, scaled for CI: 200 runs, 50 ms per DML statement, the day's free
    /// INSERTs used up after 100 per table): no run fails for a quota or a conflict, every
    /// scope completes exactly once, and the concurrent duplicates skip.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fleet_within_bigquery_dml_limits_completes_every_scope_once() {
        let _turn = AT_THE_MODEL.lock().await;
        let url =
            require_bigquery!("a_fleet_within_bigquery_dml_limits_completes_every_scope_once");
        let url = with_dataset(&url, &unique("idem_fleet"));
        BigQueryStore::connect(&url).await.unwrap();
        let upstream = super::bq_limits::endpoint_of(&url).expect("an emulator endpoint");
        let runs = std::env::var("IDEM_TEST_FLEET_RUNS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(200);
        let mut limits = super::bq_limits::Limits::bigquery(Duration::from_millis(50));
        limits.insert_free_per_day = 100;
        let sim = super::bq_limits::Simulator::start(&upstream, limits).await;
        let fleet = super::fleet::Fleet {
            runs,
            duplicates: runs / 10,
            jobs: 20,
            work: Duration::from_millis(100),
            lease: Duration::from_secs(3600),
            prefix: unique("fleet"),
            spread: Duration::ZERO,
            one_shard: None,
            only_shards: None,
        };
        let report = super::fleet::fire(&fleet, &url, &sim).await;
        eprintln!("{}", report.summary());
        assert!(
            report.failures.is_empty(),
            "{} runs failed, e.g. {:?}",
            report.failures.len(),
            report.failures.iter().take(3).collect::<Vec<_>>()
        );
        assert_eq!(report.quota_failures, 0);
        assert!(
            report.wrong_completions.is_empty(),
            "scopes not completed exactly once: {:?}",
            report.wrong_completions.iter().take(5).collect::<Vec<_>>()
        );
        assert_eq!(report.completed, fleet.runs - fleet.duplicates);
        assert_eq!(report.double_work, 0);
        assert_eq!(
            report.in_progress + report.time_window,
            fleet.duplicates,
            "every duplicate skipped"
        );
        assert!(
            report.in_progress > 0,
            "concurrent duplicates skip in_progress"
        );
    }

    /// Issue 35: a statement idem stops waiting for is cancelled, not left to commit. A
    /// claim whose lease-table statement takes 4 s, from a store that waits 1 s for an
    /// answer (`timeout=1s`): the claim fails, idem sends `jobs.cancel` for its job, and
    /// the claim never takes the lease. Left running, it would have held the scope for
    /// the lease's whole hour on behalf of a run that had given up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_idem_gave_up_on_is_cancelled_and_takes_no_lease() {
        let url = require_bigquery!("a_claim_idem_gave_up_on_is_cancelled_and_takes_no_lease");
        let url = with_dataset(&url, &unique("idem_cancel"));
        let direct = BigQueryStore::connect(&url).await.unwrap();
        let upstream = super::bq_limits::endpoint_of(&url).expect("an emulator endpoint");
        let limits = super::bq_limits::Limits::bigquery(Duration::from_secs(4));
        let sim = super::bq_limits::Simulator::start(&upstream, limits).await;
        let impatient = BigQueryStore::connect_lazy(&format!("{}&timeout=1s", sim.url(&url)))
            .await
            .unwrap();
        let (name, scope) = ("gave_up", "2025-11-18");
        let claim = |store: &'static str| ClaimRequest {
            processor: name,
            scope,
            run_id: store,
            ttl: Duration::from_secs(3600),
            now: Utc::now(),
        };
        let gave_up = impatient.claim(&claim("impatient")).await;
        assert!(
            matches!(&gave_up, Err(e) if e.is_outage()),
            "no answer within 1 s is an outage: {gave_up:?}"
        );
        // The cancel goes out in the background as the claim returns.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while sim.stats().jobs_cancelled == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no jobs.cancel reached BigQuery for the claim idem gave up on"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Cancelled before its commit: the scope is free for the next run at once.
        let next = direct.claim(&claim("next")).await.unwrap();
        assert!(
            matches!(&next, idem::store::Claim::Acquired(lease) if lease.run_id == "next"),
            "{next:?}"
        );
    }

    /// Describes content (so the content hash guard has a key); succeeds.
    #[derive(Debug, Default)]
    struct Described {
        calls: AtomicUsize,
        describes: AtomicUsize,
    }

    #[async_trait]
    impl Processor for Described {
        fn name(&self) -> &str {
            "described"
        }
        async fn describe(&self, _: &RunRequest) -> Result<Option<idem::Content>, BoxError> {
            self.describes.fetch_add(1, Ordering::SeqCst);
            Ok(Some(idem::Content::new().entities(["p1", "p2"])))
        }
        async fn process(&self, _: &RunRequest) -> Result<Outcome, BoxError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::records(2))
        }
    }

    /// Jobs (`jobs.query` calls) per run, counted at the limits simulator (no
    /// contention), with the default guards (time window 1 h, content hash 24 h, lease
    /// 1 h) and with time window + lease. Before the scripts, a completed run on a new
    /// scope was 9 jobs with the default stack and 8 with time window + lease (1 h lease),
    /// an `in_progress` skip 4 and 3; before the early lease read and the skip recorded
    /// with the content read, an `in_progress` skip and a content-hash skip were 3 with
    /// the default stack; see docs/bigquery.md, "What a run sends".
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_per_completed_and_skipped_run_at_the_simulator() {
        let _turn = AT_THE_MODEL.lock().await;
        let url = require_bigquery!("jobs_per_completed_and_skipped_run_at_the_simulator");
        BigQueryStore::connect(&url).await.unwrap();
        let upstream = super::bq_limits::endpoint_of(&url).expect("an emulator endpoint");
        // At the model (scripts statement by statement), so that bytes billed count each
        // child statement as BigQuery bills it: at least 10 MB per table it reads.
        let mut limits = super::bq_limits::Limits::bigquery(Duration::ZERO);
        limits.statements = true;
        let sim = super::bq_limits::Simulator::start(&upstream, limits).await;
        let store = Arc::new(BigQueryStore::connect_lazy(&sim.url(&url)).await.unwrap());
        let date = idem::parse_date("2025-11-18").unwrap();
        let default_stack = || {
            GuardStack::builder()
                .guard(idem::guard::TimeWindowGuard::new(Duration::from_secs(3600)))
                .guard(idem::guard::ContentHashGuard::new(
                    Duration::from_secs(86_400),
                    idem::HashAlgorithm::Sha256,
                ))
                .guard(LeaseGuard::new(Duration::from_secs(3600)))
                .build()
        };
        let window_and_lease = || {
            GuardStack::builder()
                .guard(idem::guard::TimeWindowGuard::new(Duration::from_secs(3600)))
                .guard(LeaseGuard::new(Duration::from_secs(3600)))
                .build()
        };
        // (stack, completed: jobs, scripts; skipped by the time window: jobs)
        let cases: [(&str, GuardStack, u64, u64); 2] = [
            // time-window check (with the lease row), content-hash check with the lease
            // row (a script: on a hit it records the skip), claim script (with the
            // re-check), finish transaction.
            ("default", default_stack(), 4, 3),
            // check with the lease row, claim script, finish transaction.
            ("time_window+lease", window_and_lease(), 3, 2),
        ];
        for (stack, guards, completed_jobs, scripts) in cases {
            let runner = Runner::new(store.clone() as Arc<DynStore>, guards).heartbeat(false);
            let processor = Described::default();
            let name = unique("jobs");
            sim.reset_stats();
            let report = runner
                .run(&processor, RunRequest::new(name.clone(), date))
                .await
                .unwrap();
            assert_eq!(report.status, RunStatus::Completed, "{stack}: {report:?}");
            let stats = sim.stats();
            assert_eq!(
                (stats.total(), stats.kind("script"), stats.kind("mutating")),
                (completed_jobs, scripts, 0),
                "{stack}: a completed run: {stats:?}"
            );
            assert!(completed_jobs <= 4, "the target: at most 4 jobs");
            assert_eq!(stats.quota_failures + stats.conflict_failures, 0);
            eprintln!(
                "{stack}: a completed run: {} jobs, {} child statements, {} MB billed (modelled)",
                stats.total(),
                stats.child_statements,
                stats.bytes_billed / (1024 * 1024)
            );
            // Released: free to claim, and the keys are there.
            assert!(store
                .lease_holder(&name, "2025-11-18", Utc::now())
                .await
                .unwrap()
                .is_none());

            // A re-fire of the completed scope: skipped by the time window.
            sim.reset_stats();
            let again = runner
                .run(&processor, RunRequest::new(name.clone(), date))
                .await
                .unwrap();
            assert_eq!(again.skip_reason, Some(SkipReason::TimeWindow), "{stack}");
            assert_eq!(
                sim.stats().total(),
                2,
                "{stack}: a skip by the time window: the check and the ledger row"
            );
            assert_eq!(processor.calls.load(Ordering::SeqCst), 1);

            // A scope another run holds: in_progress.
            let held_date = idem::parse_date("2025-11-19").unwrap();
            hold(&*store, &name, "2025-11-19").await;
            sim.reset_stats();
            let describes = processor.describes.load(Ordering::SeqCst);
            let held = runner
                .run(&processor, RunRequest::new(name.clone(), held_date))
                .await
                .unwrap();
            assert_eq!(held.skip_reason, Some(SkipReason::InProgress), "{stack}");
            assert_eq!(
                sim.stats().total(),
                2,
                "{stack}: in_progress: the first check, with the lease row, and the ledger row: {:?}",
                sim.stats()
            );
            // Held by another run: skipped before the content is described (the default
            // stack's content guard is not asked).
            assert_eq!(
                held.guards
                    .iter()
                    .map(|g| g.guard.as_str())
                    .collect::<Vec<_>>(),
                ["time_window", "lease"],
                "{stack}"
            );
            assert_eq!(held.processing_key, None, "{stack}");
            assert_eq!(
                processor.describes.load(Ordering::SeqCst),
                describes,
                "{stack}"
            );
            assert!(held.recorded(), "{stack}");
        }

        // A skip by the content hash (the time window passed, the content is unchanged):
        // time-window check (with the lease row), then one script: the content-hash check
        // with the lease row and, on its hit, the ledger row: 2. The time window is read
        // first so that its skip never queries the content.
        let runner = Runner::new(store.clone() as Arc<DynStore>, default_stack()).heartbeat(false);
        let name = unique("content");
        let processor = Described::default();
        let first = runner
            .run(&processor, RunRequest::new(name.clone(), date))
            .await
            .unwrap();
        assert_eq!(first.status, RunStatus::Completed);
        tokio::time::sleep(Duration::from_millis(5)).await;
        sim.reset_stats();
        let request = RunRequest::new(name.clone(), date);
        let short_window = || {
            GuardStack::builder()
                .guard(idem::guard::TimeWindowGuard::new(Duration::from_millis(1)))
                .guard(idem::guard::ContentHashGuard::new(
                    Duration::from_secs(86_400),
                    idem::HashAlgorithm::Sha256,
                ))
                .guard(LeaseGuard::new(Duration::from_secs(3600)))
                .build()
        };
        let unchanged = Runner::new(store.clone() as Arc<DynStore>, short_window())
            .heartbeat(false)
            .run(&processor, request)
            .await
            .unwrap();
        assert_eq!(
            unchanged.skip_reason,
            Some(SkipReason::DuplicateContentHash),
            "{unchanged:?}"
        );
        assert_eq!(sim.stats().total(), 2, "{:?}", sim.stats());
        assert_eq!(sim.stats().kind("script"), 1, "{:?}", sim.stats());
        assert!(unchanged.recorded());
        // The row recorded with the read is the row `record` writes for the skip.
        let previous = unchanged.previous_run.as_ref().expect("the previous run");
        assert_eq!(previous.run_id, first.run_id);
        let rows = store
            .runs(&RunFilter {
                run_id: Some(unchanged.run_id.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "{rows:?}");
        let row = &rows[0];
        assert_eq!(
            (
                row.status,
                row.skip_reason.clone(),
                row.previous_run_id.as_deref(),
                row.processing_key.as_deref(),
                row.mode,
                row.started_at,
                row.finished_at,
                row.duration_ms,
            ),
            (
                RunStatus::Skipped,
                Some(SkipReason::DuplicateContentHash),
                Some(first.run_id.as_str()),
                first.processing_key.as_deref(),
                idem::Mode::Enforce,
                unchanged.started_at,
                unchanged.finished_at,
                unchanged.duration_ms,
            )
        );
        assert_eq!(processor.calls.load(Ordering::SeqCst), 1);

        // A content skip under a run id the ledger holds already (an id in idem's own
        // form is not looked up before the run): the script records nothing, and the skip
        // is recorded as `record` does, under the derived id.
        sim.reset_stats();
        let mut reused = RunRequest::new(name.clone(), date);
        reused.run_id = first.run_id.clone();
        let duplicate = Runner::new(store.clone() as Arc<DynStore>, short_window())
            .heartbeat(false)
            .run(&processor, reused)
            .await
            .unwrap();
        assert_eq!(
            duplicate.skip_reason,
            Some(SkipReason::DuplicateContentHash)
        );
        assert!(
            duplicate.run_id.starts_with(&format!("{}.", first.run_id)),
            "a derived id: {duplicate:?}"
        );
        assert!(duplicate.recorded(), "{duplicate:?}");
        let rows = store
            .runs(&RunFilter {
                run_id: Some(duplicate.run_id.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].skip_reason, Some(SkipReason::DuplicateContentHash));

        // Shadow mode asks every guard and records the would-skip as before: nothing is
        // recorded with the read, the run goes on.
        sim.reset_stats();
        let shadow = Runner::new(store.clone() as Arc<DynStore>, short_window())
            .heartbeat(false)
            .mode(idem::Mode::Shadow)
            .run(&processor, RunRequest::new(name.clone(), date))
            .await
            .unwrap();
        assert_eq!(shadow.status, RunStatus::Completed, "{shadow:?}");
        assert_eq!(
            shadow.would_skip_reason,
            Some(SkipReason::DuplicateContentHash)
        );
        assert_eq!(
            shadow
                .guards
                .iter()
                .map(|g| g.guard.as_str())
                .collect::<Vec<_>>(),
            ["time_window", "content_hash", "lease"]
        );
        assert_eq!(processor.calls.load(Ordering::SeqCst), 2);

        // A scope held by another run, whose content would skip too: in enforce mode the
        // lease seen held with the first read decides (in_progress, 2 jobs); shadow mode
        // asks every guard in order and reports the content's would-skip first.
        let held_scope = idem::parse_date("2025-11-20").unwrap();
        let described = Runner::new(store.clone() as Arc<DynStore>, short_window())
            .heartbeat(false)
            .run(&processor, RunRequest::new(name.clone(), held_scope))
            .await
            .unwrap();
        assert_eq!(described.status, RunStatus::Completed);
        tokio::time::sleep(Duration::from_millis(5)).await;
        hold(&*store, &name, "2025-11-20").await;
        sim.reset_stats();
        let enforce = Runner::new(store.clone() as Arc<DynStore>, short_window())
            .heartbeat(false)
            .run(&processor, RunRequest::new(name.clone(), held_scope))
            .await
            .unwrap();
        assert_eq!(enforce.skip_reason, Some(SkipReason::InProgress));
        assert_eq!(sim.stats().total(), 2, "{:?}", sim.stats());
        let shadow = Runner::new(store.clone() as Arc<DynStore>, short_window())
            .heartbeat(false)
            .mode(idem::Mode::Shadow)
            .run(&processor, RunRequest::new(name.clone(), held_scope))
            .await
            .unwrap();
        assert_eq!(
            shadow.would_skip_reason,
            Some(SkipReason::DuplicateContentHash),
            "{shadow:?}"
        );
        assert_eq!(shadow.guards.len(), 3, "{shadow:?}");
    }

    /// A statement BigQuery refuses for a full DML queue did not run: it is sent again
    /// after a pause, and the run completes (nothing is reported as a store failure).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_dml_queue_is_waited_out_not_a_failure() {
        let url = require_bigquery!("a_full_dml_queue_is_waited_out_not_a_failure");
        let refused = Arc::new(AtomicUsize::new(0));
        let store: Arc<DynStore> = {
            let refused = refused.clone();
            Arc::new(
                BigQueryStore::connect(&url)
                    .await
                    .unwrap()
                    .with_fault_hook(hook(move |op| {
                        let full = matches!(op, "claim.take" | "finish")
                            && refused.fetch_add(1, Ordering::SeqCst) < 6;
                        full.then(|| {
                            let op = op.to_string();
                            Box::pin(async move {
                                Some(ApiError::dml_queue_full(
                                    op,
                                    "idem-test:d.processing_leases_03",
                                    20,
                                ))
                            }) as FaultFuture
                        })
                    })),
            )
        };
        let report = lease_runner(store)
            .run(
                &Counting::default(),
                RunRequest::new(unique("queued"), idem::parse_date("2025-11-18").unwrap()),
            )
            .await
            .expect("a full queue is waited out");
        assert!(refused.load(Ordering::SeqCst) > 6);
        assert_eq!(report.status, RunStatus::Completed, "{report:?}");
        assert!(report.store_errors.is_empty(), "{report:?}");
        assert!(report.recorded());
    }

    /// One retry path for every BigQuery call (issue 35, item 4), shown at the limits
    /// simulator with injected faults (`bq_limits::Faults`): a rate limit on the REST calls
    /// a store makes at open, a rate limit on a poll, an answer lost after the statement
    /// ran, and job SQL beyond a table's DML queue.
    mod retries {
        use std::sync::atomic::Ordering::SeqCst;

        use super::*;
        use crate::bq_limits::{Faults, Limits, Simulator};

        async fn simulator(url: &str, limits: Limits) -> Simulator {
            let upstream = crate::bq_limits::endpoint_of(url).expect("an emulator endpoint");
            Simulator::start(&upstream, limits).await
        }

        async fn count(url: &str, table: &str) -> i64 {
            let n = rows(url, &format!("SELECT COUNT(*) AS n FROM {table}")).await[0]["n"].clone();
            n.as_i64()
                .or_else(|| n.as_str().and_then(|s| s.parse().ok()))
                .unwrap_or_else(|| panic!("a count: {n}"))
        }

        /// A thousand processes starting on one tick exceed BigQuery's API request rate;
        /// the store's startup REST calls (`tables.list`, `tables.get`) answered HTTP 429
        /// `rateLimitExceeded` are made again after a pause, and the store opens.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_rest_rate_limit_at_store_open_is_waited_out() {
            let url = require_bigquery!("retries::a_rest_rate_limit_at_store_open_is_waited_out");
            BigQueryStore::connect(&url).await.unwrap();
            let limits = Limits::bigquery(Duration::ZERO);
            let faults = limits.faults.clone();
            let sim = simulator(&url, limits).await;
            faults.rest_rate_limits.store(3, SeqCst);
            let store = BigQueryStore::connect(&sim.url(&url))
                .await
                .expect("rate limits at open are waited out");
            assert_eq!(faults.injected.load(SeqCst), 3, "three calls were refused");
            assert_eq!(faults.rest_rate_limits.load(SeqCst), 0);
            assert!(store.runs(&RunFilter::default()).await.is_ok());
        }

        /// A rate limit on `getQueryResults` is a failed poll, not a failed statement: the
        /// poll is made again for the same job, and the statement is sent (and runs) once —
        /// for a warehouse's job SQL and for the store's statements alike.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_rate_limited_poll_is_polled_again_and_the_statement_runs_once() {
            let url = require_bigquery!(
                "retries::a_rate_limited_poll_is_polled_again_and_the_statement_runs_once"
            );
            BigQueryStore::connect(&url).await.unwrap(); // the dataset
            let target = table(&url, &unique("polled"));
            exec(&url, &format!("CREATE TABLE {target} (id INT64)")).await;
            let limits = Limits::bigquery(Duration::ZERO);
            let faults = limits.faults.clone();
            let sim = simulator(&url, limits).await;

            // Job SQL: an INSERT answered "not complete", its first three polls refused.
            let w = BigQueryWarehouse::connect(&sim.url(&url)).await.unwrap();
            faults.unfinished.store(1, SeqCst);
            faults.poll_rate_limits.store(3, SeqCst);
            let insert = prepare(
                &format!("INSERT INTO {target} (id) VALUES (1)"),
                Dialect::BigQuery,
            )
            .unwrap();
            w.execute(&insert, &Default::default())
                .await
                .expect("a rate-limited poll is polled again");
            assert_eq!(
                faults.poll_rate_limits.load(SeqCst),
                0,
                "three polls refused"
            );
            assert_eq!(faults.request_ids.lock().unwrap().len(), 1, "sent once");
            assert_eq!(sim.stats().kind("insert"), 1, "{:?}", sim.stats());
            assert_eq!(count(&url, &target).await, 1, "the row was inserted once");

            // A store statement (the ledger read) the same way.
            let store = BigQueryStore::connect_lazy(&sim.url(&url)).await.unwrap();
            sim.reset_stats();
            faults.request_ids.lock().unwrap().clear();
            faults.unfinished.store(1, SeqCst);
            faults.poll_rate_limits.store(2, SeqCst);
            store
                .runs(&RunFilter {
                    run_id: Some(unique("none")),
                    ..Default::default()
                })
                .await
                .expect("a rate-limited poll is polled again");
            assert_eq!(faults.poll_rate_limits.load(SeqCst), 0);
            assert_eq!(faults.request_ids.lock().unwrap().len(), 1, "sent once");
            assert_eq!(sim.stats().total(), 1, "{:?}", sim.stats());
        }

        /// Arms a lost answer when it runs: the next statement (the finish) takes effect in
        /// BigQuery, but its answer is an HTTP 503.
        struct LosesTheFinishAnswer {
            faults: Faults,
            calls: AtomicUsize,
        }

        #[async_trait]
        impl Processor for LosesTheFinishAnswer {
            fn name(&self) -> &str {
                "loses_the_finish_answer"
            }
            async fn process(&self, _: &RunRequest) -> Result<Outcome, BoxError> {
                self.calls.fetch_add(1, SeqCst);
                self.faults.lost_answers.store(1, SeqCst);
                Ok(Outcome::records(1))
            }
        }

        /// An HTTP 503 after the statement ran (BigQuery did the work; the answer was
        /// lost): the statement is sent again with the same `requestId`, BigQuery answers
        /// with the first job, and it ran once: the run completes, its ledger row is
        /// recorded once, and its keys make the next run skip.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_lost_answer_is_sent_again_with_its_request_id_and_runs_once() {
            let url = require_bigquery!(
                "retries::a_lost_answer_is_sent_again_with_its_request_id_and_runs_once"
            );
            BigQueryStore::connect(&url).await.unwrap();
            let limits = Limits::bigquery(Duration::ZERO);
            let faults = limits.faults.clone();
            let sim = simulator(&url, limits).await;
            let store = Arc::new(BigQueryStore::connect_lazy(&sim.url(&url)).await.unwrap());
            let runner = || {
                Runner::new(
                    store.clone() as Arc<DynStore>,
                    GuardStack::builder()
                        .guard(idem::guard::TimeWindowGuard::new(Duration::from_secs(3600)))
                        .guard(LeaseGuard::new(Duration::from_secs(600)))
                        .build(),
                )
                .heartbeat(false)
            };
            let processor = LosesTheFinishAnswer {
                faults: faults.clone(),
                calls: AtomicUsize::new(0),
            };
            let name = unique("lost");
            let date = idem::parse_date("2025-11-18").unwrap();
            sim.reset_stats();
            faults.request_ids.lock().unwrap().clear();
            let report = runner()
                .run(&processor, RunRequest::new(name.clone(), date))
                .await
                .expect("a lost answer is sent again");
            assert_eq!(report.status, RunStatus::Completed, "{report:?}");
            assert!(report.store_errors.is_empty(), "{report:?}");
            assert!(report.recorded(), "{report:?}");
            assert_eq!(faults.injected.load(SeqCst), 1, "one answer was lost");
            let ids = faults.request_ids.lock().unwrap().clone();
            let resent = faults.resent_ids();
            assert_eq!(resent.len(), 1, "one statement was sent again: {ids:?}");
            assert_eq!(
                ids.iter().filter(|id| **id == resent[0]).count(),
                2,
                "with the same requestId: {ids:?}"
            );
            let distinct: std::collections::BTreeSet<&String> = ids.iter().collect();
            assert_eq!(
                sim.stats().total() as usize,
                distinct.len(),
                "every statement ran once: {:?}",
                sim.stats()
            );
            let recorded = store
                .runs(&RunFilter {
                    run_id: Some(report.run_id.clone()),
                    ..Default::default()
                })
                .await
                .unwrap();
            assert_eq!(recorded.len(), 1, "one ledger row: {recorded:?}");
            assert_eq!(recorded[0].status, RunStatus::Completed);
            let again = runner()
                .run(&processor, RunRequest::new(name.clone(), date))
                .await
                .unwrap();
            assert_eq!(again.skip_reason, Some(SkipReason::TimeWindow), "{again:?}");
            assert_eq!(processor.calls.load(SeqCst), 1);
        }

        /// Job SQL on a BigQuery warehouse (the recommended `DELETE …; INSERT …` of a
        /// scope) from many scopes at once into one table overflows its DML queue ("Too
        /// many DML statements outstanding against table …"); the refused statements did
        /// not run and are sent again after a pause, and every scope's SQL succeeds.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn job_sql_beyond_the_dml_queue_is_waited_out() {
            let url = require_bigquery!("retries::job_sql_beyond_the_dml_queue_is_waited_out");
            BigQueryStore::connect(&url).await.unwrap(); // the dataset
            let target = table(&url, &unique("scopes"));
            exec(&url, &format!("CREATE TABLE {target} (id INT64)")).await;
            let mut limits = Limits::bigquery(Duration::from_millis(200));
            limits.mutating_running = 1;
            limits.mutating_queue = 1;
            let sim = simulator(&url, limits).await;
            let w = Arc::new(BigQueryWarehouse::connect(&sim.url(&url)).await.unwrap());
            let scopes = 10;
            let tasks: Vec<_> = (0..scopes)
                .map(|i| {
                    let w = w.clone();
                    let sql = format!(
                        "DELETE FROM {target} WHERE id = {i}; INSERT INTO {target} (id) VALUES ({i})"
                    );
                    tokio::spawn(async move {
                        let statements = prepare(&sql, Dialect::BigQuery).unwrap();
                        w.execute(&statements, &Default::default())
                            .await
                            .map_err(|e| e.to_string())
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap().expect("job SQL waits out a full queue");
            }
            let stats = sim.stats();
            assert!(stats.quota_failures > 0, "the queue overflowed: {stats:?}");
            assert_eq!(stats.kind("mutating"), scopes + stats.quota_failures);
            assert_eq!(count(&url, &target).await, scopes as i64);
        }
    }
}
