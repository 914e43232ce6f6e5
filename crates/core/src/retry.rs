//! RetryAsNewOperation: a failed or cancelled refund tried again as a new
//! operation (docs/operating.md, "Trying a failed refund again"). The
//! provider answers a key it has seen with what it did for it: sending the
//! old operation key again would get the old, failed refund back. So the
//! retry is a new job with a new key, the old job stays as it is, and the
//! two stories name each other. A job is tried again once: the old job's
//! row lock reserves the new key before the new job exists
//! ([`jobfence_store::JobStore::reserve_retry`]), and asking again with the
//! same key (the derived one, by default) answers the same new job.

use super::Coordinator;
use jobfence_domain::admin::{retry_key, RetryJob};
use jobfence_domain::scope::ANY_QUEUE;
use jobfence_domain::validate::Violations;
use jobfence_domain::{CoordinatorError, Enqueue, Job};
use std::time::Duration;

/// What RetryAsNewOperation did.
#[derive(Debug, Clone)]
pub struct RetryOutcome {
    /// The failed or cancelled job, unchanged.
    pub old: Job,
    /// The new job (ready), or the one an earlier identical call made.
    pub new: Job,
    /// False when an earlier call with the same key made the new job.
    pub created: bool,
}

impl Coordinator {
    /// Tries job `req.job_id` again as a new operation, in the same queue
    /// with the same payload, under `req.new_operation_key` or the derived
    /// [`retry_key`]. Refusals: `InvalidArgument` (a job that is not failed
    /// or cancelled, with its state; a job already tried again with
    /// another key, naming it; a new key equal to the old; the operator
    /// fields), `JobNotFound`, `JobPruned`, and what an Enqueue of the new
    /// key may answer (`OperationKeyConflict` for a key that names another
    /// payload's job).
    pub async fn retry_as_new_operation(
        &self,
        req: RetryJob,
    ) -> Result<RetryOutcome, CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(req.job_id);
        super::admin::operator_fields(&mut v, &req.operator, &req.reason);
        if let Some(k) = &req.new_operation_key {
            v.key("new_operation_key", k);
        }
        v.finish()?;
        let store = self.shards().for_job(req.job_id)?;
        let (old, _) = match store.get_job(req.job_id).await {
            Ok(found) => found,
            Err(e) => return Err(self.explain(e, &ANY_QUEUE).await),
        };
        let new_key = req
            .new_operation_key
            .clone()
            .unwrap_or_else(|| retry_key(&old.operation_key, old.id));
        if new_key == old.operation_key {
            return Err(CoordinatorError::invalid(
                "new_operation_key",
                "is the failed job's own key: the provider would answer it with the old refund",
            ));
        }
        let mut v = Violations::default();
        v.key("new_operation_key", &new_key);
        v.finish()?;
        let reserved = match store.reserve_retry(&req, &new_key).await {
            Ok(r) => r,
            Err(e) => return Err(self.explain(e, &ANY_QUEUE).await),
        };
        let made = self
            .enqueue(
                Enqueue {
                    queue: reserved.old.queue.clone(),
                    operation_key: new_key,
                    payload: reserved.old.payload.clone(),
                    delay: Duration::ZERO,
                    // The same merchant's, as urgent (rule 18).
                    fairness_key: reserved.old.fairness_key.clone(),
                    priority: reserved.old.priority,
                },
                &ANY_QUEUE,
            )
            .await?;
        self.shards()
            .for_job(made.job.id)?
            .link_retry(made.job.id, &reserved.old, &req)
            .await?;
        if made.created {
            tracing::warn!(
                job_id = reserved.old.id,
                new_job_id = made.job.id,
                queue = %reserved.old.queue,
                new_operation_key = %made.job.operation_key.escape_debug(),
                operator = %req.operator.escape_debug(),
                reason = %req.reason.escape_debug(),
                "job tried again as a new operation"
            );
        }
        Ok(RetryOutcome {
            old: reserved.old,
            new: made.job,
            created: made.created,
        })
    }
}
