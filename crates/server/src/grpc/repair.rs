//! The on-call repairs BulkRepair, RetryAsNewOperation, PauseQueue and
//! ResumeQueue, as JobAdmin serves them (crates/core/src/bulk.rs,
//! retry.rs and queue_pause.rs decide).

use super::{convert, Rpc};
use jobfence_api::v1 as proto;
use jobfence_core::Coordinator;
use jobfence_domain::admin::{BulkAction, BulkRepair, CountedJob, RetryJob};
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

/// The action a BulkRepair names (unset or unknown is a violation).
pub(super) fn bulk_action(v: &mut Violations, raw: i32) -> BulkAction {
    match proto::BulkAction::try_from(raw) {
        Ok(proto::BulkAction::Cancel) => BulkAction::Cancel,
        Ok(proto::BulkAction::Fail) => BulkAction::Fail,
        Ok(proto::BulkAction::Requeue) => BulkAction::Requeue,
        _ => {
            v.add(
                "action",
                format!("unknown or unset bulk action {raw} (CANCEL, FAIL or REQUEUE)"),
            );
            BulkAction::Cancel
        }
    }
}

/// BulkRepair: the operator's name as every operator write takes it; one
/// answer per job, an error as the job's single call would carry it.
pub(super) async fn bulk_repair(
    rpc: Rpc<'_>,
    coordinator: &Coordinator,
    request: Request<proto::BulkRepairRequest>,
) -> Result<Response<proto::BulkRepairResponse>, Status> {
    rpc.operator(request, |r, operator| async move {
        let mut v = Violations::default();
        let action = bulk_action(&mut v, r.action);
        v.finish()?;
        let call = BulkRepair {
            action,
            jobs: r
                .jobs
                .iter()
                .map(|j| CountedJob {
                    job_id: j.job_id,
                    attempt: j.attempt,
                })
                .collect(),
            operator,
            reason: r.reason,
        };
        let out = coordinator.bulk_repair(call).await?;
        let mut answer = proto::BulkRepairResponse {
            results: Vec::with_capacity(out.results.len()),
            applied: out.applied() as u32,
            skipped: out.skipped() as u32,
            conflicts_retried: out.conflicts_retried,
        };
        for (job_id, r) in out.results {
            let result = match r {
                Ok(a) => proto::bulk_repair_result::Result::Applied(proto::BulkApplied {
                    state: convert::state(a.state) as i32,
                    replayed: a.replayed,
                }),
                Err(e) => proto::bulk_repair_result::Result::Error(convert::item_error(&e)),
            };
            answer.results.push(proto::BulkRepairResult {
                job_id,
                result: Some(result),
            });
        }
        Ok(answer)
    })
    .await
}
