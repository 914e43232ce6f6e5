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
