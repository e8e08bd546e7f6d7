//! End-to-end scenarios through the `idem` binary, each run against every store URL:
//! SQLite always; Postgres and BigQuery when `IDEM_TEST_POSTGRES_URL` /
//! `IDEM_TEST_BIGQUERY_URL` are set (otherwise each test says why it skipped and passes;
//! under `IDEM_REQUIRE_SERVICES=1` it fails instead). The job's warehouse is the store's
//! database (for SQLite a `warehouse.db` beside the store file). Every scenario uses its
//! own job and table names (random suffix), so they share one database.

use std::sync::Arc;

use chrono::Utc;
use idem::store::KeyLookup;
use idem::warehouse::{open_warehouse, prepare, Dialect, Warehouse};
use idem::{scope_key, KeyKind, KeyRecord};
use serde_json::Value;

use crate::common;

use common::{toml_str, Sandbox};

/// One store URL with its warehouse.
struct Target {
    dialect: Dialect,
    sandbox: Sandbox,
    warehouse_url: String,
    warehouse: Arc<dyn Warehouse>,
    suffix: String,
    /// Tables to drop at the end (Postgres: the database outlives the test).
    tables: std::sync::Mutex<Vec<String>>,
}

impl Target {
    async fn new(dialect: Dialect, sandbox: Sandbox, warehouse_url: String) -> Target {
        let warehouse = open_warehouse(&warehouse_url)
            .await
            .expect("open the warehouse");
        Target {
            dialect,
            sandbox,
            warehouse_url,
            warehouse,
            suffix: idem::new_run_id().replace('-', "")[..10].to_string(),
            tables: Default::default(),
        }
    }

    async fn sqlite() -> Target {
        let sandbox = Sandbox::new("idem-scn");
        let warehouse = format!("sqlite://{}", sandbox.dir.join("warehouse.db").display());
        Target::new(Dialect::Sqlite, sandbox, warehouse).await
    }

    async fn postgres(test: &str) -> Option<Target> {
        let url = common::postgres_url(&format!("scenarios::{test}::postgres"))?;
        Some(
            Target::new(
                Dialect::Postgres,
                Sandbox::with_store("idem-scn", &url),
                url,
            )
            .await,
        )
    }

    #[cfg(feature = "bigquery")]
    async fn bigquery(test: &str) -> Option<Target> {
        let url = common::bigquery_url(&format!("scenarios::{test}::bigquery"))?;
        // Opening the store creates the dataset the job's tables go in.
        idem::store::bigquery::BigQueryStore::connect(&url)
            .await
            .expect("open the store");
        Some(
            Target::new(
                Dialect::BigQuery,
                Sandbox::with_store("idem-scn", &url),
                url,
            )
            .await,
        )
    }

    /// A unique name: `prefix_SUFFIX`.
    fn unique(&self, prefix: &str) -> String {
        format!("{prefix}_{}", self.suffix)
    }

    /// A fresh table name as job SQL writes it (fully qualified on BigQuery).
    fn table(&self, prefix: &str) -> String {
        let name = self.unique(prefix);
        self.tables.lock().unwrap().push(name.clone());
        match self.dialect {
            #[cfg(feature = "bigquery")]
            Dialect::BigQuery => idem::backend::bigquery::BigQueryUrl::parse(&self.warehouse_url)
                .unwrap()
                .table(&name),
            _ => name,
        }
    }

    /// Column types: (text, integer, date).
    fn types(&self) -> (&'static str, &'static str, &'static str) {
        match self.dialect {
            Dialect::Sqlite => ("TEXT", "INTEGER", "TEXT"),
            Dialect::Postgres => ("TEXT", "BIGINT", "DATE"),
            Dialect::BigQuery => ("STRING", "INT64", "DATE"),
        }
    }

    /// A date literal.
    fn date(&self, day: &str) -> String {
        match self.dialect {
            Dialect::Sqlite => format!("'{day}'"),
            _ => format!("DATE '{day}'"),
        }
    }

    /// The parameter a job compares with a date column: `@scope` (bound like an untyped
    /// literal) or, on BigQuery, the DATE parameter `@scope_date`.
    fn scope_date(&self) -> &'static str {
        match self.dialect {
            Dialect::BigQuery => "@scope_date",
            _ => "@scope",
        }
    }

    /// What the database says about a missing table.
    fn missing_table(&self) -> &'static str {
        match self.dialect {
            Dialect::Sqlite => "no such table",
            Dialect::Postgres => "does not exist",
            Dialect::BigQuery => "Not found",
        }
    }

    /// Runs statements on the warehouse (no parameters).
    async fn exec(&self, sql: &str) {
        let statements = prepare(sql, self.dialect).unwrap();
        self.warehouse
            .execute(&statements, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The rows of a query on the warehouse, as JSON objects.
    async fn rows(&self, sql: &str) -> Vec<Value> {
        let statement = &prepare(sql, self.dialect).unwrap()[0];
        self.warehouse
            .query(statement, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The scope key `processor` wrote for `scope` in the last day, read from the store.
    async fn scope_key(&self, processor: &str, scope: &str) -> Option<KeyRecord> {
        let store = idem::store::open(&self.sandbox.store).await.unwrap();
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

    /// Drops the tables a scenario made (Postgres; SQLite's go with the sandbox, the
    /// emulator's with the emulator).
    async fn cleanup(&self) {
        if self.dialect != Dialect::Postgres {
            return;
        }
        let tables = std::mem::take(&mut *self.tables.lock().unwrap());
        for table in tables {
            let drop = prepare(&format!("DROP TABLE IF EXISTS {table}"), self.dialect).unwrap();
            let _ = self.warehouse.execute(&drop, &Default::default()).await;
        }
    }
}

/// A SQL job that sums `src` into `out` for the scope's day.
struct Sales {
    src: String,
    out: String,
}

impl Sales {
    fn new(t: &Target) -> Sales {
        Sales {
            src: t.table("src"),
            out: t.table("out"),
        }
    }

    fn create(&self, t: &Target) -> String {
        let (text, int, date) = t.types();
        format!(
            "CREATE TABLE IF NOT EXISTS {src} (day {date}, item {text}, qty {int});\n\
             CREATE TABLE IF NOT EXISTS {out} (day {date}, qty {int})",
            src = self.src,
            out = self.out
        )
    }

    /// The insert alone (one statement).
    fn insert(&self, t: &Target) -> String {
        format!(
            "INSERT INTO {out} (day, qty) SELECT day, SUM(qty) FROM {src} WHERE day = {p} GROUP BY day",
            out = self.out,
            src = self.src,
            p = t.scope_date()
        )
    }

    /// The good process: DELETE the day, INSERT it again.
    fn process(&self, t: &Target) -> String {
        format!(
            "DELETE FROM {out} WHERE day = {p};\n{insert}",
            out = self.out,
            p = t.scope_date(),
            insert = self.insert(t)
        )
    }

    fn toml(&self, t: &Target, name: &str, guards: &str, process: &str) -> String {
        format!(
            "name = {name}\nprocessor = \"sql\"\n[guards]\n{guards}\n[sql]\nwarehouse = {wh}\n\
             setup = '''\n{create}\n'''\n\
             content = \"SELECT item, qty FROM {src} WHERE day = {p} ORDER BY item\"\n\
             process = '''\n{process}\n'''\n",
            name = toml_str(name),
            wh = toml_str(&t.warehouse_url),
            create = self.create(t),
            src = self.src,
            p = t.scope_date(),
        )
    }

    async fn add(&self, t: &Target, day: &str, item: &str, qty: i64) {
        t.exec(&format!(
            "{create};\nINSERT INTO {src} (day, item, qty) VALUES ({day}, '{item}', {qty})",
            create = self.create(t),
            src = self.src,
            day = t.date(day),
        ))
        .await;
    }

    async fn total(&self, t: &Target, day: &str) -> Option<i64> {
        t.rows(&format!(
            "SELECT qty FROM {} WHERE day = {}",
            self.out,
            t.date(day)
        ))
        .await
        .first()
        .and_then(|r| r["qty"].as_i64())
    }
}

fn status(v: &Value) -> &str {
    v["status"].as_str().unwrap_or("?")
}

fn statuses(runs: &Value) -> Vec<&str> {
    runs.as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect()
}

/// A SQL job runs once, then skips by time window (also under another trigger), and
/// `explain`, the human output and the ledger say which run it was.
async fn a_sql_job_runs_once_then_skips_by_time_window(t: Target) {
    let s = &t.sandbox;
    let job = Sales::new(&t);
    job.add(&t, "2025-11-18", "ball", 3).await;
    job.add(&t, "2025-11-18", "bat", 4).await;
    job.add(&t, "2025-11-19", "ball", 100).await;
    let name = t.unique("daily_sales");
    let path = s.write_job(
        "sales",
        &job.toml(&t, &name, "time_window = \"1h\"", &job.process(&t)),
    );
    let path = path.to_str().unwrap();

    let (code, first, stderr) = s.json(&["run", path, "--date", "2025-11-18"]);
    assert_eq!(code, 0, "{first}\n{stderr}");
    assert_eq!(status(&first), "completed", "{first}");
    assert_eq!(first["recorded"], true);
    assert_eq!(
        first["records_processed"], 1,
        "rows affected: DELETE 0 + INSERT 1 {first}"
    );
    assert_eq!(first["job"], name.as_str());
    assert_eq!(first["scope"], "2025-11-18");
    assert_eq!(
        job.total(&t, "2025-11-18").await,
        Some(7),
        "the scope's day is selected"
    );

    let (code, second, stderr) = s.json(&[
        "run",
        path,
        "--date",
        "2025-11-18",
        "--trigger",
        "scheduler",
    ]);
    assert_eq!(code, 0, "a skip is a success: {second}\n{stderr}");
    assert_eq!(status(&second), "skipped", "{second}");
    assert_eq!(second["skip_reason"], "time_window");
    assert_eq!(second["previous_run"]["run_id"], first["run_id"]);
    assert_eq!(second["trigger"], "scheduler");

    let out = s.idem(&["explain", path, "--date", "2025-11-18"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("would be skipped (time_window)"), "{text}");
    assert!(
        text.contains(first["run_id"].as_str().unwrap()) || text.contains("completed at"),
        "{text}"
    );
    let (_, explained, _) = s.json(&["explain", path, "--date", "2025-11-18"]);
    assert_eq!(explained["decision"], "skip");
    assert_eq!(explained["previous_run"]["run_id"], first["run_id"]);

    // The human output of a skip says which guard, which run, when.
    let out = s.idem(&["run", path, "--date", "2025-11-18"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("skipped {name} for 2025-11-18 (time_window)")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "previous run: {}",
            first["run_id"].as_str().unwrap()
        )),
        "{text}"
    );

    // The ledger has every run, newest first; the key is in the store.
    let (code, runs, _) = s.json(&["runs", "--job", &name]);
    assert_eq!(code, 0);
    assert_eq!(statuses(&runs), vec!["skipped", "skipped", "completed"]);
    assert!(t.scope_key(&name, "2025-11-18").await.is_some());
    t.cleanup().await;
}

/// A failing script: the run fails (exit 1) and is recorded with the database's message
/// and the failing statement, writes no key, and where the dialect has transactions its
/// earlier statements are rolled back; fixed, the next run completes, then skips.
async fn a_failing_sql_records_a_failed_run_and_no_key_then_the_fix_runs(t: Target) {
    let s = &t.sandbox;
    let job = Sales::new(&t);
    job.add(&t, "2025-11-18", "ball", 5).await;
    job.add(&t, "2025-11-18", "bat", 2).await;
    job.add(&t, "2025-11-19", "ball", 100).await;
    let name = t.unique("failing");
    let missing = t.table("missing");
    let guards = "lease = \"1m\"\ntime_window = \"1h\"\ncontent_hash = \"24h\"";
    let broken = format!(
        "{insert};\nINSERT INTO {missing} (day) SELECT day FROM {src} WHERE day = {p}",
        insert = job.insert(&t),
        src = job.src,
        p = t.scope_date()
    );
    let path = s.write_job("failing", &job.toml(&t, &name, guards, &broken));
    let path = path.to_str().unwrap();

    let (code, failed, stderr) = s.json(&["run", path, "--date", "2025-11-18"]);
    assert_eq!(code, 1, "a failed run exits 1: {failed}\n{stderr}");
    assert_eq!(status(&failed), "failed");
    let error = failed["error"].as_str().unwrap_or("");
    assert!(
        error.contains("sql process failed")
            && error.contains("statement 2 of 2")
            && error.contains(t.missing_table()),
        "the warehouse's error is reported: {error}"
    );
    assert_eq!(failed["recorded"], true);
    assert!(failed["processing_key"].is_string(), "content was hashed");
    let (_, runs, _) = s.json(&["runs", "--job", &name, "--status", "failed"]);
    assert_eq!(runs.as_array().unwrap().len(), 1, "{runs}");
    assert!(
        runs[0]["error"]
            .as_str()
            .unwrap()
            .contains("sql process failed"),
        "{runs}"
    );
    assert!(
        t.scope_key(&name, "2025-11-18").await.is_none(),
        "a failed run writes no key"
    );
    if t.dialect != Dialect::BigQuery {
        assert_eq!(
            job.total(&t, "2025-11-18").await,
            None,
            "the first statement was rolled back"
        );
    }
    // No key: explain says the guards let it run.
    let (_, explained, _) = s.json(&["explain", path, "--date", "2025-11-18"]);
    assert_eq!(explained["decision"], "run", "{explained}");
    // The human output says it failed, and why.
    let out = s.idem(&["run", path, "--date", "2025-11-18"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("failed {name} for 2025-11-18")),
        "{text}"
    );
    assert!(text.contains(t.missing_table()), "{text}");
    if t.dialect == Dialect::Sqlite {
        assert!(
            text.contains(&format!("no such table: {missing}")),
            "{text}"
        );
    }

    // Fixed: the retry is not blocked and completes.
    s.write_job("failing", &job.toml(&t, &name, guards, &job.process(&t)));
    let (code, fixed, stderr) = s.json(&["run", path, "--date", "2025-11-18"]);
    assert_eq!(code, 0, "{fixed}\n{stderr}");
    assert_eq!(status(&fixed), "completed", "{fixed}");
    assert_eq!(fixed["records_processed"], 1, "DELETE + INSERT 1");
    assert_eq!(job.total(&t, "2025-11-18").await, Some(7));
    assert_eq!(
        job.total(&t, "2025-11-19").await,
        None,
        "only the scope's day"
    );
    assert!(t.scope_key(&name, "2025-11-18").await.is_some());

    // Same content again: skipped (time window first).
    let (code, again, _) = s.json(&["run", path, "--date", "2025-11-18"]);
    assert_eq!(code, 0);
    assert_eq!(status(&again), "skipped");
    let (code, runs, _) = s.json(&["runs", "--job", &name]);
    assert_eq!(code, 0);
    assert_eq!(
        statuses(&runs),
        vec!["skipped", "completed", "failed", "failed"]
    );
    t.cleanup().await;
}

/// The content hash skips a run whose source rows did not change (another day's rows do
/// not count) and runs when they did, with another key.
async fn the_content_hash_skips_unchanged_source_and_runs_on_change(t: Target) {
    let s = &t.sandbox;
    let job = Sales::new(&t);
    job.add(&t, "2025-11-18", "ball", 3).await;
    let name = t.unique("hashed");
    let path = s.write_job(
        "hashed",
        &job.toml(
            &t,
            &name,
            "time_window = \"0s\"\ncontent_hash = \"24h\"\nhash = \"md5\"",
            &job.process(&t),
        ),
    );

    let (code, first, stderr) = s.run(&path, "2025-11-18");
    assert_eq!(
        (code, status(&first)),
        (0, "completed"),
        "{first}\n{stderr}"
    );
    let key = first["processing_key"].as_str().unwrap().to_string();
    assert_eq!(key.len(), 32, "md5 keys are 32 hex characters");

    let (code, same, _) = s.run(&path, "2025-11-18");
    assert_eq!((code, status(&same)), (0, "skipped"), "{same}");
    assert_eq!(same["skip_reason"], "duplicate_content_hash");
    assert_eq!(same["processing_key"], key.as_str());
    assert_eq!(same["previous_run"]["run_id"], first["run_id"]);

    // Another day's rows are not this scope's content.
    job.add(&t, "2025-11-19", "bat", 9).await;
    let (_, still, _) = s.run(&path, "2025-11-18");
    assert_eq!(still["skip_reason"], "duplicate_content_hash", "{still}");

    job.add(&t, "2025-11-18", "bat", 4).await;
    let (code, changed, stderr) = s.run(&path, "2025-11-18");
    assert_eq!(
        (code, status(&changed)),
        (0, "completed"),
        "{changed}\n{stderr}"
    );
    assert_ne!(changed["processing_key"], key.as_str());
    // DELETE 1 + INSERT 1: records processed are the last statement's rows.
    assert_eq!(changed["records_processed"], 1, "{changed}");
    assert_eq!(job.total(&t, "2025-11-18").await, Some(7));
    t.cleanup().await;
}

/// A job name and a scope full of quotes, semicolons, comment markers, placeholders and
/// unicode round-trip byte for byte through `idem run --scope`, the SQL processor's
/// parameters, the ledger and the keys.
async fn names_and_scopes_with_quotes_and_unicode_round_trip(t: Target) {
    let s = &t.sandbox;
    let (text, _, _) = t.types();
    let table = t.table("odd");
    t.exec(&format!(
        "CREATE TABLE {table} (scope {text} NOT NULL, job {text} NOT NULL)"
    ))
    .await;
    let name = format!(
        "it's; \"odd\" -- DROP TABLE processing_runs; — ünïcødé 🎉 {}",
        t.suffix
    );
    let scope = "2025-11-18/team='LAL'; DELETE FROM processing_keys; DROP TABLE out; --/ñ \"x\" $1 ?1 @scope ünïcødé 🎉";
    let path = s.write_job(
        "odd",
        &format!(
            "name = {}\nprocessor = \"sql\"\n[guards]\nlease = \"1m\"\ntime_window = \"1h\"\n\
             [sql]\nwarehouse = {}\nprocess = \"INSERT INTO {table} (scope, job) VALUES (@scope, @job)\"\n\
             [sql.params]\njob = {}\n",
            toml_str(&name),
            toml_str(&t.warehouse_url),
            toml_str(&name)
        ),
    );
    let path = path.to_str().unwrap();
    let run_args = ["run", path, "--date", "2025-11-18", "--scope", scope];

    let (code, report, stderr) = s.json(&run_args);
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["status"], "completed");
    assert_eq!(report["job"], name.as_str());
    assert_eq!(report["scope"], scope);
    let (code, runs, _) = s.json(&["runs", "--job", &name, "--scope", scope]);
    assert_eq!(code, 0);
    let list = runs.as_array().unwrap();
    assert_eq!(list.len(), 1, "{runs:?}");
    assert_eq!(list[0]["processor"], name.as_str(), "byte-exact round trip");
    assert_eq!(list[0]["scope"], scope);
    let rows = t.rows(&format!("SELECT scope, job FROM {table}")).await;
    assert_eq!(
        rows,
        vec![serde_json::json!({"scope": scope, "job": name.as_str()})]
    );

    // The key written under those strings is found again: the next run is skipped.
    let (code, again, _) = s.json(&run_args);
    assert_eq!(code, 0);
    assert_eq!(again["status"], "skipped", "{again}");
    assert_eq!(again["skip_reason"], "time_window");
    let key = t.scope_key(&name, scope).await.expect("key found");
    assert_eq!(key.processor, name);
    assert_eq!(key.scope, scope);
    let (_, runs, _) = s.json(&["runs", "--job", &name, "--scope", scope]);
    assert_eq!(runs.as_array().unwrap().len(), 2);
    assert_eq!(runs[0]["scope"], scope);
    t.cleanup().await;
}

/// What the content query reads and how each step changes it, per dialect: a list of
/// (label, script) applied in turn after `initial`.
fn type_steps(t: &Target) -> (String, Vec<String>, Vec<(String, String)>) {
    let (first, last) = (t.table("typed_first"), t.table("typed_last"));
    match t.dialect {
        // Untyped columns: each value keeps its storage class.
        Dialect::Sqlite => {
            let set =
                |value: &str| format!("DELETE FROM {first}; INSERT INTO {first} VALUES ({value})");
            let steps = [
                ("duplicate column name", "2"),
                ("NULL", "NULL"),
                ("+infinity", "1e999"),
                ("-infinity", "-1e999"),
                ("text not UTF-8", "CAST(x'ff' AS TEXT)"),
                ("text", "'ab'"),
                ("blob of the text's hex digits", "x'ab'"),
                ("integer", "3"),
                ("real", "3.0"),
                ("text of the integer", "'3'"),
            ];
            (
                format!("SELECT f.v, l.v FROM {first} f, {last} l WHERE @scope <> ''"),
                vec![format!(
                    "CREATE TABLE {first} (v); CREATE TABLE {last} (v); \
                     INSERT INTO {first} VALUES (1); INSERT INTO {last} VALUES ('x')"
                )],
                steps
                    .iter()
                    .map(|(label, value)| (label.to_string(), set(value)))
                    .collect(),
            )
        }
        // Two one-column views, redefined.
        Dialect::Postgres => {
            let define = |view: &str, value: &str| {
                format!("DROP VIEW IF EXISTS {view}; CREATE VIEW {view} AS SELECT {value} AS v")
            };
            let mut steps: Vec<(String, String)> = [
                "1.5::numeric",
                "'1.5'::text",
                "'NaN'::numeric",
                "'NaN'::float8",
                "'NaN'::text",
                "'Infinity'::float8",
                "'Infinity'::text",
                "'\\x6162'::bytea",
                "'ab'::text",
                "true",
                "'true'::json",
                "'infinity'::date",
                "'infinity'::timestamptz",
                "'-infinity'::timestamp",
                "ARRAY[[1, 2], [3, 4]]",
                "'\\x7fffffff'::text",
                "NULL::int",
            ]
            .iter()
            .map(|value| (format!("{last} {value}"), define(&last, value)))
            .collect();
            // The first of the two columns named `v`.
            steps.push((format!("{first} 2"), define(&first, "2")));
            (
                format!("SELECT f.v, l.v FROM {first} f, {last} l WHERE @scope <> ''"),
                vec![define(&first, "1"), define(&last, "'initial'::text")],
                steps,
            )
        }
        // One one-column table, recreated with another type.
        Dialect::BigQuery => {
            let define = |ty: &str, value: &str| {
                format!(
                    "DROP TABLE IF EXISTS {last}; CREATE TABLE {last} (v {ty}); \
                     INSERT INTO {last} (v) VALUES ({value})"
                )
            };
            let steps = [
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
            ];
            (
                format!("SELECT * FROM {last}"),
                vec![define("STRING", "'initial'")],
                steps
                    .iter()
                    .map(|(ty, value)| (format!("{ty} {value}"), define(ty, value)))
                    .collect(),
            )
        }
    }
}

/// Every column and every value's type reach the content key: each step below used to
/// encode like the one before it (`duplicate_content_hash`): a changed column hidden by
/// a later column of the same name, and values of different types that encoded alike
/// (NULL, ±infinity, NaN and text that is not UTF-8; numeric `1.5` and the text `'1.5'`;
/// bytes and the text of their hex digits or base64; a date and its text).
async fn every_column_and_every_type_change_reaches_the_content_key(t: Target) {
    let s = &t.sandbox;
    let (content, initial, steps) = type_steps(&t);
    for script in &initial {
        t.exec(script).await;
    }
    let name = t.unique("typed");
    let job = s.write_job(
        "typed",
        &format!(
            "name = {}\nprocessor = \"sql\"\n[guards]\ntime_window = \"0s\"\n\
             content_hash = \"24h\"\n[sql]\nwarehouse = {}\ncontent = {}\nprocess = \"SELECT 1\"\n",
            toml_str(&name),
            toml_str(&t.warehouse_url),
            toml_str(&content),
        ),
    );
    let (code, first, stderr) = s.run(&job, "2025-11-18");
    assert_eq!(code, 0, "{first}\n{stderr}");
    assert_eq!(status(&first), "completed", "{first}");
    let (_, same, _) = s.run(&job, "2025-11-18");
    assert_eq!(same["skip_reason"], "duplicate_content_hash", "{same}");
    let mut keys = vec![first["processing_key"].clone()];
    for (label, script) in steps {
        t.exec(&script).await;
        let (code, run, stderr) = s.run(&job, "2025-11-18");
        assert_eq!(code, 0, "{label}: {run}\n{stderr}");
        assert_eq!(status(&run), "completed", "{label}: {run}");
        assert!(
            !keys.contains(&run["processing_key"]),
            "{label}: a key seen before {run}"
        );
        keys.push(run["processing_key"].clone());
        // The same content again is still a duplicate.
        let (_, again, _) = s.run(&job, "2025-11-18");
        assert_eq!(
            again["skip_reason"], "duplicate_content_hash",
            "{label}: {again}"
        );
    }
    if t.dialect == Dialect::Postgres {
        for view in [t.unique("typed_first"), t.unique("typed_last")] {
            t.exec(&format!("DROP VIEW IF EXISTS {view}")).await;
        }
        t.tables.lock().unwrap().clear();
    }
    t.cleanup().await;
}

/// One test per scenario and store.
macro_rules! every_store {
    ($scenario:ident) => {
        mod $scenario {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$scenario(Target::sqlite().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if let Some(t) = Target::postgres(stringify!($scenario)).await {
                    super::$scenario(t).await;
                }
            }

            #[cfg(feature = "bigquery")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn bigquery() {
                if let Some(t) = Target::bigquery(stringify!($scenario)).await {
                    super::$scenario(t).await;
                }
            }
        }
    };
}

every_store!(a_sql_job_runs_once_then_skips_by_time_window);
every_store!(a_failing_sql_records_a_failed_run_and_no_key_then_the_fix_runs);
every_store!(the_content_hash_skips_unchanged_source_and_runs_on_change);
every_store!(names_and_scopes_with_quotes_and_unicode_round_trip);
every_store!(every_column_and_every_type_change_reaches_the_content_key);
