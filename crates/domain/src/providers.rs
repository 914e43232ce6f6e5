//! Providers and stored queue policies as operators see and change them
//! (docs/design.md rules 11 and 13): the records, the requests, and the
//! recorded changes. What a claim does with a budget is in [`super::budget`].

use super::budget::{Budget, Pause};
use super::{DbTime, QueuePolicy};
use std::time::Duration;

/// A provider as stored, with what its budget holds at `now` (DB clock).
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderRecord {
    pub name: String,
    pub budget: Budget,
    /// The queues that dispatch to it, sorted.
    pub queues: Vec<String>,
    pub pause: Pause,
    /// The operator's reason for the pause.
    pub pause_reason: Option<String>,
    /// Set while a worker's throttle report holds hand-outs.
    pub throttled_until: Option<DbTime>,
    /// Throttle reports received, in all.
    pub throttle_reports: u64,
    /// Whole units that could be spent at `now`.
    pub units_available: u32,
    /// When the next unit is due, if none is available at `now`.
    pub next_unit_in: Option<Duration>,
    /// Jobs of its queues running with a live lease at `now`.
    pub in_flight: u64,
    pub updated_at: DbTime,
    /// The operator of the last change.
    pub updated_by: String,
    /// The DB clock when this was read.
    pub now: DbTime,
}

impl ProviderRecord {
    /// True while a throttle report holds hand-outs.
    pub fn throttled(&self) -> bool {
        self.throttled_until.is_some_and(|t| t > self.now)
    }

    /// What holds its queues' ready jobs now (docs/design.md rule 11), the
    /// first of: an operator's pause, a worker's throttle report, the
    /// in-flight cap, a spent budget; `None` when a claim could be handed
    /// a job now.
    pub fn hold(&self) -> Option<QueueHold> {
        let hold = |kind, why: String, since, by: Option<&str>| QueueHold {
            provider: self.name.clone(),
            kind,
            why,
            since,
            by: by.map(str::to_owned),
        };
        let reason = self.pause_reason.as_deref().unwrap_or("no reason given");
        match self.pause {
            Pause::All => {
                return Some(hold(
                    HoldKind::Paused,
                    format!("provider {} paused: {reason}", self.name),
                    Some(self.updated_at),
                    Some(&self.updated_by),
                ))
            }
            Pause::Sends => {
                return Some(hold(
                    HoldKind::SendsPaused,
                    format!(
                        "provider {} paused for sends (reconciles go on): {reason}",
                        self.name
                    ),
                    Some(self.updated_at),
                    Some(&self.updated_by),
                ))
            }
            Pause::None => {}
        }
        if let Some(until) = self.throttled_until.filter(|t| *t > self.now) {
            return Some(hold(
                HoldKind::Throttled,
                format!(
                    "provider {} throttled until {} (a worker reported its Retry-After)",
                    self.name,
                    until.format("%H:%M:%S UTC")
                ),
                None,
                None,
            ));
        }
        if let Some(cap) = self
            .budget
            .max_in_flight
            .filter(|c| self.in_flight >= u64::from(*c))
        {
            return Some(hold(
                HoldKind::InFlightCap,
                format!(
                    "provider {}: {} in flight, its cap is {cap}",
                    self.name, self.in_flight
                ),
                None,
                None,
            ));
        }
        let next = self.next_unit_in.filter(|_| self.units_available == 0)?;
        Some(hold(
            HoldKind::BudgetSpent,
            format!(
                "provider {}'s budget is spent: the next unit in {:.1} s ({}/s, burst {})",
                self.name,
                next.as_secs_f64(),
                self.budget.rate_per_second,
                self.budget.burst
            ),
            None,
            None,
        ))
    }
}

/// Why a queue's ready jobs wait: what its provider's record says holds
/// them ([`ProviderRecord::hold`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueHold {
    /// The provider that holds them; empty when the queue itself is
    /// paused.
    pub provider: String,
    pub kind: HoldKind,
    /// For a person: what holds the jobs, and the pause's reason.
    pub why: String,
    /// Since when, and by whom: an operator's pause (the provider's last
    /// change); `None` for what no person decided.
    pub since: Option<DbTime>,
    pub by: Option<String>,
}

/// The kinds of [`QueueHold`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldKind {
    /// The queue itself paused by an operator.
    QueuePaused,
    Paused,
    SendsPaused,
    Throttled,
    InFlightCap,
    BudgetSpent,
}

impl HoldKind {
    /// The name the API and the CLI's JSON carry.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldKind::QueuePaused => "QUEUE_PAUSED",
            HoldKind::Paused => "PAUSED",
            HoldKind::SendsPaused => "SENDS_PAUSED",
            HoldKind::Throttled => "THROTTLED",
            HoldKind::InFlightCap => "IN_FLIGHT_CAP",
            HoldKind::BudgetSpent => "BUDGET_SPENT",
        }
    }
}

/// A queue's stored row: its provider, and its resend policy if stored.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuePolicyRecord {
    pub queue: String,
    pub provider: Option<String>,
    /// The stored resend policy; `None`: the coordinators' flags decide.
    pub policy: Option<QueuePolicy>,
    /// The queue's retention of finished jobs; `None`: the coordinators'
    /// `--retention-jobs`.
    pub job_retention: Option<std::time::Duration>,
    pub updated_at: DbTime,
    pub updated_by: String,
}

/// Who changes a provider or a policy, and why (both recorded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeBy {
    pub operator: String,
    pub reason: String,
}

/// PutProvider: create a provider, or replace its budget and queues.
#[derive(Debug, Clone, PartialEq)]
pub struct PutProvider {
    pub name: String,
    pub budget: Budget,
    /// The queues that dispatch to it (replaces the list).
    pub queues: Vec<String>,
    pub by: ChangeBy,
}

/// PauseProvider / ResumeProvider (`Pause::None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetPause {
    pub name: String,
    pub pause: Pause,
    pub by: ChangeBy,
}

/// PutQueuePolicy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutQueuePolicy {
    pub queue: String,
    pub policy: QueuePolicy,
    /// The queue's retention of finished jobs (docs/design.md rule 14); `None`:
    /// the coordinators' default.
    pub job_retention: Option<std::time::Duration>,
    pub by: ChangeBy,
}

/// What an operator did, as recorded in `policy_changes.action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyAction {
    PutProvider,
    DeleteProvider,
    PauseProvider,
    ResumeProvider,
    PutQueuePolicy,
    DeleteQueuePolicy,
    /// A provider's settlement settings were stored.
    PutSettlement,
    /// A queue paused by an operator (its claims hand out nothing).
    PauseQueue,
    /// A paused queue resumed.
    ResumeQueue,
}

impl PolicyAction {
    /// The value stored in `policy_changes.action`.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyAction::PutProvider => "put_provider",
            PolicyAction::DeleteProvider => "delete_provider",
            PolicyAction::PauseProvider => "pause_provider",
            PolicyAction::ResumeProvider => "resume_provider",
            PolicyAction::PutQueuePolicy => "put_queue_policy",
            PolicyAction::DeleteQueuePolicy => "delete_queue_policy",
            PolicyAction::PutSettlement => "put_settlement",
            PolicyAction::PauseQueue => "pause_queue",
            PolicyAction::ResumeQueue => "resume_queue",
        }
    }
}

/// One recorded change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyChange {
    pub id: u64,
    pub changed_at: DbTime,
    pub operator: String,
    /// `provider:<name>` or `queue:<name>`.
    pub subject: String,
    /// See [`PolicyAction::as_str`].
    pub action: String,
    pub reason: String,
    /// JSON: the stored values after the change (before it, for a delete).
    pub detail: String,
}

/// The subject of a provider's changes.
pub fn provider_subject(name: &str) -> String {
    format!("provider:{name}")
}

/// The subject of a queue policy's changes.
pub fn queue_subject(queue: &str) -> String {
    format!("queue:{queue}")
}
