//! gRPC adapters: each RPC takes the request, converts it to a domain call,
//! awaits the coordinator, and maps the error through [`status`], in the
//! one shape of [`Rpc`].
//!
//! - `job_coordinator.rs`: the worker-facing `JobCoordinator`.
//! - `job_admin.rs`: the operator service `JobAdmin`.
//! - `events.rs`: the events feed `JobEvents` (ListEvents, WatchEvents).

pub mod convert;
pub mod events;
mod handoff;
mod job_admin;
mod job_coordinator;
mod providers;
mod repair;
mod settlement;
mod span_fields;
pub mod status;
mod workers;

pub use events::JobEventsService;
pub use job_admin::JobAdminService;
pub use job_coordinator::JobCoordinatorService;
pub(crate) use span_fields::{record_request, RequestFields, ResponseFields};

use jobfence_api::v1 as proto;
use jobfence_auth::{self as auth, Action, Caller, Refusal};
use jobfence_domain::validate::Violations;
use jobfence_domain::{CoordinatorError, QueueScope};
use jobfence_metrics::Metrics;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};
use tracing::Span;

/// The one shape of a gRPC handler, shared by every unary RPC: record the
/// request's fields on the RPC's span ([`RequestFields`]), authorise
/// the caller, hand the message to the call (which converts it to the
/// domain's types and awaits the coordinator), then answer: the answer's
/// fields ([`ResponseFields`]) and the outcome on the RPC's span, a
/// `QUEUE_NOT_ALLOWED` refusal counted and logged, the error mapped by
/// [`status`]. Handlers record nothing on the span themselves
/// (`span_fields.rs`). The RPC's
/// latency and status code are recorded by the layer around every service
/// (`crate::rpc_metrics`), and its span by the handler's `#[instrument]`.
///
/// Three ways to authorise, by who may call: [`scoped`](Self::scoped) (a
/// worker's or reader's call on the queues its credential covers),
/// [`operator`](Self::operator) (an operator's write, recorded under the
/// operator's name) and [`read`](Self::read) (an operator's read).
pub(crate) struct Rpc<'a> {
    metrics: &'a Metrics,
    /// The RPC's name, as a refusal for the caller's role names it.
    method: &'static str,
}

impl<'a> Rpc<'a> {
    /// The handler of `method`, counting into `metrics`.
    pub(crate) fn new(metrics: &'a Metrics, method: &'static str) -> Self {
        Rpc { metrics, method }
    }

    /// A call on the queues the caller may act on for `action`: `call`
    /// gets the message and that scope.
    pub(crate) async fn scoped<Req, Resp, Fut>(
        self,
        request: Request<Req>,
        action: Action,
        call: impl FnOnce(Req, QueueScope) -> Fut,
    ) -> Result<Response<Resp>, Status>
    where
        Req: RequestFields,
        Resp: ResponseFields,
        Fut: Future<Output = Result<Resp, CoordinatorError>>,
    {
        let scope = self.scope(&request, action)?;
        self.answer(call(request.into_inner(), scope).await)
    }

    /// An operator's write: `call` gets the message and the operator to
    /// record, the credential's name when the server authenticates (a
    /// request naming someone else is refused), else the request's
    /// `operator` field.
    pub(crate) async fn operator<Req, Resp, Fut>(
        self,
        request: Request<Req>,
        call: impl FnOnce(Req, String) -> Fut,
    ) -> Result<Response<Resp>, Status>
    where
        Req: NamesOperator + RequestFields,
        Resp: ResponseFields,
        Fut: Future<Output = Result<Resp, CoordinatorError>>,
    {
        record_request(request.get_ref());
        let caller = caller(&request);
        let requested = request.get_ref().operator();
        let operator = self.operator_for(caller.as_deref(), requested, request.extensions())?;
        Span::current().record("operator", operator.as_str());
        self.answer(call(request.into_inner(), operator).await)
    }

    /// The operator an operator's write is recorded under (see
    /// [`Refusal::operator_for`]): a blank `requested` name is refused as
    /// any blank field is (docs/api.md, "Strings"), before it is compared
    /// with the credential's.
    pub(crate) fn operator_for(
        &self,
        caller: Option<&Caller>,
        requested: &str,
        extensions: &tonic::Extensions,
    ) -> Result<String, Status> {
        let mut v = Violations::default();
        v.not_blank("operator", requested);
        v.finish().map_err(|e| self.fail(e))?;
        Refusal::operator_for(caller, requested).map_err(|r| self.refuse(extensions, r))
    }

    /// An operator's read: the caller is recorded on the span (the
    /// authentication layer already checked its role).
    pub(crate) async fn read<Req, Resp, Fut>(
        self,
        request: Request<Req>,
        call: impl FnOnce(Req) -> Fut,
    ) -> Result<Response<Resp>, Status>
    where
        Req: RequestFields,
        Resp: ResponseFields,
        Fut: Future<Output = Result<Resp, CoordinatorError>>,
    {
        record_request(request.get_ref());
        caller(&request);
        self.answer(call(request.into_inner()).await)
    }

    /// The queues the caller may act on for `action` (see [`scope`]); a
    /// caller without the role is refused. The request's fields are on
    /// the span first, refused or not.
    pub(crate) fn scope<T: RequestFields>(
        &self,
        request: &Request<T>,
        action: Action,
    ) -> Result<QueueScope, Status> {
        record_request(request.get_ref());
        let caller = caller(request);
        scope(caller.as_deref(), action, self.method)
            .map_err(|r| self.refuse(request.extensions(), r))
    }

    /// A refusal decided by the handler (a webhook's observation source,
    /// an operator name): counted, logged, recorded on the span, answered.
    /// `extensions` are the request's (they carry its method and peer).
    pub(crate) fn refuse(&self, extensions: &tonic::Extensions, refusal: Refusal) -> Status {
        let (_, reason) = status::refusal_code_and_reason(&refusal);
        Span::current().record("outcome", reason);
        let method = extensions
            .get::<auth::layer::CalledMethod>()
            .map(|m| m.0.as_str())
            .unwrap_or("");
        let peer = extensions.get::<auth::layer::Peer>();
        auth::layer::refuse(self.metrics, &refusal, method, peer);
        Status::from(refusal)
    }

    /// The last step of every handler: records the outcome (`ok` or the
    /// ErrorInfo reason) on the RPC's span and converts the error. A
    /// `QUEUE_NOT_ALLOWED` refusal is also counted and logged, like every
    /// refusal for who the caller is.
    pub(crate) fn answer<T: ResponseFields>(
        &self,
        result: Result<T, CoordinatorError>,
    ) -> Result<Response<T>, Status> {
        match result {
            Ok(v) => {
                let span = Span::current();
                v.record(&span);
                span.record("outcome", "ok");
                Ok(Response::new(v))
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// The answer of a call that streams its answers: the outcome on the
    /// RPC's span is `streaming`.
    pub(crate) fn streaming<T>(&self, stream: T) -> Result<Response<T>, Status> {
        Span::current().record("outcome", "streaming");
        Ok(Response::new(stream))
    }

    /// [`answer`](Self::answer) of an error.
    pub(crate) fn fail(&self, e: CoordinatorError) -> Status {
        let (_, reason) = status::code_and_reason(&e);
        Span::current().record("outcome", reason);
        if let CoordinatorError::QueueNotAllowed { .. } = &e {
            self.metrics.auth_refusal(reason);
            tracing::warn!(reason, error = %e, "call refused");
        }
        status::to_status(e)
    }
}

/// A request that names the operator it acts for (the JobAdmin writes).
pub(crate) trait NamesOperator {
    /// The request's `operator` field.
    fn operator(&self) -> &str;
}

macro_rules! names_operator {
    ($($request:ty),+ $(,)?) => {
        $(impl NamesOperator for $request {
            fn operator(&self) -> &str {
                &self.operator
            }
        })+
    };
}

names_operator!(
    proto::ResolveManualReviewRequest,
    proto::CancelJobRequest,
    proto::BulkRepairRequest,
    proto::RetryAsNewOperationRequest,
    proto::PauseQueueRequest,
    proto::ResumeQueueRequest,
    proto::PutProviderRequest,
    proto::DeleteProviderRequest,
    proto::PauseProviderRequest,
    proto::ResumeProviderRequest,
    proto::PutQueuePolicyRequest,
    proto::DeleteQueuePolicyRequest,
);

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
