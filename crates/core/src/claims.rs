//! Claim and Takeover: validation, coalescing per queue, long polling,
//! and what is counted and logged of every hand-out.

use super::long_poll::Wake;
use super::Coordinator;
use jobfence_domain::validate::Violations;
use jobfence_domain::{
    ClaimSlot, ClaimedJob, CoordinatorError, Job, QueuePolicy, QueueScope, Takeover,
};
use jobfence_metrics::Metrics;
use jobfence_store::{JobStore, MAX_CLAIM_TRANSACTION_JOBS};
use std::sync::Arc;
use std::time::Duration;

/// What a caller gives a Claim, before defaults: `lease: None` means the default lease,
/// `wait` zero means answer at once.
#[derive(Debug, Clone)]
pub struct ClaimParams {
    pub queue: String,
    pub worker_id: String,
    pub max_jobs: u32,
    pub lease: Option<Duration>,
    /// How long to wait for work when none is due (long poll); cut to
    /// the server's maximum.
    pub wait: Duration,
}

/// What a caller gives a Takeover, before defaults (the lease).
#[derive(Debug, Clone)]
pub struct TakeoverParams {
    pub job_id: u64,
    pub worker_id: String,
    pub lease: Option<Duration>,
}

/// A validated Claim of one caller, waiting in its database's claim
/// pipeline: its share of a coalesced claim transaction.
pub(crate) struct QueuedClaim {
    queue: String,
    policy: QueuePolicy,
    slot: ClaimSlot,
    want_next_due: bool,
}

/// What a coalesced claim gave one caller (a claim pipeline's `<Verb>Result`):
/// its jobs, and when the queue's next job is due if it was asked for.
pub(crate) type ClaimResult = Result<(Vec<ClaimedJob>, Option<Duration>), CoordinatorError>;

impl Coordinator {
    /// Claim: up to `max_jobs` jobs of the queue (see
    /// [`JobStore::claim_batch`]); concurrent Claims of a queue share one
    /// claim transaction. With a `wait`, a Claim that finds nothing waits
    /// for work (see [`long_poll`]) and answers empty only when the wait
    /// ends or the coordinator drains. `QueueNotAllowed` when `scope` does
    /// not cover the queue.
    pub async fn claim(
        &self,
        req: ClaimParams,
        scope: &QueueScope,
    ) -> Result<Vec<ClaimedJob>, CoordinatorError> {
        let lease = self.check_claim(&req, scope, "")?;
        let waiters = &self.pipelines.waiters;
        let mut waiting = waiters.register(&req.queue, req.wait);
        self.metrics.set_claim_waiters(waiters.waiting());
        let claimed = self.claim_waiting(&req, lease, &mut waiting, None).await;
        drop(waiting);
        self.metrics.set_claim_waiters(waiters.waiting());
        let claimed = claimed?;
        for c in &claimed {
            self.handed_out(c, &req.worker_id, "claim", lease);
        }
        Ok(claimed)
    }

    /// The checks of a Claim (or of the claim half of a Complete or Fail):
    /// its fields, then `scope` (`QueueNotAllowed`); the lease it gives.
    pub(crate) fn check_claim(
        &self,
        req: &ClaimParams,
        scope: &QueueScope,
        prefix: &str,
    ) -> Result<Duration, CoordinatorError> {
        let mut v = Violations::default();
        let field = |name: &str| format!("{prefix}{name}");
        v.queue(&field("queue"), &req.queue);
        v.key(&field("worker_id"), &req.worker_id);
        if req.max_jobs == 0 || req.max_jobs > self.config.max_claim_batch {
            v.add(
                &field("max_jobs"),
                format!("must be between 1 and {}", self.config.max_claim_batch),
            );
        }
        let lease = self.lease(&mut v, &field("lease"), req.lease);
        v.finish()?;
        scope.check(&req.queue, None)?;
        Ok(lease)
    }

    /// Claims through the queue's claim pipeline until a job is handed out
    /// or, while `waiting`, until the wait ends. `tried`: a claim of this
    /// caller already ran and handed out nothing (with when to look
    /// again), so the loop starts by waiting.
    pub(crate) async fn claim_waiting(
        &self,
        req: &ClaimParams,
        lease: Duration,
        waiting: &mut Option<super::long_poll::Waiting<'_>>,
        mut tried: Option<Option<Duration>>,
    ) -> Result<Vec<ClaimedJob>, CoordinatorError> {
        let policy = self.config.policies.get(&req.queue);
        let claims = &self.for_queue(&req.queue)?.claims;
        let mut asked = tokio::time::Instant::now();
        loop {
            if let Some(next_due) = tried {
                let again = match waiting.as_mut() {
                    Some(w) => w.wait_from(next_due, asked).await == Wake::Claim,
                    None => false,
                };
                if !again {
                    self.metrics.empty_claim(&req.queue);
                    return Ok(Vec::new());
                }
            }
            asked = tokio::time::Instant::now();
            let (claimed, next_due) = claims
                .submit(QueuedClaim {
                    queue: req.queue.clone(),
                    policy,
                    slot: ClaimSlot {
                        worker_id: req.worker_id.clone(),
                        max_jobs: req.max_jobs,
                        lease,
                        waiter: waiting.as_ref().map(|w| w.ticket()),
                    },
                    want_next_due: waiting.is_some(),
                })
                .await
                .and_then(|r| r)
                .inspect_err(|e| self.metrics.commit_outcome("Claim", e))?;
            if !claimed.is_empty() {
                return Ok(claimed);
            }
            tried = Some(next_due);
        }
    }

    /// Takeover; see [`JobStore::takeover`] (the job's queue is checked
    /// against `scope` under its row lock).
    pub async fn takeover(
        &self,
        req: TakeoverParams,
        scope: &QueueScope,
    ) -> Result<ClaimedJob, CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(req.job_id);
        v.key("worker_id", &req.worker_id);
        let lease = self.lease(&mut v, "lease", req.lease);
        v.finish()?;
        let claimed = self
            .shards
            .for_job(req.job_id)?
            .takeover(
                &Takeover {
                    job_id: req.job_id,
                    worker_id: req.worker_id.clone(),
                    lease,
                },
                scope,
            )
            .await;
        let claimed = match claimed {
            Ok(c) => Ok(c),
            Err(e) => Err(self.explain(e, scope).await),
        };
        let claimed = claimed.inspect_err(|e| {
            self.metrics.commit_outcome("Takeover", e);
            if let CoordinatorError::ProviderHoldback { provider, why, .. } = e {
                self.metrics.provider_deferred(provider, *why);
            }
        })?;
        tracing::Span::current().record("queue", claimed.job.queue.as_str());
        self.handed_out(&claimed, &req.worker_id, "takeover", lease);
        Ok(claimed)
    }

    /// Counts and logs a job handed out, and remembers when its lease
    /// ends (a long-polling Claim of the queue wakes then).
    pub(crate) fn handed_out(
        &self,
        c: &ClaimedJob,
        worker_id: &str,
        via: &'static str,
        lease: Duration,
    ) {
        let job = &c.job;
        self.metrics.claimed(&job.queue, job.next_action.as_str());
        if let Some(p) = &c.provider {
            self.metrics.provider_handout(p, job.next_action.as_str());
        }
        self.pipelines.waiters.due_in(&job.queue, lease);
        if c.takeover {
            // A takeover is a reconcile: checked before it was written
            // (jobfence_domain::transition::check_hand_out).
            self.metrics.takeover(&job.queue, via);
            tracing::info!(
                job_id = job.id,
                queue = %job.queue,
                operation_key = %job.operation_key.escape_debug(),
                attempt = job.attempt,
                previous_attempt = job.attempt - 1,
                worker_id = %worker_id.escape_debug(),
                via,
                "expired lease taken over"
            );
        }
    }
}

/// Counts and logs a due resend a claim parked in manual review instead
/// of handing it out (its window would close within the lease).
pub(crate) fn parked(metrics: &Metrics, job: &Job) {
    let reason = job.state_reason.as_deref().unwrap_or_default();
    metrics.resend_decision(&job.queue, "refused");
    metrics.manual_review_entered(&job.queue, reason);
    tracing::warn!(
        job_id = job.id,
        queue = %job.queue,
        operation_key = %job.operation_key.escape_debug(),
        attempt = job.attempt,
        reason,
        dispatch_count = job.dispatch_count,
        "resend not handed out: its window would close within the lease; moved to manual review"
    );
}

/// A claim task's result, or `None` when it panicked or was cancelled (at
/// shutdown): nothing then says whether it committed, so its calls are
/// answered `Unanswered` (a Claim never acts on an unknown outcome) rather
/// than the panic being carried on, or a cancellation turned into one.
fn joined_claim<T>(joined: Result<T, tokio::task::JoinError>) -> Option<T> {
    match joined {
        Ok(done) => Some(done),
        Err(e) => {
            tracing::error!(error = %e, "a claim transaction's task ended without an answer");
            None
        }
    }
}

/// Runs one batch of Claims: one claim transaction per queue (split so
/// none takes more than [`MAX_CLAIM_TRANSACTION_JOBS`]), the queues side by
/// side.
pub(crate) async fn run_claims(
    store: JobStore,
    calls: Vec<QueuedClaim>,
    metrics: Metrics,
) -> Vec<ClaimResult> {
    // Group by queue, keeping arrival order inside each group, and split a
    // group that would take too many jobs in one transaction.
    // Long-polling Claims first, in the order they came: a waiter's turn
    // at the provider's budget is filled before a claim that does not wait
    // (docs/design.md rule 11, "Waiters take turns").
    let mut order: Vec<usize> = (0..calls.len()).collect();
    order.sort_by_key(|&i| calls[i].slot.waiter.is_none());
    let mut chunks: Vec<(Vec<usize>, u32)> = Vec::new();
    let mut open: std::collections::HashMap<&str, usize> = Default::default();
    for (i, c) in order.into_iter().map(|i| (i, &calls[i])) {
        let n = c.slot.max_jobs;
        match open.get(c.queue.as_str()) {
            Some(&k) if chunks[k].1 + n <= MAX_CLAIM_TRANSACTION_JOBS => {
                chunks[k].0.push(i);
                chunks[k].1 += n;
            }
            _ => {
                open.insert(c.queue.as_str(), chunks.len());
                chunks.push((vec![i], n));
            }
        }
    }
    let calls = Arc::new(calls);
    let mut runs = tokio::task::JoinSet::new();
    for (k, (chunk, _)) in chunks.iter().enumerate() {
        let (store, calls, chunk) = (store.clone(), calls.clone(), chunk.clone());
        runs.spawn(async move {
            let first = &calls[chunk[0]];
            let slots: Vec<ClaimSlot> = chunk.iter().map(|&i| calls[i].slot.clone()).collect();
            let want_next_due = chunk.iter().any(|&i| calls[i].want_next_due);
            let result = store
                .claim_batch(&first.queue, first.policy, &slots, want_next_due)
                .await;
            (k, result)
        });
    }
    let mut answers: Vec<Option<ClaimResult>> = (0..calls.len()).map(|_| None).collect();
    while let Some(joined) = runs.join_next().await {
        let Some((k, result)) = joined_claim(joined) else {
            // Its calls stay unanswered: `Unanswered`, never acted on.
            continue;
        };
        let chunk = &chunks[k].0;
        match result {
            Ok(batch) => {
                if let Some(report) = &batch.budget {
                    metrics.provider_claim(report);
                }
                for job in &batch.parked {
                    parked(&metrics, job);
                }
                let next_due = batch.next_due;
                for (&i, jobs) in chunk.iter().zip(batch.jobs) {
                    answers[i] = Some(Ok((jobs, next_due)));
                }
            }
            Err(e) => {
                for &i in chunk {
                    answers[i] = Some(Err(e.clone()));
                }
            }
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or(Err(CoordinatorError::Unanswered { what: "claim" })))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cancelled_or_panicked_claim_task_is_left_unanswered_not_a_panic() {
        let cancelled = tokio::spawn(std::future::pending::<u32>());
        cancelled.abort();
        assert_eq!(joined_claim(cancelled.await), None);
        let panicked = tokio::spawn(async { panic!("a claim task's bug") });
        assert_eq!(joined_claim::<u32>(panicked.await), None);
        let done = tokio::spawn(async { 7u32 });
        assert_eq!(joined_claim(done.await), Some(7));
    }
}
