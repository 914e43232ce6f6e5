//! The provider's time source: real monotonic time plus a skew that tests
//! move forward, so retention, pending settlement and read lag can be tested
//! without sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A clock shared by one provider and whoever holds a clone of it.
///
/// [`Clock::now`] is `Instant::now()` plus everything passed to
/// [`Clock::advance`]. Only the provider's own bookkeeping (idempotency
/// retention, `pending_for`, read lag) follows it; injected latency and hangs
/// are real time, because the client's timeout is.
#[derive(Debug, Clone)]
pub struct Clock {
    origin: Instant,
    origin_unix_secs: u64,
    skew_ms: Arc<AtomicU64>,
}

impl Default for Clock {
    fn default() -> Self {
        Clock {
            origin: Instant::now(),
            origin_unix_secs: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            skew_ms: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl Clock {
    /// A clock that starts at real time.
    pub fn new() -> Self {
        Self::default()
    }

    /// Now, on this clock.
    pub fn now(&self) -> Instant {
        Instant::now() + Duration::from_millis(self.skew_ms.load(Ordering::SeqCst))
    }

    /// Moves this clock (and every clone) forward by `by` (millisecond
    /// resolution). It never goes back.
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.skew_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// `at` as Unix seconds.
    pub fn unix_secs(&self, at: Instant) -> u64 {
        self.origin_unix_secs + at.saturating_duration_since(self.origin).as_secs()
    }
}
