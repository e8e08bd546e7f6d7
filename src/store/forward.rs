//! Wrappers complete by construction: [`forward_event_key_store!`] implements every method
//! of [`EventKeyStore`](super::EventKeyStore) for a wrapper, each routed through one macro
//! the wrapper writes.
//!
//! [`forward_event_key_store!`]: crate::forward_event_key_store

/// Implements [`EventKeyStore`](crate::store::EventKeyStore) for a wrapper type, every
/// method of the trait (which has no default methods: a method missing here does not
/// compile), each routed through `$via!(self, method(arguments…))`, a macro the wrapper
/// writes whose expansion is the method's result. The wrapper's macro states only what
/// it changes: an arm per method it treats differently, then one arm for all the others.
/// [`StoreBase`](crate::store::StoreBase) is the wrapper's to implement.
///
/// ```
/// use std::sync::Arc;
/// use async_trait::async_trait;
/// use idem::store::{Capabilities, EventKeyStore, MemoryStore, StoreBase};
///
/// /// Counts the calls that reach the store.
/// #[derive(Debug)]
/// struct Counted {
///     inner: Arc<dyn EventKeyStore>,
///     calls: std::sync::atomic::AtomicU64,
/// }
///
/// #[async_trait]
/// impl StoreBase for Counted {
///     fn kind(&self) -> &'static str { self.inner.kind() }
///     fn location(&self) -> String { self.inner.location() }
///     fn capabilities(&self) -> Capabilities { self.inner.capabilities() }
///     async fn migrate(&self) -> idem::Result<()> { self.inner.migrate().await }
/// }
///
/// macro_rules! counted {
///     ($s:ident, $method:ident($($arg:expr),*)) => {{
///         $s.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         $s.inner.$method($($arg),*).await
///     }};
/// }
/// idem::forward_event_key_store!([] Counted, counted);
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = Counted { inner: Arc::new(MemoryStore::new()), calls: Default::default() };
/// let keys = vec!["k".to_string()];
/// assert_eq!(store.mark_event_keys("ns", &keys, chrono::Utc::now()).await.unwrap(), [true]);
/// assert_eq!(store.calls.load(std::sync::atomic::Ordering::Relaxed), 1);
/// # });
/// ```
#[macro_export]
macro_rules! forward_event_key_store {
    ([$($generics:tt)*] $wrapper:ty, $via:ident) => {
        #[$crate::__private::async_trait::async_trait]
        impl<$($generics)*> $crate::store::EventKeyStore for $wrapper {
            async fn check_and_mark(
                &self,
                namespace: &str,
                marks: &[$crate::store::EventMark],
                now: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>,
            ) -> $crate::Result<::std::vec::Vec<$crate::store::EventVerdict>> {
                $via!(self, check_and_mark(namespace, marks, now))
            }

            async fn is_duplicate(
                &self,
                namespace: &str,
                keys: &[::std::string::String],
                now: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>,
            ) -> $crate::Result<::std::vec::Vec<bool>> {
                $via!(self, is_duplicate(namespace, keys, now))
            }

            async fn check_all_marked(
                &self,
                namespace: &str,
                marks: &[$crate::store::EventMark],
                now: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>,
            ) -> $crate::Result<
                ::std::option::Option<::std::vec::Vec<$crate::store::EventVerdict>>,
            > {
                $via!(self, check_all_marked(namespace, marks, now))
            }

            async fn record_decision(
                &self,
                namespace: &str,
                key: &str,
                decision: &$crate::__private::serde_json::Value,
            ) -> $crate::Result<bool> {
                $via!(self, record_decision(namespace, key, decision))
            }

            async fn mark_event_keys(
                &self,
                namespace: &str,
                keys: &[::std::string::String],
                now: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>,
            ) -> $crate::Result<::std::vec::Vec<bool>> {
                $via!(self, mark_event_keys(namespace, keys, now))
            }

            async fn forget_event_keys(
                &self,
                namespace: &str,
                keys: &[::std::string::String],
            ) -> $crate::Result<u64> {
                $via!(self, forget_event_keys(namespace, keys))
            }

            async fn confirm_event_keys(
                &self,
                namespace: &str,
                keys: &[$crate::store::fallback::KeyExpiry],
                owner: &str,
            ) -> $crate::Result<u64> {
                $via!(self, confirm_event_keys(namespace, keys, owner))
            }

            async fn check_and_mark_pending(
                &self,
                namespace: &str,
                marks: &[$crate::store::EventMark],
                now: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>,
                batch: $crate::store::PendingBatch<'_>,
                cursor: ::std::option::Option<(&str, &$crate::store::Cursor)>,
            ) -> $crate::Result<::std::vec::Vec<$crate::store::EventVerdict>> {
                $via!(
                    self,
                    check_and_mark_pending(namespace, marks, now, batch, cursor)
                )
            }

            async fn check_and_mark_pending_ahead(
                &self,
                namespace: &str,
                marks: &[$crate::store::EventMark],
                now: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>,
                batch: $crate::store::PendingBatch<'_>,
            ) -> $crate::Result<
                ::std::option::Option<::std::vec::Vec<$crate::store::EventVerdict>>,
            > {
                $via!(
                    self,
                    check_and_mark_pending_ahead(namespace, marks, now, batch)
                )
            }

            async fn confirm_pending_batch(
                &self,
                namespace: &str,
                marker: &str,
                keys: &[$crate::store::fallback::KeyExpiry],
                whole: bool,
            ) -> $crate::Result<u64> {
                $via!(self, confirm_pending_batch(namespace, marker, keys, whole))
            }

            async fn unmark_event_keys(
                &self,
                namespace: &str,
                keys: &[::std::string::String],
                first_seen: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>,
            ) -> $crate::Result<u64> {
                $via!(self, unmark_event_keys(namespace, keys, first_seen))
            }

            async fn cursor(
                &self,
                namespace: &str,
                name: &str,
            ) -> $crate::Result<::std::option::Option<$crate::store::Cursor>> {
                $via!(self, cursor(namespace, name))
            }

            async fn advance_cursor(
                &self,
                namespace: &str,
                name: &str,
                to: &$crate::store::Cursor,
            ) -> $crate::Result<()> {
                $via!(self, advance_cursor(namespace, name, to))
            }

            async fn check_and_mark_advancing(
                &self,
                namespace: &str,
                marks: &[$crate::store::EventMark],
                now: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>,
                cursor: &str,
                to: &$crate::store::Cursor,
            ) -> $crate::Result<::std::vec::Vec<$crate::store::EventVerdict>> {
                $via!(
                    self,
                    check_and_mark_advancing(namespace, marks, now, cursor, to)
                )
            }
        }
    };
}

/// Implements [`LeaseStore`](crate::store::LeaseStore) for a wrapper type, every method
/// routed through `$via!` as [`forward_event_key_store!`](crate::forward_event_key_store)
/// does.
#[macro_export]
macro_rules! forward_lease_store {
    ([$($generics:tt)*] $wrapper:ty, $via:ident) => {
        #[$crate::__private::async_trait::async_trait]
        impl<$($generics)*> $crate::store::LeaseStore for $wrapper {
            async fn claim(
                &self,
                request: &$crate::store::ClaimRequest<'_>,
            ) -> $crate::Result<$crate::store::Claim> {
                $via!(self, claim(request))
            }

            async fn lease_holder(
                &self,
                processor: &str,
                scope: &str,
                now: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>,
            ) -> $crate::Result<::std::option::Option<$crate::store::LeaseHolder>> {
                $via!(self, lease_holder(processor, scope, now))
            }

            async fn renew(
                &self,
                lease: &$crate::store::Lease,
                ttl: ::std::time::Duration,
                now: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>,
            ) -> $crate::Result<$crate::store::Lease> {
                $via!(self, renew(lease, ttl, now))
            }

            async fn release(
                &self,
                lease: &$crate::store::Lease,
                now: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>,
            ) -> $crate::Result<bool> {
                $via!(self, release(lease, now))
            }

            async fn open_leases(
                &self,
                processor: ::std::option::Option<&str>,
            ) -> $crate::Result<::std::vec::Vec<$crate::store::OpenLease>> {
                $via!(self, open_leases(processor))
            }

            async fn claim_and_find(
                &self,
                request: &$crate::store::ClaimRequest<'_>,
                lookups: &[$crate::store::KeyLookup],
            ) -> $crate::Result<$crate::store::fallback::ClaimAndKeys> {
                $via!(self, claim_and_find(request, lookups))
            }
        }
    };
}

/// Implements [`LedgerStore`](crate::store::LedgerStore) for a wrapper type, every method
/// routed through `$via!` as [`forward_event_key_store!`](crate::forward_event_key_store)
/// does.
#[macro_export]
macro_rules! forward_ledger_store {
    ([$($generics:tt)*] $wrapper:ty, $via:ident) => {
        #[$crate::__private::async_trait::async_trait]
        impl<$($generics)*> $crate::store::LedgerStore for $wrapper {
            async fn find_keys(
                &self,
                lookups: &[$crate::store::KeyLookup],
            ) -> $crate::Result<::std::vec::Vec<::std::option::Option<$crate::KeyRecord>>> {
                $via!(self, find_keys(lookups))
            }

            async fn find_keys_and_holder(
                &self,
                lookups: &[$crate::store::KeyLookup],
                processor: &str,
                scope: &str,
                now: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>,
            ) -> $crate::Result<$crate::store::fallback::KeysAndHolder> {
                $via!(self, find_keys_and_holder(lookups, processor, scope, now))
            }

            async fn find_keys_recording_skip(
                &self,
                lookups: &[$crate::store::KeyLookup],
                now: $crate::__private::chrono::DateTime<$crate::__private::chrono::Utc>,
                peek: bool,
                skip: &$crate::store::SkipOnHit,
            ) -> $crate::Result<$crate::store::fallback::KeysHolderRecorded> {
                $via!(self, find_keys_recording_skip(lookups, now, peek, skip))
            }

            async fn finish(&self, finish: &$crate::store::Finish) -> $crate::Result<()> {
                $via!(self, finish(finish))
            }

            async fn runs(
                &self,
                filter: &$crate::store::RunFilter,
            ) -> $crate::Result<::std::vec::Vec<$crate::RunRecord>> {
                $via!(self, runs(filter))
            }
        }
    };
}

/// Implements [`MaintenanceStore`](crate::store::MaintenanceStore) for a wrapper type,
/// every method routed through `$via!` as
/// [`forward_event_key_store!`](crate::forward_event_key_store) does.
#[macro_export]
macro_rules! forward_maintenance_store {
    ([$($generics:tt)*] $wrapper:ty, $via:ident) => {
        #[$crate::__private::async_trait::async_trait]
        impl<$($generics)*> $crate::store::MaintenanceStore for $wrapper {
            async fn purge(
                &self,
                processor: &str,
                scope: ::std::option::Option<&str>,
            ) -> $crate::Result<u64> {
                $via!(self, purge(processor, scope))
            }

            async fn cleanup(
                &self,
                policy: &$crate::store::CleanupPolicy,
            ) -> $crate::Result<$crate::store::CleanupReport> {
                $via!(self, cleanup(policy))
            }

            async fn partition_expiration(
                &self,
            ) -> $crate::Result<
                ::std::option::Option<::std::vec::Vec<$crate::store::PartitionExpiration>>,
            > {
                $via!(self, partition_expiration())
            }

            async fn set_partition_expiration(
                &self,
                days: ::std::option::Option<u32>,
            ) -> $crate::Result<()> {
                $via!(self, set_partition_expiration(days))
            }
        }
    };
}

/// [`forward_lease_store!`](crate::forward_lease_store),
/// [`forward_ledger_store!`](crate::forward_ledger_store),
/// [`forward_maintenance_store!`](crate::forward_maintenance_store) and
/// [`forward_event_key_store!`](crate::forward_event_key_store) at once: a wrapper of a
/// whole [`Store`](crate::store::Store), every method routed through `$via!`.
#[macro_export]
macro_rules! forward_store {
    ([$($generics:tt)*] $wrapper:ty, $via:ident) => {
        $crate::forward_lease_store!([$($generics)*] $wrapper, $via);
        $crate::forward_ledger_store!([$($generics)*] $wrapper, $via);
        $crate::forward_maintenance_store!([$($generics)*] $wrapper, $via);
        $crate::forward_event_key_store!([$($generics)*] $wrapper, $via);
    };
}
