//! Opening a store from its URL, and the store that stands in when one cannot be opened.

use std::sync::Arc;

use async_trait::async_trait;

use super::{redact_url, Capabilities, DynStore, EventKeyStore, MemoryStore, StoreBase};
use crate::backend::shared::OpenOnce;
use crate::backend::{Backend, PoolSize};
use crate::error::{Error, Result};

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

/// Every call fails as the store does.
macro_rules! unavailable {
    ($s:ident, $method:ident($($arg:expr),*)) => {{
        let _ = ($($arg),*);
        $s.fail()
    }};
}
crate::forward_store!([] UnavailableStore, unavailable);

/// The default store URL: a SQLite file in the current directory.
pub const DEFAULT_STORE_URL: &str = "sqlite://idem.db";

/// Opens (and migrates) the store a URL names, for one run: one connection unless the URL
/// says `?max_connections=N` (see [`PoolSize::ONE_RUN`]).
pub async fn open(url: &str) -> Result<Arc<DynStore>> {
    open_sized(url, PoolSize::ONE_RUN).await
}

/// [`open`], with `size` connections in the pool when the URL does not say.
pub async fn open_sized(url: &str, size: PoolSize) -> Result<Arc<DynStore>> {
    let store: Arc<DynStore> = match Backend::of(url) {
        Some(Backend::Memory) => Arc::new(MemoryStore::new()),
        #[cfg(feature = "sqlite")]
        Some(Backend::Sqlite) => {
            Arc::new(super::sqlite::SqliteStore::connect_sized(url, size.sqlite).await?)
        }
        #[cfg(feature = "bigquery")]
        Some(Backend::BigQuery) => Arc::new(super::bigquery::BigQueryStore::connect(url).await?),
        #[cfg(feature = "postgres")]
        Some(Backend::Postgres) => {
            Arc::new(super::postgres::PostgresStore::connect_sized(url, size.postgres).await?)
        }
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

/// Where a store's schema stands against the migrations of this build (`idem migrate
/// --check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaState {
    /// The version the store records: 0 when it has no schema yet.
    pub current: i64,
    /// The newest version this build knows: what `idem migrate` brings the store to.
    pub latest: i64,
}

impl SchemaState {
    /// Whether `idem migrate` has something to do. A store ahead of this build (migrated
    /// by a newer idem) is not behind.
    pub fn is_behind(&self) -> bool {
        self.current < self.latest
    }
}

/// Reads the schema version the store `url` records, creating, migrating and writing
/// nothing (a SQLite file that does not exist is at version 0 and stays absent).
/// `memory://` has no schema to fall behind.
pub async fn schema_state(url: &str) -> Result<SchemaState> {
    use super::migrations::{self, Schema};
    #[cfg_attr(not(any(feature = "bigquery", feature = "postgres")), allow(dead_code))]
    async fn of(schema: &(impl Schema + ?Sized)) -> Result<SchemaState> {
        Ok(SchemaState {
            current: schema.version().await?,
            latest: migrations::latest(schema.migrations()),
        })
    }
    match Backend::of(url) {
        Some(Backend::Memory) => Ok(SchemaState {
            current: 0,
            latest: 0,
        }),
        #[cfg(feature = "sqlite")]
        Some(Backend::Sqlite) => Ok(SchemaState {
            current: super::sqlite::SqliteStore::recorded_version(url).await?,
            latest: migrations::latest(&migrations::SQLITE),
        }),
        #[cfg(feature = "bigquery")]
        Some(Backend::BigQuery) => {
            of(&super::bigquery::BigQueryStore::connect_lazy(url).await?).await
        }
        #[cfg(feature = "postgres")]
        Some(Backend::Postgres) => of(&super::postgres::PostgresStore::connect_lazy(url)?).await,
        // Every other URL: the error opening it gives.
        _ => open(url).await.map(|_| SchemaState {
            current: 0,
            latest: 0,
        }),
    }
}

/// One store per URL for every run of a process: a scheduler's jobs, a parallel backfill's
/// dates, a Python program's processors share one pool (see [`crate::backend::shared`]:
/// concurrent first opens wait for one, and a failed open is shared by those who waited).
/// Cheap to clone: the clones share the stores. For one tokio runtime.
#[derive(Debug, Clone)]
pub struct Stores {
    size: PoolSize,
    stores: Arc<OpenOnce<DynStore>>,
}

impl Stores {
    /// No store open yet; each will be opened with `size` connections when its URL does
    /// not say.
    pub fn new(size: PoolSize) -> Self {
        Stores {
            size,
            stores: Arc::default(),
        }
    }

    /// The store `url` names, opened (and migrated) by the first caller.
    pub async fn open(&self, url: &str) -> Result<Arc<DynStore>> {
        self.stores
            .get_or_open(url, || open_sized(url, self.size))
            .await
    }

    /// How many stores are open.
    pub fn len(&self) -> usize {
        self.stores.len()
    }

    /// Whether no store is open.
    pub fn is_empty(&self) -> bool {
        self.stores.is_empty()
    }
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
/// only. A SQL store's pool holds what an event gate's batches side by side need
/// ([`PoolSize::EVENTS`]) unless the URL says `?max_connections=N`.
pub async fn open_event_keys(url: &str) -> Result<Arc<dyn EventKeyStore>> {
    match Backend::of(url) {
        #[cfg(feature = "redis")]
        Some(Backend::Redis) => Ok(Arc::new(super::redis::RedisStore::connect(url).await?)),
        _ => {
            let store: Arc<dyn EventKeyStore> = open_sized(url, PoolSize::EVENTS).await?;
            Ok(store)
        }
    }
}

/// What a store `url` names is known to be before it is open: its kind and the
/// capabilities it answers once opened by [`open_event_keys`] (a pool of
/// [`PoolSize::EVENTS`] connections). The conformance suite holds every backend to it
/// (`wrappers_answer_as_the_store`).
fn known(url: &str) -> (&'static str, Capabilities) {
    let shared = Capabilities::SHARED;
    match Backend::of(url) {
        Some(Backend::Memory) => (
            "memory",
            Capabilities {
                confirms_pending: true,
                ..Capabilities::NONE
            },
        ),
        Some(Backend::Sqlite) => (
            "sqlite",
            Capabilities {
                confirms_pending: true,
                batch_concurrency: PoolSize::EVENTS.sqlite as usize,
                marks_ahead: true,
                ..shared
            },
        ),
        Some(Backend::Postgres) => (
            "postgres",
            Capabilities {
                confirms_pending: true,
                batch_concurrency: PoolSize::EVENTS.postgres as usize,
                marks_ahead: true,
                ..shared
            },
        ),
        Some(Backend::BigQuery) => ("bigquery", shared),
        Some(Backend::Redis) => (
            "redis",
            Capabilities {
                durable: false,
                cross_process: true,
                confirms_pending: true,
                batch_concurrency: 4,
                marks_ahead: true,
            },
        ),
        None => ("unavailable", Capabilities::NONE),
    }
}

/// An event-key store that could not be opened when the caller started (under
/// `best_effort`/`log_only`, which go on unverified): every call first tries to open it
/// again, and once that succeeds every call goes to it. Put a breaker in front, so a store
/// still down is tried once per reset timeout, not once per batch.
pub struct ReopeningEventStore {
    url: String,
    store: tokio::sync::OnceCell<Arc<dyn EventKeyStore>>,
}

impl std::fmt::Debug for ReopeningEventStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReopeningEventStore")
            .field("url", &redact_url(&self.url))
            .field("open", &self.store.initialized())
            .finish()
    }
}

impl ReopeningEventStore {
    /// A store at `url`, opened on first use.
    pub fn new(url: &str) -> Self {
        ReopeningEventStore {
            url: url.to_string(),
            store: tokio::sync::OnceCell::new(),
        }
    }

    async fn get(&self) -> Result<&Arc<dyn EventKeyStore>> {
        self.store
            .get_or_try_init(|| open_event_keys(&self.url))
            .await
    }
}

#[async_trait]
impl StoreBase for ReopeningEventStore {
    /// The backend's, open or not.
    fn kind(&self) -> &'static str {
        self.store
            .get()
            .map_or_else(|| known(&self.url).0, |s| s.kind())
    }

    fn location(&self) -> String {
        redact_url(&self.url)
    }

    /// The store's once it is open; before, what a store of its backend answers (a gate
    /// decides when it starts whether to mark keys pending and how many batches to run
    /// side by side).
    fn capabilities(&self) -> Capabilities {
        self.store
            .get()
            .map_or_else(|| known(&self.url).1, |s| s.capabilities())
    }

    async fn migrate(&self) -> Result<()> {
        self.get().await.map(|_| ())
    }
}

/// Every event-key call goes to the store, opened first if it is not yet.
macro_rules! reopened {
    ($s:ident, $method:ident($($arg:expr),*)) => {
        $s.get().await?.$method($($arg),*).await
    };
}
crate::forward_event_key_store!([] ReopeningEventStore, reopened);
