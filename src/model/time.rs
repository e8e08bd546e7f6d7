//! How idem writes (and reads) days and instants as text: one format each.

use std::fmt::Display;

use chrono::{DateTime, NaiveDate, Utc};

/// A day: `2025-11-18`.
pub const DAY_FORMAT: &str = "%Y-%m-%d";

/// An instant in messages: `2025-11-18 06:00:00 UTC`.
pub const UTC_FORMAT: &str = "%Y-%m-%d %H:%M:%S UTC";

/// An instant at microsecond precision, RFC 3339 in UTC: `2025-11-18T06:00:00.000000Z`.
pub const MICROS_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.6fZ";

/// `d` as `2025-11-18`.
pub fn day_text(d: NaiveDate) -> String {
    d.format(DAY_FORMAT).to_string()
}

/// Reads a day written by [`day_text`].
pub fn parse_day(s: &str) -> Result<NaiveDate, chrono::ParseError> {
    NaiveDate::parse_from_str(s, DAY_FORMAT)
}

/// `t` as messages show it: `2025-11-18 06:00:00 UTC` (formatted when displayed).
pub fn utc_text(t: DateTime<Utc>) -> impl Display {
    t.format(UTC_FORMAT)
}

/// `t` at microsecond precision: `2025-11-18T06:00:00.000000Z`.
pub fn micros_text(t: DateTime<Utc>) -> String {
    t.format(MICROS_FORMAT).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        let t = DateTime::from_timestamp_micros(1_763_445_600_123_456).unwrap();
        assert_eq!(utc_text(t).to_string(), "2025-11-18 06:00:00 UTC");
        assert_eq!(micros_text(t), "2025-11-18T06:00:00.123456Z");
        let d = t.date_naive();
        assert_eq!(day_text(d), "2025-11-18");
        assert_eq!(parse_day("2025-11-18").unwrap(), d);
        assert!(parse_day("2025-13-01").is_err());
    }
}
