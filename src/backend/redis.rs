//! Redis connection plumbing: the URL (`redis://HOST[:PORT][/DB][?prefix=P]`), the
//! connection manager's timeouts, and which driver errors are outages.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError};

use crate::backend::redact_url;
use crate::error::{Error, Result};

/// The key prefix when the URL names none.
pub const DEFAULT_PREFIX: &str = "idem:ev:";

/// How long connecting, and each command, may take before the store counts as unavailable.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// A parsed Redis store URL.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisUrl {
    /// What the driver connects to (the URL without idem's own query parameters).
    pub connect: String,
    /// The key prefix (`?prefix=`, [`DEFAULT_PREFIX`] by default).
    pub prefix: String,
}

fn bad_url(url: &str, why: &str) -> Error {
    Error::config(format!(
        "invalid redis url {:?}: {why}; expected redis://[USER[:PASSWORD]@]HOST[:PORT][/DB][?prefix=PREFIX]",
        redact_url(url)
    ))
}

/// Parses `redis://…`: takes idem's `prefix` parameter out, refuses `rediss://` (TLS is
/// not built in) and prefixes with braces (they would break the `{namespace}` hash tag).
pub fn parse_url(url: &str) -> Result<RedisUrl> {
    let mut parsed = url::Url::parse(url).map_err(|e| bad_url(url, &e.to_string()))?;
    match parsed.scheme() {
        "redis" => {}
        "rediss" => {
            return Err(Error::config(format!(
                "cannot open {:?}: this build of idem has no tls support for redis; use redis:// \
                 over a trusted network, an SSH tunnel or a local TLS-terminating proxy (e.g. stunnel)",
                redact_url(url)
            )))
        }
        other => return Err(bad_url(url, &format!("scheme {other:?} is not redis"))),
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad_url(url, "no host"));
    }
    let path = parsed.path().trim_start_matches('/');
    if !path.is_empty() && path.parse::<u16>().is_err() {
        return Err(bad_url(url, "the path must be a database number"));
    }
    let mut prefix = DEFAULT_PREFIX.to_string();
    let mut rest: Vec<(String, String)> = Vec::new();
    for (k, v) in parsed.query_pairs() {
        if k == "prefix" {
            prefix = v.into_owned();
        } else {
            rest.push((k.into_owned(), v.into_owned()));
        }
    }
    if prefix.contains(['{', '}']) {
        return Err(bad_url(
            url,
            "the prefix must not contain braces (idem puts the namespace in a {hash tag})",
        ));
    }
    if rest.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(rest);
    }
    Ok(RedisUrl {
        connect: parsed.to_string(),
        prefix,
    })
}

/// Connects (one attempt within [`TIMEOUT`]; the manager reconnects in the background
/// after a dropped connection). `store` is the redacted URL for messages.
pub async fn connect(url: &RedisUrl, store: &str) -> Result<ConnectionManager> {
    let client = redis::Client::open(url.connect.as_str())
        .map_err(|e| Error::config(format!("invalid redis url {store:?}: {e}")))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(TIMEOUT)
        .set_response_timeout(TIMEOUT)
        .set_number_of_retries(1)
        .set_max_delay(500);
    ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| error(store, "a connection", e))
}

/// Whether a driver error means Redis could not be used at all (unreachable, loading,
/// timed out, a cluster without quorum) rather than refusing a command.
pub fn is_outage(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || matches!(
            e.kind(),
            ErrorKind::BusyLoadingError
                | ErrorKind::TryAgain
                | ErrorKind::ClusterDown
                | ErrorKind::MasterDown
                | ErrorKind::AuthenticationFailed
                | ErrorKind::ClusterConnectionNotFound
        )
}

/// A driver error of `store` during `operation` as idem's error: outages are
/// [`Error::StoreUnavailable`], refused commands [`Error::StoreRejected`].
pub fn error(store: &str, operation: &str, e: RedisError) -> Error {
    if is_outage(&e) {
        Error::store_source(
            store,
            format!("{operation} to redis failed: {e}; check that redis is running and reachable"),
            e,
        )
    } else {
        Error::StoreRejected {
            store: store.to_string(),
            operation: operation.to_string(),
            message: e.to_string(),
            source: Some(Box::new(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_prefix_and_refusals() {
        let u = parse_url("redis://127.0.0.1:6379/2?prefix=app:ev:").unwrap();
        assert_eq!(u.prefix, "app:ev:");
        assert_eq!(u.connect, "redis://127.0.0.1:6379/2");
        let u = parse_url("redis://:pw@h").unwrap();
        assert_eq!(u.prefix, DEFAULT_PREFIX);
        assert_eq!(u.connect, "redis://:pw@h");
        for bad in [
            "rediss://h:6379",
            "redis://",
            "redis://h/notadb",
            "redis://h?prefix=a{b",
            "not a url",
        ] {
            let e = parse_url(bad).unwrap_err();
            assert!(e.is_usage(), "{bad}: {e}");
        }
        assert!(parse_url("rediss://h")
            .unwrap_err()
            .to_string()
            .contains("no tls support"));
    }
}
