//! The Rust worker SDK of jobfence: a typed client over
//! `jobfence.v1.JobCoordinator` that makes the protocol hard to misuse.
//! It depends on the API (the crate `jobfence-api`, generated from
//! `proto/`) and on tonic, prost and tokio; nothing of the coordinator.
//!
//! - [`WorkerClient::claim`] / [`WorkerClient::takeover`] hand out
//!   [`ClaimedJob`] handles, and only a committed claim does: an unclear
//!   one (lost commit, expired deadline, transport error) yields no handle
//!   at all, so a worker never acts on a job it may not hold (docs/design.md
//!   rule 4).
//! - Every write goes through the handle, which presents its attempt
//!   (the fencing token); refusals come back as [`WriteError`] variants
//!   read from the coordinator's `google.rpc.ErrorInfo`, never as strings
//!   (rule 3).
//! - [`ClaimedJob::operation_key`] is the one key to send to the provider;
//!   the attempt is readable for logs only.
//! - [`WorkerClient::enqueue`] adds an [`Enqueue`]: a job with, when
//!   asked, a delay, a fairness key (claims go round-robin across a
//!   queue's keys) and a priority (docs/design.md rule 18); the job it
//!   returns, like [`ClaimedJob::priority`] and
//!   [`ClaimedJob::fairness_key`], says what it was given.
//! - A provider success that can no longer be written back (superseded) is
//!   kept as an observation instead of being dropped (rule 7).
//! - [`WorkerClient::run`] (the same loop as [`Worker::run`]) runs a
//!   [`Handler`] on up to `max_in_flight` jobs at a time, claims only for
//!   free slots, and shuts down gracefully: the run loop every jobfence
//!   client has (docs/workers.md, "The clients side by side").
//! - Calls are retried with exponential backoff and jitter only where a
//!   repeat cannot do harm (see [`WorkerClient::claim`] for why a Claim is
//!   not one of them); a refusal for who the caller is
//!   ([`WriteError::Denied`], [`ClaimError::Denied`]) never is.
//! - A coordinator that names another API major version in its
//!   `jobfence-api-version` header is refused: [`WriteError::ApiVersion`],
//!   [`ClaimError::ApiVersion`] (one without the header is accepted).
//! - [`Credentials`]: TLS (a CA, optionally a client certificate) and a
//!   bearer token, for a coordinator that authenticates its callers.
//! - With the cargo feature `otel`, every call carries the caller's W3C
//!   `traceparent` (the current OpenTelemetry context, e.g. that of an
//!   entered `tracing` span under `tracing-opentelemetry`), so the
//!   coordinator's span of the call joins the caller's trace.
//!
//! ```no_run
//! use jobfence_worker::{ClaimedJob, Handler, HandlerError, Worker, WorkerClient, WorkerConfig};
//!
//! struct Refunds;
//!
//! impl Handler for Refunds {
//!     async fn handle(&self, job: &mut ClaimedJob) -> Result<(), HandlerError> {
//!         // Send job.operation_key() to the provider as the idempotency key
//!         // (or ask it what happened, if job.next_action() is RECONCILE)...
//!         let refund_id = "re_123";
//!         job.complete(refund_id, r#"{"status":"succeeded"}"#).await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let config = WorkerConfig {
//!     max_in_flight: 4,
//!     // JOBFENCE_TLS_CA, JOBFENCE_TOKEN_FILE, ...
//!     credentials: jobfence_worker::Credentials::from_env()?,
//!     ..WorkerConfig::new("refund-worker-1", "refunds")
//! };
//! let client = WorkerClient::connect("http://127.0.0.1:50051", config).await?;
//! let report = Worker::new(client)
//!     .run(Refunds, async {
//!         let _ = tokio::signal::ctrl_c().await;
//!     })
//!     .await;
//! println!("{report:?}");
//! # Ok(())
//! # }
//! ```

// Every public item says its units and the rule it implements.
#![deny(missing_docs)]

mod client;
pub mod credentials;
mod enqueue;
mod error;
mod handle;
mod next;
pub mod reason;
mod retry;
mod runner;
mod trace;
mod version;

/// The generated protobuf messages and clients of `jobfence.v1` (the crate
/// `jobfence-api`), for the types the handles return ([`proto::Job`],
/// [`proto::Observation`], …) and for calls the SDK does not wrap.
pub mod proto {
    pub use jobfence_api::v1::*;
}

pub use client::{WorkerClient, WorkerConfig, MAX_IN_FLIGHT};
pub use credentials::{Authorization, BearerToken, Credentials};
pub use enqueue::{Enqueue, Enqueued};
pub use error::{ClaimError, ConnectError, WriteError};
pub use handle::{observation_dedup_key, ClaimedJob, Disposition, FailWritten, Recorded, Written};
pub use retry::RetryPolicy;
pub use runner::{Handler, HandlerError, RunReport, Worker};
pub use version::ApiVersionError;
