//! The statement-level model of BigQuery's documented semantics, used by the simulator
//! ([`super::Simulator`]) when [`super::Limits::statements`] is on.
//!
//! The emulator runs a whole script as one atomic step, and so hides every interleaving of
//! two scripts. BigQuery does not: a script is a sequence of *child jobs*, and each DML
//! statement in it "initiates an implicit transaction … automatically committed at the end
//! of each successful DML statement" (DML page, "Limitations":
//! <https://cloud.google.com/bigquery/docs/data-manipulation-language#limitations>). So the
//! model runs a script statement by statement, each statement its own job:
//!
//! * **`IF cond THEN … [ELSEIF cond THEN …] [ELSE …] END IF`**: the condition is read as a
//!   query of its own (`SELECT (cond)`) at the time it is reached (scripting reference,
//!   "IF": <https://cloud.google.com/bigquery/docs/reference/standard-sql/procedural-language#if>).
//! * **Reads** (`SELECT`) take [`super::Limits::read_latency`] and see what is committed when
//!   they run.
//! * **`INSERT … SELECT`**: the statement reads its snapshot when it starts and commits after
//!   [`super::Limits::dml_latency`] (snapshot isolation: "When a job starts, BigQuery
//!   determines the snapshot timestamp to use to read the tables used in the query",
//!   <https://cloud.google.com/blog/products/data-analytics/dml-without-limits-now-in-bigquery>).
//!   The model materialises the `SELECT` into a scratch table at the start and inserts that
//!   at the commit, so a row another statement committed in between is not seen — and an
//!   INSERT never conflicts with anything ("An INSERT DML statement … doesn't conflict with
//!   any other concurrently running DML statement", DML page, "DML statement conflicts").
//! * **`UPDATE`**: the rows it changes are those its `WHERE` matches *in its snapshot*; the
//!   model reads their identities at the start and restricts the statement to them at the
//!   commit (rows inserted meanwhile are not touched), and a conflict with another mutating
//!   statement that committed on the table meanwhile re-runs it with a new snapshot, up to 3
//!   times, then fails it ("BigQuery tries to rerun failed statements up to three times",
//!   same section). The identity of a row is all its lease columns, so this restriction
//!   applies to the lease tables (`processing_leases_*`), the only tables idem's scripts
//!   UPDATE; elsewhere an UPDATE is applied to what is committed at its commit.
//! * **Transactions** (`BEGIN TRANSACTION … COMMIT`) run whole, taking the latency of all
//!   their DML statements, and are *cancelled* on a conflict, never re-run ("Conflicting
//!   transactions are cancelled", multi-statement transactions page, "Transaction
//!   concurrency": <https://cloud.google.com/bigquery/docs/transactions#transaction_concurrency>).
//!   Scripts with `DECLARE` run whole as well (one atomic step, as on the emulator).
//!
//! The answer of a script is the answer of its last `SELECT` ("the results of the last
//! statement", `jobs.query`). A failed statement fails the script; what the statements
//! before it committed stays committed.

use std::sync::atomic::Ordering;

use super::{admit, error_name, forward, google_error, table};
pub(super) use super::{Answer, Request, Shared};

/// One step of a script.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A statement, without its `;`.
    Sql(String),
    /// `IF` with its arms (condition, steps) in order, and the `ELSE` steps.
    If {
        arms: Vec<(String, Vec<Step>)>,
        otherwise: Vec<Step>,
    },
}

/// Whether the model runs `sql` statement by statement (no `DECLARE`, no transaction).
pub fn splittable(sql: &str) -> bool {
    let upper = sql.to_ascii_uppercase();
    !upper.contains("BEGIN TRANSACTION") && !upper.trim_start().starts_with("DECLARE")
}

/// The statements of `sql`, split at every `;` outside quotes and parentheses.
pub fn split_statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        current.push(c);
        match quote {
            Some(q) => {
                if c == '\\' {
                    if let Some(next) = chars.next() {
                        current.push(next);
                    }
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '\'' | '"' | '`' => quote = Some(c),
                '(' => depth += 1,
                ')' => depth -= 1,
                ';' if depth == 0 => {
                    current.pop();
                    if !current.trim().is_empty() {
                        out.push(current.trim().to_string());
                    }
                    current.clear();
                }
                _ => {}
            },
        }
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_string());
    }
    out
}

/// The byte offset of the first top-level (outside quotes and parentheses) whole word
/// `word` in `s` (ASCII case-insensitive), from `from`.
pub fn find_word(s: &str, word: &str, from: usize) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut depth = 0i32;
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match quote {
            Some(q) => {
                if c == b'\\' {
                    i += 1;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                b'\'' | b'"' | b'`' => quote = Some(c),
                b'(' => depth += 1,
                b')' => depth -= 1,
                _ if depth == 0 && i >= from => {
                    let end = i + word.len();
                    let boundary = |k: usize| {
                        k >= bytes.len() || !(bytes[k].is_ascii_alphanumeric() || bytes[k] == b'_')
                    };
                    if end <= bytes.len()
                        && s[i..end].eq_ignore_ascii_case(word)
                        && (i == 0 || boundary(i - 1))
                        && boundary(end)
                    {
                        return Some(i);
                    }
                }
                _ => {}
            },
        }
        i += 1;
    }
    None
}

fn starts_with_word(s: &str, word: &str) -> bool {
    find_word(s, word, 0) == Some(0)
}

/// The steps of a script.
pub fn parse(sql: &str) -> Result<Vec<Step>, String> {
    let pieces = split_statements(sql);
    let mut at = 0;
    let steps = parse_block(&pieces, &mut at, None)?;
    if at != pieces.len() {
        return Err(format!("unexpected `{}`", pieces[at]));
    }
    Ok(steps)
}

/// How a block of an `IF` ended.
enum BlockEnd {
    ElseIf(String, Option<String>),
    Else(Option<String>),
    EndIf,
}

/// Parses pieces from `*at` until the end, or (inside an `IF`) until `ELSEIF`, `ELSE` or
/// `END IF`, whose piece is left at `*at` for the caller.
fn parse_block(
    pieces: &[String],
    at: &mut usize,
    first: Option<String>,
) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    let mut pending = first;
    loop {
        let piece = match pending.take() {
            Some(p) => p,
            None => {
                if *at >= pieces.len() {
                    return Ok(steps);
                }
                if block_end(&pieces[*at]).is_some() {
                    return Ok(steps);
                }
                *at += 1;
                pieces[*at - 1].clone()
            }
        };
        if starts_with_word(&piece, "IF") {
            let (cond, rest) = condition(&piece, 2)?;
            let mut arms = vec![(cond, parse_block(pieces, at, rest)?)];
            let mut otherwise = Vec::new();
            loop {
                let Some(end) = pieces.get(*at).and_then(|p| block_end(p)) else {
                    return Err("an IF without END IF".into());
                };
                *at += 1;
                match end {
                    BlockEnd::ElseIf(cond, rest) => {
                        arms.push((cond, parse_block(pieces, at, rest)?))
                    }
                    BlockEnd::Else(rest) => otherwise = parse_block(pieces, at, rest)?,
                    BlockEnd::EndIf => break,
                }
            }
            steps.push(Step::If { arms, otherwise });
        } else {
            steps.push(Step::Sql(piece));
        }
    }
}

/// `cond` and the statement after `THEN` (if any) of `IF cond THEN stmt`, the keyword
/// being `keyword_len` bytes long.
fn condition(piece: &str, keyword_len: usize) -> Result<(String, Option<String>), String> {
    let then =
        find_word(piece, "THEN", keyword_len).ok_or_else(|| format!("no THEN in `{piece}`"))?;
    let cond = piece[keyword_len..then].trim().to_string();
    let rest = piece[then + 4..].trim();
    Ok((cond, (!rest.is_empty()).then(|| rest.to_string())))
}

fn block_end(piece: &str) -> Option<BlockEnd> {
    if starts_with_word(piece, "ELSEIF") {
        return condition(piece, 6)
            .ok()
            .map(|(cond, rest)| BlockEnd::ElseIf(cond, rest));
    }
    if starts_with_word(piece, "ELSE") {
        let rest = piece[4..].trim();
        return Some(BlockEnd::Else((!rest.is_empty()).then(|| rest.to_string())));
    }
    if starts_with_word(piece, "END") && piece[3..].trim().eq_ignore_ascii_case("IF") {
        return Some(BlockEnd::EndIf);
    }
    None
}

/// The number of DML statements in `sql` (for a transaction's latency): its top-level
/// `INSERT`, `UPDATE`, `DELETE` and `MERGE` keywords.
pub fn dml_statements(sql: &str) -> u32 {
    let mut n = 0;
    for word in ["INSERT", "UPDATE", "DELETE", "MERGE"] {
        let mut from = 0;
        while let Some(at) = find_word(sql, word, from) {
            n += 1;
            from = at + word.len();
        }
    }
    n
}

/// The backquoted names in `sql`, in order.
fn tables_in(sql: &str) -> Vec<String> {
    sql.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// A copy of `request` that runs `sql` instead (no parameters: scripts carry literals).
fn with_sql(request: &Request, sql: &str) -> Request {
    let mut body = serde_json::from_slice::<serde_json::Value>(&request.body).unwrap_or_default();
    body["query"] = serde_json::Value::String(sql.to_string());
    // A child job is a job of its own: it does not share the script's `requestId`.
    if let Some(body) = body.as_object_mut() {
        body.remove("requestId");
    }
    Request {
        method: request.method.clone(),
        path: request.path.clone(),
        content_type: request.content_type.clone(),
        body: body.to_string().into_bytes(),
    }
}

/// The first column of every row of a successful answer, or the failed answer.
fn first_column(answer: Answer) -> Result<Vec<String>, Answer> {
    let value = serde_json::from_slice::<serde_json::Value>(&answer.2).unwrap_or_default();
    if answer.0 != 200 || value.get("errors").is_some() || value.get("error").is_some() {
        return Err(answer);
    }
    Ok(value
        .get("rows")
        .and_then(|r| r.as_array())
        .map(|rows| {
            rows.iter()
                .filter_map(|r| r["f"][0]["v"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

/// A child statement the model sent to the emulator: counted and billed.
fn count_child(shared: &Shared, sql: &str, written: Option<&str>) {
    let mut read: Vec<String> = tables_in(sql)
        .into_iter()
        .filter(|t| Some(t.as_str()) != written)
        .collect();
    read.sort();
    read.dedup();
    let mut stats = shared.stats.lock().unwrap();
    stats.child_statements += 1;
    stats.bytes_billed += read.len() as u64 * super::MIN_BILLED_PER_TABLE;
}

/// Runs a script statement by statement; its answer is that of its last `SELECT`.
pub(super) async fn run_script(shared: &Shared, request: &Request, sql: &str) -> Answer {
    let steps = match parse(sql) {
        Ok(steps) => steps,
        Err(e) => return google_error("invalidQuery", &format!("model: {e}")),
    };
    let mut last = None;
    if let Err(answer) = Box::pin(run_steps(shared, request, &steps, &mut last)).await {
        return answer;
    }
    last.unwrap_or_else(|| {
        (
            200,
            "application/json".into(),
            serde_json::json!({"kind": "bigquery#queryResponse", "jobComplete": true})
                .to_string()
                .into_bytes(),
        )
    })
}

async fn run_steps(
    shared: &Shared,
    request: &Request,
    steps: &[Step],
    last: &mut Option<Answer>,
) -> Result<(), Answer> {
    for step in steps {
        match step {
            Step::Sql(sql) => run_statement(shared, request, sql, last).await?,
            Step::If { arms, otherwise } => {
                let mut chosen = otherwise;
                for (cond, body) in arms {
                    let read = format!("SELECT ({cond}) AS c");
                    tokio::time::sleep(jittered(shared.limits.read_latency)).await;
                    count_child(shared, &read, None);
                    let answer = forward(shared, &with_sql(request, &read)).await;
                    if first_column(answer)?.first().map(String::as_str) == Some("true") {
                        chosen = body;
                        break;
                    }
                }
                Box::pin(run_steps(shared, request, chosen, last)).await?;
            }
        }
    }
    Ok(())
}

async fn run_statement(
    shared: &Shared,
    request: &Request,
    sql: &str,
    last: &mut Option<Answer>,
) -> Result<(), Answer> {
    let first = sql
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_ascii_uppercase();
    let target = tables_in(sql).into_iter().next().unwrap_or_default();
    let answer = match first.as_str() {
        "SELECT" | "WITH" => {
            tokio::time::sleep(jittered(shared.limits.read_latency)).await;
            count_child(shared, sql, None);
            let answer = forward(shared, &with_sql(request, sql)).await;
            *last = Some(answer.clone());
            answer
        }
        "INSERT" => insert(shared, request, sql, &target).await,
        "UPDATE" => update(shared, request, sql, &target).await,
        _ => {
            tokio::time::sleep(jittered(shared.limits.dml_latency)).await;
            count_child(shared, sql, None);
            forward(shared, &with_sql(request, sql)).await
        }
    };
    first_column(answer).map(|_| ())
}

/// A latency drawn around `mean`: uniformly from a quarter of it to 1.75 times it, so that
/// statements started together finish in varying order, as real jobs do.
pub fn jittered(mean: std::time::Duration) -> std::time::Duration {
    static DRAWS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    // splitmix64 of a counter: enough randomness for an interleaving, no crate needed.
    let mut z = DRAWS
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_add(seed)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
    mean.mul_f64(0.25 + 1.5 * unit)
}

/// An INSERT, under the table's INSERT limits like any INSERT.
async fn insert(shared: &Shared, request: &Request, sql: &str, target: &str) -> Answer {
    let t = table(shared, target);
    let limited = t.inserts.fetch_add(1, Ordering::SeqCst) >= shared.limits.insert_free_per_day;
    let permit = if limited {
        match admit(shared, &t.insert, target, true).await {
            Ok(p) => Some(p),
            Err(answer) => return answer,
        }
    } else {
        None
    };
    let answer = insert_snapshot(shared, request, sql, target).await;
    drop(permit);
    answer
}

/// `INSERT INTO t (cols) SELECT … [WHERE cond]` decides at its start whether its
/// `SELECT` has rows (its snapshot), and at its commit inserts them without re-reading
/// (`WHERE` dropped): idem's scripts select literals, so only the `WHERE` reads tables.
/// `INSERT … VALUES` just takes its latency.
async fn insert_snapshot(shared: &Shared, request: &Request, sql: &str, target: &str) -> Answer {
    let select_at = sql.find('(').and_then(|open| {
        let close = sql[open..].find(')')? + open;
        let rest = &sql[close + 1..];
        let trimmed = rest.trim_start();
        starts_with_word(trimmed, "SELECT").then(|| close + 1 + (rest.len() - trimmed.len()))
    });
    count_child(shared, sql, Some(target));
    let latency = jittered(shared.limits.dml_latency);
    let where_at = select_at.and_then(|at| find_word(sql, "WHERE", at));
    let (Some(select_at), Some(where_at)) = (select_at, where_at) else {
        tokio::time::sleep(latency).await;
        return forward(shared, &with_sql(request, sql)).await;
    };
    let count = format!("SELECT COUNT(*) FROM ({})", &sql[select_at..]);
    let rows = match first_column(forward(shared, &with_sql(request, &count)).await) {
        Ok(rows) => rows,
        Err(answer) => return answer,
    };
    tokio::time::sleep(latency).await;
    if rows.first().map(String::as_str) == Some("0") {
        return (
            200,
            "application/json".into(),
            serde_json::json!({"kind": "bigquery#queryResponse", "jobComplete": true,
                "numDmlAffectedRows": "0"})
            .to_string()
            .into_bytes(),
        );
    }
    forward(shared, &with_sql(request, &sql[..where_at])).await
}

/// The identity of a lease row (every column), as an expression.
const LEASE_ROW_ID: &str = "CONCAT(processor_name, '|', scope, '|', IFNULL(holder_run_id, '~'), \
'|', CAST(token AS STRING), '|', CAST(UNIX_MICROS(acquired_at) AS STRING), '|', \
CAST(UNIX_MICROS(expires_at) AS STRING))";

/// An UPDATE: a mutating statement (queue, latency, conflicts re-run up to 3 times) that
/// changes, on a lease table, only the rows its `WHERE` matched in its snapshot.
async fn update(shared: &Shared, request: &Request, sql: &str, target: &str) -> Answer {
    let t = table(shared, target);
    let permit = match admit(shared, &t.mutating, target, false).await {
        Ok(p) => p,
        Err(answer) => return answer,
    };
    let lease_table = target.contains("processing_leases");
    let where_at = find_word(sql, "WHERE", 0);
    let mut attempt = 0;
    let answer = loop {
        let snapshot = t.version.load(Ordering::SeqCst);
        count_child(shared, sql, None);
        let restricted = match (lease_table, where_at) {
            (true, Some(at)) => {
                let read = format!(
                    "SELECT {LEASE_ROW_ID} FROM `{target}` WHERE {}",
                    &sql[at + 5..]
                );
                let ids = match first_column(forward(shared, &with_sql(request, &read)).await) {
                    Ok(ids) => ids,
                    Err(answer) => break answer,
                };
                let list: Vec<String> = ids
                    .iter()
                    .map(|id| format!("'{}'", id.replace('\\', "\\\\").replace('\'', "\\'")))
                    .collect();
                format!(
                    "{} WHERE ({}) AND {LEASE_ROW_ID} IN UNNEST([{}])",
                    &sql[..at],
                    &sql[at + 5..],
                    if list.is_empty() {
                        "CAST(NULL AS STRING)".to_string()
                    } else {
                        list.join(", ")
                    }
                )
            }
            _ => sql.to_string(),
        };
        tokio::time::sleep(jittered(shared.limits.dml_latency)).await;
        let commit = t.commit.lock().await;
        if t.version.load(Ordering::SeqCst) != snapshot {
            drop(commit);
            if attempt < shared.limits.conflict_retries {
                attempt += 1;
                shared.stats.lock().unwrap().conflict_reruns += 1;
                continue;
            }
            shared.stats.lock().unwrap().conflict_failures += 1;
            break google_error(
                "invalidQuery",
                &format!(
                    "Could not serialize access to table {} due to concurrent update",
                    error_name(target)
                ),
            );
        }
        let answer = forward(shared, &with_sql(request, &restricted)).await;
        if super::affected_rows(&answer) > 0 {
            t.version.fetch_add(1, Ordering::SeqCst);
        }
        break answer;
    };
    drop(permit);
    answer
}

#[cfg(test)]
mod tests {
    #[test]
    fn scripts_parse_into_statements_and_branches() {
        use super::{parse, Step};
        let steps = parse(
            "IF NOT EXISTS (SELECT 1 FROM `t` WHERE a = 'x;y') THEN
  INSERT INTO `t` (a) SELECT 'b' FROM UNNEST([1]);
  UPDATE `t` SET a = 'c' WHERE a = 'b';
ELSEIF EXISTS (SELECT 2) THEN
  SELECT 'two';
ELSE
  SELECT 'else';
END IF;
SELECT 'last' AS x;",
        )
        .unwrap();
        assert_eq!(steps.len(), 2);
        let Step::If { arms, otherwise } = &steps[0] else {
            panic!("{steps:?}")
        };
        assert_eq!(arms[0].0, "NOT EXISTS (SELECT 1 FROM `t` WHERE a = 'x;y')");
        assert_eq!(arms[0].1.len(), 2);
        assert_eq!(arms[1].1, vec![Step::Sql("SELECT 'two'".into())]);
        assert_eq!(otherwise, &vec![Step::Sql("SELECT 'else'".into())]);
        assert_eq!(steps[1], Step::Sql("SELECT 'last' AS x".into()));
    }
}
