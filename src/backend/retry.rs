//! One retry loop for the stores and the backends' own calls: a bounded number of attempts, with an exponential pause
//! and random jitter between them.

use std::future::Future;
use std::time::Duration;

/// How often to try, and how long to pause between tries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Attempts in all (at least 1).
    pub attempts: u32,
    /// The pause after the first attempt; it doubles after each further one (up to 32×).
    pub base: Duration,
    /// Up to this much random time is added to each pause, so competing callers spread.
    pub jitter: Duration,
}

impl Backoff {
    /// `attempts` tries, one right after the other.
    pub const fn immediate(attempts: u32) -> Self {
        Backoff {
            attempts,
            base: Duration::ZERO,
            jitter: Duration::ZERO,
        }
    }

    /// The pause after attempt `attempt` (0-based) failed.
    pub fn pause(&self, attempt: u32) -> Duration {
        let jitter = match self.jitter.as_micros() {
            0 => Duration::ZERO,
            max => Duration::from_micros((uuid::Uuid::new_v4().as_u128() % max) as u64),
        };
        self.base * (1u32 << attempt.min(5)) + jitter
    }
}

/// What a failed attempt says.
#[derive(Debug)]
pub enum Retry<E> {
    /// Try again; the error is the answer when no attempt is left.
    Again(E),
    /// Give up now with this error.
    Stop(E),
}

impl<E> From<E> for Retry<E> {
    fn from(e: E) -> Self {
        Retry::Stop(e)
    }
}

/// Calls `attempt(n)` for n = 0, 1, … until it succeeds, stops, or `policy.attempts` are
/// used, pausing as `policy` says between attempts (never after the last).
pub async fn retry<T, E, F, Fut>(policy: Backoff, mut attempt: F) -> Result<T, E>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, Retry<E>>>,
{
    let mut n = 0;
    loop {
        match attempt(n).await {
            Ok(value) => return Ok(value),
            Err(Retry::Again(e)) if n + 1 >= policy.attempts.max(1) => return Err(e),
            Err(Retry::Again(_)) => {
                let pause = policy.pause(n);
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
                n += 1;
            }
            Err(Retry::Stop(e)) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stops_after_the_attempts_and_on_stop() {
        let mut calls = 0;
        let r: Result<(), &str> = retry(Backoff::immediate(3), |_| {
            calls += 1;
            async { Err(Retry::Again("again")) }
        })
        .await;
        assert_eq!((r, calls), (Err("again"), 3));
        let mut calls = 0;
        let r: Result<(), &str> = retry(Backoff::immediate(3), |_| {
            calls += 1;
            async { Err(Retry::Stop("stop")) }
        })
        .await;
        assert_eq!((r, calls), (Err("stop"), 1));
        let r: Result<u32, &str> = retry(Backoff::immediate(3), |n| async move {
            if n < 2 {
                Err(Retry::Again("again"))
            } else {
                Ok(n)
            }
        })
        .await;
        assert_eq!(r, Ok(2));
    }

    #[test]
    fn pauses_double_with_jitter() {
        let policy = Backoff {
            attempts: 5,
            base: Duration::from_millis(50),
            jitter: Duration::from_millis(100),
        };
        for (attempt, base) in [(0, 50), (1, 100), (3, 400), (9, 1600)] {
            let pause = policy.pause(attempt);
            assert!(pause >= Duration::from_millis(base), "{pause:?}");
            assert!(pause < Duration::from_millis(base + 100), "{pause:?}");
        }
    }
}
