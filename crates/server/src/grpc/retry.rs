//! RetryAsNewOperation, as JobAdmin serves it (crates/core/src/retry.rs
//! decides).

use super::{convert, Rpc};
use jobfence_api::v1 as proto;
use jobfence_core::Coordinator;
use jobfence_domain::admin::RetryJob;
use tonic::{Request, Response, Status};
use tracing::Span;

/// RetryAsNewOperation: the operator's name as every operator write takes
/// it; an empty `new_operation_key` is the derived one.
pub(super) async fn retry(
    rpc: Rpc<'_>,
    coordinator: &Coordinator,
    request: Request<proto::RetryAsNewOperationRequest>,
) -> Result<Response<proto::RetryAsNewOperationResponse>, Status> {
    rpc.operator(request, |r, operator| async move {
        let span = Span::current();
        span.record("job_id", r.job_id);
        span.record("operator", operator.as_str());
        let call = RetryJob {
            job_id: r.job_id,
            new_operation_key: Some(r.new_operation_key).filter(|k| !k.is_empty()),
            operator,
            reason: r.reason,
        };
        let out = coordinator.retry_as_new_operation(call).await?;
        span.record("new_job_id", out.new.id);
        span.record("created", out.created);
        Ok(proto::RetryAsNewOperationResponse {
            old_job: Some(convert::job(out.old)),
            new_job: Some(convert::job(out.new)),
            created: out.created,
        })
    })
    .await
}
