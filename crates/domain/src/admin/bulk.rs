//! BulkRepair: one operator action (cancel, fail, requeue) over many jobs
//! counted by a filter, in one transaction per database. Each job is
//! fenced on the attempt the count saw and decided alone, by the very rule
//! of its single call (CancelJob, ResolveManualReview; [`super::fence`]):
//! docs/design.md rule 8, a batch changes how many jobs share a
//! transaction, never the rule per job. A job that moved since the count
//! is skipped and answered with its reason; every job applied or refused
//! is recorded in its events with the operator's name and reason, as a
//! single call records it.

use super::Resolution;
use crate::{CoordinatorError, JobState};
use std::time::Duration;

/// Most jobs one BulkRepair names: its transaction holds the row locks of
/// all of them until it commits.
pub const MAX_BULK_JOBS: usize = 1000;

/// Jobs per BulkRepair the CLI (`jobfence jobs bulk`, unless
/// `--batch-size` says otherwise) and the console send: a batch whose
/// transaction leaves the workers of the same database at their rate
/// beside a bulk (docs/benchmarks.md, "Repair in bulk").
pub const BULK_BATCH: usize = 500;

/// What a BulkRepair does to each of its jobs: the single call it stands
/// for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkAction {
    /// CancelJob: a ready job never dispatched becomes `cancelled`.
    Cancel,
    /// ResolveManualReview to [`Resolution::Failed`]: the refund will not
    /// happen.
    Fail,
    /// ResolveManualReview to [`Resolution::RetryReconcile`] due at once:
    /// back to ready, the next worker asks the provider first.
    Requeue,
}

impl BulkAction {
    /// The name of the action in the CLI, the console and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Cancel => "cancel",
            BulkAction::Fail => "fail",
            BulkAction::Requeue => "requeue",
        }
    }

    /// The resolution of `fail` and `requeue`; `None` for `cancel`.
    pub fn resolution(self) -> Option<Resolution> {
        match self {
            BulkAction::Cancel => None,
            BulkAction::Fail => Some(Resolution::Failed),
            BulkAction::Requeue => Some(Resolution::RetryReconcile {
                delay: Duration::ZERO,
            }),
        }
    }

    /// The state the action acts on: `ready` for `cancel`, `manual_review`
    /// for the resolutions.
    pub fn from_state(self) -> JobState {
        match self {
            BulkAction::Cancel => JobState::Ready,
            BulkAction::Fail | BulkAction::Requeue => JobState::ManualReview,
        }
    }

    /// The state an applied job is in afterwards.
    pub fn to_state(self) -> JobState {
        match self.resolution() {
            None => JobState::Cancelled,
            Some(r) => r.to_state(),
        }
    }
}

/// One job of a BulkRepair: its id and the attempt the count saw on it
/// (the fence; 0 for a job never claimed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountedJob {
    pub job_id: u64,
    pub attempt: u64,
}

/// A validated BulkRepair: 1 to [`MAX_BULK_JOBS`] jobs, no job twice.
#[derive(Debug, Clone)]
pub struct BulkRepair {
    pub action: BulkAction,
    /// In the order the caller counted them (oldest first); the answers
    /// come in this order.
    pub jobs: Vec<CountedJob>,
    /// Who acts, recorded in every job's event.
    pub operator: String,
    /// Why, recorded in every job's event.
    pub reason: String,
}

/// What a BulkRepair did to one job it applied to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkApplied {
    /// The job's queue.
    pub queue: String,
    /// Its state now.
    pub state: JobState,
    /// True when this very action (the same job, attempt, operator and
    /// reason) had been applied before, by a single call or a bulk one
    /// whose answer was lost: nothing was written again.
    pub replayed: bool,
}

/// The answer for one job: applied, or the refusal its single call would
/// have got (the fence's when the job moved: [`super::fence::moved`]).
pub type BulkJobResult = Result<BulkApplied, CoordinatorError>;

/// What a BulkRepair did.
#[derive(Debug, Clone, Default)]
pub struct BulkRepairOutcome {
    /// One per job, in the order of the call.
    pub results: Vec<(u64, BulkJobResult)>,
    /// Transactions the database rolled back as conflicts (a deadlock, a
    /// lock wait timeout) and the store ran again; nothing of a rolled-back
    /// try was applied.
    pub conflicts_retried: u32,
}

impl BulkRepairOutcome {
    /// Jobs applied (replays included).
    pub fn applied(&self) -> usize {
        self.results.iter().filter(|(_, r)| r.is_ok()).count()
    }

    /// Jobs skipped because they moved since the count.
    pub fn skipped(&self) -> usize {
        self.results
            .iter()
            .filter(|(_, r)| r.as_ref().is_err_and(super::fence::moved))
            .count()
    }
}
