//! Operator writes: ResolveManualReview and CancelJob, one job at a time
//! or many in one transaction (BulkRepair; `writes.rs` is the one way of
//! both).
//!
//! Fenced like every worker write (docs/design.md rule 3): one short transaction
//! locks the rows by primary key, checks state and attempt under the lock,
//! and runs an UPDATE that still carries `id + state + attempt` in its WHERE,
//! with the events appended in the same transaction. The operator presents
//! the attempt they saw, so of two operators acting on the same job exactly
//! one wins; the other is told precisely why, and the refusal is itself an
//! event carrying the attempt they presented. An identical call repeated
//! after a lost response is recognised by its digest and answered as a
//! replay without writing anything.
//!
//! Reads for operators (ListJobs, QueueStats, the pending-age gauges) are in
//! [`stats`].

mod stats;
mod writes;

use super::reads;
use super::JobStore;
use crate::run::{transaction, Body, Failure};
use jobfence_domain::admin::{
    BulkApplied, BulkJobResult, BulkRepair, CancelJob, CountedJob, ResolveManualReview,
};
use jobfence_domain::{CoordinatorError, WriteOutcome};
use sqlx::MySqlConnection;
use writes::{OperatorWrite, WrittenResult};

impl JobStore {
    /// Resolves a job parked in manual review. Refusals:
    /// `JobNotInManualReview` (not parked, e.g. resolved by someone else
    /// first), `AttemptSuperseded` (parked again under a later attempt),
    /// `AttemptNotIssued`, `JobNotFound`.
    pub async fn resolve_manual_review(
        &self,
        req: &ResolveManualReview,
    ) -> Result<WriteOutcome, CoordinatorError> {
        let w = OperatorWrite::new(Some(&req.resolution), &req.operator, &req.reason);
        let job = CountedJob {
            job_id: req.job_id,
            attempt: req.attempt,
        };
        transaction!(self, |tx| self.operator_write_one(tx, &w, job))
    }

    /// Cancels a `ready` job that was never dispatched. Refusals:
    /// `JobNotCancellable`, `AttemptSuperseded`, `AttemptNotIssued`,
    /// `JobNotFound`.
    pub async fn cancel_job(&self, req: &CancelJob) -> Result<WriteOutcome, CoordinatorError> {
        let w = OperatorWrite::new(None, &req.operator, &req.reason);
        let job = CountedJob {
            job_id: req.job_id,
            attempt: req.attempt,
        };
        transaction!(self, |tx| self.operator_write_one(tx, &w, job))
    }

    /// A BulkRepair of the jobs of this database, in one transaction: each
    /// job decided alone, as its single call would be (see `writes.rs`).
    /// Answers one result per job in the order of `req.jobs` (`JobNotFound`
    /// for a job this database does not have), and how many times the
    /// transaction met a conflict and was run again (the store's one
    /// policy, counted in `jobfence_transaction_conflicts_total` too).
    /// Fails as a whole when the transaction does (a conflict past the
    /// retries, the database unavailable, a COMMIT whose outcome is
    /// unknown); `req` is validated by the caller (1 to
    /// [`jobfence_domain::admin::MAX_BULK_JOBS`] jobs, none twice).
    pub async fn bulk_repair(
        &self,
        req: &BulkRepair,
    ) -> Result<(Vec<BulkJobResult>, u32), CoordinatorError> {
        let resolution = req.action.resolution();
        let w = OperatorWrite::new(resolution.as_ref(), &req.operator, &req.reason);
        let mut tries = 0u32;
        let written = transaction!(self, |tx| {
            tries += 1;
            self.write_jobs(tx, &w, &req.jobs)
        })?;
        let to_state = req.action.to_state();
        let results = written
            .into_iter()
            .map(|r| {
                r.map(|w| BulkApplied {
                    state: if w.replayed { w.job.state } else { to_state },
                    queue: w.job.queue,
                    replayed: w.replayed,
                })
            })
            .collect();
        Ok((results, tries.saturating_sub(1)))
    }

    /// A single operator call: the write of one job, answered with the job
    /// as it is now. A refusal's event is committed before the refusal is
    /// answered (docs/design.md rule 7); a job that does not exist writes
    /// nothing.
    async fn operator_write_one(
        &self,
        tx: &mut MySqlConnection,
        w: &OperatorWrite<'_>,
        job: CountedJob,
    ) -> Body<WriteOutcome> {
        let answer: WrittenResult = self
            .write_jobs(tx, w, &[job])
            .await?
            .pop()
            .expect("one answer per job");
        match answer {
            Ok(written) if written.replayed => Ok(WriteOutcome {
                job: written.job,
                replayed: true,
            }),
            Ok(_) => {
                let after = reads::job(tx, job.job_id)
                    .await?
                    .ok_or(CoordinatorError::JobNotFound { job_id: job.job_id })?;
                Ok(WriteOutcome {
                    job: after,
                    replayed: false,
                })
            }
            Err(e @ CoordinatorError::JobNotFound { .. }) => Err(Failure::Error(e)),
            Err(refused) => Err(Failure::Refused(refused)),
        }
    }
}
