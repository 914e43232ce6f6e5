//! Claim and Takeover: the two ways to get a new attempt (fencing token).
//!
//! Both lock the row (`SELECT … FOR UPDATE`, by scan with SKIP LOCKED or by
//! primary key), re-check the state under the lock, add one to `attempt`
//! and commit at once. Only a committed claim counts: if the commit's
//! outcome is unknown the caller is told so and must not act on the job.

use super::events::{self, kind, NewEvent};
use super::reads::{self, elapsed};
use super::rows;
use super::{commit, convert_sqlx_err, micros, retry_conflicts, JobStore};
use crate::domain::policy::{claim_action, DispatchFacts};
use crate::domain::{ClaimedJob, CoordinatorError, JobState, NextAction, QueuePolicy};
use sqlx::MySqlConnection;
use std::time::Duration;

/// A validated Claim.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub queue: String,
    pub worker_id: String,
    /// At least 1.
    pub max_jobs: u32,
    /// Lease length from the commit (DB clock).
    pub lease: Duration,
    pub policy: QueuePolicy,
}

/// A validated Takeover of one named job.
#[derive(Debug, Clone)]
pub struct TakeoverRequest {
    pub job_id: u64,
    pub worker_id: String,
    pub lease: Duration,
}

/// A candidate row locked by a claim scan.
struct Candidate {
    id: u64,
    state: JobState,
    attempt: u64,
    next_action: NextAction,
    dispatch: DispatchFacts,
}

impl JobStore {
    /// Hands out up to `max_jobs` jobs of the queue: first running jobs whose
    /// lease expired (inline takeover, next_action `reconcile`), then due
    /// ready jobs. Rows locked by a concurrent claim are skipped, so two
    /// claims never get the same job.
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Vec<ClaimedJob>, CoordinatorError> {
        retry_conflicts(|| self.claim_once(req)).await
    }

    async fn claim_once(&self, req: &ClaimRequest) -> Result<Vec<ClaimedJob>, CoordinatorError> {
        let mut tx = self.begin().await?;
        let mut candidates = scan(
            &mut tx,
            include_str!("queries/jobs/scan_expired.sql"),
            &req.queue,
            req.max_jobs,
        )
        .await?;
        let room = req.max_jobs.saturating_sub(candidates.len() as u32);
        if room > 0 {
            candidates.extend(
                scan(
                    &mut tx,
                    include_str!("queries/jobs/scan_ready.sql"),
                    &req.queue,
                    room,
                )
                .await?,
            );
        }
        self.pause("claim.after_scan").await;
        if candidates.is_empty() {
            tx.rollback().await.map_err(convert_sqlx_err)?;
            return Ok(Vec::new());
        }
        let mut takeovers = Vec::with_capacity(candidates.len());
        for c in &candidates {
            let takeover = c.state == JobState::Running;
            let (action, dispatch) =
                claim_action(takeover, c.next_action, req.lease, c.dispatch, req.policy);
            hand_out(
                &mut tx,
                &req.queue,
                c.id,
                c.state,
                c.attempt,
                action,
                dispatch,
                req.lease,
                &req.worker_id,
            )
            .await?;
            takeovers.push(takeover);
        }
        let ids: Vec<u64> = candidates.iter().map(|c| c.id).collect();
        let jobs = reads::jobs(&mut tx, &ids).await?;
        let mut observations = reads::observations(&mut tx, &ids).await?;
        self.pause("claim.before_commit").await;
        commit(tx).await?;
        Ok(jobs
            .into_iter()
            .zip(takeovers)
            .map(|(job, takeover)| ClaimedJob {
                observations: observations.remove(&job.id).unwrap_or_default(),
                job,
                takeover,
            })
            .collect())
    }

    /// Takes over one named job: only a `running` job whose lease has
    /// expired by the DB clock. Refusals: `JobNotFound`, `JobFinished`
    /// (terminal state), `JobNotRunning` (ready or manual_review),
    /// `LeaseNotExpired`.
    pub async fn takeover(&self, req: &TakeoverRequest) -> Result<ClaimedJob, CoordinatorError> {
        retry_conflicts(|| self.takeover_once(req)).await
    }

    async fn takeover_once(&self, req: &TakeoverRequest) -> Result<ClaimedJob, CoordinatorError> {
        let mut tx = self.begin().await?;
        let locked = reads::lock_job(&mut tx, req.job_id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id: req.job_id })?;
        let job = &locked.job;
        let refusal = if job.state.is_terminal() {
            Some(CoordinatorError::JobFinished {
                job_id: job.id,
                attempt: job.attempt,
                state: job.state,
            })
        } else if job.state != JobState::Running {
            Some(CoordinatorError::JobNotRunning {
                job_id: job.id,
                attempt: job.attempt,
                state: job.state,
            })
        } else if !locked.lease_expired {
            Some(CoordinatorError::LeaseNotExpired {
                job_id: job.id,
                attempt: job.attempt,
                lease_until: job.lease_until.unwrap_or(job.updated_at),
            })
        } else {
            None
        };
        if let Some(refusal) = refusal {
            tx.rollback().await.map_err(convert_sqlx_err)?;
            return Err(refusal);
        }
        self.pause("takeover.after_lock").await;
        hand_out(
            &mut tx,
            &job.queue,
            job.id,
            job.state,
            job.attempt,
            NextAction::Reconcile,
            false,
            req.lease,
            &req.worker_id,
        )
        .await?;
        let job = reads::job(&mut tx, req.job_id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id: req.job_id })?;
        let mut observations = reads::observations(&mut tx, &[job.id]).await?;
        commit(tx).await?;
        Ok(ClaimedJob {
            observations: observations.remove(&job.id).unwrap_or_default(),
            job,
            takeover: true,
        })
    }
}

async fn scan(
    conn: &mut MySqlConnection,
    sql: &'static str,
    queue: &str,
    limit: u32,
) -> Result<Vec<Candidate>, CoordinatorError> {
    let found = sqlx::query(sql)
        .bind(queue)
        .bind(limit)
        .fetch_all(conn)
        .await
        .map_err(convert_sqlx_err)?;
    found
        .iter()
        .map(|row| {
            Ok(Candidate {
                id: rows::get(row, "id")?,
                state: rows::text(row, "state")?
                    .parse()
                    .map_err(|e| CoordinatorError::Internal(format!("{e}")))?,
                attempt: rows::get(row, "attempt")?,
                next_action: rows::text(row, "next_action")?
                    .parse()
                    .map_err(|e| CoordinatorError::Internal(format!("{e}")))?,
                dispatch: DispatchFacts {
                    since_first_dispatch: elapsed(rows::get(row, "since_first_dispatch_us")?),
                    dispatch_count: rows::get(row, "dispatch_count")?,
                },
            })
        })
        .collect()
}

/// Gives one locked row its next attempt and writes the event.
#[allow(clippy::too_many_arguments)]
async fn hand_out(
    conn: &mut MySqlConnection,
    queue: &str,
    id: u64,
    state: JobState,
    attempt: u64,
    action: NextAction,
    dispatch: bool,
    lease: Duration,
    worker_id: &str,
) -> Result<(), CoordinatorError> {
    let updated = sqlx::query(include_str!("queries/jobs/claim.sql"))
        .bind(action.as_str())
        .bind(micros(lease))
        .bind(worker_id)
        .bind(u32::from(dispatch))
        .bind(dispatch)
        .bind(id)
        .bind(state.as_str())
        .bind(attempt)
        .execute(&mut *conn)
        .await
        .map_err(convert_sqlx_err)?;
    if updated.rows_affected() != 1 {
        // Cannot happen while we hold the row lock; if it does, roll back and
        // let the caller's retry re-read the row.
        return Err(CoordinatorError::TransactionConflict(format!(
            "job {id} changed under its row lock"
        )));
    }
    let takeover = state == JobState::Running;
    events::append(
        conn,
        NewEvent {
            job_id: id,
            queue,
            attempt: attempt + 1,
            kind: if takeover {
                kind::TAKEN_OVER
            } else {
                kind::CLAIMED
            },
            from_state: Some(state),
            to_state: Some(JobState::Running),
            current_attempt: attempt + 1,
            request_digest: None,
            detail: Some(action.as_str().to_owned()),
        },
    )
    .await
}
