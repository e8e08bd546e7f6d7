//! Postgres connection plumbing shared by the store and the warehouse: URL parsing into
//! sqlx options, the acquire timeout, and sqlx errors as sentences.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use super::redact_url;
use crate::error::{Error, Result};

/// How long a caller waits for a pooled connection (including connecting) before the
/// database counts as unavailable.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// sqlx options for `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`, named `idem` on the
/// server.
pub fn connect_options(url: &str) -> Result<PgConnectOptions> {
    let options = PgConnectOptions::from_str(url).map_err(|e| {
        Error::config(format!(
            "bad postgres url {:?}: {e} (expected postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE)",
            redact_url(url)
        ))
    })?;
    // No `extra_float_digits` in the startup packet: servers since Postgres 12 print floats
    // exactly by default, and connection poolers (PgBouncer) refuse a startup parameter
    // they do not know.
    Ok(options.application_name("idem").extra_float_digits(None))
}

/// A sqlx error as a sentence; a pool timeout says what it usually means.
pub fn sqlx_message(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::PoolTimedOut => format!(
            "no connection within {} s (server down or unreachable, or its connection limit reached)",
            ACQUIRE_TIMEOUT.as_secs()
        ),
        other => other.to_string(),
    }
}
