//! Settlement (docs/design.md rule 15): the provider's own report of the
//! refunds it made has the last word on whether money moved. This module
//! is the pure part: a report's line ([`SettlementLine`], read through a
//! provider's [`mapping::Mapping`]), and what the lines of one operation
//! key say about the job that holds it ([`held::decide_held`], [`decide`]),
//! and whether a key's first line is decided as it is inserted
//! ([`on_insert`]). The store keeps the lines and the exceptions, and
//! decides a line on insert by [`on_insert`]; the coordinator applies the
//! other decisions through the same fenced write an operator's resolution
//! uses.
//!
//! What a report may change, and what it may only report:
//! - a settled refund of a job in `manual_review` resolves it to
//!   `succeeded` (fenced: if a worker or an operator moved the job first,
//!   the resolution is refused and the job is looked at again);
//! - a settled refund of a `ready` or `running` job is kept as an
//!   observation, for its next reconcile;
//! - everything else it contradicts is an [`ExceptionKind`] for a person.

pub mod held;
pub mod mapping;
pub mod records;

use crate::{DbTime, JobState};

/// A refund's status as the report gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LineStatus {
    /// Not settled yet (Stripe's `pending` and `requires_action`): decides
    /// nothing until a later report says how it ended.
    Pending,
    /// Money moved.
    Succeeded,
    /// The refund failed: no money moved.
    Failed,
    /// Cancelled before it moved money.
    Canceled,
}

impl LineStatus {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LineStatus::Pending => "pending",
            LineStatus::Succeeded => "succeeded",
            LineStatus::Failed => "failed",
            LineStatus::Canceled => "canceled",
        }
    }

    /// A report's status, in any case: `pending`, `requires_action`,
    /// `succeeded`, `failed`, `canceled` (or `cancelled`).
    pub fn parse(text: &str) -> Option<LineStatus> {
        match text.trim().to_ascii_lowercase().as_str() {
            "pending" | "requires_action" => Some(LineStatus::Pending),
            "succeeded" => Some(LineStatus::Succeeded),
            "failed" => Some(LineStatus::Failed),
            "canceled" | "cancelled" => Some(LineStatus::Canceled),
            _ => None,
        }
    }

    /// Whether the refund moved money.
    pub fn moved_money(self) -> bool {
        self == LineStatus::Succeeded
    }
}

impl_str_enum!(
    LineStatus,
    "settlement line status",
    [
        LineStatus::Pending,
        LineStatus::Succeeded,
        LineStatus::Failed,
        LineStatus::Canceled
    ]
);

/// One refund in a provider's report, read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettlementLine {
    /// The provider's id of the refund: a line seen again with this id is
    /// the same refund (its status may have moved on).
    pub provider_reference: String,
    /// The merchant reference jobfence sent (its operation key), when the
    /// report has one.
    pub operation_key: Option<String>,
    /// In the currency's minor unit, above zero.
    pub amount_minor: i64,
    /// Three letters, upper case.
    pub currency: String,
    pub status: LineStatus,
    /// When the provider made it (UTC).
    pub created_at: DbTime,
}

/// What a person must look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExceptionKind {
    /// Two or more refunds moved money for one operation key: the failure
    /// jobfence exists to prevent.
    DoubleRefund,
    /// The provider refunded an operation jobfence holds as failed or
    /// cancelled: money moved that jobfence says did not.
    RefundNotRecorded,
    /// A job succeeded inside a covered period, longer ago than the
    /// provider's settlement lag, and no refund of its key is in the
    /// reports.
    MissingAtProvider,
    /// The refund's amount or currency differs from the job's payload.
    AmountMismatch,
    /// A refund whose reference jobfence never enqueued (one made by hand
    /// in the provider's dashboard).
    UnknownReference,
    /// The refund's operation key is held by jobs of two or more of the
    /// provider's queues, no single one of them recorded the refund's
    /// provider reference, and what the refund says differs by job: the
    /// report changes none of them and names each queue and job.
    AmbiguousKey,
}

/// How urgent an exception is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Severity {
    /// Money may have moved wrongly: page someone.
    Critical,
    /// Look at it during the day.
    Warning,
}

impl Severity {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Warning => "warning",
        }
    }
}

impl ExceptionKind {
    /// The stored and printed name.
    pub fn as_str(self) -> &'static str {
        match self {
            ExceptionKind::DoubleRefund => "DOUBLE_REFUND",
            ExceptionKind::RefundNotRecorded => "REFUND_NOT_RECORDED",
            ExceptionKind::MissingAtProvider => "MISSING_AT_PROVIDER",
            ExceptionKind::AmountMismatch => "AMOUNT_MISMATCH",
            ExceptionKind::UnknownReference => "UNKNOWN_REFERENCE",
            ExceptionKind::AmbiguousKey => "AMBIGUOUS_KEY",
        }
    }

    /// Its severity.
    pub fn severity(self) -> Severity {
        match self {
            ExceptionKind::DoubleRefund
            | ExceptionKind::RefundNotRecorded
            | ExceptionKind::MissingAtProvider => Severity::Critical,
            ExceptionKind::AmountMismatch
            | ExceptionKind::UnknownReference
            | ExceptionKind::AmbiguousKey => Severity::Warning,
        }
    }

    /// Every kind, in a stable order.
    pub const ALL: [ExceptionKind; 6] = [
        ExceptionKind::DoubleRefund,
        ExceptionKind::RefundNotRecorded,
        ExceptionKind::MissingAtProvider,
        ExceptionKind::AmountMismatch,
        ExceptionKind::UnknownReference,
        ExceptionKind::AmbiguousKey,
    ];
}

impl_str_enum!(
    ExceptionKind,
    "settlement exception kind",
    [
        ExceptionKind::DoubleRefund,
        ExceptionKind::RefundNotRecorded,
        ExceptionKind::MissingAtProvider,
        ExceptionKind::AmountMismatch,
        ExceptionKind::UnknownReference,
        ExceptionKind::AmbiguousKey
    ]
);

/// Where an exception is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExceptionState {
    /// Nobody has looked at it.
    Open,
    /// Someone is on it (recorded with their name and note).
    Acknowledged,
    /// Closed: by a person's recorded action, or by a later report that
    /// no longer contradicts the job (recorded as `settlement`).
    Resolved,
}

impl ExceptionState {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ExceptionState::Open => "open",
            ExceptionState::Acknowledged => "acknowledged",
            ExceptionState::Resolved => "resolved",
        }
    }
}

impl_str_enum!(
    ExceptionState,
    "settlement exception state",
    [
        ExceptionState::Open,
        ExceptionState::Acknowledged,
        ExceptionState::Resolved
    ]
);

/// The operator name settlement's own actions are recorded under.
pub const OPERATOR: &str = "settlement";

/// What jobfence holds for one operation key of the provider's queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// No job and no key record: the key was never enqueued.
    Nobody,
    /// A live or finished job.
    Job {
        id: u64,
        state: JobState,
        attempt: u64,
        /// Its amount and currency, read from its payload by the queue's
        /// pointers; `None` when the queue has none (amounts are then not
        /// compared) or the payload lacks them.
        amount: Option<(i64, String)>,
    },
    /// A pruned job: its key record (docs/design.md rule 14). Amounts are
    /// not compared (the payload is gone).
    Pruned { job_id: u64, final_state: JobState },
}

impl Holder {
    /// The id of the job that holds the key, pruned or not; `None` for
    /// nobody.
    pub fn job_id(&self) -> Option<u64> {
        match self {
            Holder::Job { id, .. } => Some(*id),
            Holder::Pruned { job_id, .. } => Some(*job_id),
            Holder::Nobody => None,
        }
    }
}

/// What the lines of one key decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing settled yet (pending lines, failed ones, or none).
    Undecided,
    /// One settled refund, and the job (or its key record) succeeded.
    Matched,
    /// One settled refund of a job in manual review: resolve it to
    /// succeeded at this attempt with this provider reference.
    Resolve {
        job_id: u64,
        attempt: u64,
        provider_reference: String,
    },
    /// One settled refund of a job still ready or running: kept as an
    /// observation for its next reconcile; the job does not change.
    Observe { job_id: u64 },
    /// Contradicted: a person must look (see the exceptions).
    Exception,
}

/// The decision for one key: its outcome, and the exceptions it raises
/// (each with a one-line detail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    pub exceptions: Vec<(ExceptionKind, String)>,
}

/// Decides what `lines` (every line of one provider for one operation
/// key, whatever their status) say about `holder`. Pending, failed and
/// cancelled lines move no money; only settled ones count.
pub fn decide(holder: &Holder, lines: &[SettlementLine]) -> Decision {
    let settled: Vec<&SettlementLine> = lines.iter().filter(|l| l.status.moved_money()).collect();
    let refs = || {
        settled
            .iter()
            .map(|l| l.provider_reference.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let exception = |kind, detail: String| Decision {
        outcome: Outcome::Exception,
        exceptions: vec![(kind, detail)],
    };
    if settled.is_empty() {
        return Decision {
            outcome: Outcome::Undecided,
            exceptions: vec![],
        };
    }
    if matches!(holder, Holder::Nobody) {
        let detail = if lines.iter().all(|l| l.operation_key.is_none()) {
            format!(
                "refund {} gives no operation key, and no job of the provider's queues (nor a \
                 pruned one's key record) recorded it as its provider reference",
                refs()
            )
        } else {
            format!("refund {} names no operation jobfence enqueued", refs())
        };
        return exception(ExceptionKind::UnknownReference, detail);
    }
    if settled.len() > 1 {
        return exception(
            ExceptionKind::DoubleRefund,
            format!("{} refunds moved money: {}", settled.len(), refs()),
        );
    }
    let line = settled[0];
    let (state, job_id) = match holder {
        Holder::Job { state, id, .. } => (*state, *id),
        Holder::Pruned {
            final_state,
            job_id,
        } => (*final_state, *job_id),
        Holder::Nobody => unreachable!("answered above"),
    };
    let mut decision = match state {
        JobState::Failed | JobState::Cancelled => {
            return exception(
                ExceptionKind::RefundNotRecorded,
                format!(
                    "refund {} moved money; job {job_id} is {}",
                    line.provider_reference,
                    state.as_str()
                ),
            )
        }
        _ => by_state(holder, state, job_id, line),
    };
    if let Some(mismatch) = amount_mismatch(holder, job_id, line) {
        decision.exceptions.push(mismatch);
    }
    decision
}

/// The outcome of one settled refund for a holder in `state`, which is
/// not failed or cancelled (those are exceptions, decided by the caller).
fn by_state(holder: &Holder, state: JobState, job_id: u64, line: &SettlementLine) -> Decision {
    let outcome = match state {
        JobState::ManualReview => match holder {
            Holder::Job { id, attempt, .. } => Outcome::Resolve {
                job_id: *id,
                attempt: *attempt,
                provider_reference: line.provider_reference.clone(),
            },
            _ => unreachable!("a key record is only ever of a finished job"),
        },
        JobState::Ready | JobState::Running => Outcome::Observe { job_id },
        JobState::Succeeded | JobState::Failed | JobState::Cancelled => Outcome::Matched,
    };
    Decision {
        outcome,
        exceptions: vec![],
    }
}

/// An AMOUNT_MISMATCH when the holder is a job whose payload gave an
/// amount (minor units) and currency that the settled `line` does not
/// repeat; `None` without a payload amount (amounts not compared).
fn amount_mismatch(
    holder: &Holder,
    job_id: u64,
    line: &SettlementLine,
) -> Option<(ExceptionKind, String)> {
    let Holder::Job {
        amount: Some((amount, currency)),
        ..
    } = holder
    else {
        return None;
    };
    (*amount != line.amount_minor || *currency != line.currency).then(|| {
        (
            ExceptionKind::AmountMismatch,
            format!(
                "refund {} is {} {}; job {job_id}'s payload says {amount} {currency}",
                line.provider_reference, line.amount_minor, line.currency
            ),
        )
    })
}

/// The decision of a key's first and only line, made as the line is
/// inserted: `held` is every job (or else key record) of the provider's
/// `queues` that holds the key (see [`held::decide_held`]).
/// `Some(outcome)` only when the outcome writes nothing beyond the line
/// ([`Outcome::Matched`] with no exception, so the amounts agree or are
/// not compared, or [`Outcome::Undecided`]): the line is then inserted
/// decided. `None` leaves the line undecided, for the decision of every
/// line of its key ([`decide()`]) and what it writes (a resolution, an
/// observation, an exception). The store calls it for a new line whose key
/// has no other line and no exception not resolved.
pub fn on_insert(
    queues: &[records::QueueAmounts],
    held: &[held::Held],
    line: &SettlementLine,
) -> Option<Outcome> {
    let (_, d) = held::decide_held(queues, held, std::slice::from_ref(line));
    let writes_nothing = matches!(d.outcome, Outcome::Matched | Outcome::Undecided);
    (writes_nothing && d.exceptions.is_empty()).then_some(d.outcome)
}

/// The exceptions a key's decision may clear (resolved under the
/// operator name [`OPERATOR`] when its lines no longer raise them): every kind
/// [`decide()`] raises, and MISSING_AT_PROVIDER only once one of `lines`
/// (every line of the key) settled. Which of them its lines raise now is
/// [`Decision::exceptions`]; the others are cleared.
pub fn clearable(lines: &[SettlementLine]) -> Vec<ExceptionKind> {
    let mut kinds = vec![
        ExceptionKind::DoubleRefund,
        ExceptionKind::RefundNotRecorded,
        ExceptionKind::AmountMismatch,
        ExceptionKind::UnknownReference,
        ExceptionKind::AmbiguousKey,
    ];
    if lines.iter().any(|l| l.status.moved_money()) {
        kinds.push(ExceptionKind::MissingAtProvider);
    }
    kinds
}

#[cfg(test)]
mod tests;
