//! The calls the coordinator hands to the store, validated and with every
//! default applied. The gRPC adapters build the coordinator's inputs; the
//! coordinator checks them and builds these; the store executes them, alone
//! or batched with other calls of the same kind (docs/design.md rule 8: a batch
//! changes how many jobs share a transaction, never the rule per job).

use super::{
    CoordinatorError, FailDisposition, FailOutcome, Job, ObservationOutcome, ObservationSource,
    OverrideReason, QueueScope,
};
use std::time::Duration;

/// A validated Enqueue.
#[derive(Debug, Clone, PartialEq)]
pub struct Enqueue {
    pub queue: String,
    /// The business identity, sent to the provider as its idempotency key.
    pub operation_key: String,
    pub payload: String,
    /// How long until the job is due (DB clock).
    pub delay: Duration,
    /// Among whose jobs claims go round-robin (docs/design.md rule 18);
    /// `None`: the queue's jobs without one, which share one key.
    pub fairness_key: Option<String>,
    /// How urgent it is (rule 18).
    pub priority: crate::fairness::Priority,
}

/// The job an Enqueue refers to, and whether this call created it.
#[derive(Debug, Clone, PartialEq)]
pub struct EnqueueOutcome {
    pub job: Job,
    /// False when the same request had already been enqueued.
    pub created: bool,
}

/// One Claim's share of a coalesced claim transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSlot {
    /// Recorded as `lease_owner` (informational only).
    pub worker_id: String,
    /// At least 1.
    pub max_jobs: u32,
    /// Lease length from the claim (DB clock).
    pub lease: Duration,
    /// The Claim's ticket when it long-polls: held back by its provider's
    /// budget, it waits its turn among the provider's waiters
    /// (docs/design.md rule 11, "Waiters take turns"). `None`: a claim that
    /// does not wait gets only the units no waiter is owed.
    pub waiter: Option<crate::budget::waiters::WaiterTicket>,
}

/// A validated Takeover of one named job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Takeover {
    pub job_id: u64,
    pub worker_id: String,
    pub lease: Duration,
}

/// A validated RenewLease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewLease {
    pub job_id: u64,
    pub attempt: u64,
    /// New lease, counted from now (DB clock). Never shortens the current one.
    pub lease: Duration,
}

/// A validated Complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Complete {
    pub job_id: u64,
    pub attempt: u64,
    pub provider_reference: Option<String>,
    pub result: Option<String>,
}

/// A validated Fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fail {
    pub job_id: u64,
    pub attempt: u64,
    pub disposition: FailDisposition,
    pub error: String,
    /// For the retry dispositions: how long until the job is due again.
    pub retry_delay: Duration,
    /// The lease the next claim is expected to get (the coordinator's
    /// default lease): a resend must fit in the window with it.
    pub expected_lease: Duration,
    /// The provider's Retry-After, when the worker reports a 429: nothing
    /// is handed out for the job's provider until then (applied with the
    /// Fail, never by a refused one).
    pub provider_retry_after: Option<Duration>,
}

/// A validated RecordObservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordObservation {
    pub job_id: u64,
    /// The attempt the reporter held; any value (0 for webhooks).
    pub attempt: u64,
    pub source: ObservationSource,
    pub outcome: ObservationOutcome,
    pub provider_reference: Option<String>,
    pub body: String,
    /// Unique per job; a repeat returns the first observation.
    pub dedup_key: String,
}

/// A write back that only the current attempt of a running job may make
/// (docs/design.md rule 3). Several of them, for different jobs, may share one
/// transaction (a group commit); each is still fenced on its own row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FencedWrite {
    RenewLease(RenewLease),
    Complete(Complete),
    Fail(Fail),
}

impl FencedWrite {
    /// The job written to.
    pub fn job_id(&self) -> u64 {
        match self {
            FencedWrite::RenewLease(r) => r.job_id,
            FencedWrite::Complete(r) => r.job_id,
            FencedWrite::Fail(r) => r.job_id,
        }
    }

    /// The attempt (fencing token) presented.
    pub fn attempt(&self) -> u64 {
        match self {
            FencedWrite::RenewLease(r) => r.attempt,
            FencedWrite::Complete(r) => r.attempt,
            FencedWrite::Fail(r) => r.attempt,
        }
    }

    /// The RPC's name, as in events and metrics labels (`RenewLease`, …).
    pub fn rpc(&self) -> &'static str {
        match self {
            FencedWrite::RenewLease(_) => "RenewLease",
            FencedWrite::Complete(_) => "Complete",
            FencedWrite::Fail(_) => "Fail",
        }
    }
}

/// A fenced write and the queues its caller may write to: the store
/// checks the job's queue, read under the row lock, before the fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopedWrite {
    pub write: FencedWrite,
    pub scope: QueueScope,
}

impl ScopedWrite {
    /// `write` by a caller that may write to every queue.
    pub fn unrestricted(write: FencedWrite) -> Self {
        ScopedWrite {
            write,
            scope: QueueScope::Any,
        }
    }
}

/// What a fenced write did: the job afterwards, whether this exact call
/// had already been applied (a replay after a lost response), and for a
/// Fail what was applied and why it differs from the request.
#[derive(Debug, Clone, PartialEq)]
pub struct FencedOutcome {
    pub job: Job,
    pub replayed: bool,
    /// Set for Fail only.
    pub fail: Option<(FailDisposition, Option<OverrideReason>)>,
    /// The provider a Fail's throttle report held (its Retry-After), if
    /// it was applied now.
    pub throttled: Option<String>,
}

impl FencedOutcome {
    /// The answer to a Fail: what was applied and why. `Internal` if the
    /// outcome carries no disposition (it was not a Fail).
    pub fn into_fail(self) -> Result<FailOutcome, CoordinatorError> {
        let (applied, override_reason) = self.fail.ok_or_else(|| {
            CoordinatorError::Internal(format!(
                "no fail disposition recorded for job {}",
                self.job.id
            ))
        })?;
        Ok(FailOutcome {
            job: self.job,
            applied,
            override_reason,
            replayed: self.replayed,
            throttled: self.throttled,
        })
    }
}
