//! Settlement's calls and records, as the store keeps them and the
//! coordinator, the CLI and the console show them.

use super::mapping::Mapping;
use super::{ExceptionKind, ExceptionState, Outcome, Severity};
use crate::providers::ChangeBy;
use crate::DbTime;
use std::time::Duration;

/// The settlement lag a provider gets unless told otherwise: a refund made
/// late in a day may be in the next day's report.
pub const DEFAULT_LAG: Duration = Duration::from_secs(24 * 3600);

/// Where one queue of a provider keeps a job's amount and currency in its
/// payload: JSON pointers (RFC 6901, `/amount`). Without them the amounts
/// of that queue are not compared, and the report says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueAmounts {
    pub queue: String,
    pub amount_pointer: Option<String>,
    pub currency_pointer: Option<String>,
}

/// A provider's settlement settings: how its report is read, its lag, and
/// the amounts of its queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettlementSettings {
    pub provider: String,
    /// `fake` or `stripe` when the mapping is a preset's.
    pub preset: Option<String>,
    pub mapping: Mapping,
    /// How long after a job succeeded its refund may still be missing from
    /// the reports before that is an exception.
    pub lag: Duration,
    /// The provider's queues (those that dispatch to it), each with its
    /// amount pointers (none when not set).
    pub queues: Vec<QueueAmounts>,
}

/// PutSettlementSettings: store a provider's settings (the queues listed
/// must be the provider's own; their pointers are replaced).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutSettlementSettings {
    pub provider: String,
    pub preset: Option<String>,
    pub mapping: Mapping,
    pub lag: Duration,
    pub queues: Vec<QueueAmounts>,
    pub by: ChangeBy,
}

/// What one batch of lines did to the stored lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineCounts {
    /// Lines not held before.
    pub new: u64,
    /// Lines held with something else (a new status, usually).
    pub updated: u64,
    /// Lines held exactly so: nothing written.
    pub unchanged: u64,
}

impl LineCounts {
    pub fn add(&mut self, other: LineCounts) {
        self.new += other.new;
        self.updated += other.updated;
        self.unchanged += other.unchanged;
    }
}

/// What settlement's decisions did in an import, counted for its summary
/// (the claim's own decisions are the store's `claim::decide::Decided`):
/// one count per key decided, by its [`Outcome`], and the exceptions
/// opened and resolved by raising them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Keys whose one settled refund matches their succeeded job.
    pub matched: u64,
    /// Manual reviews resolved to succeeded: (job id, provider reference).
    pub resolved: Vec<(u64, String)>,
    /// Live jobs given a settled line as an observation.
    pub observed: u64,
    /// Keys with only pending, failed or cancelled lines.
    pub undecided: u64,
    /// Exceptions opened (or opened again).
    pub exceptions_opened: u64,
    /// Exceptions a report no longer raises, resolved.
    pub exceptions_resolved: u64,
}

impl Tally {
    /// The outcomes of lines decided as they were inserted, counted.
    pub fn counted(outcomes: &[Outcome]) -> Tally {
        let mut out = Tally::default();
        for o in outcomes {
            out.count(o);
        }
        out
    }

    /// Counts one key's outcome. [`Outcome::Exception`] counts nothing
    /// here: its exceptions are counted as they are opened.
    pub fn count(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Matched => self.matched += 1,
            Outcome::Resolve {
                job_id,
                provider_reference,
                ..
            } => self.resolved.push((*job_id, provider_reference.clone())),
            Outcome::Observe { .. } => self.observed += 1,
            Outcome::Undecided => self.undecided += 1,
            Outcome::Exception => {}
        }
    }

    /// Adds `other`'s counts, and its resolutions after these.
    pub fn add(&mut self, other: &Tally) {
        self.matched += other.matched;
        self.resolved.extend(other.resolved.iter().cloned());
        self.observed += other.observed;
        self.undecided += other.undecided;
        self.exceptions_opened += other.exceptions_opened;
        self.exceptions_resolved += other.exceptions_resolved;
    }
}

/// One exception, with its life so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettlementException {
    pub id: u64,
    pub provider: String,
    pub kind: ExceptionKind,
    pub severity: Severity,
    /// The operation key, or a refund's provider reference when it named
    /// none.
    pub subject: String,
    pub job_id: Option<u64>,
    pub detail: String,
    pub state: ExceptionState,
    pub opened_at: DbTime,
    pub updated_at: DbTime,
    /// Every step of its life, oldest first (filled for one exception).
    pub actions: Vec<ExceptionAction>,
}

/// Exceptions as one list shows them: cut at its limit, and how many
/// matched.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExceptionList {
    /// Newest first, at most the limit asked for.
    pub exceptions: Vec<SettlementException>,
    /// How many match the list's filters, in every database (more than
    /// `exceptions` holds when the limit cut it).
    pub total: u64,
}

/// One step of an exception's life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExceptionAction {
    /// `opened`, `reopened`, `acknowledged`, `resolved`.
    pub action: String,
    pub operator: String,
    pub note: String,
    pub acted_at: DbTime,
}

/// A person acting on an exception: acknowledge it (someone is on it) or
/// resolve it, with a note. Refused when the exception is not in `seen`
/// any more (someone else acted first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActOnException {
    pub id: u64,
    pub seen: ExceptionState,
    pub to: ExceptionState,
    pub operator: String,
    pub note: String,
}

/// A covered period of a provider's reports, `[start, end)` UTC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoveredPeriod {
    pub start: DbTime,
    pub end: DbTime,
    pub last_imported_at: DbTime,
    pub last_imported_by: String,
}

/// One provider's settlement at a glance.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProviderSettlement {
    pub provider: String,
    pub periods: Vec<CoveredPeriod>,
    /// Lines held, by status (`pending`, `succeeded`, `failed`,
    /// `canceled`).
    pub lines: Vec<(String, u64)>,
    /// Succeeded jobs (or key records) of the provider's queues matched by
    /// exactly one settled refund.
    pub matched: u64,
    /// Manual reviews settlement resolved (recorded under its operator
    /// name).
    pub resolved_reviews: u64,
    /// Exceptions by kind and state.
    pub exceptions: Vec<(ExceptionKind, ExceptionState, u64)>,
    /// Queues whose amounts are not compared (no pointers).
    pub amounts_not_compared: Vec<String>,
}
