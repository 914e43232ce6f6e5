//! The coordinator: validates requests, applies lease bounds and per-queue
//! policy, calls the store, and logs the decisions that matter. Independent
//! of tonic; the gRPC adapters in `grpc` call it.

pub mod validate;

use crate::domain::{
    ClaimedJob, CoordinatorError, FailDisposition, FailOutcome, Job, Observation, QueuePolicies,
    WriteOutcome,
};
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
}

impl Coordinator {
    pub fn new(store: JobStore, config: CoordinatorConfig) -> Self {
        Coordinator {
            store,
            config: std::sync::Arc::new(config),
        }
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
        v.key("operation_key", &req.operation_key);
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
        let claimed = self
            .store
            .claim(&ClaimRequest {
                queue: req.queue,
                worker_id: req.worker_id,
                max_jobs: req.max_jobs,
                lease,
                policy,
            })
            .await?;
        for c in claimed.iter().filter(|c| c.takeover) {
            tracing::info!(job_id = c.job.id, attempt = c.job.attempt, queue = %c.job.queue, "expired lease taken over by claim");
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
                worker_id: req.worker_id,
                lease,
            })
            .await?;
        tracing::info!(
            job_id = claimed.job.id,
            attempt = claimed.job.attempt,
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
        self.store
            .renew_lease(&RenewLeaseRequest {
                job_id: req.job_id,
                attempt: req.attempt,
                lease,
            })
            .await
            .inspect_err(log_refusal)
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
        self.store.complete(&req).await.inspect_err(log_refusal)
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
        let out = self
            .store
            .fail(
                &FailRequest {
                    job_id: req.job_id,
                    attempt: req.attempt,
                    disposition: req.disposition,
                    error: req.error,
                    retry_delay: req.retry_delay,
                },
                &self.config.policies,
            )
            .await
            .inspect_err(log_refusal)?;
        if let Some(why) = out.override_reason {
            tracing::warn!(
                job_id = out.job.id,
                attempt = req.attempt,
                reason = why.as_str(),
                dispatch_count = out.job.dispatch_count,
                "resend refused, moved to manual review"
            );
        } else if req.disposition == FailDisposition::RetryExecute && !out.replayed {
            tracing::info!(
                job_id = out.job.id,
                attempt = req.attempt,
                dispatch_count = out.job.dispatch_count,
                "resend allowed"
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
        v.key("dedup_key", &req.dedup_key);
        v.max_bytes("body", &req.body, MAX_BODY_BYTES);
        if let Some(r) = &req.provider_reference {
            v.max_bytes("provider_reference", r, MAX_KEY_BYTES);
        }
        v.finish()?;
        self.store.record_observation(&req).await
    }

    /// GetJob; see [`JobStore::get_job`].
    pub async fn get_job(&self, job_id: u64) -> Result<(Job, Vec<Observation>), CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(job_id);
        v.finish()?;
        self.store.get_job(job_id).await
    }
}

fn log_refusal(e: &CoordinatorError) {
    if e.is_stale_write() {
        tracing::info!(error = %e, "stale write rejected");
    }
}
