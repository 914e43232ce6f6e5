//! [`ClaimedJob`]: the handle a committed Claim or Takeover returns, and
//! the only way to write to a job. It carries the attempt (fencing token)
//! it was issued and presents it on every write, so a worker cannot send a
//! write without one, or with somebody else's.

use super::client::{proto_duration, WorkerClient};
use super::error::{self, WriteError};
use super::next::NextAsk;
use crate::proto::{
    self, CompleteRequest, FailRequest, ObservationOutcome, ObservationSource,
    RecordObservationRequest, RenewLeaseRequest,
};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// How a worker asks Fail to dispose of the job it holds (the
/// `FailDisposition` of the API, without its unset value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// Outcome unknown or pending: due again after the retry delay, to
    /// reconcile first. The safe choice whenever the provider may have
    /// been reached.
    RetryReconcile,
    /// Send again with the same operation_key after the retry delay. The
    /// coordinator applies it only while the queue's resend window
    /// (counted from the first dispatch) is open and dispatches remain;
    /// otherwise it parks the job in manual review (docs/design.md rule 6).
    RetryExecute,
    /// Terminal: the outcome is known to be a failure.
    Failed,
    /// Park the job for an operator.
    ManualReview,
}

impl Disposition {
    fn to_proto(self) -> proto::FailDisposition {
        match self {
            Disposition::RetryReconcile => proto::FailDisposition::RetryReconcile,
            Disposition::RetryExecute => proto::FailDisposition::RetryExecute,
            Disposition::Failed => proto::FailDisposition::Failed,
            Disposition::ManualReview => proto::FailDisposition::ManualReview,
        }
    }

    fn from_proto(raw: i32) -> Option<Self> {
        match proto::FailDisposition::try_from(raw).ok()? {
            proto::FailDisposition::RetryReconcile => Some(Disposition::RetryReconcile),
            proto::FailDisposition::RetryExecute => Some(Disposition::RetryExecute),
            proto::FailDisposition::Failed => Some(Disposition::Failed),
            proto::FailDisposition::ManualReview => Some(Disposition::ManualReview),
            proto::FailDisposition::Unspecified => None,
        }
    }
}

/// An applied Complete or RenewLease.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// True when this exact call had already been applied and its answer
    /// was lost (typically: the SDK retried after a lost commit); nothing
    /// was written again.
    pub replayed: bool,
    /// The job after the write.
    pub job: proto::Job,
}

/// An applied Fail.
#[derive(Debug, Clone, PartialEq)]
pub struct FailWritten {
    /// As in [`Written::replayed`].
    pub replayed: bool,
    /// The job after the write.
    pub job: proto::Job,
    /// What the coordinator applied: differs from the request when it
    /// turned a `RetryExecute` into `ManualReview` (rule 6).
    pub applied: Disposition,
    /// Why it overrode the request (`RESEND_WINDOW_CLOSED`,
    /// `MAX_DISPATCHES_REACHED`); `None` when applied as asked.
    pub override_reason: Option<String>,
}

/// A recorded observation.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// The stored observation (the first one, for a duplicate).
    pub observation: proto::Observation,
    /// True when an observation with the same dedup key already existed.
    pub duplicate: bool,
}

/// The dedup key under which a worker records a provider result it could
/// not write back: `worker:<worker_id>:<provider_reference>`, or
/// `worker-sha256:<hex>` of both when that would exceed 255 bytes. The same
/// worker reporting the same provider result twice (a retry, a restart)
/// records it once. The Python client derives the same key.
pub fn observation_dedup_key(worker_id: &str, provider_reference: &str) -> String {
    let plain = format!("worker:{worker_id}:{provider_reference}");
    if plain.len() <= 255 {
        return plain;
    }
    let mut h = Sha256::new();
    h.update(worker_id.as_bytes());
    h.update([0u8]);
    h.update(provider_reference.as_bytes());
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("worker-sha256:{hex}")
}

/// A job this worker holds, as handed out by a committed Claim or Takeover.
///
/// Every write presents the attempt the handle was issued, and the
/// coordinator applies it only while that attempt is the job's current one
/// and the job is running (docs/design.md rule 3). Expiry of the lease does not
/// end the handle's write right; a takeover that commits does (rule 1).
///
/// There is no way to get a provider key from the handle other than
/// [`operation_key`](Self::operation_key), on purpose.
#[derive(Debug)]
pub struct ClaimedJob {
    pub(crate) client: WorkerClient,
    job: proto::Job,
    attempt: u64,
    takeover: bool,
    observations: Vec<proto::Observation>,
    settled: bool,
    /// Set by the run loop: Complete and Fail ask for the next job.
    pub(crate) next: Option<NextAsk>,
    /// The jobs a Complete or Fail of this handle was answered with.
    pub(crate) handed: Vec<proto::ClaimedJob>,
}

impl ClaimedJob {
    pub(crate) fn from_proto(client: WorkerClient, c: proto::ClaimedJob) -> Option<Self> {
        let job = c.job?;
        Some(ClaimedJob {
            client,
            attempt: job.attempt,
            job,
            takeover: c.takeover,
            observations: c.observations,
            settled: false,
            next: None,
            handed: Vec::new(),
        })
    }

    /// The job's id.
    pub fn job_id(&self) -> u64 {
        self.job.job_id
    }

    /// The business identity of the operation, and *the* idempotency key
    /// (or merchant reference) to send to the provider.
    ///
    /// It never changes across attempts, so a resend or a reconcile by a
    /// later attempt names the same operation and the provider
    /// de-duplicates it. A key built from [`attempt`](Self::attempt)
    /// (`refund-123-7`, then `refund-123-8`) would look like two separate
    /// refunds to the provider and lose that protection: the seed's
    /// 千萬別把 attempt 拼進 Idempotency Key.
    pub fn operation_key(&self) -> &str {
        &self.job.operation_key
    }

    /// The fencing token this handle presents on every write. Readable for
    /// logs and metrics only: never send it to the provider, never build a
    /// key from it (see [`operation_key`](Self::operation_key)).
    pub fn attempt(&self) -> u64 {
        self.attempt
    }

    /// The opaque payload given at enqueue.
    pub fn payload(&self) -> &str {
        &self.job.payload
    }

    /// The job's priority: 1 (lowest) to 9 (most urgent), 5 unless its
    /// enqueue asked for another (docs/design.md rule 18).
    pub fn priority(&self) -> u32 {
        self.job.priority
    }

    /// The fairness key the job was enqueued with (a merchant, a tenant),
    /// empty when it was given none (rule 18).
    pub fn fairness_key(&self) -> &str {
        &self.job.fairness_key
    }

    /// What to do first: `Execute` (send the operation) or `Reconcile` (ask
    /// the provider what happened; "not found" is not proof that nothing
    /// happened, rule 5).
    pub fn next_action(&self) -> proto::NextAction {
        self.job.next_action()
    }

    /// True when this handle took over an expired lease; `next_action` is
    /// then always `Reconcile`.
    pub fn is_takeover(&self) -> bool {
        self.takeover
    }

    /// Evidence recorded for the job before it was handed out, oldest
    /// first (for example a stale worker's late success, rule 7).
    pub fn observations(&self) -> &[proto::Observation] {
        &self.observations
    }

    /// The job as last returned by the coordinator (at the claim, or after
    /// this handle's last applied write).
    pub fn job(&self) -> &proto::Job {
        &self.job
    }

    /// True once a write told this handle it no longer holds the job: its
    /// Complete or Fail was applied (or replayed), or a write was refused
    /// as superseded, not running or not found. The runner releases an
    /// unsettled job when its handler returns.
    pub fn is_settled(&self) -> bool {
        self.settled
    }

    /// Marks the job succeeded with the provider's reference (at most 255
    /// bytes, may be empty) and result (opaque text, at most 64 KiB).
    ///
    /// Retried on transport failures and on the coordinator's lost-commit,
    /// database-unavailable and conflict answers: if an earlier try
    /// was applied, the answer is `Ok` with `replayed: true`.
    ///
    /// If the write is refused as [`Superseded`](WriteError::Superseded) or
    /// [`NotRunning`](WriteError::NotRunning) and `provider_reference` is
    /// not empty, the provider's success is evidence that must not be
    /// dropped (rule 7): it is recorded as an observation (source WORKER,
    /// outcome SUCCEEDED, body `result`, key [`observation_dedup_key`]) for
    /// the current holder or the reconciler, and the error says
    /// `observation_recorded: true`.
    pub async fn complete(
        &mut self,
        provider_reference: &str,
        result: &str,
    ) -> Result<Written, WriteError> {
        let message = CompleteRequest {
            job_id: self.job.job_id,
            attempt: self.attempt,
            provider_reference: provider_reference.to_owned(),
            result: result.to_owned(),
            next: self.next.as_ref().and_then(NextAsk::now),
        };
        let client = &self.client;
        let outcome = client
            .retrying(error::retryable_write, || {
                let mut rpc = client.rpc.clone();
                let request = client.request(message.clone());
                async move { client.deadline(rpc.complete(request)).await }
            })
            .await;
        let outcome = outcome.and_then(|response| {
            let mut r = response.into_inner();
            self.answered(r.next.take()).map(|()| r)
        });
        match outcome {
            Ok(r) => Ok(self.applied(r.job, r.replayed)),
            Err(status) => {
                let refusal = self.refused(status);
                if provider_reference.is_empty() {
                    return Err(refusal);
                }
                Err(self
                    .keep_evidence(refusal, provider_reference, result)
                    .await)
            }
        }
    }

    /// Like [`complete`](Self::complete), and also keeps the provider
    /// result as an observation when the Complete's outcome stays unknown
    /// or the coordinator stays unavailable after the retries: whichever
    /// way that write went, the evidence is then on record (recording it
    /// twice is harmless, observations are de-duplicated). Use it when the
    /// provider has confirmed the operation. `provider_reference` must not
    /// be empty (it names the evidence).
    pub async fn complete_or_observe(
        &mut self,
        provider_reference: &str,
        result: &str,
    ) -> Result<Written, WriteError> {
        if provider_reference.is_empty() {
            return Err(WriteError::Invalid(
                tonic_types::BadRequest::with_violation(
                    "provider_reference",
                    "complete_or_observe needs the provider's reference",
                ),
            ));
        }
        match self.complete(provider_reference, result).await {
            Err(unclear @ (WriteError::OutcomeUnknown(_) | WriteError::Unavailable(_))) => {
                if let Err(e) = self.observe_success(provider_reference, result).await {
                    tracing::warn!(job_id = self.job.job_id, attempt = self.attempt, error = %e, "could not record the provider result either");
                }
                Err(unclear)
            }
            other => other,
        }
    }

    /// Reports a failure with a disposition. `error` says what went wrong
    /// (required, at most 4096 bytes); `retry_delay` is how long until a
    /// retried job is due again (DB clock; ignored by `Failed` and
    /// `ManualReview`).
    ///
    /// Retried like [`complete`](Self::complete). The coordinator may apply
    /// another disposition than asked (see [`FailWritten::applied`]).
    pub async fn fail(
        &mut self,
        disposition: Disposition,
        error: &str,
        retry_delay: Duration,
    ) -> Result<FailWritten, WriteError> {
        self.fail_with(disposition, error, retry_delay, None).await
    }

    /// Like [`fail`](Self::fail), for a provider that pushed back (HTTP
    /// 429, or 503 with Retry-After): `provider_retry_after` is how long it
    /// asked to wait. The coordinator then hands out nothing for the
    /// provider until then, on every coordinator, so the other workers
    /// stop hitting it too; the job is disposed of as asked (a throttled
    /// send was not processed: `RetryExecute` sends it again later).
    pub async fn fail_throttled(
        &mut self,
        disposition: Disposition,
        error: &str,
        retry_delay: Duration,
        provider_retry_after: Duration,
    ) -> Result<FailWritten, WriteError> {
        self.fail_with(disposition, error, retry_delay, Some(provider_retry_after))
            .await
    }

    async fn fail_with(
        &mut self,
        disposition: Disposition,
        error: &str,
        retry_delay: Duration,
        provider_retry_after: Option<Duration>,
    ) -> Result<FailWritten, WriteError> {
        let message = FailRequest {
            job_id: self.job.job_id,
            attempt: self.attempt,
            disposition: disposition.to_proto() as i32,
            error: error.to_owned(),
            retry_delay: Some(proto_duration(retry_delay)),
            provider_retry_after: provider_retry_after.map(proto_duration),
            next: self.next.as_ref().and_then(NextAsk::now),
        };
        let client = &self.client;
        let outcome = client
            .retrying(error::retryable_write, || {
                let mut rpc = client.rpc.clone();
                let request = client.request(message.clone());
                async move { client.deadline(rpc.fail(request)).await }
            })
            .await;
        let outcome = outcome.and_then(|response| {
            let mut r = response.into_inner();
            self.answered(r.next.take()).map(|()| r)
        });
        match outcome {
            Ok(r) => {
                let applied = Disposition::from_proto(r.applied).unwrap_or(disposition);
                let written = self.applied(r.job, r.replayed);
                Ok(FailWritten {
                    replayed: written.replayed,
                    job: written.job,
                    applied,
                    override_reason: (!r.override_reason.is_empty()).then_some(r.override_reason),
                })
            }
            Err(status) => Err(self.refused(status)),
        }
    }

    /// Extends the lease to `lease` from now (DB clock; within the
    /// coordinator's bounds; never shortens it). The SDK never renews on
    /// its own: like the seed's first version, a worker claims only what it
    /// can do now and writes back promptly, so a long job renews
    /// explicitly. A renewal does not prove the provider call finished.
    pub async fn renew_lease(&mut self, lease: Duration) -> Result<Written, WriteError> {
        let message = RenewLeaseRequest {
            job_id: self.job.job_id,
            attempt: self.attempt,
            lease: Some(proto_duration(lease)),
        };
        let client = &self.client;
        let outcome = client
            .retrying(error::retryable_write, || {
                let mut rpc = client.rpc.clone();
                let request = client.request(message);
                async move { client.deadline(rpc.renew_lease(request)).await }
            })
            .await;
        match outcome {
            Ok(response) => {
                let r = response.into_inner();
                let job = r.job.unwrap_or_else(|| self.job.clone());
                self.job = job.clone();
                Ok(Written {
                    replayed: r.replayed,
                    job,
                })
            }
            Err(status) => Err(self.refused(status)),
        }
    }

    /// Records evidence about the job (source WORKER, this handle's
    /// attempt). Allowed whatever the job's state or attempt, stale
    /// included (rule 7); it never changes the job. `dedup_key` (1..=255
    /// bytes) is unique per job: a repeat returns the first observation
    /// with `duplicate: true`, so this call is retried freely.
    pub async fn record_observation(
        &self,
        outcome: ObservationOutcome,
        provider_reference: &str,
        body: &str,
        dedup_key: &str,
    ) -> Result<Recorded, WriteError> {
        let message = RecordObservationRequest {
            job_id: self.job.job_id,
            attempt: self.attempt,
            source: ObservationSource::Worker as i32,
            outcome: outcome as i32,
            provider_reference: provider_reference.to_owned(),
            body: body.to_owned(),
            dedup_key: dedup_key.to_owned(),
        };
        let client = &self.client;
        let response = client
            .retrying(error::retryable_write, || {
                let mut rpc = client.rpc.clone();
                let request = client.request(message.clone());
                async move { client.deadline(rpc.record_observation(request)).await }
            })
            .await
            .map_err(error::write_error)?
            .into_inner();
        let observation = response.observation.ok_or_else(|| {
            WriteError::Other(Box::new(tonic::Status::internal(
                "observation response without an observation",
            )))
        })?;
        Ok(Recorded {
            observation,
            duplicate: response.duplicate,
        })
    }

    fn applied(&mut self, job: Option<proto::Job>, replayed: bool) -> Written {
        let job = job.unwrap_or_else(|| self.job.clone());
        self.job = job.clone();
        self.settled = true;
        Written { replayed, job }
    }

    fn refused(&mut self, status: tonic::Status) -> WriteError {
        let e = error::write_error(status);
        if matches!(
            e,
            WriteError::Superseded { .. } | WriteError::NotRunning { .. } | WriteError::NotFound
        ) {
            self.settled = true;
            tracing::info!(job_id = self.job.job_id, attempt = self.attempt, refusal = %e, "write refused: this worker no longer holds the job");
        }
        e
    }

    async fn observe_success(
        &self,
        provider_reference: &str,
        result: &str,
    ) -> Result<Recorded, WriteError> {
        let key = observation_dedup_key(&self.client.config.worker_id, provider_reference);
        self.record_observation(
            ObservationOutcome::Succeeded,
            provider_reference,
            result,
            &key,
        )
        .await
    }

    /// For a refusal that means "not yours any more", records the provider
    /// result as an observation and says so in the error.
    async fn keep_evidence(
        &self,
        refusal: WriteError,
        provider_reference: &str,
        result: &str,
    ) -> WriteError {
        if !matches!(
            refusal,
            WriteError::Superseded { .. } | WriteError::NotRunning { .. }
        ) {
            return refusal;
        }
        let recorded = match self.observe_success(provider_reference, result).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(job_id = self.job.job_id, attempt = self.attempt, error = %e, "could not record a late provider result");
                false
            }
        };
        match refusal {
            WriteError::Superseded {
                current_attempt,
                current_state,
                ..
            } => WriteError::Superseded {
                current_attempt,
                current_state,
                observation_recorded: recorded,
            },
            WriteError::NotRunning { state, .. } => WriteError::NotRunning {
                state,
                observation_recorded: recorded,
            },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_key_is_plain_when_short_and_hashed_when_long() {
        assert_eq!(observation_dedup_key("w1", "re_1"), "worker:w1:re_1");
        let long = "r".repeat(255);
        let key = observation_dedup_key("w1", &long);
        assert!(key.starts_with("worker-sha256:"));
        assert_eq!(key.len(), "worker-sha256:".len() + 64);
        assert_ne!(key, observation_dedup_key("w2", &long));
    }
}
