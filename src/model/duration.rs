//! Durations as people write them (humantime), bounded so that time arithmetic never
//! overflows.

use std::time::Duration;

use crate::error::{Error, Result};

/// The longest duration idem accepts anywhere (a lease, a window, a wait, a retention):
/// 100 years (36 525 days).
///
/// Every duration ends up in `now ± duration` (a lease's expiry, a window's start, the
/// cleanup cutoff), and the result must be a time every store accepts: BigQuery's
/// TIMESTAMP stops at 9999-12-31 and chrono at about ±262 000 years, so a bound keeps that
/// arithmetic from panicking or wrapping, with room to spare for any real schedule.
pub const MAX_DURATION: Duration = Duration::from_secs(36_525 * 86_400);

/// The shortest lease a job may ask for: 1 s.
///
/// The heartbeat renews a lease every third of its duration (and never more often than
/// every 100 ms), so each renewal must reach the store within two thirds of the lease.
/// Below 1 s that leaves less than a few hundred milliseconds for a store round trip,
/// which a busy SQLite file (writers wait their turn) or a remote Postgres easily takes,
/// and a lease lost mid-run stops the work. 1 s is also the precision people think in for
/// leases; use longer leases on BigQuery, where one DML statement takes about a second.
pub const MIN_LEASE: Duration = Duration::from_secs(1);

/// Parses a duration: `90s`, `15m`, `1h`, `1h30m`, `2d`, `500ms`, `0s` (zero), and the
/// other spellings of [humantime](https://docs.rs/humantime) (`1h 30m`, `2 days`, `1w`).
/// Longer than [`MAX_DURATION`] (or too large to represent) is an error.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let expected = "expected a number with a unit, like 90s, 15m, 1h, 1h30m, 2d or 500ms";
    let d = humantime::parse_duration(s.trim()).map_err(|e| match e {
        humantime::DurationError::NumberOverflow => Error::config(format!(
            "duration {s:?} is too long: the maximum is 100 years (36525d)"
        )),
        e => Error::config(format!("bad duration {s:?}: {e}; {expected}")),
    })?;
    if d > MAX_DURATION {
        return Err(Error::config(format!(
            "duration {s:?} is too long: the maximum is 100 years (36525d)"
        )));
    }
    Ok(d)
}

/// [`parse_duration`] with errors naming `field` (`guards.lease`, `--keep`).
pub fn parse_duration_field(field: &str, s: &str) -> Result<Duration> {
    parse_duration(s).map_err(|e| Error::config(format!("{field}: {e}")))
}
