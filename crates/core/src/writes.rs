//! The fenced writes a worker makes with the attempt it holds: RenewLease,
//! Complete and Fail. Each is checked here, then joins the one write
//! pipeline ([`run_writes`]), with or without a claim half (docs/design.md
//! rule 16, `handoffs.rs`): concurrent writes share one transaction (a
//! group commit), each still fenced on its own row (see
//! `store::writeback`).

use super::Coordinator;
use jobfence_domain::budget::MAX_PROVIDER_RETRY_AFTER;
use jobfence_domain::validate::{Violations, MAX_BODY_BYTES, MAX_ERROR_BYTES, MAX_KEY_BYTES};
use jobfence_domain::{ClaimSlot, QueuePolicies, QueuePolicy};
use jobfence_domain::{
    Complete, CoordinatorError, Fail, FailDisposition, FailOutcome, FencedOutcome, FencedWrite,
    QueueScope, RenewLease, ScopedWrite, WriteOutcome,
};
use jobfence_metrics::Metrics;
use jobfence_store::{ClaimHalf, Handoff, JobStore};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// What a caller gives a RenewLease, before defaults (the lease).
#[derive(Debug, Clone)]
pub struct RenewLeaseParams {
    pub job_id: u64,
    pub attempt: u64,
    pub lease: Option<Duration>,
}

/// What a caller gives a Fail, before the queue policy and the default
/// lease are known.
#[derive(Debug, Clone)]
pub struct FailParams {
    pub job_id: u64,
    pub attempt: u64,
    pub disposition: FailDisposition,
    pub error: String,
    pub retry_delay: Duration,
    /// The provider's Retry-After, when the worker got a 429 (or a 503
    /// with Retry-After): hand-outs for the job's provider stop until
    /// then, on every coordinator.
    pub provider_retry_after: Option<Duration>,
}

impl Coordinator {
    /// RenewLease: extends the lease of the current attempt, never shortens
    /// it. Refusals as for every fenced write (see `domain::fence`), and
    /// `QueueNotAllowed` for a job outside `scope` (checked under the row
    /// lock, before the fence; nothing written).
    pub async fn renew_lease(
        &self,
        req: RenewLeaseParams,
        scope: &QueueScope,
    ) -> Result<WriteOutcome, CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(req.job_id);
        v.attempt(req.attempt);
        let lease = self.lease(&mut v, "lease", req.lease);
        v.finish()?;
        let out = self
            .write(
                FencedWrite::RenewLease(RenewLease {
                    job_id: req.job_id,
                    attempt: req.attempt,
                    lease,
                }),
                scope,
            )
            .await?;
        Ok(WriteOutcome {
            job: out.job,
            replayed: out.replayed,
        })
    }

    /// The fenced write of a Fail (its error moved out of `req`: what
    /// follows the write does not read it).
    pub(crate) fn fail_write(&self, req: &mut FailParams) -> FencedWrite {
        FencedWrite::Fail(Fail {
            job_id: req.job_id,
            attempt: req.attempt,
            disposition: req.disposition,
            error: std::mem::take(&mut req.error),
            retry_delay: req.retry_delay,
            expected_lease: self.config.default_lease,
            provider_retry_after: req.provider_retry_after,
        })
    }

    /// What an applied Fail changes beyond its row: a retry wakes the
    /// queue's long-polling Claims when it is due, a throttle report and
    /// every resend decision are counted and logged.
    pub(crate) fn failed(&self, req: &FailParams, out: &FailOutcome) {
        let job = &out.job;
        if matches!(
            out.applied,
            FailDisposition::RetryExecute | FailDisposition::RetryReconcile
        ) {
            self.pipelines.waiters.due_in(&job.queue, req.retry_delay);
        }
        if let (Some(provider), Some(d)) = (&out.throttled, req.provider_retry_after) {
            self.metrics.provider_throttle_report(provider);
            tracing::warn!(
                job_id = job.id,
                queue = %job.queue,
                provider = %provider,
                retry_after_ms = d.as_millis() as u64,
                "provider throttled: hand-outs held until its Retry-After"
            );
        }
        if let Some(why) = out.override_reason {
            self.metrics.resend_decision(&job.queue, "refused");
            self.metrics.manual_review_entered(&job.queue, why.as_str());
            tracing::warn!(
                job_id = job.id,
                queue = %job.queue,
                operation_key = %job.operation_key.escape_debug(),
                attempt = req.attempt,
                reason = why.as_str(),
                dispatch_count = job.dispatch_count,
                retry_delay_ms = req.retry_delay.as_millis() as u64,
                "resend refused, moved to manual review"
            );
        } else if req.disposition == FailDisposition::RetryExecute {
            self.metrics.resend_decision(&job.queue, "allowed");
            tracing::info!(
                job_id = job.id,
                queue = %job.queue,
                operation_key = %job.operation_key.escape_debug(),
                attempt = req.attempt,
                dispatch_count = job.dispatch_count,
                retry_delay_ms = req.retry_delay.as_millis() as u64,
                "resend allowed"
            );
        } else if out.applied == FailDisposition::ManualReview {
            self.metrics
                .manual_review_entered(&job.queue, jobfence_domain::MANUAL_REVIEW_REQUESTED);
            tracing::warn!(
                job_id = job.id,
                queue = %job.queue,
                operation_key = %job.operation_key.escape_debug(),
                attempt = req.attempt,
                reason = jobfence_domain::MANUAL_REVIEW_REQUESTED,
                "moved to manual review"
            );
        }
    }

    /// Sends one fenced write through the write pipeline; see
    /// [`written`](Self::written).
    pub(crate) async fn write(
        &self,
        write: FencedWrite,
        scope: &QueueScope,
    ) -> Result<FencedOutcome, CoordinatorError> {
        let (rpc, job_id) = (write.rpc(), write.job_id());
        let scoped = ScopedWrite {
            write,
            scope: scope.clone(),
        };
        let result = self
            .for_job(job_id)?
            .writes
            .submit(QueuedWrite::alone(scoped))
            .await
            .and_then(|r| r)
            .and_then(|h| h.write);
        self.written(rpc, job_id, scope, result).await
    }

    /// What follows a fenced write's answer: labels the RPC's span with
    /// the job's queue, and counts and logs a refused stale write (its
    /// queue read by primary key: the refusal does not carry it) and a
    /// commit whose outcome is unknown.
    pub(crate) async fn written(
        &self,
        rpc: &'static str,
        job_id: u64,
        scope: &QueueScope,
        result: Result<FencedOutcome, CoordinatorError>,
    ) -> Result<FencedOutcome, CoordinatorError> {
        let e = match result {
            Ok(out) => {
                let span = tracing::Span::current();
                span.record("queue", out.job.queue.as_str());
                span.record("operation_key", out.job.operation_key.as_str());
                return Ok(out);
            }
            Err(e) => self.explain(e, scope).await,
        };
        self.metrics.commit_outcome(rpc, &e);
        let stale = match &e {
            CoordinatorError::AttemptSuperseded {
                presented,
                current,
                state,
                ..
            } => Some((*presented, *current, *state)),
            CoordinatorError::JobNotRunning { attempt, state, .. } => {
                Some((*attempt, *attempt, *state))
            }
            _ => None,
        };
        if let Some((presented, current, state)) = stale {
            let queue = match self.shards.for_job(job_id) {
                Ok(store) => store.queue_of(job_id).await.ok().flatten(),
                Err(_) => None,
            };
            let queue = queue.as_deref().unwrap_or("");
            tracing::Span::current().record("queue", queue);
            self.metrics.stale_rejection(queue, rpc);
            tracing::info!(
                job_id,
                queue,
                rpc,
                presented_attempt = presented,
                current_attempt = current,
                current_state = %state,
                "stale write rejected"
            );
        }
        Err(e)
    }
}

/// The checks of a Complete's own fields (the rest is the fence's):
/// `InvalidArgument` with each field violation.
pub fn check_complete(req: &Complete) -> Result<(), CoordinatorError> {
    let mut v = Violations::default();
    v.job_id(req.job_id);
    v.attempt(req.attempt);
    if let Some(r) = &req.provider_reference {
        v.max_bytes("provider_reference", r, MAX_KEY_BYTES);
    }
    if let Some(r) = &req.result {
        v.max_bytes("result", r, MAX_BODY_BYTES);
    }
    v.finish()
}

/// The checks of a Fail's own fields (the rest is the fence's):
/// `InvalidArgument` with each field violation.
pub fn check_fail(req: &FailParams) -> Result<(), CoordinatorError> {
    let mut v = Violations::default();
    v.job_id(req.job_id);
    v.attempt(req.attempt);
    // Content, like a provider's result: whitespace is kept, only an
    // empty message is refused (a worker must not be stuck on its error).
    if req.error.is_empty() {
        v.add("error", "must say what went wrong");
    }
    v.max_bytes("error", &req.error, MAX_ERROR_BYTES);
    v.delay("retry_delay", req.retry_delay);
    if let Some(d) = req.provider_retry_after {
        if d.is_zero() {
            v.add(
                "provider_retry_after",
                "must be positive when set (leave it unset when the provider gave none)",
            );
        } else if d > MAX_PROVIDER_RETRY_AFTER {
            v.add(
                "provider_retry_after",
                format!(
                    "must be at most {}",
                    humantime::format_duration(MAX_PROVIDER_RETRY_AFTER)
                ),
            );
        }
    }
    v.finish()
}

/// A checked write waiting in its database's write pipeline, with its
/// claim half when its caller asked for its next jobs (rule 16).
pub(crate) struct QueuedWrite {
    pub write: ScopedWrite,
    pub next: Option<NextHalf>,
}

impl QueuedWrite {
    /// A write with no claim half.
    pub fn alone(write: ScopedWrite) -> Self {
        QueuedWrite { write, next: None }
    }
}

/// The claim half of a queued write: its caller's slot in a Claim of
/// `queue`.
pub(crate) struct NextHalf {
    pub queue: String,
    pub policy: QueuePolicy,
    pub slot: ClaimSlot,
    pub want_next_due: bool,
}

/// What one queued write is answered (a pipeline's `<Verb>Result`): the
/// write's own answer and the jobs its claim half handed out (none
/// without one); `Err` is the transaction's, both halves'.
pub(crate) type WriteResult = Result<Handoff, CoordinatorError>;

/// Runs one batch of the write pipeline: one [`JobStore::write_calls`] for
/// the writes with no claim half and one per claimed queue, side by side.
pub(crate) async fn run_writes(
    store: JobStore,
    calls: Vec<QueuedWrite>,
    policies: QueuePolicies,
    metrics: Metrics,
) -> Vec<WriteResult> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut by_queue: HashMap<Option<&str>, usize> = HashMap::new();
    for (i, c) in calls.iter().enumerate() {
        let queue = c.next.as_ref().map(|n| n.queue.as_str());
        let k = *by_queue.entry(queue).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[k].push(i);
    }
    let calls = Arc::new(calls);
    let policies = Arc::new(policies);
    let mut runs = tokio::task::JoinSet::new();
    let mut tasks = HashMap::new();
    for (k, group) in groups.iter().enumerate() {
        let (store, calls, policies, group) = (
            store.clone(),
            calls.clone(),
            policies.clone(),
            group.clone(),
        );
        let task = runs.spawn(async move {
            let writes: Vec<ScopedWrite> = group.iter().map(|&i| calls[i].write.clone()).collect();
            let slots: Vec<ClaimSlot> = group
                .iter()
                .filter_map(|&i| calls[i].next.as_ref().map(|n| n.slot.clone()))
                .collect();
            let claim = calls[group[0]].next.as_ref().map(|first| ClaimHalf {
                queue: &first.queue,
                policy: first.policy,
                slots: &slots,
                want_next_due: group
                    .iter()
                    .any(|&i| calls[i].next.as_ref().is_some_and(|n| n.want_next_due)),
            });
            (k, store.write_calls(&writes, claim, &policies).await)
        });
        tasks.insert(task.id(), k);
    }
    let mut answers: Vec<Option<WriteResult>> = (0..calls.len()).map(|_| None).collect();
    while let Some(joined) = runs.join_next().await {
        let (k, batch) = match joined {
            Ok(done) => done,
            Err(e) => {
                // Panicked or cancelled, perhaps after its COMMIT: its
                // writes may be applied, so they are answered as a COMMIT
                // whose outcome is unknown (send the same call again).
                tracing::error!(error = %e, "a write transaction's task ended without an answer");
                for &i in tasks.get(&e.id()).map_or(&[][..], |&k| &groups[k][..]) {
                    answers[i] = Some(Err(CoordinatorError::CommitOutcomeUnknown(
                        "the write batch was lost".into(),
                    )));
                }
                continue;
            }
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
