//! The job model of docs/design.md and its pure rules, independent of MySQL and
//! of gRPC (this crate depends on neither sqlx nor tonic): the bottom of
//! jobfence's layers, which every other crate of the coordinator uses.
//!
//! `operation_key` and `attempt` are two identities that are never mixed:
//! the first is the business identity sent to the provider as its idempotency
//! key, the second is the fencing token that decides who may write back.
//!
//! - [`fence`]: who may write (the attempt check); [`transition`]: the row
//!   image each write produces; [`policy`]: the resend window.
//! - [`budget`], [`providers`]: provider budgets (GCRA) and their records.
//! - [`calls`]: the domain calls; [`write_plan`]: what a fenced write does
//!   to its locked row; [`admin`]: the operator's calls and reads;
//!   [`event`], [`feed`]: the events log and the outbox read from it; [`validate`]: request validation and the
//!   input limits; [`violation`]: one bad field.
//! - [`error`]: the one error type; [`scope`]: the queues a caller may act
//!   on; [`durability`]: whether the database can lose a commit;
//!   [`retention`]: what a pruned job leaves behind; [`settlement`]: what
//!   a provider's report says about the jobs (docs/design.md rule 15).

/// `FromStr` and `Display` for an enum with `as_str`: the stored or
/// logged spelling of each value, parsed back with [`UnknownValue`] for a
/// value the code does not know.
macro_rules! impl_str_enum {
    ($ty:ty, $kind:literal, [$($variant:expr),+ $(,)?]) => {
        impl std::str::FromStr for $ty {
            type Err = $crate::UnknownValue;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                [$($variant),+]
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| $crate::UnknownValue { kind: $kind, value: s.to_owned() })
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod admin;
pub mod budget;
pub mod calls;
pub mod durability;
pub mod error;
pub mod event;
pub mod fairness;
pub mod feed;
pub mod fence;
pub mod pacing;
pub mod policy;
pub mod providers;
pub mod retention;
pub mod scope;
pub mod settlement;
pub mod transition;
pub mod validate;
pub mod violation;
pub mod write_plan;

use chrono::NaiveDateTime;

pub use calls::{
    ClaimSlot, Complete, Enqueue, EnqueueOutcome, Fail, FencedOutcome, FencedWrite,
    RecordObservation, RenewLease, ScopedWrite, Takeover,
};
pub use error::CoordinatorError;
pub use event::EventKind;
pub use retention::{KeyRecord, PruneCounts, Retention};
pub use scope::QueueScope;
pub use violation::FieldViolation;

/// A timestamp from the database clock (UTC, microsecond precision).
pub type DbTime = NaiveDateTime;

/// Where a job is in its life. `succeeded`, `failed` and `cancelled` are
/// terminal; `manual_review` changes only by an operator's resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    Ready,
    Running,
    Succeeded,
    Failed,
    ManualReview,
    Cancelled,
}

impl JobState {
    /// Every state, in life-cycle order.
    pub const ALL: [JobState; 6] = [
        JobState::Ready,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::ManualReview,
        JobState::Cancelled,
    ];

    /// The value stored in `jobs.state`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Ready => "ready",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::ManualReview => "manual_review",
            JobState::Cancelled => "cancelled",
        }
    }

    /// True for `succeeded`, `failed` and `cancelled`: nothing changes them.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

/// What a worker does with a job it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NextAction {
    /// Send the operation, with `operation_key` as the idempotency key.
    Execute,
    /// Ask the provider what happened first (always the first step of a takeover).
    Reconcile,
}

impl NextAction {
    /// The value stored in `jobs.next_action`.
    pub fn as_str(self) -> &'static str {
        match self {
            NextAction::Execute => "execute",
            NextAction::Reconcile => "reconcile",
        }
    }
}

/// Who reported an observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObservationSource {
    Worker,
    Webhook,
    Reconciler,
    Operator,
    /// A line of the provider's settlement report, kept by the coordinator's
    /// settlement import (docs/design.md rule 15); never accepted from a
    /// caller.
    Settlement,
}

impl ObservationSource {
    /// The value stored in `job_observations.source`.
    pub fn as_str(self) -> &'static str {
        match self {
            ObservationSource::Worker => "worker",
            ObservationSource::Webhook => "webhook",
            ObservationSource::Reconciler => "reconciler",
            ObservationSource::Operator => "operator",
            ObservationSource::Settlement => "settlement",
        }
    }
}

/// What the provider said about the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObservationOutcome {
    Succeeded,
    Pending,
    Failed,
    NotFound,
    Unknown,
}

impl ObservationOutcome {
    /// The value stored in `job_observations.outcome`.
    pub fn as_str(self) -> &'static str {
        match self {
            ObservationOutcome::Succeeded => "succeeded",
            ObservationOutcome::Pending => "pending",
            ObservationOutcome::Failed => "failed",
            ObservationOutcome::NotFound => "not_found",
            ObservationOutcome::Unknown => "unknown",
        }
    }
}

/// A stored enum value the code does not know (a newer schema, or a typo in
/// hand-written SQL).
#[derive(Debug, thiserror::Error)]
#[error("unknown {kind} value {value:?} in the database")]
pub struct UnknownValue {
    pub kind: &'static str,
    pub value: String,
}

impl_str_enum!(
    JobState,
    "state",
    [
        JobState::Ready,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::ManualReview,
        JobState::Cancelled
    ]
);
impl_str_enum!(
    NextAction,
    "next_action",
    [NextAction::Execute, NextAction::Reconcile]
);
impl_str_enum!(
    ObservationSource,
    "source",
    [
        ObservationSource::Worker,
        ObservationSource::Webhook,
        ObservationSource::Reconciler,
        ObservationSource::Operator,
        ObservationSource::Settlement
    ]
);
impl_str_enum!(
    ObservationOutcome,
    "outcome",
    [
        ObservationOutcome::Succeeded,
        ObservationOutcome::Pending,
        ObservationOutcome::Failed,
        ObservationOutcome::NotFound,
        ObservationOutcome::Unknown
    ]
);

/// One row of `jobs`.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: u64,
    pub queue: String,
    pub operation_key: String,
    pub payload: String,
    pub state: JobState,
    /// The current fencing token; 0 until the first claim.
    pub attempt: u64,
    pub next_action: NextAction,
    pub run_at: DbTime,
    pub lease_until: Option<DbTime>,
    pub lease_owner: Option<String>,
    pub first_dispatched_at: Option<DbTime>,
    pub dispatch_count: u32,
    pub provider_reference: Option<String>,
    pub result: Option<String>,
    pub last_error: Option<String>,
    pub state_reason: Option<String>,
    pub created_at: DbTime,
    pub updated_at: DbTime,
    pub finished_at: Option<DbTime>,
    /// Its priority (docs/design.md rule 18).
    pub priority: fairness::Priority,
    /// Its fairness key (a merchant, a tenant), if it was given one.
    pub fairness_key: Option<String>,
}

/// One row of `job_observations`: evidence, never a write to the job.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub id: u64,
    pub job_id: u64,
    pub attempt: u64,
    pub source: ObservationSource,
    pub outcome: ObservationOutcome,
    pub provider_reference: Option<String>,
    pub body: String,
    pub dedup_key: String,
    pub recorded_at: DbTime,
}

/// A job handed out by Claim or Takeover, with the attempt the caller now holds.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedJob {
    pub job: Job,
    /// True when an expired lease was taken over (next_action is `reconcile`).
    pub takeover: bool,
    pub observations: Vec<Observation>,
    /// The provider whose budget paid for the hand-out, if the queue has
    /// one.
    pub provider: Option<String>,
}

/// Per-queue rules the coordinator enforces (docs/design.md rule 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePolicy {
    /// How long after the first dispatch a resend with the same
    /// operation_key is still covered by the provider's idempotency
    /// guarantee (Stripe: 24 h).
    pub resend_window: std::time::Duration,
    /// The most times a job may be handed out with `execute`.
    pub max_dispatches: u32,
}

impl Default for QueuePolicy {
    fn default() -> Self {
        QueuePolicy {
            resend_window: std::time::Duration::from_secs(24 * 3600),
            max_dispatches: 3,
        }
    }
}

/// The policy of every queue: a default and per-queue overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueuePolicies {
    /// Policy of queues not named in `by_queue`.
    pub default: QueuePolicy,
    pub by_queue: std::collections::HashMap<String, QueuePolicy>,
}

impl QueuePolicies {
    /// The policy of `queue`.
    pub fn get(&self, queue: &str) -> QueuePolicy {
        self.by_queue.get(queue).copied().unwrap_or(self.default)
    }
}

/// How a worker asks Fail to dispose of the job it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailDisposition {
    /// Ready again after the delay, to reconcile first.
    RetryReconcile,
    /// Ready again after the delay, to send again (subject to the resend policy).
    RetryExecute,
    /// Terminal failure: the outcome is known.
    Failed,
    /// Park for an operator.
    ManualReview,
}

impl FailDisposition {
    /// The name used in events (a Fail's detail), call digests and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            FailDisposition::RetryReconcile => "retry_reconcile",
            FailDisposition::RetryExecute => "retry_execute",
            FailDisposition::Failed => "failed",
            FailDisposition::ManualReview => "manual_review",
        }
    }
}

impl_str_enum!(
    FailDisposition,
    "fail disposition",
    [
        FailDisposition::RetryReconcile,
        FailDisposition::RetryExecute,
        FailDisposition::Failed,
        FailDisposition::ManualReview
    ]
);

/// Why the coordinator did not apply a RetryExecute as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverrideReason {
    /// The provider's idempotency window (from the first dispatch) would be
    /// closed when the resend becomes due.
    ResendWindowClosed,
    /// The queue's max dispatches is reached.
    MaxDispatchesReached,
}

impl OverrideReason {
    /// The reason string reported to clients and stored in `state_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            OverrideReason::ResendWindowClosed => "RESEND_WINDOW_CLOSED",
            OverrideReason::MaxDispatchesReached => "MAX_DISPATCHES_REACHED",
        }
    }
}

impl_str_enum!(
    OverrideReason,
    "override reason",
    [
        OverrideReason::ResendWindowClosed,
        OverrideReason::MaxDispatchesReached
    ]
);

/// `state_reason` of a job a worker itself asked to park (the other
/// reasons of manual review are the [`OverrideReason`]s).
pub const MANUAL_REVIEW_REQUESTED: &str = "REQUESTED";

/// Why a job is where it is, for a person: its `state_reason` told in
/// words (a worker's own explanation, its last error, for a job it
/// parked; the rule for one the coordinator parked), else its last error.
/// What lists of jobs show instead of the bare reason code.
pub fn explain_state(state_reason: Option<&str>, last_error: Option<&str>) -> Option<String> {
    let error = last_error.filter(|e| !e.trim().is_empty());
    let told = match state_reason {
        Some(MANUAL_REVIEW_REQUESTED) => match error {
            Some(e) => format!("the worker asked for an operator: {e}"),
            None => "the worker asked for an operator".to_owned(),
        },
        Some(r) => match r.parse::<OverrideReason>() {
            Ok(OverrideReason::ResendWindowClosed) => "a resend was refused: the provider's \
                 idempotency window, counted from the first dispatch, is closed"
                .to_owned(),
            Ok(OverrideReason::MaxDispatchesReached) => {
                "a resend was refused: the queue's dispatches are used up".to_owned()
            }
            Err(_) => r.to_owned(),
        },
        None => error?.to_owned(),
    };
    Some(told)
}

#[cfg(test)]
mod explain_tests {
    use super::explain_state;

    #[test]
    fn a_reason_code_is_told_in_words_with_the_workers_own_error() {
        let told = |r, e| explain_state(r, e).unwrap_or_default();
        assert_eq!(
            told(Some("REQUESTED"), Some("lookup timed out")),
            "the worker asked for an operator: lookup timed out"
        );
        assert_eq!(
            told(Some("REQUESTED"), None),
            "the worker asked for an operator"
        );
        assert!(told(Some("RESEND_WINDOW_CLOSED"), None).contains("idempotency window"));
        assert!(told(Some("MAX_DISPATCHES_REACHED"), None).contains("dispatches are used up"));
        assert_eq!(
            told(Some("cancelled by alice: dup"), None),
            "cancelled by alice: dup"
        );
        assert_eq!(told(None, Some("card expired")), "card expired");
        assert_eq!(explain_state(None, Some(" ")), None);
    }
}

/// The result of a fenced write: the job afterwards, and whether this exact
/// call had already been applied (a replay after a lost response).
#[derive(Debug, Clone, PartialEq)]
pub struct WriteOutcome {
    pub job: Job,
    pub replayed: bool,
}

/// The result of Fail: what was applied, and why it differs from the request.
#[derive(Debug, Clone, PartialEq)]
pub struct FailOutcome {
    pub job: Job,
    pub applied: FailDisposition,
    pub override_reason: Option<OverrideReason>,
    pub replayed: bool,
    /// The provider held by this Fail's throttle report, if any.
    pub throttled: Option<String>,
}
