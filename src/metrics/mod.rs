//! Prometheus metrics: the registry is the crate `jobfence-metrics`; here
//! are the parts that need a server, and the gauges read from the stores.
//!
//! - [`layer`]: the RPC latency histogram, as a tower layer on the server.
//! - [`http`]: the `/metrics` HTTP endpoint.

pub mod http;
pub mod layer;

pub use jobfence_core::gauges::{refresh_pending, refresh_pending_all};
pub use jobfence_metrics::*;
