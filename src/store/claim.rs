//! Claim and Takeover: the two ways to get a new attempt (fencing token).
//!
//! Both lock the rows (`SELECT … FOR UPDATE`, by scan with SKIP LOCKED or
//! by primary key), re-check the state under the lock, add one to
//! `attempt` and commit at once. Only a committed claim counts: if the
//! commit's outcome is unknown the caller is told so and must not act on
//! the job.
//!
//! Concurrent Claims of one queue are coalesced by the coordinator into one
//! claim transaction ([`JobStore::claim_batch`]): one scan for all of them,
//! the rows handed out to each caller in turn, one UPDATE (fenced row by
//! row) and one event insert for the whole batch.

use super::batch::{self, with_job_columns, Change};
use super::events::{self, kind, NewEvent};
use super::literal;
use super::reads::{self, LockedJob};
use super::{commit, convert_sqlx_err, JobStore};
use crate::domain::policy::claim_action;
use crate::domain::{
    transition, ClaimSlot, ClaimedJob, CoordinatorError, DbTime, Job, JobState, NextAction,
    QueuePolicy, QueueScope, TakeoverRequest,
};
use sqlx::MySqlConnection;
use std::sync::LazyLock;
use std::time::Duration;

static SCAN_EXPIRED: LazyLock<String> =
    LazyLock::new(|| with_job_columns(include_str!("queries/jobs/scan_expired.sql")));
static SCAN_READY: LazyLock<String> =
    LazyLock::new(|| with_job_columns(include_str!("queries/jobs/scan_ready.sql")));

/// Both claim scans, as one text query (one round trip): running jobs
/// whose lease expired, then due ready jobs, each up to `limit` rows and
/// locked with SKIP LOCKED. Rows of the first scan come first. When the
/// first finds some, the second may lock a few more ready rows than are
/// handed out; they are released at the claim's commit.
async fn scan_both(
    conn: &mut MySqlConnection,
    queue: &str,
    limit: u32,
) -> Result<(Vec<LockedJob>, Vec<LockedJob>), CoordinatorError> {
    use tokio_stream::StreamExt;
    let q = literal::queue(queue)?;
    let fill = |sql: &str| {
        sql.replace("{queue}", &q)
            .replace("{limit}", &limit.to_string())
    };
    let text = format!("{}; {}", fill(&SCAN_EXPIRED), fill(&SCAN_READY));
    let mut results = sqlx::raw_sql(&text).fetch_many(conn);
    let (mut expired, mut ready) = (Vec::new(), Vec::new());
    let mut first = true;
    while let Some(item) = results.next().await {
        match item.map_err(convert_sqlx_err)? {
            sqlx::Either::Left(_) => first = false,
            sqlx::Either::Right(row) if first => expired.push(batch::locked_job(&row)?),
            sqlx::Either::Right(row) => ready.push(batch::locked_job(&row)?),
        }
    }
    Ok((expired, ready))
}

/// Most jobs one claim transaction takes; the coordinator splits larger
/// coalesced claims.
pub const MAX_CLAIM_TRANSACTION_JOBS: u32 = 256;

/// A validated Claim of one caller (see [`JobStore::claim`]).
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

/// What a coalesced claim handed out: the jobs of each slot, in the order
/// of the slots, and, when asked for and some slot got fewer jobs than it
/// wanted, how long until the next job of the queue becomes claimable
/// (`Some(ZERO)`: already; `None`: nothing pending).
#[derive(Debug, Default)]
pub struct ClaimBatch {
    pub jobs: Vec<Vec<ClaimedJob>>,
    pub next_due: Option<Duration>,
}

impl JobStore {
    /// Hands out up to `max_jobs` jobs of the queue to one caller; see
    /// [`claim_batch`](Self::claim_batch).
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Vec<ClaimedJob>, CoordinatorError> {
        let slot = ClaimSlot {
            worker_id: req.worker_id.clone(),
            max_jobs: req.max_jobs,
            lease: req.lease,
        };
        let mut out = self
            .claim_batch(&req.queue, req.policy, &[slot], false)
            .await?;
        Ok(out.jobs.pop().unwrap_or_default())
    }

    /// One claim transaction for several callers of one queue: first
    /// running jobs whose lease expired (inline takeover, next_action
    /// `reconcile`), then due ready jobs, oldest first, handed out to the
    /// slots in order (each up to its `max_jobs`). Rows locked by a
    /// concurrent claim are skipped, so two claims never get the same job.
    /// With `want_next_due`, a batch that left a slot short also reads when
    /// the next job becomes due (for long-polling callers).
    ///
    /// Errors are for every slot: `CommitOutcomeUnknown` (nobody may act on
    /// what the batch would have handed out), `DatabaseUnavailable`,
    /// `TransactionConflict` after 3 tries.
    pub async fn claim_batch(
        &self,
        queue: &str,
        policy: QueuePolicy,
        slots: &[ClaimSlot],
        want_next_due: bool,
    ) -> Result<ClaimBatch, CoordinatorError> {
        self.retry_conflicts(|| self.claim_once(queue, policy, slots, want_next_due))
            .await
    }

    async fn claim_once(
        &self,
        queue: &str,
        policy: QueuePolicy,
        slots: &[ClaimSlot],
        want_next_due: bool,
    ) -> Result<ClaimBatch, CoordinatorError> {
        let wanted: u32 = slots.iter().map(|s| s.max_jobs).sum();
        let mut tx = self.begin_batch().await?;
        let (mut candidates, ready) = scan_both(&mut tx, queue, wanted).await?;
        let room = (wanted as usize).saturating_sub(candidates.len());
        candidates.extend(ready.into_iter().take(room));
        self.pause("claim.after_scan").await;
        let short = (candidates.len() as u32) < wanted;
        let next_due = if short && want_next_due {
            next_due(&mut tx, queue).await?
        } else {
            None
        };
        if candidates.is_empty() {
            tx.rollback().await?;
            return Ok(ClaimBatch {
                jobs: vec![Vec::new(); slots.len()],
                next_due,
            });
        }
        // The latest clock reading of the scans: every lease runs from it.
        let now = candidates.iter().map(|c| c.now).max().expect("candidates");
        // Hand the rows out to the slots in order.
        let mut rows = candidates.iter();
        let mut handed: Vec<Vec<(&LockedJob, Job)>> = Vec::with_capacity(slots.len());
        for slot in slots {
            let mut mine = Vec::new();
            for c in rows.by_ref().take(slot.max_jobs as usize) {
                let takeover = c.job.state == JobState::Running;
                let (action, dispatch) =
                    claim_action(takeover, c.job.next_action, slot.lease, c.dispatch, policy);
                let after = transition::hand_out(
                    &c.job,
                    action,
                    dispatch,
                    slot.lease,
                    &slot.worker_id,
                    now,
                );
                mine.push((c, after));
            }
            handed.push(mine);
        }
        let all: Vec<&(&LockedJob, Job)> = handed.iter().flatten().collect();
        let claimed = write_hand_outs(&mut tx, &all, now).await?;
        let with_observations: Vec<u64> = all
            .iter()
            .filter(|(c, _)| c.has_observations)
            .map(|(c, _)| c.job.id)
            .collect();
        let mut observations = reads::observations(&mut tx, &with_observations).await?;
        self.pause_in("claim.before_commit", &mut tx).await;
        events::append_and_commit(tx, &claimed).await?;
        drop(claimed);
        Ok(ClaimBatch {
            jobs: handed
                .into_iter()
                .map(|mine| {
                    mine.into_iter()
                        .map(|(c, job)| ClaimedJob {
                            takeover: c.job.state == JobState::Running,
                            observations: observations.remove(&job.id).unwrap_or_default(),
                            job,
                        })
                        .collect()
                })
                .collect(),
            next_due,
        })
    }

    /// Takes over one named job: only a `running` job whose lease has
    /// expired by the DB clock. Refusals: `JobNotFound`, `JobFinished`
    /// (terminal state), `JobNotRunning` (ready or manual_review),
    /// `LeaseNotExpired`, and `QueueNotAllowed` when `scope` does not cover
    /// the job's queue (nothing written).
    pub async fn takeover(
        &self,
        req: &TakeoverRequest,
        scope: &QueueScope,
    ) -> Result<ClaimedJob, CoordinatorError> {
        self.retry_conflicts(|| self.takeover_once(req, scope))
            .await
    }

    async fn takeover_once(
        &self,
        req: &TakeoverRequest,
        scope: &QueueScope,
    ) -> Result<ClaimedJob, CoordinatorError> {
        let mut tx = self.begin().await?;
        let locked = reads::lock_job(&mut tx, req.job_id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id: req.job_id })?;
        let job = &locked.job;
        // The queue is read under the lock; a caller of another queue
        // learns nothing of the job's state.
        let refusal = if let Err(e) = scope.check(&job.queue, Some(job.id)) {
            Some(e)
        } else if job.state.is_terminal() {
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
        // The row lock may have been waited for: stamp the lease from now.
        let now = batch::db_now(&mut tx).await?;
        let after = transition::hand_out(
            job,
            NextAction::Reconcile,
            false,
            req.lease,
            &req.worker_id,
            now,
        );
        let handed = (&locked, after.clone());
        let taken = write_hand_outs(&mut tx, &[&handed], now).await?;
        events::append_all(&mut tx, &taken).await?;
        drop(taken);
        let mut observations = if locked.has_observations {
            reads::observations(&mut tx, &[job.id]).await?
        } else {
            Default::default()
        };
        commit(tx).await?;
        Ok(ClaimedJob {
            observations: observations.remove(&after.id).unwrap_or_default(),
            job: after,
            takeover: true,
        })
    }
}

/// How long until the next job of `queue` becomes claimable (see
/// `queries/jobs/next_due.sql`).
async fn next_due(
    conn: &mut MySqlConnection,
    queue: &str,
) -> Result<Option<Duration>, CoordinatorError> {
    /// Anything further than this is "nothing pending" (the SQL's sentinel
    /// is the year 9999).
    const NOTHING: i64 = 100 * 365 * 24 * 3600 * 1_000_000;
    let row = sqlx::query(include_str!("queries/jobs/next_due.sql"))
        .bind(queue)
        .bind(queue)
        .fetch_one(conn)
        .await
        .map_err(convert_sqlx_err)?;
    let us: Option<i64> = super::rows::get(&row, "due_in_us")?;
    Ok(us
        .filter(|us| *us < NOTHING)
        .map(|us| Duration::from_micros(us.max(0) as u64)))
}

/// Writes the new attempts of locked rows (fenced on the state and attempt
/// read under the lock), and returns their `claimed` / `taken_over` events
/// (appended by the caller, with its COMMIT).
async fn write_hand_outs<'a>(
    conn: &mut MySqlConnection,
    handed: &[&'a (&LockedJob, Job)],
    now: DbTime,
) -> Result<Vec<NewEvent<'a>>, CoordinatorError> {
    let changes: Vec<Change> = handed
        .iter()
        .map(|(before, after)| Change {
            before: &before.job,
            after,
        })
        .collect();
    batch::write_images(&mut *conn, &changes).await?;
    Ok(handed
        .iter()
        .map(|(before, after)| {
            let takeover = before.job.state == JobState::Running;
            NewEvent {
                job_id: after.id,
                queue: &after.queue,
                attempt: after.attempt,
                kind: if takeover {
                    kind::TAKEN_OVER
                } else {
                    kind::CLAIMED
                },
                from_state: Some(before.job.state),
                to_state: Some(JobState::Running),
                current_attempt: after.attempt,
                request_digest: None,
                detail: Some(after.next_action.as_str().to_owned()),
                created_at: now,
            }
        })
        .collect())
}
