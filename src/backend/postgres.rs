//! Postgres connection plumbing shared by the store and the warehouse: URL parsing into
//! sqlx options, the acquire timeout, and sqlx errors as sentences.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use crate::error::{Error, Result};

/// How long a caller waits for a pooled connection (including connecting) before the
/// database counts as unavailable, unless the URL's `connect_timeout` says otherwise.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The URL parameter for how long to wait for a connection: libpq's, in whole seconds.
const CONNECT_TIMEOUT_PARAM: &str = "connect_timeout";

/// sqlx options for `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`, named `idem` on the
/// server, and how long a caller waits for a connection: the URL's `connect_timeout`
/// (whole seconds, as libpq reads it; sqlx does not), else [`ACQUIRE_TIMEOUT`].
pub fn connect_options(url: &str) -> Result<(PgConnectOptions, Duration)> {
    let (url, timeout) = take_connect_timeout(url).map_err(Error::config)?;
    Ok((options(&url)?, timeout))
}

/// `url` without `connect_timeout`, and its value (else [`ACQUIRE_TIMEOUT`]). libpq reads
/// 0 as "wait forever": refused here, since a store that never answers would hold its
/// caller for good.
fn take_connect_timeout(url: &str) -> std::result::Result<(String, Duration), String> {
    let (url, secs) = super::take_count(url, CONNECT_TIMEOUT_PARAM, "seconds")
        .map_err(|e| format!("postgres url parameter {e}"))?;
    let timeout = secs.map_or(ACQUIRE_TIMEOUT, |s| Duration::from_secs(s.into()));
    Ok((url, timeout))
}

fn options(url: &str) -> Result<PgConnectOptions> {
    // A secret parameter sqlx does not read (`sslpassword`…) would be logged by it with its
    // value: it is dropped here, and named without it.
    let mut url = url.to_string();
    let names: Vec<String> = url
        .split_once('?')
        .map(|(_, q)| q.split('&'))
        .into_iter()
        .flatten()
        .map(|part| part.split_once('=').map_or(part, |(k, _)| k).to_string())
        .filter(|k| super::is_secret_param(k) && !["password", "sslkey"].contains(&k.as_str()))
        .collect();
    for name in names {
        url = super::take_param(&url, &name).0;
        tracing::warn!("ignoring the postgres url parameter {name:?}, which is not supported");
    }
    let url = url.as_str();
    // A certificate or key file that is not there would fail every connection with only
    // "No such file or directory": named here instead, as a configuration error.
    for name in ["sslrootcert", "sslcert", "sslkey"] {
        if let (_, Some(path)) = super::take_param(url, name) {
            if !std::path::Path::new(&path).is_file() {
                return Err(Error::config(format!(
                    "postgres url parameter {name}: {path} is not a file (a PEM {})",
                    if name == "sslkey" {
                        "private key"
                    } else {
                        "certificate"
                    }
                )));
            }
        }
    }
    // The message names what is wrong (the port, the host…), never the URL: one that
    // does not parse cannot be trusted to be redacted right.
    let options = PgConnectOptions::from_str(url).map_err(|e| {
        let e = e.to_string();
        let e = e.strip_prefix("error with configuration: ").unwrap_or(&e);
        Error::config(format!(
            "bad postgres url: {e} (expected postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE)"
        ))
    })?;
    // No `extra_float_digits` in the startup packet: servers since Postgres 12 print floats
    // exactly by default, and connection poolers (PgBouncer) refuse a startup parameter
    // they do not know.
    Ok(options.application_name("idem").extra_float_digits(None))
}

/// A sqlx error as a sentence; a pool timeout (after `timeout`, the pool's) says what it
/// usually means.
pub fn sqlx_message(e: &sqlx::Error, timeout: Duration) -> String {
    match e {
        sqlx::Error::PoolTimedOut => format!(
            "no connection within {} s (server down or unreachable, or its connection limit reached)",
            timeout.as_secs()
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_timeout_is_read_in_whole_seconds_and_kept_from_sqlx() {
        let (_, timeout) = connect_options("postgres://u@h/db").unwrap();
        assert_eq!(timeout, ACQUIRE_TIMEOUT);
        let (url, timeout) =
            take_connect_timeout("postgres://u@h/db?sslmode=disable&connect_timeout=2").unwrap();
        assert_eq!(timeout, Duration::from_secs(2));
        assert_eq!(
            url, "postgres://u@h/db?sslmode=disable",
            "sqlx would warn of it"
        );
        let (_, timeout) = connect_options("postgres://u@h/db?connect_timeout=%2030").unwrap();
        assert_eq!(timeout, Duration::from_secs(30));
        for bad in ["0", "-1", "1.5", "2s", "", "99999999999"] {
            let e = connect_options(&format!("postgres://u:pw@h/db?connect_timeout={bad}"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("connect_timeout={bad:?}"))
                    && e.contains("whole number of seconds"),
                "{bad}: {e}"
            );
            assert!(!e.contains("pw"), "{e}");
        }
    }
}
