//! What a claim writes and answers once it has decided: the new
//! attempts and parked resends with their events, and each slot's jobs.

use super::decide::Decided;
use crate::batch::{self, Change};
use crate::budget::LockedProvider;
use crate::events::NewEvent;
use jobfence_domain::{
    transition, ClaimedJob, CoordinatorError, DbTime, EventKind, Job, JobState, Observation,
};
use sqlx::MySqlConnection;
use std::collections::HashMap;

/// The answer of a committed claim: the jobs of each slot, in the order
/// of the slots, and the due resends it parked.
pub(super) fn hand_out(
    decided: Vec<Decided<'_>>,
    mut observations: HashMap<u64, Vec<Observation>>,
    slots: usize,
    provider: Option<&LockedProvider>,
) -> (Vec<Vec<ClaimedJob>>, Vec<Job>) {
    let mut jobs: Vec<Vec<ClaimedJob>> = vec![Vec::new(); slots];
    let mut parked = Vec::new();
    for d in decided {
        match d.slot {
            Some(i) => jobs[i].push(ClaimedJob {
                takeover: d.locked.job.state == JobState::Running,
                observations: observations.remove(&d.after.id).unwrap_or_default(),
                job: d.after,
                provider: provider.map(|p| p.name.clone()),
            }),
            None => parked.push(d.after),
        }
    }
    (jobs, parked)
}

/// Writes what a claim decided (new attempts, fenced on the state and
/// attempt read under the lock; parked resends), and returns their events (`claimed`, `taken_over`,
/// `manual_review`), appended by the caller with its COMMIT.
pub(super) async fn write_decided<'a>(
    conn: &mut MySqlConnection,
    decided: &'a [Decided<'_>],
    now: DbTime,
) -> Result<Vec<NewEvent<'a>>, CoordinatorError> {
    batch::write_images(&mut *conn, &decided_changes(decided)?).await?;
    Ok(decided_events(decided, now))
}

/// The new images of what a claim decided, each hand-out checked to be a
/// valid one (`transition::check_hand_out`).
pub(super) fn decided_changes<'a>(
    decided: &'a [Decided<'_>],
) -> Result<Vec<Change<'a>>, CoordinatorError> {
    for d in decided.iter().filter(|d| d.slot.is_some()) {
        transition::check_hand_out(&d.locked.job, &d.after)?;
    }
    Ok(decided
        .iter()
        .map(|d| Change {
            before: &d.locked.job,
            after: &d.after,
        })
        .collect())
}

/// The events of what a claim decided (`claimed`, `taken_over`,
/// `manual_review`).
pub(super) fn decided_events<'a>(decided: &'a [Decided<'_>], now: DbTime) -> Vec<NewEvent<'a>> {
    decided
        .iter()
        .map(|d| {
            let before = &d.locked.job;
            let after = &d.after;
            let (kind, to_state, detail) = match d.slot {
                None => (
                    EventKind::ManualReview,
                    JobState::ManualReview,
                    format!(
                        "hand_out:{}",
                        after.state_reason.as_deref().unwrap_or_default()
                    ),
                ),
                Some(_) if before.state == JobState::Running => (
                    EventKind::TakenOver,
                    JobState::Running,
                    after.next_action.as_str().to_owned(),
                ),
                Some(_) => (
                    EventKind::Claimed,
                    JobState::Running,
                    after.next_action.as_str().to_owned(),
                ),
            };
            NewEvent {
                job_id: after.id,
                queue: &after.queue,
                attempt: after.attempt,
                kind,
                from_state: Some(before.state),
                to_state: Some(to_state),
                current_attempt: after.attempt,
                request_digest: None,
                detail: Some(detail),
                created_at: now,
            }
        })
        .collect()
}
