//! Enqueue, idempotent on (queue, operation_key).

use super::errors::is_unique_violation;
use super::events::{self, call_digest, kind, NewEvent};
use super::{commit, convert_sqlx_err, micros, reads, retry_conflicts, JobStore};
use crate::domain::{CoordinatorError, Job, JobState};
use std::time::Duration;

/// A validated Enqueue.
#[derive(Debug, Clone)]
pub struct EnqueueRequest {
    pub queue: String,
    pub operation_key: String,
    pub payload: String,
    /// How long until the job is due (DB clock).
    pub delay: Duration,
}

/// The job, and whether this call created it.
#[derive(Debug, Clone, PartialEq)]
pub struct EnqueueOutcome {
    pub job: Job,
    /// False when the same request had already been enqueued.
    pub created: bool,
}

impl JobStore {
    /// Inserts a `ready` job with next_action `execute`. The same (queue,
    /// operation_key, payload) again returns the existing job with
    /// `created = false`; the same key with another payload is
    /// `OperationKeyConflict`.
    pub async fn enqueue(&self, req: &EnqueueRequest) -> Result<EnqueueOutcome, CoordinatorError> {
        retry_conflicts(|| self.enqueue_once(req)).await
    }

    async fn enqueue_once(&self, req: &EnqueueRequest) -> Result<EnqueueOutcome, CoordinatorError> {
        let digest = call_digest(&[req.payload.as_bytes()]);
        let mut tx = self.begin().await?;
        let inserted = sqlx::query(include_str!("queries/jobs/insert.sql"))
            .bind(&req.queue)
            .bind(&req.operation_key)
            .bind(&digest[..])
            .bind(&req.payload)
            .bind(micros(req.delay))
            .execute(&mut *tx)
            .await;
        let id = match inserted {
            Ok(done) => done.last_insert_id(),
            Err(e) if is_unique_violation(&e) => {
                tx.rollback().await.map_err(convert_sqlx_err)?;
                return self.existing(req, &digest).await;
            }
            Err(e) => return Err(convert_sqlx_err(e)),
        };
        events::append(
            &mut tx,
            NewEvent {
                job_id: id,
                queue: &req.queue,
                attempt: 0,
                kind: kind::ENQUEUED,
                from_state: None,
                to_state: Some(JobState::Ready),
                current_attempt: 0,
                request_digest: None,
                detail: None,
            },
        )
        .await?;
        let job = reads::job(&mut tx, id)
            .await?
            .ok_or_else(|| CoordinatorError::Internal(format!("job {id} vanished after insert")))?;
        commit(tx).await?;
        Ok(EnqueueOutcome { job, created: true })
    }

    async fn existing(
        &self,
        req: &EnqueueRequest,
        digest: &[u8; 32],
    ) -> Result<EnqueueOutcome, CoordinatorError> {
        let mut conn = self.pool.acquire().await.map_err(convert_sqlx_err)?;
        let (job, stored_digest) = reads::job_by_key(&mut conn, &req.queue, &req.operation_key)
            .await?
            .ok_or_else(|| {
                CoordinatorError::TransactionConflict("duplicate key vanished; retrying".into())
            })?;
        if stored_digest[..] == digest[..] {
            Ok(EnqueueOutcome {
                job,
                created: false,
            })
        } else {
            Err(CoordinatorError::OperationKeyConflict {
                queue: req.queue.clone(),
                operation_key: req.operation_key.clone(),
                job_id: job.id,
            })
        }
    }
}
