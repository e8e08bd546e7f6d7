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
CAST(NULL AS INT64) AS entity_count, CAST(NULL AS JSON) AS metadata, CAST(NULL AS STRING) AS run_id
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

/// The claim as one script: unless the lease is held and unexpired at `now`, create its
/// row free when there is none (an INSERT never decides a claim) and take it with one
/// `UPDATE … WHERE (free or expired)`; then answer the lease row and, after the claim,
/// the latest key of each lookup. Not a transaction: each statement commits by itself, as
/// the separate statements did, so a claim that conflicts is queued or re-run by BigQuery
/// like any DML statement (a conflicting *transaction* would be cancelled instead).
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
    let mut sql = format!(
        "IF NOT EXISTS (SELECT 1 FROM {leases} WHERE processor_name = {p} AND scope = {s} \
AND holder_run_id IS NOT NULL AND expires_at > {now}) THEN
  INSERT INTO {leases} (processor_name, scope, holder_run_id, token, acquired_at, expires_at)
  SELECT {p}, {s}, CAST(NULL AS STRING), 0, {now}, {now} FROM UNNEST([1])
  WHERE NOT EXISTS (SELECT 1 FROM {leases} WHERE processor_name = {p} AND scope = {s});
  UPDATE {leases}
  SET holder_run_id = {r}, token = token + 1, acquired_at = {now}, expires_at = {exp}
  WHERE processor_name = {p} AND scope = {s} AND (holder_run_id IS NULL OR expires_at <= {now});
END IF;
{lease}",
        r = lit::string(run_id),
        exp = lit::timestamp(expires_at),
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

/// What a [`finish`] script answers in its one row (`outcome`).
pub(super) const RECORDED: &str = "recorded";
/// The lease was no longer held with this token: nothing written.
pub(super) const LOST: &str = "lost";
/// The run id is in the ledger already: nothing written.
pub(super) const DUPLICATE: &str = "duplicate";

/// The finish as one transaction: release the lease (fenced: `token` and holder), and
/// only if that matched and the run id is new, insert the ledger row and the keys; commit
/// all of it at once, so the keys are visible exactly when the lease is free, or roll it
/// all back. Answers one row, `outcome` = [`RECORDED`], [`LOST`] or [`DUPLICATE`].
pub(super) fn finish(
    runs: &str,
    keys: &str,
    leases: &str,
    run: &RunRecord,
    key_rows: &[KeyRecord],
    lease: Option<&Lease>,
) -> String {
    let mut inserts = format!(
        "INSERT INTO {runs} ({RUN_COLUMNS}) VALUES ({});",
        run_values(run)
    );
    if !key_rows.is_empty() {
        let rows: Vec<String> = key_rows.iter().map(key_values).collect();
        inserts.push_str(&format!(
            "\n  INSERT INTO {keys} ({KEY_COLUMNS}) VALUES {};",
            rows.join(",\n    ")
        ));
    }
    let (release, lost) = match lease {
        Some(lease) => {
            let (p, s, t, r) = (
                lit::string(&lease.processor),
                lit::string(&lease.scope),
                lit::int64(lease.token),
                lit::string(&lease.run_id),
            );
            let at = lit::timestamp(micros(run.finished_at));
            (
                format!(
                    "UPDATE {leases} SET holder_run_id = NULL, expires_at = {at}
WHERE processor_name = {p} AND scope = {s} AND token = {t} AND holder_run_id = {r};
"
                ),
                format!(
                    "IF NOT EXISTS (SELECT 1 FROM {leases} WHERE processor_name = {p} AND scope = {s} \
AND token = {t} AND holder_run_id IS NULL AND expires_at = {at}) THEN
  ROLLBACK TRANSACTION;
  SELECT '{LOST}' AS outcome;
ELSEIF"
                ),
            )
        }
        None => (String::new(), "IF".to_string()),
    };
    format!(
        "BEGIN TRANSACTION;
{release}{lost} EXISTS (SELECT 1 FROM {runs} WHERE run_id = {id}) THEN
  ROLLBACK TRANSACTION;
  SELECT '{DUPLICATE}' AS outcome;
ELSE
  {inserts}
  COMMIT TRANSACTION;
  SELECT '{RECORDED}' AS outcome;
END IF;",
        id = lit::string(&run.run_id),
    )
}

/// The type of the `found` variable of [`find_recording_skip`]: the rows of
/// [`FIND_KEYS_SQL`].
const FOUND_TYPE: &str = "ARRAY<STRUCT<pos INT64, processing_key STRING, kind STRING, \
processor_name STRING, scope STRING, scope_date DATE, processed_at TIMESTAMP, \
entity_count INT64, metadata JSON, run_id STRING>>";

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
f.metadata AS metadata, f.run_id AS run_id))";
    format!(
        "DECLARE found {FOUND_TYPE} DEFAULT ({found} FROM ({find_keys}) AS f);
DECLARE recorded_previous STRING DEFAULT NULL;
DECLARE recorded BOOL DEFAULT FALSE;
IF EXISTS (SELECT 1 FROM UNNEST(found) AS f WHERE f.pos = {pos}) THEN
  IF NOT EXISTS (SELECT 1 FROM {runs} WHERE run_id = {id}) THEN
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
CAST(NULL AS INT64), CAST(NULL AS JSON), recorded_previous
FROM UNNEST([1]) WHERE recorded;",
        find_keys = find_keys_literal(keys, lookups),
        values = run_values_with(run, "f.run_id".to_string()),
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

fn key_values(k: &KeyRecord) -> String {
    format!(
        "({})",
        [
            lit::string(&k.key),
            lit::string(k.kind.as_str()),
            lit::string(&k.processor),
            lit::string(&k.scope),
            lit::date(k.scope_date),
            lit::timestamp(micros(k.processed_at)),
            lit::opt_int64(k.entity_count),
            lit::json(Some(&k.metadata.to_string())),
            lit::string(&k.run_id),
        ]
        .join(", ")
    )
}
