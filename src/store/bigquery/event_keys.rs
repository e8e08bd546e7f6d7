//! Event keys: check and mark in two statements (a MERGE, then a read), duplicates,
//! decisions.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::Result;
use crate::model::micros;
use crate::store::event_keys::{self, Found};
use crate::store::{EventKeyStore, EventMark, EventVerdict};

use crate::backend::bigquery::{string, string_array, struct_array, timestamp, timestamp_text};

use super::BigQueryStore;

#[async_trait]
impl EventKeyStore for BigQueryStore {
    async fn check_and_mark(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Vec<EventVerdict>> {
        if marks.is_empty() {
            return Ok(Vec::new());
        }
        let rows = event_keys::firsts(marks)
            .into_iter()
            .map(|m| {
                vec![
                    Some(m.key.clone()),
                    m.fingerprint.clone(),
                    event_keys::decision_text(m),
                    m.expires_at(now).map(timestamp_text),
                ]
            })
            .collect();
        let fields = [
            ("event_key", "STRING"),
            ("fingerprint", "STRING"),
            ("decision", "STRING"),
            ("expires_at", "TIMESTAMP"),
        ];
        let batch = crate::model::new_run_id();
        let params = vec![
            struct_array("marks", &fields, rows),
            string("namespace", namespace),
            timestamp("now", micros(now)),
            string("batch_id", &batch),
        ];
        // The MERGE may update expired keys, so it can lose a concurrent-update conflict;
        // one that lost did not commit, and sent again it marks the same keys with the same
        // batch id: safe to send again.
        self.send_again_on_conflict("check_and_mark", &self.sql.events_check, &params)
            .await
            .map_err(|e| self.err(e))?;
        let out = self
            .query("check_and_mark.read", &self.sql.events_checked, params)
            .await?;
        let mut found = Found::default();
        for r in out.records() {
            let read = || -> std::result::Result<_, String> {
                Ok((
                    r.str("event_key")?,
                    r.opt_str("fingerprint")?,
                    r.opt_str("decision")?,
                    r.timestamp("first_seen")?,
                    r.str("batch_id")?,
                ))
            };
            let (key, fingerprint, decision, first_seen, batch_id) =
                read().map_err(|e| self.bad_row("check_and_mark.read", e))?;
            if batch_id == batch {
                found.marked(key);
            } else {
                found.stored(key, fingerprint, decision, first_seen);
            }
        }
        Ok(found.verdicts(marks, now))
    }

    async fn is_duplicate(
        &self,
        namespace: &str,
        keys: &[String],
        now: DateTime<Utc>,
    ) -> Result<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let out = self
            .query(
                "is_duplicate",
                &self.sql.events_read,
                vec![
                    string_array("keys", keys),
                    string("namespace", namespace),
                    timestamp("now", micros(now)),
                ],
            )
            .await?;
        let found: Vec<String> = out
            .records()
            .map(|r| r.str("event_key"))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| self.bad_row("is_duplicate", e))?;
        Ok(event_keys::present(keys, found))
    }

    async fn check_all_marked(
        &self,
        _namespace: &str,
        _marks: &[EventMark],
        _now: DateTime<Utc>,
    ) -> Result<Option<Vec<EventVerdict>>> {
        crate::store::fallback::never_all_marked()
    }

    async fn record_decision(
        &self,
        namespace: &str,
        key: &str,
        decision: &serde_json::Value,
    ) -> Result<bool> {
        let params = vec![
            string("namespace", namespace),
            string("key", key),
            string("decision", &decision.to_string()),
        ];
        let n = self
            .mutate("record_decision", &self.sql.events_decision, params)
            .await?;
        Ok(n > 0)
    }

    async fn mark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        now: chrono::DateTime<chrono::Utc>,
    ) -> crate::error::Result<Vec<bool>> {
        crate::store::fallback::mark_by_check(self, namespace, keys, now).await
    }

    /// A BigQuery write is a job of its own: a gate's batches mark one after another.
    async fn check_and_mark_pending_ahead(
        &self,
        _namespace: &str,
        _marks: &[crate::store::EventMark],
        _now: chrono::DateTime<chrono::Utc>,
        _batch: crate::store::PendingBatch<'_>,
    ) -> crate::error::Result<Option<Vec<crate::store::EventVerdict>>> {
        crate::store::fallback::never_ahead()
    }

    async fn check_and_mark_pending(
        &self,
        namespace: &str,
        marks: &[crate::store::EventMark],
        now: chrono::DateTime<chrono::Utc>,
        batch: crate::store::PendingBatch<'_>,
        cursor: Option<(&str, &crate::store::Cursor)>,
    ) -> crate::error::Result<Vec<crate::store::EventVerdict>> {
        crate::store::fallback::pending_per_key(self, namespace, marks, now, batch, cursor).await
    }

    async fn confirm_pending_batch(
        &self,
        namespace: &str,
        marker: &str,
        keys: &[(String, Option<chrono::DateTime<chrono::Utc>>)],
        _whole: bool,
    ) -> crate::error::Result<u64> {
        crate::store::fallback::confirm_batch_per_key(self, namespace, marker, keys).await
    }

    async fn check_and_mark_advancing(
        &self,
        namespace: &str,
        marks: &[crate::store::EventMark],
        now: chrono::DateTime<chrono::Utc>,
        cursor: &str,
        to: &crate::store::Cursor,
    ) -> crate::error::Result<Vec<crate::store::EventVerdict>> {
        crate::store::fallback::mark_then_advance(self, namespace, marks, now, cursor, to).await
    }

    async fn forget_event_keys(&self, _: &str, _: &[String]) -> crate::error::Result<u64> {
        Err(crate::store::fallback::unsupported(
            self,
            "deleting event keys",
        ))
    }

    async fn confirm_event_keys(
        &self,
        _: &str,
        _: &[(String, Option<chrono::DateTime<chrono::Utc>>)],
        _: &str,
    ) -> crate::error::Result<u64> {
        Err(crate::store::fallback::unsupported(
            self,
            "confirming pending event marks",
        ))
    }

    async fn unmark_event_keys(
        &self,
        _: &str,
        _: &[String],
        _: chrono::DateTime<chrono::Utc>,
    ) -> crate::error::Result<u64> {
        Err(crate::store::fallback::unsupported(
            self,
            "taking back event marks",
        ))
    }

    async fn cursor(&self, _: &str, _: &str) -> crate::error::Result<Option<crate::store::Cursor>> {
        Err(crate::store::fallback::unsupported(
            self,
            "event cursors (--cursor)",
        ))
    }

    async fn advance_cursor(
        &self,
        _: &str,
        _: &str,
        _: &crate::store::Cursor,
    ) -> crate::error::Result<()> {
        Err(crate::store::fallback::unsupported(
            self,
            "event cursors (--cursor)",
        ))
    }
}
