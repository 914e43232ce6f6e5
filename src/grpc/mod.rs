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

use crate::domain::CoordinatorError;
use tonic::{Response, Status};
use tracing::Span;

/// The last step of every handler: records the outcome (`ok` or the
/// ErrorInfo reason) on the RPC's span and converts the error.
pub(crate) fn finish<T>(result: Result<T, CoordinatorError>) -> Result<Response<T>, Status> {
    match result {
        Ok(v) => {
            Span::current().record("outcome", "ok");
            Ok(Response::new(v))
        }
        Err(e) => {
            let (_, reason) = status::code_and_reason(&e);
            Span::current().record("outcome", reason);
            Err(e.into())
        }
    }
}
