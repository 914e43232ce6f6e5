//! gRPC adapters: each RPC takes the request, converts it to a domain call,
//! awaits the coordinator, and maps the error through [`status`].

pub mod convert;
mod job_coordinator;
pub mod status;

pub use job_coordinator::JobCoordinatorService;
