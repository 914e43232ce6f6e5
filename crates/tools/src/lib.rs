//! The tools around the coordinator, each a subcommand of `jobfence` (on
//! by default, behind the binary's `tools` feature, so a serve-and-operate
//! binary links none of them):
//!
//! - [`demo`]: `jobfence demo`, the main job: refunds through coordinators
//!   with real failures, ending in `invariant: OK`.
//! - [`bench`]: `jobfence bench`, the coordinator against workers running
//!   the SQL themselves.
//! - [`refund_worker`]: `jobfence refund-worker`, the Rust refund worker,
//!   built on the worker SDK like any other worker.
//! - [`procs`]: the child processes the demo and the benchmark start.
//!
//! Nothing here is linked by the server; they drive it from outside, as
//! processes, through gRPC.

pub mod bench;
pub mod demo;
pub mod procs;
pub mod refund_worker;
