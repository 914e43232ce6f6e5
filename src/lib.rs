//! jobfence: a job coordinator that fences every write back with an
//! `attempt` (fencing token), so a worker whose lease was taken over can
//! never change the job again, however late it wakes up.
//!
//! Layers, from the wire down:
//! - [`grpc`]: tonic adapters: proto ⇄ domain, errors → `tonic::Status`.
//! - [`coordinator`]: request validation, lease bounds, queue policy.
//! - [`store`]: MySQL; the SQL, transactions and fencing conditions.
//! - [`domain`]: the job model and the pure rules of DESIGN.md.
//! - [`server`]: assembly (health, reflection, TLS, limits, graceful
//!   shutdown).
//! - [`auth`]: callers, roles and the layer that authenticates every call;
//!   [`security_cli`] is its command line (`jobfence credentials`).
//! - [`metrics`]: Prometheus metrics and their HTTP endpoint.
//! - [`admin_cli`]: the operator commands (`jobfence jobs …`, `jobfence stats`).
//! - [`console`]: the operator web console, another adapter over the
//!   coordinator's operator calls (`jobfence serve --console-listen`).
//!
//! Beside them, [`bench`] measures the coordinator against workers running
//! the SQL themselves, and [`provider`] is a fake payment provider (Stripe-style refunds
//! with fault injection) that the demo and the tests run against. The worker
//! SDK is the crate `jobfence-worker` (`sdk/rust`), which [`refund_worker`]
//! uses like any other worker would.

pub use jobfence_auth as auth;
pub use jobfence_operator as admin_cli;
pub use jobfence_tools::bench;
pub use jobfence_tools::procs;
pub mod cli;
pub use jobfence_console as console;
pub use jobfence_core as coordinator;
pub use jobfence_domain as domain;
pub use jobfence_server::grpc;
pub use jobfence_tools::demo;
/// Prometheus metrics: the crate `jobfence-metrics`, and the gauges the
/// coordinator reads from the stores.
pub mod metrics {
    pub use jobfence_core::gauges::{refresh_pending, refresh_pending_all};
    pub use jobfence_metrics::*;
}
pub use jobfence_fake_provider as provider;
pub use jobfence_tools::refund_worker;
pub mod security_cli;
pub use jobfence_server as server;
pub mod signal;
pub use jobfence_store as store;

/// Generated protobuf and gRPC code for `jobfence.v1`: the crate
/// `jobfence-api` (`proto/`).
pub mod proto {
    pub use jobfence_api::v1::*;
    pub use jobfence_api::FILE_DESCRIPTOR_SET;
}
