//! A pending batch marked whole: one transaction (`MULTI` … `EXEC`) of native commands,
//! with two short scripts around the keys' `SET`s for the batch's own key and its gate's
//! row (see [`BATCH_BEGIN`] and [`BATCH_END`]). No argument per key passes through Lua:
//! a script per key (`redis.call` for each, every value made into a Lua string and back)
//! cost Redis about half again the time of the same `SET`s sent natively (issue 36 item 8).

use chrono::{DateTime, Utc};

use super::scripts::{BATCH_BEGIN, BATCH_END, UNMARK_EXACT};
use super::value::{batch_key, px, turn_key, MAX_PX_MS, PENDING};
use super::RedisStore;
use crate::error::Result;
use crate::store::{EventMark, PendingBatch};

/// `SET key value NX [PX ms] GET`, sized up front (no regrowth per argument): sets the key
/// when absent (answering nil), else answers the value stored.
pub(super) fn set_nx_get(key: &str, value: &[u8], px: Option<u64>) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(7, key.len() + value.len() + 32);
    cmd.arg("SET").arg(key).arg(value).arg("NX");
    if let Some(ms) = px {
        cmd.arg("PX").arg(ms);
    }
    cmd.arg("GET");
    cmd
}

/// A call's keys: each the first occurrence of its mark in `firsts`, set to `values`.
pub(super) struct Keys<'a> {
    pub(super) firsts: &'a [&'a EventMark],
    pub(super) keys: &'a [String],
    pub(super) values: &'a [Vec<u8>],
}

impl RedisStore {
    /// Marks a pending batch's keys, whole. The answer per key: `None` where this call set it
    /// (or an earlier call for the same batch did: a refused call whose undoing did not
    /// reach Redis), else the value found stored. `None` when the batch was refused: asked
    /// `ahead` of its turn, which had not come, or with a key not new; the keys the
    /// refused call set named a batch never set (dead to every reader from the start) and
    /// are deleted, and the batch asks again in its turn.
    pub(super) async fn mark_pending(
        &self,
        namespace: &str,
        Keys {
            firsts,
            keys,
            values,
        }: Keys<'_>,
        batch: PendingBatch<'_>,
        now: DateTime<Utc>,
        ahead: bool,
    ) -> Result<Option<Vec<Option<Vec<u8>>>>> {
        // The batch's key before its keys: a key never names a batch not yet stored. Set
        // once, by the batch's first call: asked again (waiting on another gate), it keeps
        // its deadline, so a batch never outlives it.
        let longest = match firsts.iter().map(|m| px(m)).collect::<Option<Vec<_>>>() {
            Some(all) => all.into_iter().max().unwrap_or(1).to_string(),
            None => String::new(),
        };
        let own_value = format!("P{}:{longest}", batch.deadline(now).timestamp_micros());
        let timeout = batch.timeout.as_millis().clamp(1, MAX_PX_MS) as u64;
        let own = batch_key(&self.prefix, namespace, batch.marker);
        let (turn, place) = match batch.turn {
            Some(t) => {
                // Its transaction checks the row's order: the batch after this one may ask
                // ahead at once (its transaction, sent after this one on the connection,
                // runs after it; should it get there first, it is refused).
                t.started.say();
                (turn_key(&self.prefix, namespace, t.row), Some(t.place))
            }
            None => (own.clone(), None),
        };
        let mut tx = redis::Pipeline::with_capacity(keys.len() + 2);
        tx.atomic();
        tx.cmd("EVAL")
            .arg(BATCH_BEGIN)
            .arg(2)
            .arg(&own)
            .arg(&turn)
            .arg(&own_value)
            .arg(timeout)
            .arg(place.map(|p| p.to_string()).unwrap_or_default())
            .arg(if ahead { "1" } else { "" });
        for ((m, key), value) in firsts.iter().zip(keys).zip(values) {
            tx.add_command(set_nx_get(key, value, px(m)));
        }
        if let Some(place) = place {
            tx.cmd("EVAL")
                .arg(BATCH_END)
                .arg(2)
                .arg(&turn)
                .arg(&own)
                .arg(keys.len())
                .arg(place)
                .arg(timeout)
                .arg(if ahead { own_value.as_str() } else { "" });
        }
        let mut conn = self.conn.clone();
        let replies: Vec<redis::Value> = tx
            .query_async(&mut conn)
            .await
            .map_err(|e| self.err("check_and_mark", e))?;
        let mut replies = replies.into_iter();
        let begun = match replies.next() {
            Some(redis::Value::Int(n)) => n,
            _ => return Err(self.bad_answer("check_and_mark", "no answer to BATCH_BEGIN")),
        };
        // A value naming this batch was set by an earlier call for it.
        let mine = format!("\n{PENDING}{}", batch.marker);
        let mut set_here = Vec::with_capacity(keys.len());
        let mut answers = Vec::with_capacity(keys.len());
        for _ in keys {
            match replies.next() {
                Some(redis::Value::Nil) => {
                    set_here.push(true);
                    answers.push(None);
                }
                Some(redis::Value::BulkString(v)) => {
                    set_here.push(false);
                    answers.push((!v.ends_with(mine.as_bytes())).then_some(v));
                }
                _ => {
                    return Err(self.bad_answer(
                        "check_and_mark",
                        "a key's SET answered neither nil nor a value",
                    ))
                }
            }
        }
        // Asked ahead, the batch stands only when every key was new (its key then set).
        let whole = match (place, replies.next()) {
            (None, _) => true,
            (Some(_), Some(redis::Value::Int(n))) => n == 1,
            _ => return Err(self.bad_answer("check_and_mark", "no answer to BATCH_END")),
        };
        if !ahead || (begun != 0 && whole) {
            return Ok(Some(answers));
        }
        // Refused: the keys this call set (dead: they name a batch never set) go, unless
        // someone took them over meanwhile.
        let set: Vec<usize> = (0..keys.len()).filter(|&i| set_here[i]).collect();
        if set.is_empty() {
            return Ok(None);
        }
        let mut undo = redis::cmd("EVAL");
        undo.arg(UNMARK_EXACT).arg(set.len());
        for &i in &set {
            undo.arg(&keys[i]);
        }
        for &i in &set {
            undo.arg(&values[i]);
        }
        let _: u64 = undo
            .query_async(&mut conn)
            .await
            .map_err(|e| self.err("check_and_mark", e))?;
        Ok(None)
    }
}
