//! The fenced writes: RenewLease, Complete and Fail. This is where a write
//! back is fenced.
//!
//! Each is one short transaction: lock the row by primary key, apply the
//! fencing rule (`domain::fence::check`) to the locked row, then run an
//! UPDATE that still carries `id + state + attempt` in its WHERE. A caller
//! that does not hold the job is told exactly why (superseded by attempt N,
//! not running), unless this very call was applied before (a replay after a
//! lost response), which is answered OK without writing anything. Every
//! refusal is logged as a `stale_write_rejected` event.

use super::events::{self, call_digest, kind, NewEvent};
use super::reads::{self, LockedJob};
use super::{commit, convert_sqlx_err, micros, retry_conflicts, JobStore};
use crate::domain::fence::{self, FenceCheck};
use crate::domain::policy::decide_fail;
use crate::domain::{
    CoordinatorError, FailDisposition, FailOutcome, Job, JobState, NextAction, OverrideReason,
    QueuePolicies, WriteOutcome,
};
use sqlx::MySqlConnection;
use std::time::Duration;

/// A validated RenewLease.
#[derive(Debug, Clone)]
pub struct RenewLeaseRequest {
    pub job_id: u64,
    pub attempt: u64,
    /// New lease, counted from now (DB clock). Never shortens the current one.
    pub lease: Duration,
}

/// A validated Complete.
#[derive(Debug, Clone)]
pub struct CompleteRequest {
    pub job_id: u64,
    pub attempt: u64,
    pub provider_reference: Option<String>,
    pub result: Option<String>,
}

/// A validated Fail.
#[derive(Debug, Clone)]
pub struct FailRequest {
    pub job_id: u64,
    pub attempt: u64,
    pub disposition: FailDisposition,
    pub error: String,
    /// For the retry dispositions: how long until the job is due again.
    pub retry_delay: Duration,
    /// The lease the next claim is expected to get (the coordinator's
    /// default lease): a resend must fit in the window with it.
    pub expected_lease: Duration,
}

/// What a fenced call asks to change.
enum Write<'a> {
    Renew(&'a RenewLeaseRequest),
    Complete(&'a CompleteRequest),
    Fail(&'a FailRequest, &'a QueuePolicies),
}

impl Write<'_> {
    fn rpc(&self) -> &'static str {
        match self {
            Write::Renew(_) => "renew_lease",
            Write::Complete(_) => "complete",
            Write::Fail(..) => "fail",
        }
    }

    fn target(&self) -> (u64, u64) {
        match self {
            Write::Renew(r) => (r.job_id, r.attempt),
            Write::Complete(r) => (r.job_id, r.attempt),
            Write::Fail(r, _) => (r.job_id, r.attempt),
        }
    }

    /// The identity of this exact call, for replay detection.
    fn digest(&self) -> [u8; 32] {
        let (job_id, attempt) = self.target();
        let (job_id, attempt) = (job_id.to_be_bytes(), attempt.to_be_bytes());
        let head: [&[u8]; 3] = [self.rpc().as_bytes(), &job_id, &attempt];
        match self {
            Write::Renew(r) => {
                let lease = micros(r.lease).to_be_bytes();
                call_digest(&[head[0], head[1], head[2], &lease])
            }
            Write::Complete(r) => call_digest(&[
                head[0],
                head[1],
                head[2],
                r.provider_reference.as_deref().unwrap_or("").as_bytes(),
                r.result.as_deref().unwrap_or("").as_bytes(),
            ]),
            Write::Fail(r, _) => {
                let delay = micros(r.retry_delay).to_be_bytes();
                call_digest(&[
                    head[0],
                    head[1],
                    head[2],
                    disposition_str(r.disposition).as_bytes(),
                    r.error.as_bytes(),
                    &delay,
                ])
            }
        }
    }
}

/// `state_reason` of a job a worker itself asked to park.
pub const MANUAL_REVIEW_REQUESTED: &str = "REQUESTED";

/// The result of one fenced call.
struct Applied {
    job: Job,
    replayed: bool,
    /// The event detail of the applied change (for Fail: what was applied).
    detail: Option<String>,
}

impl JobStore {
    /// Extends the lease of the current attempt (see `RenewLeaseRequest`).
    pub async fn renew_lease(
        &self,
        req: &RenewLeaseRequest,
    ) -> Result<WriteOutcome, CoordinatorError> {
        let a = retry_conflicts(|| self.fenced(Write::Renew(req))).await?;
        Ok(WriteOutcome {
            job: a.job,
            replayed: a.replayed,
        })
    }

    /// Marks the job succeeded with the provider's reference and result.
    pub async fn complete(&self, req: &CompleteRequest) -> Result<WriteOutcome, CoordinatorError> {
        let a = retry_conflicts(|| self.fenced(Write::Complete(req))).await?;
        Ok(WriteOutcome {
            job: a.job,
            replayed: a.replayed,
        })
    }

    /// Applies a failure disposition; a resend outside the queue's resend
    /// window, or past its max dispatches, goes to manual review instead.
    pub async fn fail(
        &self,
        req: &FailRequest,
        policies: &QueuePolicies,
    ) -> Result<FailOutcome, CoordinatorError> {
        let a = retry_conflicts(|| self.fenced(Write::Fail(req, policies))).await?;
        let (applied, override_reason) =
            parse_fail_detail(a.detail.as_deref()).ok_or_else(|| {
                CoordinatorError::Internal(format!("unreadable fail event detail {:?}", a.detail))
            })?;
        Ok(FailOutcome {
            job: a.job,
            applied,
            override_reason,
            replayed: a.replayed,
        })
    }

    async fn fenced(&self, write: Write<'_>) -> Result<Applied, CoordinatorError> {
        let (job_id, attempt) = write.target();
        let digest = write.digest();
        let mut tx = self.begin().await?;
        let locked = reads::lock_job(&mut tx, job_id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id })?;
        self.pause("write.after_lock").await;
        let refusal = match fence::check(job_id, locked.job.state, locked.job.attempt, attempt) {
            FenceCheck::Holder => None,
            FenceCheck::NotHolder(why) => Some(why),
        };
        if let Some(refusal) = refusal {
            // A renewal is never answered as a replay: a heartbeat repeats
            // the very same call many times, each one applied, so an earlier
            // one would tell a superseded holder its lease was renewed. Once
            // the caller no longer holds the job there is no lease to renew.
            let replay = match write {
                Write::Renew(_) => None,
                _ => events::find_applied(&mut tx, job_id, attempt, &digest).await?,
            };
            if let Some((_, detail)) = replay {
                tx.rollback().await.map_err(convert_sqlx_err)?;
                return Ok(Applied {
                    job: locked.job,
                    replayed: true,
                    detail,
                });
            }
            let detail = format!("{}: {refusal}", write.rpc());
            return events::refuse(
                tx,
                &locked.job,
                attempt,
                kind::STALE_WRITE_REJECTED,
                detail,
                refusal,
            )
            .await;
        }
        let (event_kind, to_state, detail) = apply(&mut tx, &write, &locked).await?;
        events::append(
            &mut tx,
            NewEvent {
                job_id,
                queue: &locked.job.queue,
                attempt,
                kind: event_kind,
                from_state: Some(JobState::Running),
                to_state: Some(to_state),
                current_attempt: attempt,
                request_digest: Some(digest),
                detail: detail.clone(),
            },
        )
        .await?;
        let job = reads::job(&mut tx, job_id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id })?;
        commit(tx).await?;
        Ok(Applied {
            job,
            replayed: false,
            detail,
        })
    }
}

/// Runs the fenced UPDATE of `write`; returns the event kind, the new state
/// and the event detail.
async fn apply(
    conn: &mut MySqlConnection,
    write: &Write<'_>,
    locked: &LockedJob,
) -> Result<(&'static str, JobState, Option<String>), CoordinatorError> {
    let (job_id, attempt) = write.target();
    let (query, outcome) = match write {
        Write::Renew(r) => (
            sqlx::query(include_str!("queries/jobs/renew_lease.sql")).bind(micros(r.lease)),
            (kind::LEASE_RENEWED, JobState::Running, None),
        ),
        Write::Complete(r) => (
            sqlx::query(include_str!("queries/jobs/complete.sql"))
                .bind(r.provider_reference.as_deref())
                .bind(r.result.as_deref()),
            (
                kind::COMPLETED,
                JobState::Succeeded,
                r.provider_reference.clone(),
            ),
        ),
        Write::Fail(r, policies) => {
            let policy = policies.get(&locked.job.queue);
            let (applied, why) = decide_fail(
                r.disposition,
                r.retry_delay,
                r.expected_lease,
                locked.dispatch,
                policy,
            );
            let detail = Some(fail_detail(applied, why));
            match applied {
                FailDisposition::RetryReconcile | FailDisposition::RetryExecute => {
                    let action = if applied == FailDisposition::RetryExecute {
                        NextAction::Execute
                    } else {
                        NextAction::Reconcile
                    };
                    (
                        sqlx::query(include_str!("queries/jobs/retry.sql"))
                            .bind(action.as_str())
                            .bind(micros(r.retry_delay))
                            .bind(r.error.as_str()),
                        (kind::RETRY_SCHEDULED, JobState::Ready, detail),
                    )
                }
                FailDisposition::Failed | FailDisposition::ManualReview => {
                    let (state, event_kind) = if applied == FailDisposition::Failed {
                        (JobState::Failed, kind::FAILED)
                    } else {
                        (JobState::ManualReview, kind::MANUAL_REVIEW)
                    };
                    (
                        sqlx::query(include_str!("queries/jobs/park.sql"))
                            .bind(state.as_str())
                            .bind(r.error.as_str())
                            // Why it is parked: the coordinator's override,
                            // or the worker's own request.
                            .bind((state == JobState::ManualReview).then(|| {
                                why.map_or(MANUAL_REVIEW_REQUESTED, OverrideReason::as_str)
                            }))
                            .bind(state.is_terminal()),
                        (event_kind, state, detail),
                    )
                }
            }
        }
    };
    let updated = query
        .bind(job_id)
        .bind(attempt)
        .execute(conn)
        .await
        .map_err(convert_sqlx_err)?;
    // sqlx sets CLIENT_FOUND_ROWS: this counts matched rows, so a renewal
    // that changes no value still reports 1. Zero means the fence did not
    // match: roll back and let the retry re-read and say why.
    if updated.rows_affected() != 1 {
        return Err(CoordinatorError::TransactionConflict(format!(
            "job {job_id} changed under its row lock"
        )));
    }
    Ok(outcome)
}

fn disposition_str(d: FailDisposition) -> &'static str {
    match d {
        FailDisposition::RetryReconcile => "retry_reconcile",
        FailDisposition::RetryExecute => "retry_execute",
        FailDisposition::Failed => "failed",
        FailDisposition::ManualReview => "manual_review",
    }
}

/// `applied[:OVERRIDE_REASON]`, stored as the event detail of a Fail.
fn fail_detail(applied: FailDisposition, why: Option<OverrideReason>) -> String {
    match why {
        Some(why) => format!("{}:{}", disposition_str(applied), why.as_str()),
        None => disposition_str(applied).to_owned(),
    }
}

fn parse_fail_detail(detail: Option<&str>) -> Option<(FailDisposition, Option<OverrideReason>)> {
    let (applied, why) = match detail?.split_once(':') {
        Some((a, w)) => (a, Some(w)),
        None => (detail?, None),
    };
    let applied = [
        FailDisposition::RetryReconcile,
        FailDisposition::RetryExecute,
        FailDisposition::Failed,
        FailDisposition::ManualReview,
    ]
    .into_iter()
    .find(|d| disposition_str(*d) == applied)?;
    let why = match why {
        None => None,
        Some(w) => Some(
            [
                OverrideReason::ResendWindowClosed,
                OverrideReason::MaxDispatchesReached,
            ]
            .into_iter()
            .find(|r| r.as_str() == w)?,
        ),
    };
    Some((applied, why))
}
