//! The coordinator: validates requests, applies lease bounds and per-queue
//! policy, calls the store, and logs and counts the decisions that matter
//! (takeover, stale write rejected, resend allowed or refused, moved to
//! manual review, operator resolution). Independent of tonic; the gRPC
//! adapters in `grpc` call it. The operator calls are in [`admin`].

pub mod admin;
pub mod validate;

use crate::domain::{
    ClaimedJob, CoordinatorError, FailDisposition, FailOutcome, Job, NextAction, Observation,
    QueuePolicies, WriteOutcome,
};
use crate::metrics::Metrics;
use crate::store::{
    ClaimRequest, CompleteRequest, EnqueueOutcome, EnqueueRequest, FailRequest, JobStore,
    RecordObservationRequest, RenewLeaseRequest, TakeoverRequest,
};
use std::time::Duration;
use validate::{Violations, MAX_BODY_BYTES, MAX_ERROR_BYTES, MAX_KEY_BYTES};

/// Lease bounds, batch size and queue policies.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Lease given when a Claim or Takeover names none.
    pub default_lease: Duration,
    /// Shortest lease a caller may ask for.
    pub min_lease: Duration,
    /// Longest lease a caller may ask for.
    pub max_lease: Duration,
    /// Most jobs one Claim may take.
    pub max_claim_batch: u32,
    /// Resend window and max dispatches, per queue.
    pub policies: QueuePolicies,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            default_lease: Duration::from_secs(30),
            min_lease: Duration::from_secs(1),
            max_lease: Duration::from_secs(3600),
            max_claim_batch: 100,
            policies: QueuePolicies::default(),
        }
    }
}

/// Claim input before defaults: `lease: None` means the default lease.
#[derive(Debug, Clone)]
pub struct Claim {
    pub queue: String,
    pub worker_id: String,
    pub max_jobs: u32,
    pub lease: Option<Duration>,
}

/// Takeover input before defaults.
#[derive(Debug, Clone)]
pub struct Takeover {
    pub job_id: u64,
    pub worker_id: String,
    pub lease: Option<Duration>,
}

/// RenewLease input before defaults.
#[derive(Debug, Clone)]
pub struct RenewLease {
    pub job_id: u64,
    pub attempt: u64,
    pub lease: Option<Duration>,
}

/// Fail input before the queue policy is known.
#[derive(Debug, Clone)]
pub struct Fail {
    pub job_id: u64,
    pub attempt: u64,
    pub disposition: FailDisposition,
    pub error: String,
    pub retry_delay: Duration,
}

/// The coordinator. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Coordinator {
    store: JobStore,
    config: std::sync::Arc<CoordinatorConfig>,
    metrics: Metrics,
}

impl Coordinator {
    /// A coordinator with a fresh set of [`Metrics`] of its own.
    pub fn new(store: JobStore, config: CoordinatorConfig) -> Self {
        Coordinator {
            store,
            config: std::sync::Arc::new(config),
            metrics: Metrics::new(),
        }
    }

    /// The metrics this coordinator records into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn store(&self) -> &JobStore {
        &self.store
    }

    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    fn lease(&self, v: &mut Violations, field: &str, lease: Option<Duration>) -> Duration {
        let c = &self.config;
        match lease {
            None => c.default_lease,
            Some(d) if d.is_zero() => {
                v.add(field, "must be positive");
                d
            }
            Some(d) if d < c.min_lease || d > c.max_lease => {
                v.add(
                    field,
                    format!(
                        "must be between {} and {}",
                        humantime::format_duration(c.min_lease),
                        humantime::format_duration(c.max_lease)
                    ),
                );
                d
            }
            Some(d) => d,
        }
    }

    /// Enqueue; see [`JobStore::enqueue`].
    pub async fn enqueue(&self, req: EnqueueRequest) -> Result<EnqueueOutcome, CoordinatorError> {
        let mut v = Violations::default();
        v.queue("queue", &req.queue);
        v.unique_key("operation_key", &req.operation_key);
        v.max_bytes("payload", &req.payload, MAX_BODY_BYTES);
        v.delay("delay", req.delay);
        v.finish()?;
        let out = self.store.enqueue(&req).await?;
        tracing::debug!(job_id = out.job.id, created = out.created, "enqueued");
        Ok(out)
    }

    /// Claim; see [`JobStore::claim`].
    pub async fn claim(&self, req: Claim) -> Result<Vec<ClaimedJob>, CoordinatorError> {
        let mut v = Violations::default();
        v.queue("queue", &req.queue);
        v.key("worker_id", &req.worker_id);
        if req.max_jobs == 0 || req.max_jobs > self.config.max_claim_batch {
            v.add(
                "max_jobs",
                format!("must be between 1 and {}", self.config.max_claim_batch),
            );
        }
        let lease = self.lease(&mut v, "lease", req.lease);
        v.finish()?;
        let policy = self.config.policies.get(&req.queue);
        let queue = req.queue.clone();
        let worker_id = req.worker_id.clone();
        let claimed = self
            .store
            .claim(&ClaimRequest {
                queue: req.queue,
                worker_id: req.worker_id,
                max_jobs: req.max_jobs,
                lease,
                policy,
            })
            .await
            .inspect_err(|e| self.metrics.commit_outcome("Claim", e))?;
        if claimed.is_empty() {
            self.metrics.empty_claim(&queue);
        }
        for c in &claimed {
            self.metrics.claimed(&queue, c.job.next_action.as_str());
            if c.takeover {
                self.metrics.takeover(&queue, "claim");
                tracing::info!(
                    job_id = c.job.id,
                    queue = %queue,
                    operation_key = %c.job.operation_key,
                    attempt = c.job.attempt,
                    previous_attempt = c.job.attempt - 1,
                    worker_id = %worker_id,
                    via = "claim",
                    "expired lease taken over"
                );
            }
        }
        Ok(claimed)
    }

    /// Takeover; see [`JobStore::takeover`].
    pub async fn takeover(&self, req: Takeover) -> Result<ClaimedJob, CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(req.job_id);
        v.key("worker_id", &req.worker_id);
        let lease = self.lease(&mut v, "lease", req.lease);
        v.finish()?;
        let claimed = self
            .store
            .takeover(&TakeoverRequest {
                job_id: req.job_id,
                worker_id: req.worker_id.clone(),
                lease,
            })
            .await
            .inspect_err(|e| self.metrics.commit_outcome("Takeover", e))?;
        let job = &claimed.job;
        tracing::Span::current().record("queue", job.queue.as_str());
        self.metrics.takeover(&job.queue, "takeover");
        self.metrics
            .claimed(&job.queue, NextAction::Reconcile.as_str());
        tracing::info!(
            job_id = job.id,
            queue = %job.queue,
            operation_key = %job.operation_key,
            attempt = job.attempt,
            previous_attempt = job.attempt - 1,
            worker_id = %req.worker_id,
            via = "takeover",
            "expired lease taken over"
        );
        Ok(claimed)
    }

    /// RenewLease; see [`JobStore::renew_lease`].
    pub async fn renew_lease(&self, req: RenewLease) -> Result<WriteOutcome, CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(req.job_id);
        v.attempt(req.attempt);
        let lease = self.lease(&mut v, "lease", req.lease);
        v.finish()?;
        let result = self
            .store
            .renew_lease(&RenewLeaseRequest {
                job_id: req.job_id,
                attempt: req.attempt,
                lease,
            })
            .await;
        self.written("RenewLease", req.job_id, result).await
    }

    /// Complete; see [`JobStore::complete`].
    pub async fn complete(&self, req: CompleteRequest) -> Result<WriteOutcome, CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(req.job_id);
        v.attempt(req.attempt);
        if let Some(r) = &req.provider_reference {
            v.max_bytes("provider_reference", r, MAX_KEY_BYTES);
        }
        if let Some(r) = &req.result {
            v.max_bytes("result", r, MAX_BODY_BYTES);
        }
        v.finish()?;
        let result = self.store.complete(&req).await;
        self.written("Complete", req.job_id, result).await
    }

    /// Fail; see [`JobStore::fail`].
    pub async fn fail(&self, req: Fail) -> Result<FailOutcome, CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(req.job_id);
        v.attempt(req.attempt);
        if req.error.is_empty() {
            v.add("error", "must say what went wrong");
        }
        v.max_bytes("error", &req.error, MAX_ERROR_BYTES);
        v.delay("retry_delay", req.retry_delay);
        v.finish()?;
        // The queue (and so its policy) is read under the row lock.
        let result = self
            .store
            .fail(
                &FailRequest {
                    job_id: req.job_id,
                    attempt: req.attempt,
                    disposition: req.disposition,
                    error: req.error,
                    retry_delay: req.retry_delay,
                    expected_lease: self.config.default_lease,
                },
                &self.config.policies,
            )
            .await;
        let out = self.written("Fail", req.job_id, result).await?;
        if out.replayed {
            return Ok(out);
        }
        let job = &out.job;
        let policy = self.config.policies.get(&job.queue);
        if let Some(why) = out.override_reason {
            self.metrics.resend_decision(&job.queue, "refused");
            self.metrics.manual_review_entered(&job.queue, why.as_str());
            tracing::warn!(
                job_id = job.id,
                queue = %job.queue,
                operation_key = %job.operation_key,
                attempt = req.attempt,
                reason = why.as_str(),
                dispatch_count = job.dispatch_count,
                max_dispatches = policy.max_dispatches,
                resend_window_secs = policy.resend_window.as_secs(),
                retry_delay_ms = req.retry_delay.as_millis() as u64,
                "resend refused, moved to manual review"
            );
        } else if req.disposition == FailDisposition::RetryExecute {
            self.metrics.resend_decision(&job.queue, "allowed");
            tracing::info!(
                job_id = job.id,
                queue = %job.queue,
                operation_key = %job.operation_key,
                attempt = req.attempt,
                dispatch_count = job.dispatch_count,
                max_dispatches = policy.max_dispatches,
                resend_window_secs = policy.resend_window.as_secs(),
                retry_delay_ms = req.retry_delay.as_millis() as u64,
                "resend allowed"
            );
        } else if out.applied == FailDisposition::ManualReview {
            self.metrics
                .manual_review_entered(&job.queue, crate::store::MANUAL_REVIEW_REQUESTED);
            tracing::warn!(
                job_id = job.id,
                queue = %job.queue,
                operation_key = %job.operation_key,
                attempt = req.attempt,
                reason = crate::store::MANUAL_REVIEW_REQUESTED,
                "moved to manual review"
            );
        }
        Ok(out)
    }

    /// RecordObservation; see [`JobStore::record_observation`].
    pub async fn record_observation(
        &self,
        req: RecordObservationRequest,
    ) -> Result<(Observation, bool), CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(req.job_id);
        v.unique_key("dedup_key", &req.dedup_key);
        v.max_bytes("body", &req.body, MAX_BODY_BYTES);
        if let Some(r) = &req.provider_reference {
            v.max_bytes("provider_reference", r, MAX_KEY_BYTES);
        }
        v.finish()?;
        let (observation, duplicate) = self
            .store
            .record_observation(&req)
            .await
            .inspect_err(|e| self.metrics.commit_outcome("RecordObservation", e))?;
        self.metrics
            .observation(req.source.as_str(), req.outcome.as_str(), duplicate);
        Ok((observation, duplicate))
    }

    /// GetJob; see [`JobStore::get_job`].
    pub async fn get_job(&self, job_id: u64) -> Result<(Job, Vec<Observation>), CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(job_id);
        v.finish()?;
        self.store.get_job(job_id).await
    }
}

/// The outcome of a fenced write, for [`Coordinator::written`].
trait Written {
    fn job(&self) -> &Job;
}

impl Written for WriteOutcome {
    fn job(&self) -> &Job {
        &self.job
    }
}

impl Written for FailOutcome {
    fn job(&self) -> &Job {
        &self.job
    }
}

impl Coordinator {
    /// Labels the RPC's span with the job's queue, and counts and logs a
    /// refused stale write (its queue read by primary key: the refusal does
    /// not carry it) and a commit whose outcome is unknown.
    async fn written<T: Written>(
        &self,
        rpc: &'static str,
        job_id: u64,
        result: Result<T, CoordinatorError>,
    ) -> Result<T, CoordinatorError> {
        let e = match result {
            Ok(out) => {
                let job = out.job();
                let span = tracing::Span::current();
                span.record("queue", job.queue.as_str());
                span.record("operation_key", job.operation_key.as_str());
                return Ok(out);
            }
            Err(e) => e,
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
            let queue = self.store.queue_of(job_id).await.ok().flatten();
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
