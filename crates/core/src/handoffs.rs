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
use super::writes::{check_complete, check_fail, FailParams};
use super::Coordinator;
use jobfence_domain::{
    ClaimSlot, ClaimedJob, Complete, CoordinatorError, FailOutcome, FencedOutcome, FencedWrite,
    QueuePolicies, QueuePolicy, QueueScope, ScopedWrite, WriteOutcome,
};
use jobfence_metrics::Metrics;
use jobfence_store::{Handoff, JobStore};
use std::collections::HashMap;
use std::sync::Arc;

/// A Complete or Fail answered with its next jobs: the write's own answer
/// (applied, a replay, or its refusal, e.g. `AttemptSuperseded`) and the
/// jobs claimed for the caller (none after a replay).
#[derive(Debug)]
pub struct Handed<T> {
    pub write: Result<T, CoordinatorError>,
    pub jobs: Vec<ClaimedJob>,
}

/// A checked write with its claim half, waiting in its database's
/// handoff pipeline.
pub(crate) struct QueuedHandoff {
    write: ScopedWrite,
    queue: String,
    policy: QueuePolicy,
    slot: ClaimSlot,
    want_next_due: bool,
}

/// What one queued call is answered (a pipeline's `<Verb>Result`).
pub(crate) type HandoffResult = Result<Handoff, CoordinatorError>;

impl Coordinator {
    /// Complete, then a Claim of `next` for the caller, in one transaction
    /// when the job and `next.queue` live on one database (else the write,
    /// then the Claim). Errors of the call: `InvalidArgument` or
    /// `QueueNotAllowed` for either half (nothing written), and the
    /// transaction's (`CommitOutcomeUnknown`: act on no job of it).
    pub async fn complete_and_claim(
        &self,
        req: Complete,
        next: ClaimParams,
        scope: &QueueScope,
    ) -> Result<Handed<WriteOutcome>, CoordinatorError> {
        let lease = both(
            check_complete(&req),
            self.check_claim(&next, scope, "next."),
        )?;
        let (write, jobs) = self
            .write_and_claim(FencedWrite::Complete(req), next, scope, lease)
            .await?;
        let write = write.map(|out| WriteOutcome {
            job: out.job,
            replayed: out.replayed,
        });
        Ok(Handed { write, jobs })
    }

    /// Fail, then a Claim of `next`; as [`complete_and_claim`](Self::complete_and_claim).
    pub async fn fail_and_claim(
        &self,
        mut req: FailParams,
        next: ClaimParams,
        scope: &QueueScope,
    ) -> Result<Handed<FailOutcome>, CoordinatorError> {
        let lease = both(check_fail(&req), self.check_claim(&next, scope, "next."))?;
        let write = self.fail_write(&mut req);
        let (write, jobs) = self.write_and_claim(write, next, scope, lease).await?;
        let write = write.and_then(FencedOutcome::into_fail);
        if let Ok(out) = &write {
            if !out.replayed {
                self.failed(&req, out);
            }
        }
        Ok(Handed { write, jobs })
    }

    /// The write and the claim of a call whose two halves were checked
    /// (`lease`: the claim half's, checked).
    async fn write_and_claim(
        &self,
        write: FencedWrite,
        next: ClaimParams,
        scope: &QueueScope,
        lease: std::time::Duration,
    ) -> Result<(Result<FencedOutcome, CoordinatorError>, Vec<ClaimedJob>), CoordinatorError> {
        let (rpc, job_id) = (write.rpc(), write.job_id());
        let waiters = &self.pipelines.waiters;
        let mut waiting = waiters.register(&next.queue, next.wait);
        let one_database =
            self.shards.index_for_id(job_id)? == self.shards.index_for_queue(&next.queue)?;
        let answered = if one_database {
            self.for_queue(&next.queue)?
                .handoffs
                .submit(QueuedHandoff {
                    write: ScopedWrite {
                        write,
                        scope: scope.clone(),
                    },
                    queue: next.queue.clone(),
                    policy: self.config.policies.get(&next.queue),
                    slot: ClaimSlot {
                        worker_id: next.worker_id.clone(),
                        max_jobs: next.max_jobs,
                        lease,
                    },
                    want_next_due: waiting.is_some(),
                })
                .await
                .and_then(|r| r)
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
            .submit(ScopedWrite {
                write,
                scope: scope.clone(),
            })
            .await
            .and_then(|r| r);
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
fn both(
    write: Result<(), CoordinatorError>,
    claim: Result<std::time::Duration, CoordinatorError>,
) -> Result<std::time::Duration, CoordinatorError> {
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

/// Runs one batch of handoffs: one [`JobStore::write_and_claim`] per
/// claimed queue, the queues side by side.
pub(crate) async fn run_handoffs(
    store: JobStore,
    calls: Vec<QueuedHandoff>,
    policies: QueuePolicies,
    metrics: Metrics,
) -> Vec<HandoffResult> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut by_queue: HashMap<&str, usize> = HashMap::new();
    for (i, c) in calls.iter().enumerate() {
        let k = *by_queue.entry(c.queue.as_str()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[k].push(i);
    }
    let calls = Arc::new(calls);
    let policies = Arc::new(policies);
    let mut runs = tokio::task::JoinSet::new();
    for (k, group) in groups.iter().enumerate() {
        let (store, calls, policies, group) = (
            store.clone(),
            calls.clone(),
            policies.clone(),
            group.clone(),
        );
        runs.spawn(async move {
            let first = &calls[group[0]];
            let writes: Vec<ScopedWrite> = group.iter().map(|&i| calls[i].write.clone()).collect();
            let slots: Vec<ClaimSlot> = group.iter().map(|&i| calls[i].slot.clone()).collect();
            let want = group.iter().any(|&i| calls[i].want_next_due);
            let batch = store
                .write_and_claim(&first.queue, first.policy, &writes, &slots, &policies, want)
                .await;
            (k, batch)
        });
    }
    let mut answers: Vec<Option<HandoffResult>> = (0..calls.len()).map(|_| None).collect();
    while let Some(joined) = runs.join_next().await {
        let Ok((k, batch)) = joined else {
            // Panicked or cancelled: its calls stay `Unanswered`.
            tracing::error!("a handoff transaction's task ended without an answer");
            continue;
        };
        for report in &batch.budgets {
            metrics.provider_claim(report);
        }
        for job in &batch.parked {
            super::claims::parked(&metrics, job);
        }
        for (&i, answer) in groups[k].iter().zip(batch.answers) {
            answers[i] = Some(answer);
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or(Err(CoordinatorError::Unanswered { what: "write" })))
        .collect()
}
