//! The coordinator's one error type. Expected outcomes (a stale attempt, a
//! finished job) are variants of their own so the gRPC layer can turn each
//! into a precise status a worker in any language can switch on; see the
//! server's `grpc::status` for the mapping.

use super::{DbTime, JobState};
use crate::violation::FieldViolation;

/// Everything a coordinator call can refuse or fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CoordinatorError {
    /// The request is malformed; nothing was written.
    #[error("invalid request: {}", describe(.0))]
    InvalidArgument(Vec<FieldViolation>),

    /// No job with this id.
    #[error("job {job_id} not found")]
    JobNotFound { job_id: u64 },

    /// The presented attempt was superseded by a claim or takeover
    /// (docs/design.md rule 3): the caller no longer holds the job.
    #[error(
        "attempt {presented} of job {job_id} was superseded by attempt {current} (job is {state})"
    )]
    AttemptSuperseded {
        job_id: u64,
        presented: u64,
        current: u64,
        state: JobState,
    },

    /// The presented attempt is newer than any handed out: a client bug.
    #[error("attempt {presented} of job {job_id} was never issued (current is {current})")]
    AttemptNotIssued {
        job_id: u64,
        presented: u64,
        current: u64,
    },

    /// The attempt is current but the job is no longer running (it was
    /// finished, retried or parked by this very attempt with another call).
    #[error("job {job_id} is {state}, not running")]
    JobNotRunning {
        job_id: u64,
        attempt: u64,
        state: JobState,
    },

    /// The job finished and was pruned by retention (docs/design.md rule 14):
    /// what is left of it is its key record. Nothing was written.
    #[error("job {} was pruned ({}; finished {})", .0.job_id, .0.final_state, .0.finished_at)]
    JobPruned(Box<super::KeyRecord>),

    /// A read of the events feed from a cursor below what the pruner has
    /// removed: events after the cursor may be gone, so the page is refused
    /// instead of silently skipping them. Resume after `pruned_through`
    /// (from a snapshot of the jobs), or keep consumers closer than the
    /// job retention.
    #[error(
        "events up to id {pruned_through} may have been pruned; the cursor {after} is behind them"
    )]
    EventsCursorPruned { after: u64, pruned_through: u64 },

    /// Takeover of a job in a terminal state.
    #[error("job {job_id} is already finished ({state})")]
    JobFinished {
        job_id: u64,
        attempt: u64,
        state: JobState,
    },

    /// Takeover of a job whose lease has not expired (DB clock).
    #[error("lease of job {job_id} (attempt {attempt}) runs until {lease_until}")]
    LeaseNotExpired {
        job_id: u64,
        attempt: u64,
        lease_until: DbTime,
    },

    /// Enqueue of a known operation_key with a different payload.
    #[error("operation_key {operation_key:?} of queue {queue:?} is already job {job_id} with a different payload")]
    OperationKeyConflict {
        queue: String,
        operation_key: String,
        job_id: u64,
    },

    /// An operator resolution of a job that is not (or no longer) parked in
    /// manual_review, e.g. because another operator resolved it first.
    #[error(
        "job {job_id} is {state}, not in manual_review (attempt {current}; presented {presented})"
    )]
    JobNotInManualReview {
        job_id: u64,
        presented: u64,
        current: u64,
        state: JobState,
    },

    /// CancelJob of a job that is not `ready`, or that was already
    /// dispatched to the provider (cancelling could hide a sent operation).
    #[error(
        "job {job_id} cannot be cancelled: it is {state} and was dispatched {dispatch_count} times"
    )]
    JobNotCancellable {
        job_id: u64,
        attempt: u64,
        state: JobState,
        dispatch_count: u32,
    },

    /// A settlement exception id that no database holds (docs/design.md
    /// rule 15). Nothing was written.
    #[error("no settlement exception {id}")]
    SettlementExceptionNotFound { id: u64 },

    /// An operator's action on a settlement exception that is no longer in
    /// the state the operator saw: someone acted first (docs/design.md rule
    /// 15). Nothing was written; look at the exception again.
    #[error(
        "settlement exception {id} is {} now, not {} as seen: someone acted first",
        .current.as_str(),
        .seen.as_str()
    )]
    SettlementExceptionMoved {
        id: u64,
        seen: crate::settlement::ExceptionState,
        current: crate::settlement::ExceptionState,
    },

    /// The connection was lost during COMMIT: the change may or may not have
    /// been applied (docs/design.md rule 4). Never report ownership after this.
    #[error("commit outcome unknown: {0}")]
    CommitOutcomeUnknown(String),

    /// The database could not be reached; nothing was applied.
    #[error("database unavailable: {0}")]
    DatabaseUnavailable(String),

    /// A deadlock or lock wait timeout rolled the transaction back; nothing
    /// was applied and the call may be retried.
    #[error("transaction conflict: {0}")]
    TransactionConflict(String),

    /// Too many calls are already waiting for the database: this one was
    /// refused at once, before anything was written (back-pressure instead
    /// of an unbounded queue). Retry after a short backoff.
    #[error("coordinator overloaded: {pending} {what} calls already waiting for the database")]
    Overloaded { what: &'static str, pending: usize },

    /// The caller's credential does not cover this queue (the request's
    /// own queue, or the queue of the job it names, read from the job's
    /// row). Nothing was written, not even a refusal event.
    #[error("{}", queue_not_allowed(queue, job_id))]
    QueueNotAllowed {
        /// The queue the call would act on (`*` for "every queue").
        queue: String,
        /// The job named by the call, if it named one.
        job_id: Option<u64>,
    },

    /// A Takeover whose reconcile the provider's budget cannot pay for now
    /// (docs/design.md rule 11): too few units, the in-flight cap, an
    /// operator's pause, or the provider's own Retry-After reported by a
    /// worker. Nothing was written; ask again after `retry_after` (`None`:
    /// only an operator's resume or a job leaving flight changes it).
    #[error("{}", holdback(provider, why, retry_after))]
    ProviderHoldback {
        provider: String,
        why: super::budget::Holdback,
        retry_after: Option<std::time::Duration>,
        /// Set when `why` is a throttle.
        throttled_until: Option<DbTime>,
    },

    /// A batched call got no answer from its batch: a bug in the batching
    /// (every call of a batch must be answered once). Nothing says whether
    /// it was applied.
    #[error("internal error: a batched {what} call got no answer")]
    Unanswered {
        /// The pipeline (`write`, `claim`, `enqueue`).
        what: &'static str,
    },

    /// Anything unexpected (a bug, or a schema the code does not match).
    #[error("internal error: {0}")]
    Internal(String),
}

fn queue_not_allowed(queue: &str, job_id: &Option<u64>) -> String {
    match job_id {
        Some(id) => format!("the caller may not act on queue {queue:?} (of job {id})"),
        None => format!("the caller may not act on queue {queue:?}"),
    }
}

fn holdback(
    provider: &str,
    why: &super::budget::Holdback,
    retry_after: &Option<std::time::Duration>,
) -> String {
    use super::budget::Holdback::*;
    let what = match why {
        Rate | FairShare => "has no budget left for a reconcile now",
        InFlight => "has as many jobs in flight as its cap allows",
        Paused => "is paused by an operator",
        Throttled => "asked to wait (a worker reported its Retry-After)",
        KeyCap => "has as many jobs of this fairness key as its caps allow",
    };
    match retry_after {
        Some(d) => format!(
            "provider {provider:?} {what}; retry in {}",
            humantime::format_duration(std::time::Duration::from_millis(
                d.as_millis().max(1) as u64
            ))
        ),
        None => format!("provider {provider:?} {what}; retry later"),
    }
}

fn describe(violations: &[FieldViolation]) -> String {
    violations
        .iter()
        .map(|v| format!("{}: {}", v.field, v.description))
        .collect::<Vec<_>>()
        .join("; ")
}

impl CoordinatorError {
    /// One invalid field.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        CoordinatorError::InvalidArgument(vec![FieldViolation::new(field, description)])
    }
}
