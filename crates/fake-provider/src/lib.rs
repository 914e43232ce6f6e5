//! A fake payment provider with a Stripe-style refund API, for the demo and
//! the tests: idempotency keys that expire, refunds that stay `pending` for a
//! while, injected faults (latency, hangs, responses cut after the refund
//! was made, 503s, read-after-write lag) and a rate limit of its own (429
//! with `Retry-After`). Its ledger tells how many refunds
//! really moved money, which is what jobfence's fencing must keep at one per
//! `operation_key`. See `docs/fake-provider.md`.
//!
//! - [`model`]: wire types, shared with the client.
//! - `state`: refunds, idempotency keys, the ledger.
//! - [`faults`]: which faults hit a request.
//! - [`limit`]: the rate limit and the request counts.
//! - `api`: HTTP routes; `server`: the accept loop, [`spawn`].
//! - [`client`]: the typed client workers use.
//! - [`cli`]: `jobfence fake-provider`.
//! - [`netcut`]: a relay that fakes the network's failures (cut, lost
//!   answers) in front of the database or a coordinator.

mod api;
pub mod cli;
pub mod client;
pub mod clock;
pub mod faults;
pub mod limit;
pub mod model;
pub mod netcut;
mod server;
mod state;

pub use api::{IDEMPOTENCY_KEY_HEADER, IDEMPOTENT_REPLAYED_HEADER, RETRY_AFTER_MS_HEADER};
pub use client::{ProviderClient, ProviderError};
pub use clock::Clock;
pub use faults::{FaultConfig, FaultKind, FAULT_HEADER};
pub use limit::{ProviderStats, RateLimitConfig};
pub use model::{Ledger, LedgerEntry, Refund, RefundParams, RefundStatus};
pub use server::{serve, spawn, ProviderHandle};
pub use state::FAILING_PAYMENT_PREFIX;

use state::Settlement;
use std::time::Duration;

/// How a fake provider behaves.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// How long an idempotency key is remembered, from its first use
    /// (Stripe: 24 h). After it, the same key makes a new refund.
    pub idempotency_retention: Duration,
    /// Share (0..=1) of new refunds that stay `pending` for `pending_for`.
    pub pending_ratio: f64,
    /// How long a pending refund stays pending before it settles.
    pub pending_for: Duration,
    /// Fault probabilities at start (`PUT /_admin/faults` changes them).
    pub faults: FaultConfig,
    /// Rate limit of the `/v1` API at start (default: none; `PUT
    /// /_admin/rate-limit` changes it).
    pub rate_limit: RateLimitConfig,
    /// Seed of the RNGs (faults, pending draw, refund ids); `None`: random.
    pub seed: Option<u64>,
    /// Time source; keep a clone to [`Clock::advance`] it in tests.
    pub clock: Clock,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            idempotency_retention: Duration::from_secs(24 * 3600),
            pending_ratio: 0.0,
            pending_for: Duration::from_secs(2),
            faults: FaultConfig::default(),
            rate_limit: RateLimitConfig::default(),
            seed: None,
            clock: Clock::new(),
        }
    }
}

impl ProviderConfig {
    /// Checks the probabilities are within 0..=1 and the rate limit is
    /// valid ([`RateLimitConfig::validate`]).
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.pending_ratio) {
            return Err(format!(
                "pending_ratio must be in 0..=1, got {}",
                self.pending_ratio
            ));
        }
        self.faults.validate()?;
        self.rate_limit.validate()
    }

    fn settlement(&self) -> Settlement {
        Settlement {
            idempotency_retention: self.idempotency_retention,
            pending_ratio: self.pending_ratio,
            pending_for: self.pending_for,
        }
    }
}
