//! Values written into a multi-statement script as SQL literals.
//!
//! A script (several statements in one `jobs.query`, one job) is how a run's claim and
//! its finish each cost one BigQuery job. The emulator binds no query parameters in a
//! script ("Values were not provided for the following prepared statement parameters"),
//! so the values of a script are literals, built here and only here, so that no value can
//! end a literal or change the statement:
//!
//! * a string made only of ASCII letters, digits and ` -_.:|/+=@` is written as a plain
//!   `'…'` literal (it holds no quote, backslash or newline), so the common values
//!   (processing keys, dates, run ids) stay readable and comparable as constants;
//! * any other string is written as `SAFE_CONVERT_BYTES_TO_STRING(FROM_BASE64('…'))`:
//!   base64 holds only letters, digits, `+`, `/` and `=`, so the literal cannot be broken
//!   out of whatever the value holds (quotes, backslashes, newlines, unicode). Both
//!   BigQuery and the emulator decode it byte-exact (the emulator does not read
//!   `\u` escapes in string literals, so escaping is not an option);
//! * timestamps as `TIMESTAMP 'YYYY-MM-DDTHH:MM:SS.ffffffZ'`, dates as `DATE 'YYYY-MM-DD'`,
//!   integers as decimal digits, NULL as `CAST(NULL AS type)`.

use base64::Engine;
use chrono::{DateTime, NaiveDate, Utc};

/// A STRING literal for `value` (see the module docs).
pub(super) fn string(value: &str) -> String {
    let plain = value.chars().all(|c| {
        c.is_ascii_alphanumeric()
            || matches!(c, ' ' | '-' | '_' | '.' | ':' | '|' | '/' | '+' | '=' | '@')
    });
    if plain {
        format!("'{value}'")
    } else {
        let encoded = base64::engine::general_purpose::STANDARD.encode(value.as_bytes());
        format!("SAFE_CONVERT_BYTES_TO_STRING(FROM_BASE64('{encoded}'))")
    }
}

/// A STRING literal or a typed NULL.
pub(super) fn opt_string(value: Option<&str>) -> String {
    value.map_or_else(|| "CAST(NULL AS STRING)".to_string(), string)
}

/// An INT64 literal.
pub(super) fn int64(value: i64) -> String {
    // i64::MIN has no positive counterpart to negate; CAST keeps every value one literal.
    format!("CAST({value} AS INT64)")
}

/// An INT64 literal or a typed NULL.
pub(super) fn opt_int64(value: Option<i64>) -> String {
    value.map_or_else(|| "CAST(NULL AS INT64)".to_string(), int64)
}

/// A TIMESTAMP literal, microseconds, UTC.
pub(super) fn timestamp(value: DateTime<Utc>) -> String {
    format!("TIMESTAMP '{}'", crate::model::time::micros_text(value))
}

/// A TIMESTAMP literal or a typed NULL.
pub(super) fn opt_timestamp(value: Option<DateTime<Utc>>) -> String {
    value.map_or_else(|| "CAST(NULL AS TIMESTAMP)".to_string(), timestamp)
}

/// A DATE literal.
pub(super) fn date(value: NaiveDate) -> String {
    format!("DATE '{}'", crate::model::time::day_text(value))
}

/// A JSON value from its text (`wide_number_mode => 'round'` as the parameterised
/// statements do), or a typed NULL.
pub(super) fn json(text: Option<&str>) -> String {
    match text {
        Some(t) => format!("PARSE_JSON({}, wide_number_mode => 'round')", string(t)),
        None => "CAST(NULL AS JSON)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_cannot_be_broken_out_of() {
        assert_eq!(string("2025-11-18"), "'2025-11-18'");
        assert_eq!(string("job|2025-11-18"), "'job|2025-11-18'");
        for hostile in [
            "it's",
            "a\\'; DROP TABLE x; --",
            "line\nbreak",
            "übersicht 🎉",
            "`tick`",
            "\"dq\"",
            "",
        ] {
            let lit = string(hostile);
            if hostile.is_empty() {
                assert_eq!(lit, "''");
                continue;
            }
            let inner = lit
                .strip_prefix("SAFE_CONVERT_BYTES_TO_STRING(FROM_BASE64('")
                .and_then(|s| s.strip_suffix("'))"))
                .unwrap_or_else(|| panic!("{hostile:?} → {lit}"));
            assert!(inner
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=')));
            let back = base64::engine::general_purpose::STANDARD
                .decode(inner)
                .unwrap();
            assert_eq!(String::from_utf8(back).unwrap(), hostile);
        }
        assert_eq!(opt_string(None), "CAST(NULL AS STRING)");
        assert_eq!(int64(-5), "CAST(-5 AS INT64)");
        assert_eq!(int64(i64::MIN), format!("CAST({} AS INT64)", i64::MIN));
        let t = DateTime::from_timestamp_micros(1_714_979_289_123_456).unwrap();
        assert_eq!(timestamp(t), "TIMESTAMP '2024-05-06T07:08:09.123456Z'");
        assert_eq!(
            date(NaiveDate::from_ymd_opt(2025, 11, 18).unwrap()),
            "DATE '2025-11-18'"
        );
    }
}
