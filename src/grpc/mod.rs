//! gRPC adapters: each RPC takes the request, converts it to a domain call,
//! awaits the coordinator, and maps the error through [`status`].
//!
//! - `job_coordinator.rs`: the worker-facing `JobCoordinator`.
//! - `job_admin.rs`: the operator service `JobAdmin`.
//! - `events.rs`: the events feed `JobEvents` (ListEvents, WatchEvents).

pub mod codec;
pub mod convert;
pub mod events;
mod job_admin;
mod job_coordinator;
pub mod status;

pub use events::JobEventsService;
pub use job_admin::JobAdminService;
pub use job_coordinator::JobCoordinatorService;
