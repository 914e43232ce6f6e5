//! The operator's fenced writes, CancelJob and ResolveManualReview, for
//! one job or for many in one transaction (BulkRepair): one way for both,
//! so a bulk action keeps the single call's rule, events and replays for
//! each of its jobs (docs/design.md rule 8).
//!
//! A transaction locks every job it names by primary key, in ascending id
//! order (`queries/batch/lock_jobs.sql`, as every batch locks), decides
//! each job alone under its lock by the domain's fence
//! ([`jobfence_domain::admin::fence`]), writes the jobs that pass with one
//! UPDATE that still carries each row's `id + state + attempt` in its
//! WHERE (docs/design.md rule 3), and appends every job's event (applied,
//! or refused with the attempt the operator presented) in one statement.
//! A refused job whose exact call was applied before (the same job,
//! attempt, operator, reason and resolution: its answer was lost) is
//! answered as a replay and writes nothing.

use super::super::batch::{self, expand, shape};
use super::super::events::{self, call_digest, CallKey, NewEvent};
use super::super::pause::PausePoint;
use super::super::reads::LockedJob;
use super::super::{micros, JobStore};
use crate::run::{Body, Failure};
use jobfence_domain::admin::{fence, CountedJob, Resolution};
use jobfence_domain::{CoordinatorError, EventKind, Job, JobState, NextAction};
use sqlx::MySqlConnection;
use std::collections::HashSet;

/// Longest `state_reason` stored (the column is VARCHAR(255)), in bytes.
const STATE_REASON_BYTES: usize = 255;

/// `"<verb> by <operator>: <reason>"`, cut to fit `state_reason`.
fn state_reason(verb: &str, operator: &str, reason: &str) -> String {
    let mut s = format!("{verb} by {operator}: {reason}");
    if s.len() > STATE_REASON_BYTES {
        let mut end = STATE_REASON_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// The JSON detail of an operator event.
fn detail(
    action: &str,
    operator: &str,
    reason: &str,
    extra: &[(&str, serde_json::Value)],
) -> String {
    let mut map = serde_json::Map::new();
    map.insert("action".into(), action.into());
    map.insert("operator".into(), operator.into());
    map.insert("reason".into(), reason.into());
    for (k, v) in extra {
        map.insert((*k).into(), v.clone());
    }
    serde_json::Value::Object(map).to_string()
}

/// One operator write, the same for every job it names: a cancel, or a
/// resolution of jobs parked in manual review.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OperatorWrite<'a> {
    /// `None` for a cancel.
    resolution: Option<&'a Resolution>,
    operator: &'a str,
    reason: &'a str,
}

/// What an operator write did to one job: the job as locked before the
/// write, and whether the call was a replay of one applied before.
#[derive(Debug)]
pub(crate) struct Written {
    pub job: Job,
    pub replayed: bool,
}

/// One job's answer (see [`Written`]); `JobNotFound` or the fence's
/// refusal otherwise.
pub(crate) type WrittenResult = Result<Written, CoordinatorError>;

/// What the fence decided for one job under its lock.
enum Decided {
    Apply(LockedJob),
    Refuse(LockedJob, CoordinatorError),
    Missing,
}

impl<'a> OperatorWrite<'a> {
    /// A cancel (`None`) or a resolution, by `operator` for `reason`.
    pub(crate) fn new(
        resolution: Option<&'a Resolution>,
        operator: &'a str,
        reason: &'a str,
    ) -> Self {
        OperatorWrite {
            resolution,
            operator,
            reason,
        }
    }

    /// The identity of the call on one job, as its event keeps it: a
    /// repeated call is recognised by it (a bulk's and a single call's
    /// alike).
    fn digest(&self, job: CountedJob) -> [u8; 32] {
        let (id, attempt) = (job.job_id.to_be_bytes(), job.attempt.to_be_bytes());
        let (op, why) = (self.operator.as_bytes(), self.reason.as_bytes());
        let Some(resolution) = self.resolution else {
            return call_digest(&[b"cancel_job", &id, &attempt, op, why]);
        };
        let (reference, result, delay) = match resolution {
            Resolution::Succeeded {
                provider_reference,
                result,
            } => (
                provider_reference.as_str(),
                result.as_deref().unwrap_or(""),
                0,
            ),
            Resolution::Failed => ("", "", 0),
            Resolution::RetryReconcile { delay } | Resolution::RetryExecute { delay } => {
                ("", "", micros(*delay))
            }
        };
        call_digest(&[
            b"resolve_manual_review",
            &id,
            &attempt,
            resolution.as_str().as_bytes(),
            op,
            why,
            reference.as_bytes(),
            result.as_bytes(),
            &delay.to_be_bytes(),
        ])
    }

    /// The action's name in its events.
    fn action(&self) -> &'static str {
        self.resolution.map_or("cancel", Resolution::as_str)
    }

    fn refusal(&self, job: &Job, presented: u64) -> Option<CoordinatorError> {
        match self.resolution {
            None => fence::cancel_refusal(job, presented),
            Some(_) => fence::resolve_refusal(job, presented),
        }
    }

    /// Where a test can hold the write, its row locks taken.
    fn pause_point(&self) -> PausePoint {
        match self.resolution {
            None => PausePoint::CancelAfterLock,
            Some(_) => PausePoint::ResolveAfterLock,
        }
    }

    /// The event of the write applied to `locked`.
    fn applied_event<'j>(
        &self,
        locked: &'j LockedJob,
        presented: u64,
        digest: [u8; 32],
    ) -> NewEvent<'j> {
        let job = &locked.job;
        let (kind, to_state, extra) = match self.resolution {
            None => (EventKind::Cancelled, JobState::Cancelled, vec![]),
            Some(r) => (
                EventKind::ManualReviewResolved,
                r.to_state(),
                resolved_extra(job, r),
            ),
        };
        NewEvent {
            job_id: job.id,
            queue: &job.queue,
            attempt: presented,
            kind,
            from_state: Some(job.state),
            to_state: Some(to_state),
            current_attempt: job.attempt,
            request_digest: Some(digest),
            detail: Some(detail(self.action(), self.operator, self.reason, &extra)),
            created_at: locked.now,
        }
    }

    /// The event of the write refused on `locked`, with the attempt the
    /// operator presented.
    fn refused_event<'j>(
        &self,
        locked: &'j LockedJob,
        presented: u64,
        refusal: &CoordinatorError,
    ) -> NewEvent<'j> {
        let kind = match self.resolution {
            None => EventKind::CancelRejected,
            Some(_) => EventKind::ResolveRejected,
        };
        let why = detail(
            self.action(),
            self.operator,
            self.reason,
            &[("refused", refusal.to_string().into())],
        );
        events::refusal(&locked.job, presented, kind, why, locked.now)
    }

    /// The fenced UPDATE of every job in `jobs` (each locked and checked
    /// by the caller): `queries/admin/cancel.sql` or `resolve.sql`, one
    /// statement, padded to a few shapes as every batch statement is.
    async fn update(&self, tx: &mut MySqlConnection, jobs: &[CountedJob]) -> Body<()> {
        let Some(&first) = jobs.first() else {
            return Ok(());
        };
        let n = shape(jobs.len());
        let template = match self.resolution {
            None => include_str!("../queries/admin/cancel.sql"),
            Some(_) => include_str!("../queries/admin/resolve.sql"),
        };
        let sql = expand(
            template,
            &[("{ids}", "?", ", "), ("{fences}", "(?, ?)", ", ")],
            n,
        );
        let mut query = sqlx::query(&sql);
        match self.resolution {
            None => query = query.bind(state_reason("cancelled", self.operator, self.reason)),
            Some(r) => {
                let (next_action, retry_delay, reference, result) = resolution_columns(r);
                query = query
                    .bind(r.to_state().as_str())
                    .bind(next_action.map(NextAction::as_str))
                    .bind(retry_delay.is_some())
                    .bind(micros(retry_delay.unwrap_or_default()))
                    .bind(reference)
                    .bind(result)
                    .bind(state_reason("resolved", self.operator, self.reason))
                    .bind(restarts_window(r))
                    .bind(r.to_state().is_terminal());
            }
        }
        let padded = || (0..n).map(|i| jobs.get(i).copied().unwrap_or(first));
        for j in padded() {
            query = query.bind(j.job_id);
        }
        for j in padded() {
            query = query.bind(j.job_id).bind(j.attempt);
        }
        let updated = query.execute(&mut *tx).await?;
        if updated.rows_affected() != jobs.len() as u64 {
            return Err(CoordinatorError::TransactionConflict(format!(
                "{} of {} jobs changed under their row locks",
                jobs.len() as u64 - updated.rows_affected(),
                jobs.len()
            ))
            .into());
        }
        Ok(())
    }

    /// The jobs this write sends back to `ready` now, placed again at the
    /// back of their lines (docs/design.md rule 18); those due later wait
    /// unplaced.
    async fn back_in_line(&self, tx: &mut MySqlConnection, applied: &[&Job]) -> Body<()> {
        let due = match self.resolution {
            Some(Resolution::RetryReconcile { delay } | Resolution::RetryExecute { delay }) => {
                delay.is_zero()
            }
            _ => return Ok(()),
        };
        let jobs: Vec<(&Job, bool)> = applied.iter().map(|j| (*j, due)).collect();
        super::super::fairness::back_in_line(tx, &jobs).await?;
        Ok(())
    }
}

/// The columns a resolution sets: next action and delay (a retry),
/// provider reference and result (succeeded).
fn resolution_columns(
    r: &Resolution,
) -> (
    Option<NextAction>,
    Option<std::time::Duration>,
    Option<&str>,
    Option<&str>,
) {
    match r {
        Resolution::Succeeded {
            provider_reference,
            result,
        } => (
            None,
            None,
            Some(provider_reference.as_str()),
            result.as_deref(),
        ),
        Resolution::Failed => (None, None, None, None),
        Resolution::RetryReconcile { delay } => {
            (Some(NextAction::Reconcile), Some(*delay), None, None)
        }
        Resolution::RetryExecute { delay } => (Some(NextAction::Execute), Some(*delay), None, None),
    }
}

/// An explicitly authorized resend restarts the resend window from the
/// next dispatch (docs/design.md rule 6).
fn restarts_window(r: &Resolution) -> bool {
    matches!(r, Resolution::RetryExecute { .. })
}

/// What a `manual_review_resolved` event says beside the action: the
/// provider's reference and, for an authorized resend, the dispatch the
/// window counted from until now.
fn resolved_extra(job: &Job, r: &Resolution) -> Vec<(&'static str, serde_json::Value)> {
    let mut extra = vec![];
    if let Resolution::Succeeded {
        provider_reference, ..
    } = r
    {
        extra.push(("provider_reference", provider_reference.as_str().into()));
    }
    if restarts_window(r) {
        extra.push((
            "previous_first_dispatched_at",
            job.first_dispatched_at
                .map(|t| t.and_utc().to_rfc3339())
                .into(),
        ));
    }
    extra
}

impl JobStore {
    /// Runs `w` on each of `jobs` in the caller's transaction (see the
    /// module): one answer per job, in the order of `jobs`. Fails as a
    /// whole only for the transaction's sake (a statement, a conflict),
    /// and for a job named twice (`Internal`: the caller validates).
    pub(crate) async fn write_jobs(
        &self,
        tx: &mut MySqlConnection,
        w: &OperatorWrite<'_>,
        jobs: &[CountedJob],
    ) -> Body<Vec<WrittenResult>> {
        let mut ids: Vec<u64> = jobs.iter().map(|j| j.job_id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|p| p[0] == p[1]) {
            return Err(Failure::Error(CoordinatorError::Internal(
                "an operator write named a job twice".into(),
            )));
        }
        let mut locked = batch::lock_jobs(tx, &ids).await?;
        self.pause(w.pause_point()).await;
        let decided: Vec<Decided> = jobs
            .iter()
            .map(|j| match locked.remove(&j.job_id) {
                None => Decided::Missing,
                Some(l) => match w.refusal(&l.job, j.attempt) {
                    None => Decided::Apply(l),
                    Some(refusal) => Decided::Refuse(l, refusal),
                },
            })
            .collect();
        let replayed = self.replays(tx, w, jobs, &decided).await?;
        let applying: Vec<CountedJob> = jobs
            .iter()
            .zip(&decided)
            .filter(|(_, d)| matches!(d, Decided::Apply(_)))
            .map(|(j, _)| *j)
            .collect();
        w.update(tx, &applying).await?;
        let mut entries = Vec::with_capacity(jobs.len());
        for (j, d) in jobs.iter().zip(&decided) {
            match d {
                Decided::Apply(l) => entries.push(w.applied_event(l, j.attempt, w.digest(*j))),
                Decided::Refuse(l, refusal) if !replayed.contains(&j.job_id) => {
                    entries.push(w.refused_event(l, j.attempt, refusal))
                }
                _ => {}
            }
        }
        events::append_all(tx, &entries).await?;
        drop(entries);
        let applied: Vec<&Job> = decided
            .iter()
            .filter_map(|d| match d {
                Decided::Apply(l) => Some(&l.job),
                _ => None,
            })
            .collect();
        w.back_in_line(tx, &applied).await?;
        Ok(jobs
            .iter()
            .zip(decided)
            .map(|(j, d)| match d {
                Decided::Apply(l) => Ok(Written {
                    job: l.job,
                    replayed: false,
                }),
                Decided::Refuse(l, _) if replayed.contains(&j.job_id) => Ok(Written {
                    job: l.job,
                    replayed: true,
                }),
                Decided::Refuse(_, refusal) => Err(refusal),
                Decided::Missing => Err(CoordinatorError::JobNotFound { job_id: j.job_id }),
            })
            .collect())
    }

    /// The refused jobs whose exact call was applied before (its answer
    /// was lost): one read for all of them, none when nothing was refused.
    async fn replays(
        &self,
        tx: &mut MySqlConnection,
        w: &OperatorWrite<'_>,
        jobs: &[CountedJob],
        decided: &[Decided],
    ) -> Body<HashSet<u64>> {
        let calls: Vec<CallKey> = jobs
            .iter()
            .zip(decided)
            .filter(|(_, d)| matches!(d, Decided::Refuse(..)))
            .map(|(j, _)| CallKey::new(j.job_id, j.attempt, &w.digest(*j)))
            .collect();
        let found = events::find_applied_all(tx, &calls).await?;
        Ok(found.into_keys().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reason_is_cut_on_a_character_boundary() {
        let long = "é".repeat(200);
        let s = state_reason("cancelled", "alice", &long);
        assert!(s.len() <= STATE_REASON_BYTES);
        assert!(s.starts_with("cancelled by alice: é"));
    }

    #[test]
    fn a_call_on_one_job_keeps_the_identity_its_events_have_always_had() {
        // The digests of events written before bulk repairs existed: a
        // call whose answer was lost across an upgrade is still a replay.
        let job = CountedJob {
            job_id: 7,
            attempt: 2,
        };
        let (id, attempt) = (7u64.to_be_bytes(), 2u64.to_be_bytes());
        let cancel = OperatorWrite::new(None, "alice", "incident 12");
        assert_eq!(
            cancel.digest(job),
            call_digest(&[b"cancel_job", &id, &attempt, b"alice", b"incident 12"])
        );
        let failed = Resolution::Failed;
        let fail = OperatorWrite::new(Some(&failed), "alice", "incident 12");
        let zero = 0i64.to_be_bytes();
        assert_eq!(
            fail.digest(job),
            call_digest(&[
                b"resolve_manual_review",
                &id,
                &attempt,
                b"failed",
                b"alice",
                b"incident 12",
                b"",
                b"",
                &zero,
            ])
        );
        let requeue = Resolution::RetryReconcile {
            delay: std::time::Duration::ZERO,
        };
        let other = OperatorWrite::new(Some(&requeue), "alice", "incident 12");
        assert_ne!(fail.digest(job), other.digest(job));
    }
}
