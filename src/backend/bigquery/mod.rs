//! BigQuery REST plumbing shared by `BigQueryStore` (`idem::store::bigquery`) and the SQL
//! processor's [`BigQueryWarehouse`](crate::warehouse::BigQueryWarehouse): the URL, credentials,
//! typed query parameters, and [`Connection::query`], the one function every statement goes
//! through.
//!
//! `query` is where "never a silent empty result" is enforced. BigQuery reports a failed
//! statement in two shapes: an HTTP error status with a Google error body (real BigQuery
//! for SQL errors; both for REST resource errors), or HTTP 200 with a top-level `errors`
//! array (what the local emulator does for SQL errors). Both become an [`ApiError`], as do
//! transport failures, timeouts, credential problems and bodies that are not BigQuery JSON.
//! A job that is still running when `jobs.query` returns is polled to completion, and
//! results longer than one page are fetched page by page, so a caller only ever sees all
//! rows or an error.

mod connection;
mod decode;
mod error;
mod params;
mod url;

pub use connection::{Connection, FaultFuture, FaultHook, OUTAGE_RETRIES, QUOTA_RETRIES};
pub use decode::{field_kind, parse_timestamp_cell, QueryOutput, Record};
pub use error::{ApiError, ErrorShape};
pub use params::{
    date, int64, opt_int64, opt_string, string, string_array, struct_array, timestamp,
    timestamp_text, Param,
};
pub use url::{BigQueryUrl, ENDPOINT_ENV};

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::DateTime;
    use std::time::Duration;

    #[test]
    fn parses_urls_and_validates_identifiers() {
        let u = BigQueryUrl::parse(
            "bigquery://my-proj/my_ds?endpoint=http://127.0.0.1:9050/&location=EU&partition_expiration_days=30&timeout=2m",
        )
        .unwrap();
        assert_eq!(u.project, "my-proj");
        assert_eq!(u.dataset, "my_ds");
        assert_eq!(u.endpoint.as_deref(), Some("http://127.0.0.1:9050"));
        assert_eq!(u.location.as_deref(), Some("EU"));
        assert_eq!(u.partition_expiration_days, Some(30));
        assert_eq!(u.timeout, Some(Duration::from_secs(120)));
        assert_eq!(
            u.table("processing_keys"),
            "`my-proj.my_ds.processing_keys`"
        );
        let enc = BigQueryUrl::parse("bigquery://p/d?endpoint=http%3A%2F%2Fh%3A1").unwrap();
        assert_eq!(enc.endpoint.as_deref(), Some("http://h:1"));

        for (bad, needle) in [
            ("bigquery://p", "expected bigquery://PROJECT/DATASET"),
            ("bigquery://p`x/d", "project id"),
            ("bigquery://p/d-x", "dataset id"),
            ("bigquery://p/d`; DROP", "dataset id"),
            ("bigquery://p/d?locaton=EU", "unknown parameter \"locaton\""),
            (
                "bigquery://p/d?partition_expiration_days=0",
                "partition_expiration_days",
            ),
            (
                "bigquery://p/d?endpoint=ftp://x",
                "expected http://HOST:PORT",
            ),
            ("bigquery://p/d?location=us'", "location"),
            ("postgres://p/d", "expected bigquery://"),
        ] {
            let e = BigQueryUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn conflicts_are_recognised() {
        assert!(ApiError::concurrent_update("claim.take", "p:d.t").is_concurrent_update());
        let tx = ApiError::new(
            "x",
            ErrorShape::Http(400),
            Some("invalidQuery"),
            "Query error: Transaction is aborted due to concurrent update against table p:d.t",
        );
        assert!(tx.is_concurrent_update());
        let other = ApiError::new(
            "x",
            ErrorShape::QueryErrors,
            Some("invalidQuery"),
            "Syntax error",
        );
        assert!(!other.is_concurrent_update());
    }

    #[test]
    fn error_messages_say_what_failed() {
        let e = ApiError::new(
            "find_keys",
            ErrorShape::QueryErrors,
            Some("notFound"),
            "Not found: Table p.d.processing_keys",
        );
        assert_eq!(
            e.to_string(),
            "bigquery find_keys failed: the query returned errors (notFound): Not found: Table p.d.processing_keys"
        );
        let h = ApiError::new(
            "runs",
            ErrorShape::Http(403),
            Some("accessDenied"),
            "Access Denied",
        );
        assert_eq!(
            h.to_string(),
            "bigquery runs failed: HTTP 403 (accessDenied): Access Denied"
        );
        let a = ApiError::new("connect", ErrorShape::Auth, None, "no token");
        assert!(a.to_string().contains("GOOGLE_APPLICATION_CREDENTIALS"));
    }

    #[test]
    fn timestamps_are_rfc3339_with_z_and_cells_parse_both_formats() {
        let t = DateTime::from_timestamp_micros(1_714_979_289_123_456).unwrap();
        assert_eq!(timestamp_text(t), "2024-05-06T07:08:09.123456Z");
        assert_eq!(parse_timestamp_cell("1714979289123456"), Some(t));
        assert_eq!(parse_timestamp_cell("1.714979289123456E9"), Some(t));
        assert_eq!(parse_timestamp_cell("x"), None);
        // Exact where an f64 is not: every microsecond of a recent second.
        for us in 0..1000 {
            let t = DateTime::from_timestamp_micros(1_764_000_000_999_000 + us).unwrap();
            let text = format!("{}E9", (1_764_000_000_999_000 + us) as f64 / 1e15);
            let sci = format!("1.{:015}E9", 764_000_000_999_000 + us);
            assert_eq!(parse_timestamp_cell(&sci), Some(t), "{sci}");
            assert!(parse_timestamp_cell(&text).is_some());
        }
        assert_eq!(
            parse_timestamp_cell("1.7E9"),
            DateTime::from_timestamp_micros(1_700_000_000_000_000)
        );
        assert_eq!(
            parse_timestamp_cell("-1.5E0"),
            DateTime::from_timestamp_micros(-1_500_000)
        );
    }
}
