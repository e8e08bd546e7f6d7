//! The multi-statement scripts (one BigQuery job each) of a run: the claim, with the
//! re-check of the guards' keys after it, and the finish, with the ledger row, the keys
//! and the release in one transaction. Values are literals ([`super::literals`]): the
//! emulator binds no parameters in a script.

use chrono::{DateTime, Utc};

use crate::model::{micros, KeyRecord, RunRecord};
use crate::store::rows::{KEY_COLUMNS, RUN_COLUMNS};
use crate::store::{KeyLookup, Lease, SkipOnHit};

use super::literals as lit;
use super::statements::FIND_KEYS_SQL;

/// The columns of a [`claim`] or [`peek`] answer: `row_kind` (`lease` or `key`), the
/// lease columns, then the key columns of [`FIND_KEYS_SQL`] (`pos` first). A `lease` row
/// has NULL key columns and a `key` row NULL lease columns.
const LEASE_BRANCH: &str = "\
SELECT 'lease' AS row_kind, holder_run_id, token, acquired_at, expires_at, \
CAST(NULL AS INT64) AS pos, CAST(NULL AS STRING) AS processing_key, CAST(NULL AS STRING) AS kind, \
CAST(NULL AS STRING) AS processor_name, CAST(NULL AS STRING) AS scope, \
CAST(NULL AS DATE) AS scope_date, CAST(NULL AS TIMESTAMP) AS processed_at, \
CAST(NULL AS INT64) AS entity_count, CAST(NULL AS JSON) AS metadata, CAST(NULL AS STRING) AS run_id, \
CAST(NULL AS TIMESTAMP) AS keep_until
FROM (SELECT holder_run_id, token, acquired_at, expires_at FROM {leases}
  WHERE processor_name = {processor} AND scope = {scope} ORDER BY token DESC LIMIT 1)";

const KEY_BRANCH: &str = "\
SELECT 'key' AS row_kind, CAST(NULL AS STRING), CAST(NULL AS INT64), CAST(NULL AS TIMESTAMP), \
CAST(NULL AS TIMESTAMP), f.* FROM ({find_keys}) AS f";

/// The lease row of (processor, scope) and the latest key per lookup, in one statement
/// (a *merged read*): with query parameters `@processor`, `@scope`, and those of
/// [`FIND_KEYS_SQL`]. `{keys}` and `{leases}` are the qualified tables.
pub(super) fn peek_sql(keys: &str, leases: &str) -> String {
    format!(
        "{}\nUNION ALL\n{}",
        LEASE_BRANCH
            .replace("{processor}", "@processor")
            .replace("{scope}", "@scope"),
        KEY_BRANCH.replace("{find_keys}", FIND_KEYS_SQL)
    )
    .replace("{keys}", keys)
    .replace("{leases}", leases)
}

/// [`FIND_KEYS_SQL`] with its parameters written as literals.
fn find_keys_literal(keys: &str, lookups: &[KeyLookup]) -> String {
    let oldest = lookups
        .iter()
        .map(|l| micros(l.since))
        .min()
        .unwrap_or_default();
    let mut distinct: Vec<&str> = lookups.iter().map(|l| l.key.as_str()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let structs: Vec<String> = lookups
        .iter()
        .enumerate()
        .map(|(i, l)| {
            format!(
                "STRUCT({} AS pos, {} AS key, {} AS kind, {} AS since)",
                lit::int64(i as i64),
                lit::string(&l.key),
                lit::string(l.kind.as_str()),
                lit::timestamp(micros(l.since))
            )
        })
        .collect();
    let key_list: Vec<String> = distinct.iter().map(|k| lit::string(k)).collect();
    FIND_KEYS_SQL
        .replace("{keys}", keys)
        .replace("@lookups", &format!("[{}]", structs.join(", ")))
        .replace("@keys", &format!("[{}]", key_list.join(", ")))
        .replace("@oldest_since", &lit::timestamp(oldest))
}

/// The claim as one script. Each statement is a job of its own with its own snapshot, and
/// commits by itself (BigQuery's DML page, "Limitations"); the script is not a
/// transaction, so BigQuery queues or re-runs its UPDATE like any DML statement instead
/// of cancelling it ("Transaction concurrency", transactions page). Unless the lease is
/// held and unexpired at `now`:
/// 1. a missing lease row is created *free*, `INSERT … WHERE NOT EXISTS`. INSERTs never
///    conflict, so two claims of a new scope may each create one: a scope may have
///    several rows, and no decision rests on a single row;
/// 2. one UPDATE decides over *all* rows of the scope: it takes every one of them (this
///    run as holder, one new token above every row's) only if *no* row of the scope is
///    held and unexpired in its snapshot. Two such UPDATEs of a lease table that overlap
///    conflict (the table is one partition: "DML statement conflicts", DML page), and
///    BigQuery re-runs the later one against the new data, where the scope is held. So
///    of the UPDATEs that see a scope free, exactly one commits a change; a free row
///    inserted after its snapshot stays free with a lower token, and it never lets a
///    second run in, because every later UPDATE sees the held row.
///
/// Then it answers the lease row with the highest token and, after the claim, the latest
/// key of each lookup. The claim is won when that row names this run: an exact compare
/// of the run id (and its integer token), never of a timestamp read back.
#[allow(clippy::too_many_arguments)]
pub(super) fn claim(
    leases: &str,
    keys: &str,
    processor: &str,
    scope: &str,
    run_id: &str,
    now: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    lookups: &[KeyLookup],
) -> String {
    let (p, s, now) = (
        lit::string(processor),
        lit::string(scope),
        lit::timestamp(now),
    );
    let this_scope = format!("processor_name = {p} AND scope = {s}");
    let held = format!(
        "SELECT 1 FROM {leases} AS held WHERE held.processor_name = {p} AND held.scope = {s} \
AND held.holder_run_id IS NOT NULL AND held.expires_at > {now}"
    );
    let mut sql = format!(
        "IF NOT EXISTS ({held}) THEN
  INSERT INTO {leases} (processor_name, scope, holder_run_id, token, acquired_at, expires_at)
  SELECT {p}, {s}, CAST(NULL AS STRING), 0, {now}, {now} FROM UNNEST([1])
  WHERE NOT EXISTS (SELECT 1 FROM {leases} WHERE {this_scope});
  UPDATE {leases}
  SET holder_run_id = {r}, acquired_at = {now}, expires_at = {exp}, renewed_at = {now},
    holder_host = {host}, holder_pid = {pid},
    token = (SELECT MAX(t.token) FROM {leases} AS t WHERE t.processor_name = {p} AND t.scope = {s}) + 1
  WHERE {this_scope} AND NOT EXISTS ({held});
END IF;
{lease}",
        r = lit::string(run_id),
        exp = lit::timestamp(expires_at),
        host = lit::string(crate::model::host_name()),
        pid = lit::int64(i64::from(std::process::id())),
        lease = LEASE_BRANCH
            .replace("{leases}", leases)
            .replace("{processor}", &p)
            .replace("{scope}", &s),
    );
    if !lookups.is_empty() {
        sql.push_str("\nUNION ALL\n");
        sql.push_str(&KEY_BRANCH.replace("{find_keys}", &find_keys_literal(keys, lookups)));
    }
    sql.push(';');
    sql
}

/// How much earlier than the time in its id ([`crate::model::run_id_made_at`]) another
/// row carrying a run id may have started: the id is made before the run starts, on the
/// clock that then stamps `started_at`, so this only covers that clock being stepped back.
const RUN_ID_CLOCK_MARGIN_HOURS: i64 = 24;

/// The earliest `started_at` of a ledger row that can carry `run`'s id: for an id idem
/// made (a UUID v7 holding the time it was made), a day before the earlier of that time
/// and the row's own start (a row written with an earlier start than its id, as tests
/// and imports do, is still found), so a lookup reads the partitions from then on, not
/// the whole ledger; the epoch for any other id (a caller's id may have been recorded on
/// any day). `processing_runs` is partitioned by `DATE(started_at)`.
pub(super) fn run_id_since(run: &RunRecord) -> DateTime<Utc> {
    crate::model::run_id_made_at(&run.run_id)
        .map(|made| made.min(run.started_at))
        .and_then(|at| at.checked_sub_signed(chrono::Duration::hours(RUN_ID_CLOCK_MARGIN_HOURS)))
        .unwrap_or(DateTime::UNIX_EPOCH)
}

/// `run_id = <id>` and, for an id idem made, the partitions it can be in
/// ([`run_id_since`]): the condition of every lookup of a run id in the scripts.
fn run_id_is(run: &RunRecord) -> String {
    let id = lit::string(&run.run_id);
    if crate::model::run_id_made_at(&run.run_id).is_none() {
        return format!("run_id = {id}");
    }
    format!(
        "run_id = {id} AND started_at >= {}",
        lit::timestamp(run_id_since(run))
    )
}

/// What a [`finish`] script answers in its one row (`outcome`).
pub(super) const RECORDED: &str = "recorded";
/// The lease was no longer held with this token: nothing written.
pub(super) const LOST: &str = "lost";
/// The run id is in the ledger already: nothing written.
pub(super) const DUPLICATE: &str = "duplicate";

/// How long before its expiry a finish still writes under the lease without extending it
/// first: longer than the few statements after the check take, queued included.
const FINISH_MARGIN_SECS: i64 = 120;
/// How far a finish extends a lease that expires within [`FINISH_MARGIN_SECS`].
const FINISH_EXTENSION_SECS: i64 = 600;

/// The finish as one script that is *not* a transaction, so that each of its DML
/// statements is queued by BigQuery behind the others on its table, never cancelled
/// ("Conflicting transactions are cancelled; conflicting DML outside a transaction is
/// queued", transactions page). With a lease:
/// 1. unless the run id is recorded already for another run (then nothing is written:
///    [`DUPLICATE`]);
/// 2. if the lease, held by this run with this token, expires within
///    [`FINISH_MARGIN_SECS`] of `now` (the run's `finished_at` when first sent, later
///    for a finish sent again), it is extended (fenced UPDATE). A lease
///    that expired but was not taken over is still this run's, as on every store: a
///    takeover changes the holder and the token, and a claim racing the extension is a
///    concurrent UPDATE of the same table, so one of the two is re-run and sees the other;
/// 3. only if the lease is now held by this run with this token until at least
///    `now` + [`FINISH_MARGIN_SECS`] — no other run can take it before then, and
///    the statements below take seconds — the ledger row and the keys are inserted
///    (each only if not there yet: a finish sent again writes nothing twice), and then
///    the lease is released (fenced). Keys are visible before the lease is free, never
///    after: a run that meets the lease held skips `in_progress`, one that claims the
///    freed lease re-checks and sees the keys.
///
/// The last statement answers one row, `outcome`: [`RECORDED`] when this run's ledger
/// row is there (written now or by an earlier send of the same finish), [`DUPLICATE`]
/// when the run id names another row, [`LOST`] when the fence failed and nothing was
/// written. Without a lease, steps 2–3 are just the inserts.
pub(super) fn finish(
    runs: &str,
    keys: &str,
    leases: &str,
    run: &RunRecord,
    key_rows: &[KeyRecord],
    lease: Option<&Lease>,
    now: DateTime<Utc>,
) -> String {
    let id = lit::string(&run.run_id);
    let run_id_is = run_id_is(run);
    let this_row = format!(
        "run_id = {id} AND processor_name = {} AND scope = {} AND started_at = {} \
AND finished_at = {} AND status = {}",
        lit::string(&run.processor),
        lit::string(&run.scope),
        lit::timestamp(micros(run.started_at)),
        lit::timestamp(micros(run.finished_at)),
        lit::string(run.status.as_str()),
    );
    let mut writes = format!(
        "INSERT INTO {runs} ({RUN_COLUMNS}) SELECT {} FROM UNNEST([1]) \
WHERE NOT EXISTS (SELECT 1 FROM {runs} WHERE {run_id_is});",
        run_values(run)
    );
    if !key_rows.is_empty() {
        let rows: Vec<String> = key_rows.iter().map(key_struct).collect();
        let oldest = key_rows.iter().map(|k| micros(k.processed_at)).min();
        let newest = key_rows.iter().map(|k| micros(k.processed_at)).max();
        let (oldest, newest) = (
            lit::timestamp(oldest.unwrap_or_default()),
            lit::timestamp(newest.unwrap_or_default()),
        );
        writes.push_str(&format!(
            "\n    INSERT INTO {keys} ({KEY_COLUMNS}) SELECT {fields} FROM UNNEST([\n      {}]) AS k\n    \
WHERE NOT EXISTS (SELECT 1 FROM {keys} WHERE run_id = {id} \
AND processed_at BETWEEN {oldest} AND {newest});",
            rows.join(",\n      "),
            fields = KEY_COLUMNS
                .split(',')
                .map(|c| format!("k.{}", c.trim()))
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    let not_duplicate =
        format!("NOT EXISTS (SELECT 1 FROM {runs} WHERE {run_id_is} AND NOT ({this_row}))");
    let body = match lease {
        Some(lease) => {
            let fence = format!(
                "processor_name = {} AND scope = {} AND token = {} AND holder_run_id = {}",
                lit::string(&lease.processor),
                lit::string(&lease.scope),
                lit::int64(lease.token),
                lit::string(&lease.run_id),
            );
            let at = micros(now);
            let secs = |n: i64| {
                lit::timestamp(
                    at.checked_add_signed(chrono::Duration::seconds(n))
                        .unwrap_or(at),
                )
            };
            let (now, safe, extended) = (
                lit::timestamp(at),
                secs(FINISH_MARGIN_SECS),
                secs(FINISH_EXTENSION_SECS),
            );
            format!(
                "  IF NOT EXISTS (SELECT 1 FROM {leases} WHERE {fence} AND expires_at > {safe}) THEN
    UPDATE {leases} SET expires_at = {extended} WHERE {fence};
  END IF;
  IF EXISTS (SELECT 1 FROM {leases} WHERE {fence} AND expires_at > {safe}) THEN
    {writes}
    UPDATE {leases} SET holder_run_id = NULL, expires_at = {now} WHERE {fence};
  END IF;"
            )
        }
        None => format!("  {writes}"),
    };
    format!(
        "IF {not_duplicate} THEN
{body}
END IF;
SELECT CASE WHEN COUNTIF({this_row}) > 0 THEN '{RECORDED}' \
WHEN COUNT(*) > 0 THEN '{DUPLICATE}' ELSE '{LOST}' END AS outcome \
FROM {runs} WHERE {run_id_is};"
    )
}

/// The type of the `found` variable of [`find_recording_skip`]: the rows of
/// [`FIND_KEYS_SQL`].
const FOUND_TYPE: &str = "ARRAY<STRUCT<pos INT64, processing_key STRING, kind STRING, \
processor_name STRING, scope STRING, scope_date DATE, processed_at TIMESTAMP, \
entity_count INT64, metadata JSON, run_id STRING, keep_until TIMESTAMP>>";

/// The row of a [`find_recording_skip`] answer that says the skip is recorded: its
/// `row_kind`; its `run_id` column holds the recorded row's `previous_run_id`.
pub(super) const RECORDED_ROW: &str = "run";

/// The guards' read with the ledger row of the skip it decides, as one script (one job):
/// the latest key per lookup is read once, into a variable. Only when the key of lookup
/// `skip.position` is there is the ledger read (a miss reads no more than the plain
/// check): unless the run id is in the ledger, the skip's row is inserted with that key's
/// run id as `previous_run_id`; then this run's skip row is looked up (inserted now, or
/// by an earlier attempt of the same script). The script answers, as [`peek_sql`] does,
/// the lease row of (processor, scope) and the keys read (the very rows the insert was
/// decided on), and a [`RECORDED_ROW`] when this run's skip row is in the ledger. Not a
/// transaction: one INSERT, which commits by itself.
pub(super) fn find_recording_skip(
    runs: &str,
    keys: &str,
    leases: &str,
    lookups: &[KeyLookup],
    skip: &SkipOnHit,
) -> String {
    let run = &skip.run;
    let (p, s) = (lit::string(&run.processor), lit::string(&run.scope));
    let id = lit::string(&run.run_id);
    let pos = lit::int64(i64::try_from(skip.position).unwrap_or(i64::MAX));
    let found = "SELECT ARRAY_AGG(STRUCT(f.pos AS pos, f.processing_key AS processing_key, \
f.kind AS kind, f.processor_name AS processor_name, f.scope AS scope, \
f.scope_date AS scope_date, f.processed_at AS processed_at, f.entity_count AS entity_count, \
f.metadata AS metadata, f.run_id AS run_id, f.keep_until AS keep_until))";
    format!(
        "DECLARE found {FOUND_TYPE} DEFAULT ({found} FROM ({find_keys}) AS f);
DECLARE recorded_previous STRING DEFAULT NULL;
DECLARE recorded BOOL DEFAULT FALSE;
IF EXISTS (SELECT 1 FROM UNNEST(found) AS f WHERE f.pos = {pos}) THEN
  IF NOT EXISTS (SELECT 1 FROM {runs} WHERE {run_id_is}) THEN
    INSERT INTO {runs} ({RUN_COLUMNS})
    SELECT {values} FROM UNNEST(found) AS f WHERE f.pos = {pos};
  END IF;
  SET recorded = EXISTS (SELECT 1 FROM {runs} WHERE {this_row});
  SET recorded_previous = (SELECT previous_run_id FROM {runs} WHERE {this_row} LIMIT 1);
END IF;
{lease}
UNION ALL
{keys_read}
UNION ALL
SELECT '{RECORDED_ROW}', CAST(NULL AS STRING), CAST(NULL AS INT64), CAST(NULL AS TIMESTAMP), \
CAST(NULL AS TIMESTAMP), CAST(NULL AS INT64), CAST(NULL AS STRING), CAST(NULL AS STRING), \
CAST(NULL AS STRING), CAST(NULL AS STRING), CAST(NULL AS DATE), CAST(NULL AS TIMESTAMP), \
CAST(NULL AS INT64), CAST(NULL AS JSON), recorded_previous, CAST(NULL AS TIMESTAMP)
FROM UNNEST([1]) WHERE recorded;",
        find_keys = find_keys_literal(keys, lookups),
        values = run_values_with(run, "f.run_id".to_string()),
        run_id_is = run_id_is(run),
        lease = LEASE_BRANCH
            .replace("{leases}", leases)
            .replace("{processor}", &p)
            .replace("{scope}", &s),
        keys_read = KEY_BRANCH.replace("{find_keys}", "SELECT f.* FROM UNNEST(found) AS f"),
        this_row = format!(
            "run_id = {id} AND started_at = {} AND status = {} AND skip_reason = {}",
            lit::timestamp(micros(run.started_at)),
            lit::string(run.status.as_str()),
            lit::opt_string(run.skip_reason.as_ref().map(|r| r.as_str())),
        ),
    )
}

fn run_values(run: &RunRecord) -> String {
    run_values_with(run, lit::opt_string(run.previous_run_id.as_deref()))
}

/// The values of `run`'s ledger row, with `previous` as its `previous_run_id`.
fn run_values_with(run: &RunRecord, previous: String) -> String {
    [
        lit::string(&run.run_id),
        lit::string(&run.processor),
        lit::string(&run.scope),
        lit::date(run.scope_date),
        lit::string(run.trigger.as_str()),
        lit::string(run.mode.as_str()),
        lit::timestamp(micros(run.started_at)),
        lit::timestamp(micros(run.finished_at)),
        lit::int64(run.duration_ms),
        lit::string(run.status.as_str()),
        lit::opt_string(run.skip_reason.as_ref().map(|r| r.as_str())),
        lit::opt_string(run.would_skip_reason.as_ref().map(|r| r.as_str())),
        previous,
        lit::opt_int64(run.records_processed),
        lit::opt_string(run.processing_key.as_deref()),
        lit::opt_string(run.error.as_deref()),
        lit::json(run.output.as_ref().map(|v| v.to_string()).as_deref()),
    ]
    .join(", ")
}

/// A key row as a `STRUCT` of the columns of [`KEY_COLUMNS`], in order (for `UNNEST`).
fn key_struct(k: &KeyRecord) -> String {
    let names = KEY_COLUMNS.split(',').map(str::trim);
    let values = [
        lit::string(&k.key),
        lit::string(k.kind.as_str()),
        lit::string(&k.processor),
        lit::string(&k.scope),
        lit::date(k.scope_date),
        lit::timestamp(micros(k.processed_at)),
        lit::opt_int64(k.entity_count),
        lit::json(Some(&k.metadata.to_string())),
        lit::string(&k.run_id),
        lit::opt_timestamp(k.keep_until.map(micros)),
    ];
    let fields: Vec<String> = values
        .into_iter()
        .zip(names)
        .map(|(v, n)| format!("{v} AS {n}"))
        .collect();
    format!("STRUCT({})", fields.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{KeyKind, RunStatus};
    use crate::store::conformance::{key_record, run_record};

    /// Every lookup of the run id in `sql` (`FROM <runs> WHERE …run_id = …`), up to the
    /// next statement.
    fn run_id_lookups(sql: &str, runs: &str) -> Vec<String> {
        sql.match_indices(&format!("FROM {runs} WHERE"))
            .map(|(at, _)| {
                let rest = &sql[at..];
                let end = rest.find([';', '\n']).unwrap_or(rest.len());
                rest[..end].to_string()
            })
            .filter(|l| l.contains("run_id = "))
            .collect()
    }

    /// A finish and a recorded skip of a run whose id idem made read the ledger only from
    /// a day before the time in the id: `processing_runs` is partitioned by
    /// `DATE(started_at)`, so the lookups read the partitions from then on, not the whole
    /// ledger. A caller's id may have been recorded at any time: those lookups stay whole.
    #[test]
    fn run_id_lookups_of_an_id_idem_made_are_bounded_by_partition() {
        let now = Utc::now();
        let date = chrono::NaiveDate::from_ymd_opt(2025, 1, 1).unwrap();
        let made = crate::model::RunRequest::new("job", date).run_id;
        let made_at = crate::model::run_id_made_at(&made).expect("a UUID v7 has its time");
        assert!(
            (now - made_at).num_seconds().abs() < 5,
            "{made_at} vs {now}"
        );
        // The rows below start 1.5 s before `now`: a little before the id was made.
        let started = now - chrono::Duration::milliseconds(1500);
        let since = lit::timestamp(made_at.min(started) - chrono::Duration::hours(24));
        let (runs, keys, leases) = ("`p.d.processing_runs`", "`p.d.processing_keys`", "`p.d.l`");
        for (id, bounded) in [(made.as_str(), true), ("airflow-run-42", false)] {
            let run = run_record("job", "2025-01-01", id, RunStatus::Completed, now);
            let key = key_record("k", KeyKind::Scope, "job", "2025-01-01", id, now);
            let lease = Lease {
                processor: "job".into(),
                scope: "2025-01-01".into(),
                run_id: id.into(),
                token: 3,
                acquired_at: now,
                expires_at: now + chrono::Duration::hours(1),
            };
            let finish = finish(runs, keys, leases, &run, &[key], Some(&lease), now);
            let mut skip_run = run.clone();
            skip_run.status = RunStatus::Skipped;
            let skip = SkipOnHit {
                position: 0,
                run: skip_run,
            };
            let lookup = KeyLookup {
                key: "k".into(),
                kind: KeyKind::Content,
                since: now - chrono::Duration::hours(24),
            };
            let skip = find_recording_skip(runs, keys, leases, &[lookup], &skip);
            let after = format!("WHERE run_id = {} AND started_at ", lit::string(id));
            for sql in [finish, skip] {
                let lookups = run_id_lookups(&sql, runs);
                assert!(lookups.len() >= 2, "{sql}");
                // A lookup of this very row (its start time) is pruned for any id; the
                // lookups of the id anywhere are pruned only for an id idem made.
                let whole: Vec<&String> = lookups
                    .iter()
                    .filter(|l| {
                        !l.contains(&format!("{after}>= {since}"))
                            && !l.contains(&format!("{after}= "))
                    })
                    .collect();
                assert_eq!(whole.is_empty(), bounded, "{id}: {whole:?}");
            }
        }
        let at = |id: &str, started: DateTime<Utc>| {
            run_id_since(&run_record("job", "s", id, RunStatus::Completed, started))
        };
        assert_eq!(at("airflow-run-42", now), DateTime::UNIX_EPOCH);
        // A UUID v4 (run ids before, `new_run_id`) has no time in it: read whole.
        assert_eq!(at(&crate::model::new_run_id(), now), DateTime::UNIX_EPOCH);
        // A row written with an earlier start than its id was made (tests, imports): from
        // a day before its start.
        let long_ago = now - chrono::Duration::days(40);
        let row = run_record("job", "s", &made, RunStatus::Completed, long_ago);
        assert_eq!(
            run_id_since(&row),
            row.started_at - chrono::Duration::hours(24)
        );
    }
}
