//! Exponential backoff with jitter, and the retry loop the SDK wraps
//! around the calls that are safe to repeat.
//!
//! Which calls are safe is decided by the caller of [`retry`], not here:
//! a fenced write (Complete, Fail, RenewLease) is, because the coordinator
//! recognises an already-applied call and answers it as a replay; an
//! observation is, because it is de-duplicated on its key; a Claim is only
//! when the coordinator said nothing was applied (see
//! [`WorkerClient::claim`](super::WorkerClient::claim)).

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tonic::Status;

/// How patiently a retryable call is repeated: for a time budget, not a
/// number of tries, so that a worker rides through a database outage or a
/// coordinator restart without its handler seeing an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// How long one call keeps being retried, counted from its first try:
    /// no retry starts whose backoff would end past it. The default, 30 s,
    /// outlasts a 10-second database outage with room to spare; zero
    /// turns retrying off.
    pub budget: Duration,
    /// Backoff before the first retry; doubles with every retry.
    pub initial_backoff: Duration,
    /// Upper bound of one backoff.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// A 30 s budget, backoff from 50 ms doubling up to 2 s (the same in
    /// every jobfence client).
    fn default() -> Self {
        RetryPolicy {
            budget: Duration::from_secs(30),
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1 for the first retry):
    /// `initial_backoff * 2^(retry-1)`, capped at `max_backoff`, of which a
    /// random half is dropped ("equal jitter"), so workers that failed
    /// together do not come back together, yet none retries at once.
    pub fn backoff(&self, retry: u32) -> Duration {
        let exp = retry.saturating_sub(1).min(31);
        let ceiling = self
            .initial_backoff
            .saturating_mul(1u32 << exp)
            .min(self.max_backoff);
        let half = ceiling / 2;
        half + half.mul_f64(unit_random())
    }
}

/// A value in [0, 1) that differs from call to call, without a random
/// number crate: std's `RandomState` is seeded randomly per process and
/// per thread, and the counter makes consecutive calls differ.
fn unit_random() -> f64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The server's hint of how long to wait before trying again
/// (`google.rpc.RetryInfo`, sent with OVERLOADED), if the status has one.
pub(crate) fn retry_after(status: &Status) -> Option<Duration> {
    use tonic_types::StatusExt;
    status.get_details_retry_info()?.retry_delay
}

/// Runs `op` until it succeeds, fails with a status `retryable` rejects, or
/// the policy's budget would be overrun by the next wait; returns the last
/// result. Between tries it waits the policy's backoff, or the server's
/// retry-after hint when that is longer, and adds one to `retries`.
pub(crate) async fn retry<T, F, Fut>(
    policy: &RetryPolicy,
    retries: &AtomicU64,
    retryable: impl Fn(&Status) -> bool,
    mut op: F,
) -> Result<T, Status>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let started = tokio::time::Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        match op().await {
            Err(status) if retryable(&status) => {
                let wait = policy
                    .backoff(tries)
                    .max(retry_after(&status).unwrap_or_default());
                if started.elapsed() + wait > policy.budget {
                    return Err(status);
                }
                retries.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(tries, code = ?status.code(), wait_ms = wait.as_millis() as u64, "retrying");
                tokio::time::sleep(wait).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_keeps_half() {
        let p = RetryPolicy {
            budget: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        };
        for _ in 0..100 {
            let first = p.backoff(1);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let third = p.backoff(3);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
            let late = p.backoff(30);
            assert!(late >= Duration::from_millis(500) && late <= Duration::from_secs(1));
        }
        assert!(p.backoff(u32::MAX) <= Duration::from_secs(1));
    }

    #[test]
    fn jitter_spreads() {
        let p = RetryPolicy::default();
        let draws: std::collections::HashSet<_> = (0..50).map(|_| p.backoff(4)).collect();
        assert!(draws.len() > 10, "jitter should vary: {draws:?}");
    }

    #[test]
    fn the_servers_retry_after_hint_is_read_from_the_status() {
        use tonic_types::{ErrorDetails, StatusExt};
        let hinted = Status::with_error_details(
            tonic::Code::ResourceExhausted,
            "busy",
            ErrorDetails::with_retry_info(Some(Duration::from_millis(700))),
        );
        assert_eq!(retry_after(&hinted), Some(Duration::from_millis(700)));
        assert_eq!(retry_after(&Status::unavailable("gone")), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_waits_at_least_the_servers_hint() {
        use tonic_types::{ErrorDetails, StatusExt};
        let p = RetryPolicy {
            budget: Duration::from_secs(5),
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        };
        let started = tokio::time::Instant::now();
        let mut calls = 0;
        let out: Result<(), Status> = retry(
            &p,
            &AtomicU64::new(0),
            |_| true,
            || {
                calls += 1;
                let first = calls == 1;
                async move {
                    if first {
                        Err(Status::with_error_details(
                            tonic::Code::ResourceExhausted,
                            "busy",
                            ErrorDetails::with_retry_info(Some(Duration::from_secs(3))),
                        ))
                    } else {
                        Ok(())
                    }
                }
            },
        )
        .await;
        assert!(out.is_ok());
        assert!(
            started.elapsed() >= Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_the_first_non_retryable_status_and_counts_retries() {
        let p = RetryPolicy {
            budget: Duration::from_secs(5),
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        };
        let retries = AtomicU64::new(0);
        let mut calls = 0;
        let out: Result<(), Status> = retry(
            &p,
            &retries,
            |s| s.code() == tonic::Code::Unavailable,
            || {
                calls += 1;
                let status = if calls < 3 {
                    Status::unavailable("down")
                } else {
                    Status::failed_precondition("superseded")
                };
                async move { Err(status) }
            },
        )
        .await;
        assert_eq!(out.unwrap_err().code(), tonic::Code::FailedPrecondition);
        assert_eq!(calls, 3);
        assert_eq!(retries.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_for_the_budget_not_for_a_number_of_tries() {
        // The default policy against a 10 s outage: every try before it
        // ends fails, the first after it succeeds, and no retry is given up.
        let p = RetryPolicy::default();
        let retries = AtomicU64::new(0);
        let started = tokio::time::Instant::now();
        let out: Result<(), Status> = retry(
            &p,
            &retries,
            |_| true,
            || {
                let down = started.elapsed() < Duration::from_secs(10);
                async move {
                    if down {
                        Err(Status::unavailable("down"))
                    } else {
                        Ok(())
                    }
                }
            },
        )
        .await;
        assert!(out.is_ok());
        assert!(retries.load(Ordering::Relaxed) > 5);
        // An outage longer than the budget: given up before the budget ends.
        let started = tokio::time::Instant::now();
        let out: Result<(), Status> = retry(
            &p,
            &retries,
            |_| true,
            || async { Err(Status::unavailable("down")) },
        )
        .await;
        assert!(out.is_err());
        assert!(started.elapsed() <= p.budget, "{:?}", started.elapsed());
        // A zero budget: one try.
        let mut calls = 0;
        let none = RetryPolicy {
            budget: Duration::ZERO,
            ..p
        };
        let _: Result<(), Status> = retry(
            &none,
            &retries,
            |_| true,
            || {
                calls += 1;
                async { Err(Status::unavailable("down")) }
            },
        )
        .await;
        assert_eq!(calls, 1);
    }
}
