//! The provider's time source: real monotonic time plus a skew that tests
//! move forward, so retention, pending settlement, read lag and the rate
//! limit can be tested without sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A clock shared by one provider and whoever holds a clone of it.
///
/// [`Clock::now`] is `Instant::now()` plus everything passed to
/// [`Clock::advance`]; a [`Clock::manual`] clock does not move on its own at
/// all. Only the provider's own bookkeeping (idempotency retention,
/// `pending_for`, read lag, the rate limit and its per-second counts)
/// follows it; injected latency and hangs are real time, because the
/// client's timeout is.
#[derive(Debug, Clone)]
pub struct Clock {
    origin: Instant,
    origin_unix_secs: u64,
    /// Real time passes on this clock (false: only `advance` moves it).
    running: bool,
    skew_ns: Arc<AtomicU64>,
}

impl Default for Clock {
    fn default() -> Self {
        Clock {
            origin: Instant::now(),
            origin_unix_secs: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            running: true,
            skew_ns: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl Clock {
    /// A clock that starts at real time.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock that stands still until [`Clock::advance`] moves it: a test
    /// that counts requests per second or waits for a rate limit to refill
    /// then knows exactly what time the provider sees.
    pub fn manual() -> Self {
        Clock {
            running: false,
            ..Self::default()
        }
    }

    /// Now, on this clock.
    pub fn now(&self) -> Instant {
        let base = if self.running {
            Instant::now()
        } else {
            self.origin
        };
        base + Duration::from_nanos(self.skew_ns.load(Ordering::SeqCst))
    }

    /// Moves this clock (and every clone) forward by `by` (nanosecond
    /// resolution). It never goes back.
    pub fn advance(&self, by: Duration) {
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.skew_ns.fetch_add(ns, Ordering::SeqCst);
    }

    /// `at` as Unix seconds.
    pub fn unix_secs(&self, at: Instant) -> u64 {
        self.origin_unix_secs + at.saturating_duration_since(self.origin).as_secs()
    }

    /// How long after this clock's start `at` is.
    pub fn since_start(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.origin)
    }
}
