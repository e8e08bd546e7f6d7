//! URLs as they may be shown: a store's or warehouse's URL with every secret replaced by
//! `***` ([`RedactedUrl`]). Below every other module (errors name stores through it), it
//! depends on none of them.

/// A store or warehouse URL as it may be shown: in a message, a log line, a summary, a JSON
/// document or a ledger row. Built from the URL once; its `Display` and `Debug` never hold
/// a secret: the password of `user:password@` and the value of every query parameter that
/// names one (`password`, `sslpassword`, tokens, keys, credentials: see
/// [`is_secret_param`]) read `***`. A URL that does not parse is redacted the same way (by
/// its text, not by a parser that could fail), never shown whole.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct RedactedUrl(String);

impl RedactedUrl {
    /// `url` without its secrets.
    pub fn new(url: &str) -> RedactedUrl {
        RedactedUrl(redact(url))
    }

    /// The redacted text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RedactedUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Debug for RedactedUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl std::ops::Deref for RedactedUrl {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for RedactedUrl {
    fn from(url: &str) -> RedactedUrl {
        RedactedUrl::new(url)
    }
}

impl From<&String> for RedactedUrl {
    fn from(url: &String) -> RedactedUrl {
        RedactedUrl::new(url)
    }
}

/// [`RedactedUrl`] as a string: `url` with its secrets replaced by `***`. Text without a
/// scheme (`the store`) and URLs without secrets come back as written. Redacting twice
/// changes nothing.
pub fn redact_url(url: &str) -> String {
    redact(url)
}

/// True when a URL query parameter named `name` holds a secret (its value is never shown
/// and never exported): any name holding `pass`, `pwd`, `secret`, `token`, `key`,
/// `credential` or `auth`, in any case (`password`, `sslpassword`, `access_token`,
/// `api_key`, `credentials_json`…).
pub fn is_secret_param(name: &str) -> bool {
    let name = percent_encoding::percent_decode_str(name)
        .decode_utf8_lossy()
        .to_ascii_lowercase();
    [
        "pass",
        "pwd",
        "secret",
        "token",
        "key",
        "credential",
        "auth",
    ]
    .iter()
    .any(|s| name.contains(s))
}

/// The redaction, by the URL's text alone (so a URL no parser accepts is redacted too).
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // A SQLite path or memory:// holds no secret, and may hold `@`, `:` or `?` as a file name.
    if ["sqlite", "memory"].contains(&scheme.to_ascii_lowercase().as_str()) {
        return url.to_string();
    }
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    // `user:password@host`: everything up to the last `@` is the user information (a
    // password with an unescaped `@` or `/` is still covered).
    let mut out = format!("{scheme}://");
    match before_query.rsplit_once('@') {
        Some((userinfo, host)) => {
            match userinfo.split_once(':') {
                Some((user, _password)) => out.push_str(&format!("{user}:***@")),
                None => out.push_str(&format!("{userinfo}@")),
            }
            out.push_str(host);
        }
        None => out.push_str(before_query),
    }
    if let Some(query) = query {
        let parts: Vec<String> = query
            .split('&')
            .map(|part| {
                let (key, value) = part.split_once('=').unwrap_or((part, ""));
                // A URL as a parameter's value (`endpoint=http://user:pass@host`) is
                // hidden whole when it holds a secret itself.
                let value = percent_encoding::percent_decode_str(value).decode_utf8_lossy();
                match is_secret_param(key) || (value.contains("://") && redact(&value) != value) {
                    true => format!("{key}=***"),
                    false => part.to_string(),
                }
            })
            .collect();
        out.push('?');
        out.push_str(&parts.join("&"));
    }
    out
}
