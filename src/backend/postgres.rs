//! Postgres connection plumbing shared by the store and the warehouse: URL parsing into
//! sqlx options, the acquire timeout, and sqlx errors as sentences.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use crate::error::{Error, Result};

/// How long a caller waits for a pooled connection (including connecting) before the
/// database counts as unavailable.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// sqlx options for `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`, named `idem` on the
/// server.
pub fn connect_options(url: &str) -> Result<PgConnectOptions> {
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
