//! The operator's calls and reads, as the coordinator, the gRPC adapter
//! and the console all see them: resolving or cancelling a job (one, or
//! many at once: [`bulk`]), the fence both check ([`fence`]), listing
//! jobs, per-queue statistics and the pending ages behind the gauges. The
//! store executes them; nothing here knows SQL.

mod bulk;
pub mod fence;

pub use bulk::{
    BulkAction, BulkApplied, BulkJobResult, BulkRepair, BulkRepairOutcome, CountedJob, BULK_BATCH,
    MAX_BULK_JOBS,
};

use crate::JobState;
use std::collections::BTreeMap;
use std::time::Duration;

/// Where an operator sends a job parked in manual review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Confirmed succeeded at the provider, with its reference.
    Succeeded {
        /// The provider's reference for the operation (required).
        provider_reference: String,
        /// The provider's result text, if any.
        result: Option<String>,
    },
    /// Confirmed not done and never to be done.
    Failed,
    /// Back to ready after `delay`; the next worker reconciles first.
    RetryReconcile {
        /// Until the job is due again (DB clock).
        delay: Duration,
    },
    /// Back to ready after `delay`; the next worker sends again with the
    /// same operation_key. An explicitly authorized resend: the resend
    /// window restarts from the next dispatch (docs/design.md rule 6 would
    /// otherwise turn it back into a reconcile).
    RetryExecute {
        /// Until the job is due again (DB clock).
        delay: Duration,
    },
}

impl Resolution {
    /// The name used in events, logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Resolution::Succeeded { .. } => "succeeded",
            Resolution::Failed => "failed",
            Resolution::RetryReconcile { .. } => "retry_reconcile",
            Resolution::RetryExecute { .. } => "retry_execute",
        }
    }

    /// The state the job moves to.
    pub fn to_state(&self) -> JobState {
        match self {
            Resolution::Succeeded { .. } => JobState::Succeeded,
            Resolution::Failed => JobState::Failed,
            Resolution::RetryReconcile { .. } | Resolution::RetryExecute { .. } => JobState::Ready,
        }
    }
}

/// A validated ResolveManualReview.
#[derive(Debug, Clone)]
pub struct ResolveManualReview {
    /// The parked job.
    pub job_id: u64,
    /// The attempt the operator saw on the parked job.
    pub attempt: u64,
    /// Where the job goes.
    pub resolution: Resolution,
    /// Who resolves it.
    pub operator: String,
    /// Why.
    pub reason: String,
}

/// A validated CancelJob.
#[derive(Debug, Clone)]
pub struct CancelJob {
    /// The job to cancel.
    pub job_id: u64,
    /// The attempt the operator saw (0 for a job never claimed).
    pub attempt: u64,
    /// Who cancels it.
    pub operator: String,
    /// Why.
    pub reason: String,
}

/// A validated RetryAsNewOperation: try a failed or cancelled job again as
/// a new operation, with a new operation key (the provider would answer
/// the old key with the old, failed refund).
#[derive(Debug, Clone)]
pub struct RetryJob {
    /// The failed or cancelled job.
    pub job_id: u64,
    /// The new job's operation key; `None` for the derived one
    /// ([`retry_key`]).
    pub new_operation_key: Option<String>,
    /// Who asks.
    pub operator: String,
    /// Why.
    pub reason: String,
}

/// The operation key a retry of job `job_id` (key `key`) gets when the
/// operator gives none: `{key}:retry:{job_id}`. Derived from the old job,
/// so asking again gives the same key, and Enqueue answers the same job:
/// a retry asked twice is one new operation, never two.
pub fn retry_key(key: &str, job_id: u64) -> String {
    format!("{key}:retry:{job_id}")
}

/// The pending states, in the order of [`QueuePending::oldest`].
pub const PENDING: [JobState; 3] = [JobState::Ready, JobState::Running, JobState::ManualReview];

/// A validated ListJobs.
#[derive(Debug, Clone, Default)]
pub struct ListJobsFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Empty means every state.
    pub states: Vec<JobState>,
    /// Only jobs created at least this long ago (DB clock).
    pub min_age: Option<Duration>,
    /// Only jobs whose operation_key starts with this (exact match included).
    pub operation_key: Option<String>,
    /// Keyset paging: only jobs with a larger id.
    pub after_id: u64,
    /// At least 1.
    pub limit: u32,
}

/// The job that has waited longest in one pending state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OldestJob {
    /// The job.
    pub job_id: u64,
    /// `ready`: since due; `running`: since claimed; `manual_review`: since
    /// parked. DB clock.
    pub age: Duration,
}

/// The pending ages of one queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueuePending {
    /// Indexed like [`QueuePending::STATES`]: ready (due only), running,
    /// manual_review.
    pub oldest: [Option<OldestJob>; 3],
    /// Since the creation of the oldest job not in a terminal state.
    pub unfinished: Option<Duration>,
}

impl QueuePending {
    /// The state of each slot of [`QueuePending::oldest`].
    pub const STATES: [JobState; 3] = PENDING;
}

/// Pending ages of every queue that has pending jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingAges {
    /// By queue name.
    pub queues: BTreeMap<String, QueuePending>,
}

/// QueueStats of one queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue.
    pub queue: String,
    /// Jobs by state (states with none are left out).
    pub counts: Vec<(JobState, u64)>,
    /// Pending ages (see [`QueuePending`]).
    pub pending: QueuePending,
    /// Takeovers within the window, from the events.
    pub takeovers: u64,
    /// Stale writes refused within the window, from the events.
    pub stale_write_rejections: u64,
    /// What holds its ready jobs now, when its provider does (filled by
    /// the coordinator from the provider's record; `None` otherwise).
    pub held: Option<crate::providers::QueueHold>,
    /// Its due jobs by fairness key (docs/design.md rule 18): the keys
    /// with the most, and the rest summed.
    pub due_keys: DueKeys,
}

/// How many fairness keys [`DueKeys::top`] names at most.
pub const TOP_DUE_KEYS: usize = 10;

/// A queue's due ready jobs by fairness key: the [`TOP_DUE_KEYS`] keys
/// with the most, most first, and every other key summed in `others`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DueKeys {
    pub top: Vec<KeyBacklog>,
    /// The other keys together (`keys`: how many); `None` when there are
    /// no others.
    pub others: Option<KeyBacklog>,
}

/// Due ready jobs of one fairness key, or of several summed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyBacklog {
    /// The key; `None` for the jobs without one, or for a sum of keys.
    pub fairness_key: Option<String>,
    /// How many keys this counts (1 for one key).
    pub keys: u64,
    /// Due ready jobs.
    pub due: u64,
    /// How long the oldest of them has been due.
    pub oldest_due: Duration,
}

/// How wide one bucket of a [`StateChange`] is (the console's trends).
pub const TREND_BUCKET: Duration = Duration::from_secs(5);

/// Jobs of one queue that went from one state to another within one
/// bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    pub queue: String,
    /// Buckets of [`TREND_BUCKET`] back from now: 0 is the last 5 s.
    pub bucket: u32,
    /// `None` for an enqueue (the job did not exist).
    pub from: Option<JobState>,
    pub to: Option<JobState>,
    pub jobs: u64,
}
