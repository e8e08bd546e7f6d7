//! Connection plumbing that stores and warehouses share: which backend a URL names, URLs
//! without their passwords, the dialect-true SQL scanner, and per-backend connection
//! options and errors. A leaf: it knows nothing of stores, warehouses or runs.

#[cfg(feature = "bigquery")]
pub mod bigquery;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod script;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use script::{prepare, Dialect, Statement};

/// The backends a URL can name, from its scheme alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `memory://`: in-process, for tests and experiments (stores only).
    Memory,
    /// `sqlite://PATH`.
    Sqlite,
    /// `postgres://…` or `postgresql://…`.
    Postgres,
    /// `bigquery://PROJECT/DATASET`.
    BigQuery,
}

impl Backend {
    /// The backend `url` names, if this build supports it (nothing is opened).
    pub fn of(url: &str) -> Option<Backend> {
        match url.split_once("://").map(|(s, _)| s).unwrap_or("") {
            "memory" => Some(Backend::Memory),
            #[cfg(feature = "sqlite")]
            "sqlite" => Some(Backend::Sqlite),
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => Some(Backend::Postgres),
            #[cfg(feature = "bigquery")]
            "bigquery" => Some(Backend::BigQuery),
            _ => None,
        }
    }

    /// The SQL dialect of a warehouse on this backend (`None` for memory).
    pub fn dialect(self) -> Option<Dialect> {
        match self {
            Backend::Memory => None,
            Backend::Sqlite => Some(Dialect::Sqlite),
            Backend::Postgres => Some(Dialect::Postgres),
            Backend::BigQuery => Some(Dialect::BigQuery),
        }
    }
}

/// A URL with its password replaced by `***`, for messages and the ledger.
pub fn redact_url(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        if let Some((userinfo, host)) = rest.split_once('@') {
            if let Some((user, _password)) = userinfo.split_once(':') {
                return format!("{scheme}://{user}:***@{host}");
            }
        }
    }
    url.to_string()
}
