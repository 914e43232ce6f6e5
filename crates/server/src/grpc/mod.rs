//! gRPC adapters: each RPC takes the request, converts it to a domain call,
//! awaits the coordinator, and maps the error through [`status`].
//!
//! - `job_coordinator.rs`: the worker-facing `JobCoordinator`.
//! - `job_admin.rs`: the operator service `JobAdmin`.
//! - `events.rs`: the events feed `JobEvents` (ListEvents, WatchEvents).

pub mod convert;
pub mod events;
mod job_admin;
mod job_coordinator;
mod providers;
pub mod status;

pub use events::JobEventsService;
pub use job_admin::JobAdminService;
pub use job_coordinator::JobCoordinatorService;

use jobfence_auth::{self as auth, Action, Caller, Refusal};
use jobfence_domain::{CoordinatorError, QueueScope};
use jobfence_metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};
use tracing::Span;

/// The last step of every handler: records the outcome (`ok` or the
/// ErrorInfo reason) on the RPC's span and converts the error. A
/// `QUEUE_NOT_ALLOWED` refusal is also counted and logged, like every
/// refusal for who the caller is.
pub(crate) fn finish<T>(
    metrics: &Metrics,
    result: Result<T, CoordinatorError>,
) -> Result<Response<T>, Status> {
    match result {
        Ok(v) => {
            Span::current().record("outcome", "ok");
            Ok(Response::new(v))
        }
        Err(e) => {
            let (_, reason) = status::code_and_reason(&e);
            Span::current().record("outcome", reason);
            if let CoordinatorError::QueueNotAllowed { .. } = &e {
                metrics.auth_refusal(reason);
                tracing::warn!(reason, error = %e, "call refused");
            }
            Err(status::to_status(e))
        }
    }
}

/// A refusal decided by a handler (a webhook's observation source, an
/// operator name): counted, logged, recorded on the span, answered.
/// `extensions` are the request's (they carry its method and peer).
pub(crate) fn refused(
    metrics: &Metrics,
    extensions: &tonic::Extensions,
    refusal: Refusal,
) -> Status {
    let (_, reason) = status::refusal_code_and_reason(&refusal);
    Span::current().record("outcome", reason);
    let method = extensions
        .get::<auth::layer::CalledMethod>()
        .map(|m| m.0.as_str())
        .unwrap_or("");
    let peer = extensions.get::<auth::layer::Peer>();
    auth::layer::refuse(metrics, &refusal, method, peer);
    Status::from(refusal)
}

/// The request's caller, recorded as the span's `caller`; `None` when the
/// server does not authenticate.
pub(crate) fn caller<T>(request: &Request<T>) -> Option<Arc<Caller>> {
    let caller = auth::caller_of(request);
    if let Some(c) = &caller {
        Span::current().record("caller", c.name.as_str());
    }
    caller
}

/// The queues `caller` may act on for `action`: every queue without
/// authentication. The authentication layer already refused a caller
/// without a role for the method, so `None` here is that same refusal.
pub(crate) fn scope(
    caller: Option<&Caller>,
    action: Action,
    method: &str,
) -> Result<QueueScope, Refusal> {
    let Some(c) = caller else {
        return Ok(QueueScope::Any);
    };
    c.scope(action).ok_or_else(|| Refusal::RoleNotAllowed {
        caller: c.name.clone(),
        roles: c.roles(),
        method: method.to_owned(),
        required: action.required_roles(),
    })
}

/// A call's deadline from its `grpc-timeout` value (gRPC over HTTP/2: an
/// integer of at most 8 digits and a unit H, M, S, m, u or n).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}
