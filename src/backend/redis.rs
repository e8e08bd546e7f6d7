//! Redis connection plumbing: the URL (`redis://HOST[:PORT][/DB][?prefix=P]`, or
//! `rediss://…` for TLS), the connection manager's timeouts, and which driver errors are
//! outages.
//!
//! # TLS
//!
//! `rediss://` connects with rustls and verifies the server's certificate against the
//! system's root certificates (rustls-native-certs: `/etc/ssl/certs`, or `SSL_CERT_FILE` /
//! `SSL_CERT_DIR`). For a self-hosted Redis whose certificate a private CA signed,
//! `?tls_ca=PATH` names a PEM file of CA certificates to verify against *instead* (idem's
//! parameter, taken out of the URL like `prefix`). The redis crate's `#insecure` fragment
//! (`rediss://HOST:6380/#insecure`) turns verification off altogether (any certificate,
//! any host name): traffic is encrypted but not protected from a machine in the middle;
//! for tests only.

use std::path::PathBuf;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, TlsCertificates};

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
    /// `rediss://`: the connection is TLS.
    pub tls: bool,
    /// `?tls_ca=PATH` (`rediss://` only): a PEM file of the CA certificates the server's
    /// certificate is verified against, instead of the system's roots. Read on connect.
    pub tls_ca: Option<PathBuf>,
}

/// The URL forms, for messages.
const EXPECTED: &str = "expected redis://[USER[:PASSWORD]@]HOST[:PORT][/DB][?prefix=PREFIX] \
     (rediss:// for TLS, which also takes tls_ca=CA.pem and #insecure)";

fn bad_url(url: &str, why: &str) -> Error {
    Error::config(format!(
        "invalid redis url {:?}: {why}; {EXPECTED}",
        redact_url(url)
    ))
}

/// Parses `redis://…` or `rediss://…`: takes idem's `prefix` and `tls_ca` parameters out,
/// and refuses prefixes with braces (they would break the `{namespace}` hash tag),
/// `tls_ca` or `#insecure` without TLS, and `tls_ca` with `#insecure`. Nothing is read or
/// opened.
pub fn parse_url(url: &str) -> Result<RedisUrl> {
    let mut parsed = url::Url::parse(url).map_err(|e| bad_url(url, &e.to_string()))?;
    let tls = match parsed.scheme() {
        "redis" => false,
        "rediss" => true,
        other => {
            return Err(bad_url(
                url,
                &format!("scheme {other:?} is not redis or rediss"),
            ))
        }
    };
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad_url(url, "no host"));
    }
    let path = parsed.path().trim_start_matches('/');
    if !path.is_empty() && path.parse::<u16>().is_err() {
        return Err(bad_url(url, "the path must be a database number"));
    }
    let insecure = match parsed.fragment() {
        None => false,
        Some("insecure") if tls => true,
        Some("insecure") => {
            return Err(bad_url(
                url,
                "#insecure (no certificate verification) applies to rediss:// only",
            ))
        }
        Some(other) => {
            return Err(bad_url(
                url,
                &format!("unknown fragment #{other} (only rediss://…#insecure is known)"),
            ))
        }
    };
    let mut prefix = DEFAULT_PREFIX.to_string();
    let mut tls_ca = None;
    let mut rest: Vec<(String, String)> = Vec::new();
    for (k, v) in parsed.query_pairs() {
        match &*k {
            "prefix" => prefix = v.into_owned(),
            "tls_ca" => tls_ca = Some(v.into_owned()),
            // The driver's own (redis-rs): RESP version; for unix sockets db, user, pass.
            "protocol" | "db" | "user" | "pass" => rest.push((k.into_owned(), v.into_owned())),
            other => {
                return Err(bad_url(
                    url,
                    &format!(
                        "unknown parameter {other:?} (idem knows prefix and tls_ca; the driver \
                         protocol, db, user and pass)"
                    ),
                ))
            }
        }
    }
    if prefix.contains(['{', '}']) {
        return Err(bad_url(
            url,
            "the prefix must not contain braces (idem puts the namespace in a {hash tag})",
        ));
    }
    if let Some(ca) = &tls_ca {
        if !tls {
            return Err(bad_url(
                url,
                "tls_ca needs a TLS connection: use rediss:// (redis:// is plain TCP)",
            ));
        }
        if ca.is_empty() {
            return Err(bad_url(url, "tls_ca is empty; give the path of a PEM file"));
        }
        if insecure {
            return Err(bad_url(
                url,
                "tls_ca and #insecure contradict each other (#insecure verifies no certificate)",
            ));
        }
    }
    if rest.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(rest);
    }
    Ok(RedisUrl {
        connect: parsed.to_string(),
        prefix,
        tls,
        tls_ca: tls_ca.map(PathBuf::from),
    })
}

/// The driver's client for `url`: with `tls_ca`, the file is read here and must hold at
/// least one PEM certificate (a config error naming the file otherwise).
fn client(url: &RedisUrl, store: &str) -> Result<redis::Client> {
    if url.tls {
        ensure_crypto_provider();
    }
    let invalid = |e: RedisError| Error::config(format!("invalid redis url {store:?}: {e}"));
    let Some(ca) = &url.tls_ca else {
        return redis::Client::open(url.connect.as_str()).map_err(invalid);
    };
    let bad_ca = |why: String| {
        Error::config(format!(
            "cannot use the CA file {} (tls_ca of redis url {store:?}): {why}",
            ca.display()
        ))
    };
    let pem = std::fs::read(ca).map_err(|e| bad_ca(e.to_string()))?;
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut certificates = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| bad_ca(format!("not a PEM certificate file: {e}")))?;
        certificates += 1;
    }
    if certificates == 0 {
        return Err(bad_ca(
            "no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    redis::Client::build_with_tls(
        url.connect.as_str(),
        TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        },
    )
    .map_err(|e| bad_ca(e.to_string()))
}

/// rustls needs a process-wide crypto provider; the redis crate takes the default, which
/// only exists on its own when exactly one provider feature is on. Installs ring (what
/// this build enables) unless the program installed one.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one meanwhile: either is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Connects (one attempt within [`TIMEOUT`]; the manager reconnects in the background
/// after a dropped connection). `store` is the redacted URL for messages.
pub async fn connect(url: &RedisUrl, store: &str) -> Result<ConnectionManager> {
    let client = client(url, store)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(TIMEOUT)
        .set_response_timeout(TIMEOUT)
        .set_number_of_retries(1)
        .set_max_delay(500);
    ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| error(store, CONNECTION, e))
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
/// [`Error::StoreUnavailable`], refused commands [`Error::StoreRejected`]. A failed TLS
/// handshake (an untrusted certificate, a plain server behind `rediss://`) is an outage
/// whose message says what was wrong with the TLS.
pub fn error(store: &str, operation: &str, e: RedisError) -> Error {
    if operation == CONNECTION && e.kind() == redis::ErrorKind::ParseError {
        // Something answers at that address, but not in Redis's protocol (a web server,
        // another database): the store cannot be used, and the address is what to check.
        let message = format!(
            "{operation} to redis failed: the server did not answer in the Redis protocol; \
             check the host and port (is it Redis there?)"
        );
        return Error::store_source(store, message, e);
    }
    if is_outage(&e) {
        let message = match tls_error(&e) {
            Some(rustls::Error::InvalidCertificate(why)) => format!(
                "{operation} to redis failed: the server's TLS certificate failed verification \
                 ({e}): {}",
                certificate_hint(why, store.contains("tls_ca="))
            ),
            Some(_) => format!(
                "{operation} to redis failed: the TLS handshake failed ({e}); \
                 check that the port serves TLS (a plain server is redis://)"
            ),
            None if operation == CONNECTION && store.starts_with("rediss:") && e.is_timeout() => {
                format!(
                    "{operation} to redis failed: {e}; check that redis is running and reachable, \
                     and that the port serves TLS (a plain server does not answer the TLS \
                     handshake: use redis://)"
                )
            }
            None if operation == CONNECTION
                && store.starts_with("redis:")
                && e.is_connection_dropped() =>
            {
                format!(
                    "{operation} to redis failed: {e}; check that redis is running and reachable, \
                     and whether the port wants TLS (it then drops plain connections: use rediss://)"
                )
            }
            None => format!(
                "{operation} to redis failed: {e}; check that redis is running and reachable"
            ),
        };
        Error::store_source(store, message, e)
    } else {
        Error::StoreRejected {
            store: store.to_string(),
            operation: operation.to_string(),
            message: e.to_string(),
            source: Some(Box::new(e)),
        }
    }
}

/// The operation named in a failed connection's message.
const CONNECTION: &str = "a connection";

/// The rustls error inside a driver error, if the TLS handshake failed.
fn tls_error(e: &RedisError) -> Option<&rustls::Error> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(tls) = s.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // io::Error's source() skips the error it wraps: look at it directly.
        if let Some(tls) = s
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        source = s.source();
    }
    None
}

/// What a refused certificate means for the user (`tls_ca`: the URL names a CA file).
fn certificate_hint(why: &rustls::CertificateError, tls_ca: bool) -> &'static str {
    use rustls::CertificateError as C;
    match why {
        C::UnknownIssuer if tls_ca => "it is not signed by a CA of the tls_ca file",
        C::UnknownIssuer => {
            "it is not signed by a CA this machine trusts (the system's root certificates); \
             for a server with a private CA, give that CA's certificate with ?tls_ca=CA.pem"
        }
        C::NotValidForName | C::NotValidForNameContext { .. } => {
            "it is not issued for the host name in the url (connect by the name or address \
             the certificate lists)"
        }
        C::Expired | C::ExpiredContext { .. } => "it has expired",
        C::NotValidYet | C::NotValidYetContext { .. } => {
            "it is not valid yet (check this machine's clock)"
        }
        _ => "it is not acceptable",
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
        assert!(!u.tls);
        let u = parse_url("redis://:pw@h").unwrap();
        assert_eq!(u.prefix, DEFAULT_PREFIX);
        assert_eq!(u.connect, "redis://:pw@h");
        let u = parse_url("redis://h?prefix=p:&protocol=resp3").unwrap();
        assert_eq!(u.connect, "redis://h?protocol=resp3");
        for bad in [
            "redis://",
            "rediss://",
            "redis://h/notadb",
            "redis://h?prefix=a{b",
            "redis://h?prefx=typo:",
            "http://h",
            "not a url",
        ] {
            let e = parse_url(bad).unwrap_err();
            assert!(e.is_usage(), "{bad}: {e}");
        }
    }

    #[test]
    fn rediss_takes_tls_ca_out_and_keeps_insecure() {
        let u = parse_url("rediss://:pw@h:6380/1?prefix=p:&tls_ca=/etc/ca%20dir/ca.pem").unwrap();
        assert!(u.tls);
        assert_eq!(u.connect, "rediss://:pw@h:6380/1");
        assert_eq!(u.prefix, "p:");
        assert_eq!(u.tls_ca, Some(PathBuf::from("/etc/ca dir/ca.pem")));
        let u = parse_url("rediss://h").unwrap();
        assert_eq!((u.connect.as_str(), u.tls_ca), ("rediss://h", None));
        let u = parse_url("rediss://h:6380/#insecure").unwrap();
        assert_eq!(u.connect, "rediss://h:6380/#insecure");
    }

    #[test]
    fn tls_options_out_of_place_are_config_errors_without_the_password() {
        for (bad, needle) in [
            ("redis://:secret@h?tls_ca=/ca.pem", "use rediss://"),
            ("rediss://:secret@h?tls_ca=", "tls_ca is empty"),
            ("rediss://:secret@h?tls_ca=/ca.pem#insecure", "contradict"),
            ("redis://:secret@h#insecure", "rediss:// only"),
            ("rediss://:secret@h#nope", "unknown fragment #nope"),
        ] {
            let e = parse_url(bad).unwrap_err();
            assert!(e.is_usage(), "{bad}: {e}");
            let text = e.to_string();
            assert!(text.contains(needle), "{bad}: {text}");
            assert!(!text.contains("secret"), "{bad}: {text}");
        }
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_a_config_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("idem-tls-ca-{}", crate::new_run_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        for path in [&missing, &empty] {
            let url = format!("rediss://:secret@h?tls_ca={}", path.display());
            let parsed = parse_url(&url).unwrap();
            let e = client(&parsed, &redact_url(&url)).unwrap_err();
            assert!(e.is_usage(), "{e}");
            let text = e.to_string();
            assert!(text.contains(&path.display().to_string()), "{text}");
            assert!(!text.contains("secret"), "{text}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn certificate_hints_point_at_tls_ca_only_when_it_can_help() {
        use rustls::CertificateError as C;
        assert!(certificate_hint(&C::UnknownIssuer, false).contains("?tls_ca=CA.pem"));
        assert!(certificate_hint(&C::UnknownIssuer, true).contains("of the tls_ca file"));
        assert!(certificate_hint(&C::NotValidForName, false).contains("host name"));
        assert!(certificate_hint(&C::Expired, true).contains("expired"));
    }
}
