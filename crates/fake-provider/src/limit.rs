//! The provider's own rate limit, as a real payment provider has one
//! (Stripe: 100 requests/s per account in live mode, HTTP 429 past it), and
//! the request counts that show whether its callers stayed under it.
//!
//! One GCRA budget (the token bucket's single-timestamp form) covers every
//! `/v1` request, creates and lookups alike. It runs on the provider's
//! [`Clock`], so a test on a [`Clock::manual`] clock knows exactly which
//! request is refused and for how long.

use super::clock::Clock;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Largest rate accepted, requests per second (an emission interval of 1 µs).
pub const MAX_RATE_PER_SECOND: f64 = 1_000_000.0;
/// Largest burst accepted, requests.
pub const MAX_BURST: u32 = 1_000_000;

/// The rate limit of the `/v1` API. `GET`/`PUT /_admin/rate-limit` read and
/// replace it; fields left out of a `PUT` body are `null`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Requests per second over all `/v1` endpoints together; fractions
    /// allowed (0.5: one request every 2 s). `None`: no limit.
    pub rate_per_second: Option<f64>,
    /// Requests that may arrive at once after a quiet spell. `None`: one
    /// second's worth, `ceil(rate_per_second)`, at least 1. Read back, it is
    /// the value in force (`None` only without a limit).
    pub burst: Option<u32>,
}

impl RateLimitConfig {
    /// A limit of `rate` requests per second with the default burst.
    pub fn per_second(rate: f64) -> Self {
        RateLimitConfig {
            rate_per_second: Some(rate),
            burst: None,
        }
    }

    /// Checks the rate is positive, finite and at most
    /// [`MAX_RATE_PER_SECOND`], the burst 1..=[`MAX_BURST`], and that no
    /// burst is given without a rate.
    pub fn validate(&self) -> Result<(), String> {
        match (self.rate_per_second, self.burst) {
            (None, None) => Ok(()),
            (None, Some(_)) => Err("burst needs a rate_per_second".to_owned()),
            (Some(rate), burst) => {
                if !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE_PER_SECOND) {
                    return Err(format!(
                        "rate_per_second must be a positive number up to {MAX_RATE_PER_SECOND}, got {rate}"
                    ));
                }
                match burst {
                    Some(b) if b == 0 || b > MAX_BURST => {
                        Err(format!("burst must be in 1..={MAX_BURST}, got {b}"))
                    }
                    _ => Ok(()),
                }
            }
        }
    }

    /// The burst filled in when left to its default.
    fn resolved(self) -> Self {
        RateLimitConfig {
            burst: self.rate_per_second.map(|rate| {
                self.burst.unwrap_or_else(|| {
                    // Validated: 0 < rate <= 1e6, so this fits.
                    (rate.ceil() as u32).max(1)
                })
            }),
            ..self
        }
    }
}

/// What the provider counted since it started (`GET /_admin/stats`,
/// [`ProviderHandle::stats`](super::ProviderHandle::stats)). Only `/v1`
/// requests count; `/_admin` and `/healthz` are neither limited nor counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProviderStats {
    /// `/v1` requests received, refused ones included.
    pub requests: u64,
    /// Of those, refused with `429` by the rate limit (nothing done).
    pub rate_limited: u64,
    /// The most `/v1` requests received within one second: the provider's
    /// clock since its start is cut into windows `[k s, (k+1) s)`, and every
    /// request (refused ones included) counts in the window it arrived in.
    pub peak_requests_per_second: u64,
    /// The rate limit in force.
    pub rate_limit: RateLimitConfig,
}

/// Budget and counts, behind one lock held for no `.await`.
#[derive(Debug)]
struct State {
    config: RateLimitConfig,
    /// GCRA's theoretical arrival time; `None`: the full burst is available.
    tat: Option<Instant>,
    requests: u64,
    rate_limited: u64,
    window: u64,
    in_window: u64,
    peak: u64,
}

/// Admits or refuses each `/v1` request. Shared by all connections.
#[derive(Debug)]
pub struct RateLimiter {
    clock: Clock,
    state: Mutex<State>,
}

impl RateLimiter {
    /// A limiter with `config` (after [`RateLimitConfig::validate`]).
    pub fn new(config: RateLimitConfig, clock: Clock) -> Self {
        RateLimiter {
            clock,
            state: Mutex::new(State {
                config: config.resolved(),
                tat: None,
                requests: 0,
                rate_limited: 0,
                window: 0,
                in_window: 0,
                peak: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("rate limiter lock poisoned")
    }

    /// Counts one request and decides it: `Err(wait)` when it is over the
    /// limit, `wait` being how long until one more request would be
    /// admitted (always positive).
    pub fn admit(&self) -> Result<(), Duration> {
        let mut s = self.lock();
        // Read under the lock, so decisions see the clock in order.
        let now = self.clock.now();
        s.requests += 1;
        let window = self.clock.since_start(now).as_secs();
        if window != s.window {
            s.window = window;
            s.in_window = 0;
        }
        s.in_window += 1;
        s.peak = s.peak.max(s.in_window);
        let (Some(rate), Some(burst)) = (s.config.rate_per_second, s.config.burst) else {
            return Ok(());
        };
        // GCRA: emission interval T = 1/rate, tolerance τ = burst × T; a
        // request is admitted when max(TAT, now) + T <= now + τ.
        let interval = Duration::from_secs_f64(1.0 / rate);
        let tolerance = interval * burst;
        let base = s.tat.map_or(now, |tat| tat.max(now));
        let next = base + interval;
        if next <= now + tolerance {
            s.tat = Some(next);
            Ok(())
        } else {
            s.rate_limited += 1;
            Err(next - tolerance - now)
        }
    }

    /// The limit in force.
    pub fn config(&self) -> RateLimitConfig {
        self.lock().config
    }

    /// Replaces the limit (after [`RateLimitConfig::validate`]) and returns
    /// the one now in force. The budget starts full again; the counts go on.
    pub fn set_config(&self, config: RateLimitConfig) -> Result<RateLimitConfig, String> {
        config.validate()?;
        let mut s = self.lock();
        s.config = config.resolved();
        s.tat = None;
        Ok(s.config)
    }

    /// The counts so far.
    pub fn stats(&self) -> ProviderStats {
        let s = self.lock();
        ProviderStats {
            requests: s.requests,
            rate_limited: s.rate_limited,
            peak_requests_per_second: s.peak,
            rate_limit: s.config,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_request_per_interval() {
        let clock = Clock::manual();
        let limiter = RateLimiter::new(RateLimitConfig::per_second(4.0), clock.clone());
        assert_eq!(limiter.config().burst, Some(4));
        for _ in 0..4 {
            assert_eq!(limiter.admit(), Ok(()));
        }
        assert_eq!(limiter.admit(), Err(Duration::from_millis(250)));
        clock.advance(Duration::from_millis(100));
        assert_eq!(limiter.admit(), Err(Duration::from_millis(150)));
        clock.advance(Duration::from_millis(150));
        assert_eq!(limiter.admit(), Ok(()));
        assert_eq!(limiter.admit(), Err(Duration::from_millis(250)));
        let stats = limiter.stats();
        assert_eq!(
            (
                stats.requests,
                stats.rate_limited,
                stats.peak_requests_per_second
            ),
            (8, 3, 8)
        );
    }

    #[test]
    fn the_peak_is_per_one_second_window() {
        let clock = Clock::manual();
        let limiter = RateLimiter::new(RateLimitConfig::default(), clock.clone());
        for _ in 0..3 {
            limiter.admit().unwrap();
        }
        clock.advance(Duration::from_secs(1));
        for _ in 0..5 {
            limiter.admit().unwrap();
        }
        clock.advance(Duration::from_secs(1));
        limiter.admit().unwrap();
        assert_eq!(limiter.stats().peak_requests_per_second, 5);
        assert_eq!(limiter.stats().rate_limited, 0);
    }

    #[test]
    fn fractional_rates_and_bad_limits() {
        let clock = Clock::manual();
        let limiter = RateLimiter::new(RateLimitConfig::per_second(0.5), clock.clone());
        assert_eq!(limiter.config().burst, Some(1));
        assert_eq!(limiter.admit(), Ok(()));
        assert_eq!(limiter.admit(), Err(Duration::from_secs(2)));
        for bad in [
            RateLimitConfig::per_second(0.0),
            RateLimitConfig::per_second(f64::NAN),
            RateLimitConfig::per_second(2e6),
            RateLimitConfig {
                rate_per_second: Some(1.0),
                burst: Some(0),
            },
            RateLimitConfig {
                rate_per_second: None,
                burst: Some(3),
            },
        ] {
            assert!(limiter.set_config(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            limiter.set_config(RateLimitConfig::default()),
            Ok(RateLimitConfig::default())
        );
        assert_eq!(limiter.admit(), Ok(()), "no limit any more");
    }
}
