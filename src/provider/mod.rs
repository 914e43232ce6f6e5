//! A fake payment provider with a Stripe-style refund API, for the demo and
//! the tests: idempotency keys that expire, refunds that stay `pending` for a
//! while, and injected faults (latency, hangs, responses cut after the refund
//! was made, 503s, read-after-write lag). Its ledger tells how many refunds
//! really moved money, which is what jobfence's fencing must keep at one per
//! `operation_key`. See `docs/fake-provider.md`.
//!
//! - [`model`]: wire types, shared with the client.
//! - [`faults`]: which faults hit a request.
//! - [`clock`]: the provider's time, which tests move forward.

pub mod clock;
pub mod faults;
pub mod model;

pub use clock::Clock;
pub use faults::{FaultConfig, FaultKind, FAULT_HEADER};
pub use model::{Ledger, LedgerEntry, Refund, RefundParams, RefundStatus};
