//! Retention (docs/design.md rule 14): what a pruned job leaves behind, and the
//! rules the pruner's settings must follow.
//!
//! A finished job (`succeeded`, `failed`, `cancelled`) older than its
//! retention is deleted with its observations and events; its operation key
//! is kept as a [`KeyRecord`] for at least as long again, so a producer's
//! retried Enqueue of the key still answers the old job instead of creating
//! a second one (and a second refund).

use crate::{DbTime, Enqueue, Job, JobState, NextAction};
use std::time::Duration;

/// What the coordinator remembers of a pruned job: one row of
/// `operation_keys`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    /// The pruned job's id (it is never handed out again).
    pub job_id: u64,
    pub queue: String,
    pub operation_key: String,
    /// `succeeded`, `failed` or `cancelled`.
    pub final_state: JobState,
    /// The job's attempt when it finished.
    pub attempt: u64,
    /// How many times it was handed out to send.
    pub dispatch_count: u32,
    /// The provider's reference the worker reported, if any.
    pub provider_reference: Option<String>,
    /// When the job was enqueued and finished (DB clock, UTC).
    pub created_at: DbTime,
    pub finished_at: DbTime,
    /// When the pruner deleted the job (DB clock, UTC).
    pub pruned_at: DbTime,
}

impl KeyRecord {
    /// The job as an Enqueue of the same key and payload answers it after
    /// pruning: the same id, state, attempt and provider reference; the
    /// payload is the request's own (its digest matched the stored one).
    /// The result body, the last error and the lease history were deleted
    /// with the row and are `None`.
    pub fn as_enqueued_job(&self, req: &Enqueue) -> Job {
        Job {
            id: self.job_id,
            queue: self.queue.clone(),
            operation_key: self.operation_key.clone(),
            payload: req.payload.clone(),
            state: self.final_state,
            attempt: self.attempt,
            next_action: NextAction::Execute,
            run_at: self.created_at,
            lease_until: None,
            lease_owner: None,
            first_dispatched_at: None,
            dispatch_count: self.dispatch_count,
            provider_reference: self.provider_reference.clone(),
            result: None,
            last_error: None,
            state_reason: None,
            created_at: self.created_at,
            updated_at: self.finished_at,
            finished_at: Some(self.finished_at),
            // The request's own: a key record keeps neither.
            priority: req.priority,
            fairness_key: req.fairness_key.clone(),
        }
    }
}

/// How long finished jobs and key records are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Finished jobs (with their observations and events) older than this,
    /// counted from `finished_at` by the DB clock, are pruned, unless their
    /// queue's stored policy says otherwise.
    pub jobs: Duration,
    /// Key records older than this (from the job's `finished_at`) are
    /// pruned; `None`: kept forever (the default).
    pub keys: Option<Duration>,
}

/// The shortest retention accepted: a job must outlive the moment between
/// an Enqueue's lookup of its key and its insert by far.
pub const MIN_RETENTION: Duration = Duration::from_secs(1);

/// Why a retention setting is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetentionError {
    /// A key record that went before its job's retention ended would let a
    /// retried Enqueue of the key create a second job (rule 14).
    #[error(
        "key records would be kept {keys} but finished jobs {jobs}: keys must be kept at least as long as jobs (rule 14)"
    )]
    KeysShorterThanJobs { keys: String, jobs: String },
    /// Below [`MIN_RETENTION`].
    #[error("a retention of {0} is shorter than the minimum of 1s")]
    TooShort(String),
}

impl Retention {
    /// Checks the settings: each at least [`MIN_RETENTION`], and key records
    /// kept at least as long as jobs.
    pub fn check(&self) -> Result<(), RetentionError> {
        let show = |d: Duration| humantime::format_duration(d).to_string();
        for d in std::iter::once(self.jobs).chain(self.keys) {
            if d < MIN_RETENTION {
                return Err(RetentionError::TooShort(show(d)));
            }
        }
        match self.keys {
            Some(keys) if keys < self.jobs => Err(RetentionError::KeysShorterThanJobs {
                keys: show(keys),
                jobs: show(self.jobs),
            }),
            _ => Ok(()),
        }
    }
}

/// What one pruning run removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneCounts {
    /// Transactions that deleted jobs.
    pub batches: u64,
    pub jobs: u64,
    pub observations: u64,
    pub events: u64,
    /// Key records written (one per pruned job).
    pub keys_recorded: u64,
    /// Key records deleted by their own retention.
    pub keys_pruned: u64,
    /// Jobs written to the archive before their deletion (one line each;
    /// 0 without `--prune-archive-dir`).
    pub archived_jobs: u64,
    /// Bytes the archive file grew by (compressed, on disk).
    pub archived_bytes: u64,
}

impl PruneCounts {
    /// Adds `other` to these counts.
    pub fn add(&mut self, other: PruneCounts) {
        self.batches += other.batches;
        self.jobs += other.jobs;
        self.observations += other.observations;
        self.events += other.events;
        self.keys_recorded += other.keys_recorded;
        self.keys_pruned += other.keys_pruned;
        self.archived_jobs += other.archived_jobs;
        self.archived_bytes += other.archived_bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_records_must_outlive_jobs() {
        let day = Duration::from_secs(86_400);
        let ok = Retention {
            jobs: 30 * day,
            keys: None,
        };
        assert_eq!(ok.check(), Ok(()));
        let same = Retention {
            jobs: 30 * day,
            keys: Some(30 * day),
        };
        assert_eq!(same.check(), Ok(()));
        let short = Retention {
            jobs: 30 * day,
            keys: Some(29 * day),
        };
        assert!(matches!(
            short.check(),
            Err(RetentionError::KeysShorterThanJobs { .. })
        ));
        let tiny = Retention {
            jobs: Duration::from_millis(10),
            keys: None,
        };
        assert!(matches!(tiny.check(), Err(RetentionError::TooShort(_))));
    }
}
