//! Opening a store from its URL, and the store that stands in when one cannot be opened.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{
    redact_url, Capabilities, Claim, ClaimRequest, CleanupPolicy, CleanupReport, DynStore,
    EventKeyStore, EventMark, EventVerdict, Finish, KeyLookup, Lease, LeaseHolder, LeaseStore,
    LedgerStore, MaintenanceStore, MemoryStore, PartitionExpiration, RunFilter, StoreBase,
};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::model::{KeyRecord, RunRecord};

/// A store that could not be opened: every call fails with
/// [`Error::StoreUnavailable`]. Used under the `best_effort` policy so a run can go on
/// unguarded, with every store failure counted.
#[derive(Debug, Clone)]
pub struct UnavailableStore {
    url: String,
    message: String,
}

impl UnavailableStore {
    /// A store at `url` that fails with `message`.
    pub fn new(url: &str, message: impl Into<String>) -> Self {
        UnavailableStore {
            url: redact_url(url),
            message: message.into(),
        }
    }

    fn fail<T>(&self) -> Result<T> {
        Err(Error::store(&self.url, &self.message))
    }
}

#[async_trait]
impl StoreBase for UnavailableStore {
    fn kind(&self) -> &'static str {
        "unavailable"
    }

    fn location(&self) -> String {
        self.url.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }

    async fn migrate(&self) -> Result<()> {
        self.fail()
    }
}

#[async_trait]
impl LeaseStore for UnavailableStore {
    async fn claim(&self, _: &ClaimRequest<'_>) -> Result<Claim> {
        self.fail()
    }

    async fn lease_holder(
        &self,
        _: &str,
        _: &str,
        _: DateTime<Utc>,
    ) -> Result<Option<LeaseHolder>> {
        self.fail()
    }

    async fn renew(&self, _: &Lease, _: Duration, _: DateTime<Utc>) -> Result<Lease> {
        self.fail()
    }

    async fn release(&self, _: &Lease, _: DateTime<Utc>) -> Result<bool> {
        self.fail()
    }
}

#[async_trait]
impl LedgerStore for UnavailableStore {
    async fn find_keys(&self, _: &[KeyLookup]) -> Result<Vec<Option<KeyRecord>>> {
        self.fail()
    }

    async fn finish(&self, _: &Finish) -> Result<()> {
        self.fail()
    }

    async fn runs(&self, _: &RunFilter) -> Result<Vec<RunRecord>> {
        self.fail()
    }
}

#[async_trait]
impl MaintenanceStore for UnavailableStore {
    async fn purge(&self, _: &str, _: Option<&str>) -> Result<u64> {
        self.fail()
    }

    async fn cleanup(&self, _: &CleanupPolicy) -> Result<CleanupReport> {
        self.fail()
    }

    async fn partition_expiration(&self) -> Result<Option<Vec<PartitionExpiration>>> {
        self.fail()
    }

    async fn set_partition_expiration(&self, _: Option<u32>) -> Result<()> {
        self.fail()
    }
}

#[async_trait]
impl EventKeyStore for UnavailableStore {
    async fn check_and_mark(
        &self,
        _: &str,
        _: &[EventMark],
        _: DateTime<Utc>,
    ) -> Result<Vec<EventVerdict>> {
        self.fail()
    }

    async fn is_duplicate(&self, _: &str, _: &[String], _: DateTime<Utc>) -> Result<Vec<bool>> {
        self.fail()
    }

    async fn record_decision(&self, _: &str, _: &str, _: &serde_json::Value) -> Result<bool> {
        self.fail()
    }

    async fn forget_event_keys(&self, _: &str, _: &[String]) -> Result<u64> {
        self.fail()
    }

    async fn cursor(&self, _: &str, _: &str) -> Result<Option<super::Cursor>> {
        self.fail()
    }

    async fn advance_cursor(&self, _: &str, _: &str, _: &super::Cursor) -> Result<()> {
        self.fail()
    }
}

/// The default store URL: a SQLite file in the current directory.
pub const DEFAULT_STORE_URL: &str = "sqlite://idem.db";

/// Opens (and migrates) the store a URL names.
pub async fn open(url: &str) -> Result<Arc<DynStore>> {
    let store: Arc<DynStore> = match Backend::of(url) {
        Some(Backend::Memory) => Arc::new(MemoryStore::new()),
        #[cfg(feature = "sqlite")]
        Some(Backend::Sqlite) => Arc::new(super::sqlite::SqliteStore::connect(url).await?),
        #[cfg(feature = "bigquery")]
        Some(Backend::BigQuery) => Arc::new(super::bigquery::BigQueryStore::connect(url).await?),
        #[cfg(feature = "postgres")]
        Some(Backend::Postgres) => Arc::new(super::postgres::PostgresStore::connect(url).await?),
        Some(Backend::Redis) => return Err(event_keys_only(url)),
        #[allow(unreachable_patterns)]
        _ => {
            let redis = if cfg!(feature = "redis") {
                " (redis://… for event keys only)"
            } else {
                ""
            };
            return Err(Error::config(format!(
                "unsupported store url {:?}: expected sqlite://PATH, postgres://…, bigquery://PROJECT/DATASET or memory://{redis}",
                redact_url(url)
            )));
        }
    };
    Ok(store)
}

/// Why a Redis URL cannot be a run's store.
fn event_keys_only(url: &str) -> Error {
    Error::config(format!(
        "{:?} is a redis store, which holds event keys only (for idem gate): it has no leases or \
         run ledger; give runs a sqlite://, postgres:// or bigquery:// store and use the redis url \
         where event keys are checked",
        redact_url(url)
    ))
}

/// Opens (and migrates) the event-key store a URL names: any [`open`] URL, or
/// `redis://HOST[:PORT][/DB][?prefix=P]` (`rediss://` for TLS), which holds event keys
/// only.
pub async fn open_event_keys(url: &str) -> Result<Arc<dyn EventKeyStore>> {
    match Backend::of(url) {
        #[cfg(feature = "redis")]
        Some(Backend::Redis) => Ok(Arc::new(super::redis::RedisStore::connect(url).await?)),
        _ => {
            let store: Arc<dyn EventKeyStore> = open(url).await?;
            Ok(store)
        }
    }
}
