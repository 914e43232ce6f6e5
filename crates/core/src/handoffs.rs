//! Complete and Fail that hand their caller its next jobs (docs/design.md
//! rule 16): the write and a Claim of the named queue in one transaction
//! (see `jobfence_store::Handoff`), coalesced like writes and Claims, one
//! transaction per queue and round of a batch.
//!
//! Both halves are checked before anything runs (a bad claim half, or a
//! queue outside the caller's scope, refuses the whole call and writes
//! nothing). Then each half answers for itself: a stale write still gets
//! its next jobs, and an empty claim (budget spent, queue paused) still
//! has its write applied. An error of the transaction (an unknown COMMIT
//! above all) is both halves'.

use super::claims::ClaimParams;
use super::writes::{check_complete, check_fail, FailParams, NextHalf, QueuedWrite};
use super::Coordinator;
use jobfence_domain::{
    ClaimSlot, ClaimedJob, Complete, CoordinatorError, FailOutcome, FencedOutcome, FencedWrite,
    QueueScope, ScopedWrite, WriteOutcome,
};
use jobfence_store::Handoff;
use std::time::Duration;

/// A Complete or Fail answered with its next jobs: the write's own answer
/// (applied, a replay, or its refusal, e.g. `AttemptSuperseded`) and the
/// jobs claimed for the caller (none after a replay).
#[derive(Debug)]
pub struct Handed<T> {
    pub write: Result<T, CoordinatorError>,
    pub jobs: Vec<ClaimedJob>,
}

impl Coordinator {
    /// Complete: `succeeded` with the provider's reference and result;
    /// with `next`, then a Claim of `next.queue` for the caller (rule 16),
    /// in one transaction when the job and the queue live on one database
    /// (else the write, then the Claim). Refusals of the write (see
    /// `domain::fence`; `QueueNotAllowed` for a job outside `scope`,
    /// checked under the row lock, nothing written) are
    /// [`Handed::write`]'s. Errors of the call: `InvalidArgument` or
    /// `QueueNotAllowed` for either half (nothing written), and the
    /// transaction's (`CommitOutcomeUnknown`: act on no job of it).
    pub async fn complete(
        &self,
        req: Complete,
        next: Option<ClaimParams>,
        scope: &QueueScope,
    ) -> Result<Handed<WriteOutcome>, CoordinatorError> {
        let next = both(check_complete(&req), self.check_next(next, scope))?;
        let (write, jobs) = self
            .write_and_claim(FencedWrite::Complete(req), next, scope)
            .await?;
        let write = write.map(|out| WriteOutcome {
            job: out.job,
            replayed: out.replayed,
        });
        Ok(Handed { write, jobs })
    }

    /// Fail: applies the disposition, except a resend outside the queue's
    /// resend window or past its max dispatches, which goes to manual
    /// review (docs/design.md rule 6); the answer says what was applied
    /// and why. With `next`, as [`complete`](Self::complete).
    pub async fn fail(
        &self,
        mut req: FailParams,
        next: Option<ClaimParams>,
        scope: &QueueScope,
    ) -> Result<Handed<FailOutcome>, CoordinatorError> {
        let next = both(check_fail(&req), self.check_next(next, scope))?;
        // The queue (and so its policy) is read under the row lock.
        let write = self.fail_write(&mut req);
        let (write, jobs) = self.write_and_claim(write, next, scope).await?;
        let write = write.and_then(FencedOutcome::into_fail);
        if let Ok(out) = &write {
            if !out.replayed {
                self.failed(&req, out);
            }
        }
        Ok(Handed { write, jobs })
    }

    /// The claim half's checks, when there is one: its lease.
    fn check_next(
        &self,
        next: Option<ClaimParams>,
        scope: &QueueScope,
    ) -> Result<Option<(ClaimParams, Duration)>, CoordinatorError> {
        let Some(next) = next else {
            return Ok(None);
        };
        let lease = self.check_claim(&next, scope, "next.")?;
        Ok(Some((next, lease)))
    }

    /// The write and the claim of a call whose two halves were checked
    /// (`next`: the claim half and its checked lease). Without a claim
    /// half, an error of the write's transaction is the call's.
    async fn write_and_claim(
        &self,
        write: FencedWrite,
        next: Option<(ClaimParams, Duration)>,
        scope: &QueueScope,
    ) -> Result<(Result<FencedOutcome, CoordinatorError>, Vec<ClaimedJob>), CoordinatorError> {
        let Some((next, lease)) = next else {
            return match self.write(write, scope).await {
                Err(e) if of_the_transaction(&e) => Err(e),
                written => Ok((written, Vec::new())),
            };
        };
        let (rpc, job_id) = (write.rpc(), write.job_id());
        let waiters = &self.pipelines.waiters;
        let mut waiting = waiters.register(&next.queue, next.wait);
        let one_database =
            self.shards.index_for_id(job_id)? == self.shards.index_for_queue(&next.queue)?;
        let answered = if one_database {
            let half = NextHalf {
                queue: next.queue.clone(),
                policy: self.config.policies.get(&next.queue),
                slot: ClaimSlot {
                    worker_id: next.worker_id.clone(),
                    max_jobs: next.max_jobs,
                    lease,
                    waiter: waiting.as_ref().map(|w| w.ticket()),
                },
                want_next_due: waiting.is_some(),
            };
            let queued = QueuedWrite {
                write: ScopedWrite {
                    write,
                    scope: scope.clone(),
                },
                next: Some(half),
            };
            let pipeline = &self.for_queue(&next.queue)?.writes;
            pipeline.submit(queued).await.and_then(|r| r)
        } else {
            self.write_then_claim(write, scope).await
        };
        let handoff = answered.inspect_err(|e| self.metrics.commit_outcome(rpc, e))?;
        let written = self.written(rpc, job_id, scope, handoff.write).await;
        // The job's queue is outside the caller's scope: the whole call is
        // refused, as without a next-job request (the store handed out
        // nothing for it).
        if let Err(e @ CoordinatorError::QueueNotAllowed { .. }) = written {
            return Err(e);
        }
        let replayed = matches!(&written, Ok(out) if out.replayed);
        let mut jobs = handoff.jobs;
        for c in &jobs {
            self.metrics.handed_on_write(&c.job.queue);
        }
        if jobs.is_empty() && !replayed {
            // Nothing was due: long-poll like a Claim (after a replay,
            // answer at once: the caller asks again on its own).
            self.metrics.set_claim_waiters(waiters.waiting());
            // Across two databases no claim ran yet: claim first.
            let tried = one_database.then_some(handoff.next_due);
            jobs = self
                .claim_waiting(&next, lease, &mut waiting, tried)
                .await?;
        }
        drop(waiting);
        self.metrics.set_claim_waiters(waiters.waiting());
        for c in &jobs {
            self.handed_out(c, &next.worker_id, "claim", lease);
        }
        Ok((written, jobs))
    }

    /// The job and the queue live on two databases: the write in its own
    /// transaction, its claim half left to the Claim loop, which then
    /// claims at once (no job yet, no claim run).
    /// An error of the write's transaction is the call's.
    async fn write_then_claim(
        &self,
        write: FencedWrite,
        scope: &QueueScope,
    ) -> Result<Handoff, CoordinatorError> {
        let job_id = write.job_id();
        let written = self
            .for_job(job_id)?
            .writes
            .submit(QueuedWrite::alone(ScopedWrite {
                write,
                scope: scope.clone(),
            }))
            .await
            .and_then(|r| r)
            .and_then(|h| h.write);
        match written {
            Err(e) if of_the_transaction(&e) => Err(e),
            write => Ok(Handoff {
                write,
                jobs: Vec::new(),
                next_due: None,
            }),
        }
    }
}

/// The checks of a call's write half and of its claim half (`next.…`)
/// together: every field violation of both in one refusal; else the
/// first other refusal (a queue outside the caller's scope).
fn both<T>(
    write: Result<(), CoordinatorError>,
    claim: Result<T, CoordinatorError>,
) -> Result<T, CoordinatorError> {
    match (write, claim) {
        (Ok(()), claim) => claim,
        (
            Err(CoordinatorError::InvalidArgument(mut w)),
            Err(CoordinatorError::InvalidArgument(c)),
        ) => {
            w.extend(c);
            Err(CoordinatorError::InvalidArgument(w))
        }
        (Err(e), _) => Err(e),
    }
}

/// An error of a write's transaction rather than the write's refusal:
/// nothing is known to be applied, so it is the whole call's.
fn of_the_transaction(e: &CoordinatorError) -> bool {
    matches!(
        e,
        CoordinatorError::CommitOutcomeUnknown(_)
            | CoordinatorError::DatabaseUnavailable(_)
            | CoordinatorError::TransactionConflict(_)
            | CoordinatorError::Overloaded { .. }
            | CoordinatorError::Unanswered { .. }
            | CoordinatorError::Internal(_)
    )
}
