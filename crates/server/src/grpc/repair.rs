//! The on-call repairs RetryAsNewOperation, PauseQueue and ResumeQueue, as JobAdmin serves
//! them (crates/core/src/retry.rs and crates/core/src/queue_pause.rs
//! decide).

use super::{convert, Rpc};
use jobfence_api::v1 as proto;
use jobfence_core::Coordinator;
use jobfence_domain::admin::RetryJob;
use jobfence_domain::providers::ChangeBy;
use jobfence_domain::validate::Violations;
use tonic::{Request, Response, Status};

/// RetryAsNewOperation: the operator's name as every operator write takes
/// it; an empty `new_operation_key` is the derived one.
pub(super) async fn retry(
    rpc: Rpc<'_>,
    coordinator: &Coordinator,
    request: Request<proto::RetryAsNewOperationRequest>,
) -> Result<Response<proto::RetryAsNewOperationResponse>, Status> {
    rpc.operator(request, |r, operator| async move {
        let mut v = Violations::default();
        let new_operation_key = v.optional("new_operation_key", r.new_operation_key);
        v.finish()?;
        let call = RetryJob {
            job_id: r.job_id,
            new_operation_key,
            operator,
            reason: r.reason,
        };
        let out = coordinator.retry_as_new_operation(call).await?;
        Ok(proto::RetryAsNewOperationResponse {
            old_job: Some(convert::job(out.old)),
            new_job: Some(convert::job(out.new)),
            created: out.created,
        })
    })
    .await
}

/// PauseQueue.
pub(super) async fn pause_queue(
    rpc: Rpc<'_>,
    coordinator: &Coordinator,
    request: Request<proto::PauseQueueRequest>,
) -> Result<Response<proto::PauseQueueResponse>, Status> {
    rpc.operator(request, |r, operator| async move {
        let by = ChangeBy {
            operator,
            reason: r.reason,
        };
        coordinator.pause_queue(&r.queue, by).await?;
        Ok(proto::PauseQueueResponse {})
    })
    .await
}

/// ResumeQueue.
pub(super) async fn resume_queue(
    rpc: Rpc<'_>,
    coordinator: &Coordinator,
    request: Request<proto::ResumeQueueRequest>,
) -> Result<Response<proto::ResumeQueueResponse>, Status> {
    rpc.operator(request, |r, operator| async move {
        let by = ChangeBy {
            operator,
            reason: r.reason,
        };
        let resumed = coordinator.resume_queue(&r.queue, by).await?;
        Ok(proto::ResumeQueueResponse { resumed })
    })
    .await
}
