//! Operator writes: ResolveManualReview and CancelJob.
//!
//! Fenced like every worker write (docs/design.md rule 3): one short transaction
//! locks the row by primary key, checks state and attempt under the lock,
//! and runs an UPDATE that still carries `id + state + attempt` in its WHERE,
//! with the event appended in the same transaction. The operator presents
//! the attempt they saw, so of two operators acting on the same job exactly
//! one wins; the other is told precisely why, and the refusal is itself an
//! event carrying the attempt they presented. An identical call repeated
//! after a lost response is recognised by its digest and answered as a
//! replay without writing anything.
//!
//! Reads for operators (ListJobs, QueueStats, the pending-age gauges) are in
//! [`stats`].

mod stats;

use super::events::{self, call_digest, NewEvent};
use super::pause::PausePoint;
use super::reads;
use super::{convert_sqlx_err, micros, JobStore};
use crate::run::{transaction, Body};
use jobfence_domain::{
    CoordinatorError, DbTime, EventKind, Job, JobState, NextAction, WriteOutcome,
};
use sqlx::MySqlConnection;

use jobfence_domain::admin::{CancelJob, Resolution, ResolveManualReview};

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

/// The attempt check shared by both operator writes, once the state is
/// known to be the expected one.
fn attempt_refusal(job: &Job, presented: u64) -> Option<CoordinatorError> {
    use std::cmp::Ordering::*;
    match presented.cmp(&job.attempt) {
        Equal => None,
        Less => Some(CoordinatorError::AttemptSuperseded {
            job_id: job.id,
            presented,
            current: job.attempt,
            state: job.state,
        }),
        Greater => Some(CoordinatorError::AttemptNotIssued {
            job_id: job.id,
            presented,
            current: job.attempt,
        }),
    }
}

/// The fenced UPDATE of a resolution (`queries/admin/resolve.sql`), on
/// the row locked and checked by the caller.
async fn write_resolution(
    conn: &mut MySqlConnection,
    job: &Job,
    req: &ResolveManualReview,
) -> Result<(), CoordinatorError> {
    let to_state = req.resolution.to_state();
    let (next_action, retry_delay, reference, result) = match &req.resolution {
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
    };
    let updated = sqlx::query(include_str!("queries/admin/resolve.sql"))
        .bind(to_state.as_str())
        .bind(next_action.map(NextAction::as_str))
        .bind(retry_delay.is_some())
        .bind(micros(retry_delay.unwrap_or_default()))
        .bind(reference)
        .bind(result)
        .bind(state_reason("resolved", &req.operator, &req.reason))
        .bind(restarts_window(req))
        .bind(to_state.is_terminal())
        .bind(job.id)
        .bind(req.attempt)
        .execute(&mut *conn)
        .await
        .map_err(convert_sqlx_err)?;
    if updated.rows_affected() != 1 {
        return Err(CoordinatorError::TransactionConflict(format!(
            "job {} changed under its row lock",
            job.id
        )));
    }
    Ok(())
}

/// An explicitly authorized resend restarts the resend window from the
/// next dispatch (docs/design.md rule 6).
fn restarts_window(req: &ResolveManualReview) -> bool {
    matches!(req.resolution, Resolution::RetryExecute { .. })
}

/// The `manual_review_resolved` event of a resolution, with the provider's
/// reference and, for an authorized resend, the dispatch the window
/// counted from until now.
fn resolved_event<'a>(
    job: &'a Job,
    req: &ResolveManualReview,
    digest: [u8; 32],
    now: DbTime,
) -> NewEvent<'a> {
    let mut extra = vec![];
    if let Resolution::Succeeded {
        provider_reference, ..
    } = &req.resolution
    {
        extra.push(("provider_reference", provider_reference.as_str().into()));
    }
    if restarts_window(req) {
        extra.push((
            "previous_first_dispatched_at",
            job.first_dispatched_at
                .map(|t| t.and_utc().to_rfc3339())
                .into(),
        ));
    }
    NewEvent {
        job_id: job.id,
        queue: &job.queue,
        attempt: req.attempt,
        kind: EventKind::ManualReviewResolved,
        from_state: Some(JobState::ManualReview),
        to_state: Some(req.resolution.to_state()),
        current_attempt: job.attempt,
        request_digest: Some(digest),
        detail: Some(detail(
            req.resolution.as_str(),
            &req.operator,
            &req.reason,
            &extra,
        )),
        created_at: now,
    }
}

impl JobStore {
    /// Resolves a job parked in manual review. Refusals:
    /// `JobNotInManualReview` (not parked, e.g. resolved by someone else
    /// first), `AttemptSuperseded` (parked again under a later attempt),
    /// `AttemptNotIssued`, `JobNotFound`.
    pub async fn resolve_manual_review(
        &self,
        req: &ResolveManualReview,
    ) -> Result<WriteOutcome, CoordinatorError> {
        transaction!(self, |tx| self.resolve_in(tx, req))
    }

    fn resolve_digest(req: &ResolveManualReview) -> [u8; 32] {
        let (reference, result, delay) = match &req.resolution {
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
            &req.job_id.to_be_bytes(),
            &req.attempt.to_be_bytes(),
            req.resolution.as_str().as_bytes(),
            req.operator.as_bytes(),
            req.reason.as_bytes(),
            reference.as_bytes(),
            result.as_bytes(),
            &delay.to_be_bytes(),
        ])
    }

    async fn resolve_in(
        &self,
        tx: &mut MySqlConnection,
        req: &ResolveManualReview,
    ) -> Body<WriteOutcome> {
        let digest = Self::resolve_digest(req);
        let locked = reads::lock_job(tx, req.job_id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id: req.job_id })?;
        self.pause(PausePoint::ResolveAfterLock).await;
        let job = &locked.job;
        let refusal = if job.state != JobState::ManualReview {
            Some(CoordinatorError::JobNotInManualReview {
                job_id: job.id,
                presented: req.attempt,
                current: job.attempt,
                state: job.state,
            })
        } else {
            attempt_refusal(job, req.attempt)
        };
        if let Some(refusal) = refusal {
            let refused = Refused {
                action: req.resolution.as_str(),
                operator: &req.operator,
                reason: &req.reason,
                presented: req.attempt,
                kind: EventKind::ResolveRejected,
            };
            return refused.answer(tx, locked, &digest, refusal).await;
        }
        write_resolution(tx, job, req).await?;
        events::append(tx, resolved_event(job, req, digest, locked.now)).await?;
        let after = reads::job(tx, job.id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id: job.id })?;
        if after.state == JobState::Ready {
            // Tried again: at the back of its line (rule 18).
            let due = after.run_at <= after.updated_at;
            super::fairness::back_in_line(tx, &[(&after, due)]).await?;
        }
        Ok(WriteOutcome {
            job: after,
            replayed: false,
        })
    }

    /// Cancels a `ready` job that was never dispatched. Refusals:
    /// `JobNotCancellable`, `AttemptSuperseded`, `AttemptNotIssued`,
    /// `JobNotFound`.
    pub async fn cancel_job(&self, req: &CancelJob) -> Result<WriteOutcome, CoordinatorError> {
        transaction!(self, |tx| self.cancel_in(tx, req))
    }

    async fn cancel_in(&self, tx: &mut MySqlConnection, req: &CancelJob) -> Body<WriteOutcome> {
        let digest = call_digest(&[
            b"cancel_job",
            &req.job_id.to_be_bytes(),
            &req.attempt.to_be_bytes(),
            req.operator.as_bytes(),
            req.reason.as_bytes(),
        ]);
        let locked = reads::lock_job(tx, req.job_id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id: req.job_id })?;
        self.pause(PausePoint::CancelAfterLock).await;
        let job = &locked.job;
        let refusal = if job.state != JobState::Ready || job.dispatch_count > 0 {
            Some(CoordinatorError::JobNotCancellable {
                job_id: job.id,
                attempt: job.attempt,
                state: job.state,
                dispatch_count: job.dispatch_count,
            })
        } else {
            attempt_refusal(job, req.attempt)
        };
        if let Some(refusal) = refusal {
            let refused = Refused {
                action: "cancel",
                operator: &req.operator,
                reason: &req.reason,
                presented: req.attempt,
                kind: EventKind::CancelRejected,
            };
            return refused.answer(tx, locked, &digest, refusal).await;
        }
        let updated = sqlx::query(include_str!("queries/admin/cancel.sql"))
            .bind(state_reason("cancelled", &req.operator, &req.reason))
            .bind(job.id)
            .bind(req.attempt)
            .execute(&mut *tx)
            .await?;
        if updated.rows_affected() != 1 {
            return Err(CoordinatorError::TransactionConflict(format!(
                "job {} changed under its row lock",
                job.id
            ))
            .into());
        }
        events::append(
            tx,
            NewEvent {
                job_id: job.id,
                queue: &job.queue,
                attempt: req.attempt,
                kind: EventKind::Cancelled,
                from_state: Some(JobState::Ready),
                to_state: Some(JobState::Cancelled),
                current_attempt: job.attempt,
                request_digest: Some(digest),
                detail: Some(detail("cancel", &req.operator, &req.reason, &[])),
                created_at: locked.now,
            },
        )
        .await?;
        let after = reads::job(tx, job.id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id: job.id })?;
        Ok(WriteOutcome {
            job: after,
            replayed: false,
        })
    }
}

/// An operator write refused under the row lock.
struct Refused<'a> {
    action: &'a str,
    operator: &'a str,
    reason: &'a str,
    presented: u64,
    kind: EventKind,
}

impl Refused<'_> {
    /// OK as a replay if this exact command was applied before (its answer
    /// was lost); otherwise the refusal, logged as `kind` in the events.
    async fn answer(
        self,
        tx: &mut MySqlConnection,
        locked: reads::LockedJob,
        digest: &[u8; 32],
        refusal: CoordinatorError,
    ) -> Body<WriteOutcome> {
        let now = locked.now;
        let job = locked.job;
        if events::find_applied(tx, job.id, self.presented, digest)
            .await?
            .is_some()
        {
            return Ok(WriteOutcome {
                job,
                replayed: true,
            });
        }
        let why = detail(
            self.action,
            self.operator,
            self.reason,
            &[("refused", refusal.to_string().into())],
        );
        events::refuse(tx, &job, self.presented, self.kind, why, now, refusal).await
    }
}
