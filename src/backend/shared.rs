//! One connection pool per URL in a process: [`OpenOnce`] opens what a URL names once and
//! hands every later caller the same value, so a scheduler of 1,000 jobs on one store is
//! one pool (one SQLite writer, a handful of Postgres connections), not 1,000.
//!
//! Callers that arrive while an open is under way wait for it and share its result, the
//! failure too: 1,000 jobs planned at once against a store that is down wait out one
//! connect timeout, not one after another. A failed open is not remembered beyond the
//! callers that waited for it; the next caller tries again.
//!
//! A pool belongs to the tokio runtime it was opened on (its connections are registered
//! with that runtime's reactor), so one `OpenOnce` serves one runtime: a process's CLI, or
//! the Python package's runtime. It is not a global: a library user who makes runtimes of
//! their own makes one per runtime.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::error::{Error, Result};

/// The values opened so far, by URL; see the module docs.
pub struct OpenOnce<T: ?Sized> {
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Slot<T>>>>>,
}

struct Slot<T: ?Sized> {
    open: Option<Arc<T>>,
    /// The last failed open: when it ended, and its error as it can be given again.
    failed: Option<(Instant, Error)>,
}

impl<T: ?Sized> Default for OpenOnce<T> {
    fn default() -> Self {
        OpenOnce {
            slots: Mutex::new(HashMap::new()),
        }
    }
}

impl<T: ?Sized> std::fmt::Debug for OpenOnce<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls = self.slots.lock().map(|s| s.len()).unwrap_or_default();
        f.debug_struct("OpenOnce").field("urls", &urls).finish()
    }
}

impl<T: ?Sized + Send + Sync> OpenOnce<T> {
    /// The value opened for `url`, opening it with `open` if nobody has; see the module
    /// docs for what concurrent callers and failures share.
    pub async fn get_or_open<F, Fut>(&self, url: &str, open: F) -> Result<Arc<T>>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Arc<T>>>,
    {
        let arrived = Instant::now();
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(url.to_string()).or_default().clone()
        };
        let mut slot = slot.lock().await;
        if let Some(open) = &slot.open {
            return Ok(open.clone());
        }
        // An open that failed while this caller waited for it is this caller's answer too.
        if let Some((ended, error)) = &slot.failed {
            if *ended >= arrived {
                return Err(error.again());
            }
        }
        match open().await {
            Ok(value) => {
                slot.open = Some(value.clone());
                slot.failed = None;
                Ok(value)
            }
            Err(e) => {
                slot.failed = Some((Instant::now(), e.again()));
                Err(e)
            }
        }
    }

    /// How many URLs have an open value.
    pub fn len(&self) -> usize {
        let slots: Vec<_> = {
            let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.values().cloned().collect()
        };
        slots
            .iter()
            .filter(|s| s.try_lock().map_or(true, |s| s.open.is_some()))
            .count()
    }

    /// Whether nothing is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: ?Sized> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            open: None,
            failed: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn one_open_per_url_shared_by_concurrent_callers() {
        let opened = Arc::new(AtomicUsize::new(0));
        let once: Arc<OpenOnce<String>> = Arc::default();
        let calls = (0..50).map(|i| {
            let (once, opened) = (once.clone(), opened.clone());
            let url = if i % 2 == 0 { "a://x" } else { "b://y" };
            tokio::spawn(async move {
                once.get_or_open(url, || async move {
                    opened.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    Ok(Arc::new(url.to_string()))
                })
                .await
            })
        });
        for call in calls {
            let value = call.await.unwrap().unwrap();
            assert!(value.as_str() == "a://x" || value.as_str() == "b://y");
        }
        assert_eq!(opened.load(Ordering::SeqCst), 2, "one open per URL");
        assert_eq!(once.len(), 2);
    }

    #[tokio::test]
    async fn callers_waiting_on_a_failed_open_share_its_error_and_a_later_one_tries_again() {
        let attempts = Arc::new(AtomicUsize::new(0));
        let once: Arc<OpenOnce<String>> = Arc::default();
        let (release, wait) = tokio::sync::watch::channel(false);
        let first = {
            let (once, attempts, mut wait) = (once.clone(), attempts.clone(), wait.clone());
            tokio::spawn(async move {
                once.get_or_open("x://down", || async move {
                    attempts.fetch_add(1, Ordering::SeqCst);
                    let _ = wait.wait_for(|go| *go).await;
                    Err(Error::store("x://down", "connection refused"))
                })
                .await
            })
        };
        // Wait until the first open is under way, then queue nine callers behind it.
        while attempts.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let waiters: Vec<_> = (0..9)
            .map(|_| {
                let (once, attempts) = (once.clone(), attempts.clone());
                tokio::spawn(async move {
                    once.get_or_open("x://down", || async move {
                        attempts.fetch_add(1, Ordering::SeqCst);
                        Err(Error::store("x://down", "tried again"))
                    })
                    .await
                })
            })
            .collect();
        // Every waiter is queued on the slot once it has asked; let them all ask.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        release.send(true).unwrap();
        let first = first.await.unwrap().unwrap_err();
        assert!(first.to_string().contains("connection refused"), "{first}");
        for w in waiters {
            let e = w.await.unwrap().unwrap_err();
            assert!(e.to_string().contains("connection refused"), "{e}");
        }
        assert_eq!(
            attempts.load(Ordering::SeqCst),
            1,
            "the waiters shared the attempt"
        );
        let later = once
            .get_or_open("x://down", || async { Ok(Arc::new("up".to_string())) })
            .await
            .unwrap();
        assert_eq!(later.as_str(), "up", "a later caller tries again");
        assert!(!once.is_empty());
    }
}
