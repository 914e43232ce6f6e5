//! Trying a failed or cancelled job again as a new operation (a new
//! operation key; docs/operating.md, "Trying a failed refund again"). The
//! old job never changes: its story gains a `retried_as_new_operation`
//! event naming the new key, reserved under its row lock before the new
//! job exists, so that one job is tried again as one new operation at most
//! whoever asks, and however often. The new job is an ordinary Enqueue;
//! its story gains a `retry_of` event naming the old job.

use super::events::{self, NewEvent};
use super::pause::PausePoint;
use super::{convert_sqlx_err, reads, JobStore};
use crate::run::{transaction, Body, Failure};
use jobfence_domain::admin::RetryJob;
use jobfence_domain::{CoordinatorError, EventKind, Job, JobState};
use serde_json::json;
use sqlx::MySqlConnection;

/// What reserving a retry found.
#[derive(Debug, Clone)]
pub struct Reserved {
    /// The old job, as it is (failed or cancelled).
    pub old: Job,
    /// This call wrote the reservation; `false`: an earlier call with the
    /// same key did (asking again is the same retry).
    pub now: bool,
}

impl JobStore {
    /// Reserves `new_key` as the one retry of job `req.job_id`, under its
    /// row lock. Refusals: `JobNotFound`; `InvalidArgument` on `job_id`
    /// for a job that is not failed or cancelled (naming its state), or
    /// whose operation key has a settled refund in its queue's provider's
    /// settlement report (docs/design.md rule 15: the money moved); on
    /// `new_operation_key` for a job already tried again with another key
    /// (naming it). Run again on a conflict (a lock wait or deadlock),
    /// counted like every write's.
    pub async fn reserve_retry(
        &self,
        req: &RetryJob,
        new_key: &str,
    ) -> Result<Reserved, CoordinatorError> {
        transaction!(self, |tx| self.reserve_in(tx, req, new_key))
    }

    async fn reserve_in(
        &self,
        tx: &mut MySqlConnection,
        req: &RetryJob,
        new_key: &str,
    ) -> Body<Reserved> {
        let locked = reads::lock_job(tx, req.job_id)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id: req.job_id })?;
        let earlier: Option<String> = sqlx::query_scalar(include_str!("queries/retry/earlier.sql"))
            .bind(req.job_id)
            .fetch_optional(&mut *tx)
            .await?
            .flatten();
        self.pause(PausePoint::RetryAfterLock).await;
        let old = locked.job;
        if !matches!(old.state, JobState::Failed | JobState::Cancelled) {
            return Err(CoordinatorError::invalid(
                "job_id",
                format!(
                    "job {} is {}: only a failed or cancelled job can be tried again as a new operation",
                    old.id, old.state
                ),
            ).into());
        }
        // A replay first (see `replay`); one whose job was never made
        // is a new operation, refused below like any.
        let replay = match replay(tx, earlier.as_deref(), &old, new_key).await? {
            Replay::Made => return Ok(Reserved { old, now: false }),
            Replay::NotMade => true,
            Replay::None => false,
        };
        let settled: Option<(String, String)> =
            sqlx::query_as(include_str!("queries/retry/settled.sql"))
                .bind(&old.queue)
                .bind(&old.operation_key)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some((provider, reference)) = settled {
            return Err(CoordinatorError::invalid(
                "job_id",
                format!(
                    "job {} is {}, but {provider}'s settlement report has a settled refund \
                     {reference:?} of its operation key: the money moved, and trying it again \
                     as a new operation would refund twice (see its settlement exceptions: \
                     `jobfence settlement exceptions --job {}`)",
                    old.id, old.state, old.id
                ),
            )
            .into());
        }
        if replay {
            // Reserved before, its job never made: it is made now.
            return Ok(Reserved { old, now: false });
        }
        let detail = json!({
            "operator": req.operator,
            "reason": req.reason,
            "new_operation_key": new_key,
        });
        events::append(
            tx,
            link_event(&old, EventKind::RetriedAsNewOperation, detail, locked.now),
        )
        .await?;
        Ok(Reserved { old, now: true })
    }

    /// Appends the new job's `retry_of` event naming `old`, once (under
    /// the new job's row lock). Run again on a conflict.
    pub async fn link_retry(
        &self,
        new_job: u64,
        old: &Job,
        req: &RetryJob,
    ) -> Result<(), CoordinatorError> {
        transaction!(self, |tx| async {
            let locked = reads::lock_job(tx, new_job)
                .await?
                .ok_or(CoordinatorError::JobNotFound { job_id: new_job })?;
            let linked: i64 = sqlx::query_scalar(include_str!("queries/retry/linked.sql"))
                .bind(new_job)
                .fetch_one(&mut *tx)
                .await?;
            if linked == 0 {
                let detail = json!({
                    "operator": req.operator,
                    "reason": req.reason,
                    "old_job_id": old.id,
                    "old_operation_key": old.operation_key,
                });
                let event = link_event(&locked.job, EventKind::RetryOf, detail, locked.now);
                events::append(tx, event).await?;
            }
            Ok::<_, Failure>(())
        })
    }
}

/// What an earlier reservation of a retry says of this one.
enum Replay {
    /// No earlier reservation.
    None,
    /// The same retry, its new job made: answered as it is.
    Made,
    /// The same retry, reserved by a call cut off before its job was
    /// enqueued: nothing was sent yet.
    NotMade,
}

/// The same command again answers the new job it made, even once a report
/// shows the old refund settled (the new job exists; refusing would hide
/// it, and the old job's REFUND_NOT_RECORDED is where a person sees the
/// money moved); but only if that job exists: a reservation is committed
/// before its job is enqueued. `earlier`: the reservation's event detail.
/// Refused on `new_operation_key` when the earlier retry used another key.
async fn replay(
    tx: &mut sqlx::MySqlConnection,
    earlier: Option<&str>,
    old: &Job,
    new_key: &str,
) -> Result<Replay, CoordinatorError> {
    let Some(detail) = earlier else {
        return Ok(Replay::None);
    };
    let reserved = serde_json::from_str::<serde_json::Value>(detail)
        .ok()
        .and_then(|d| d["new_operation_key"].as_str().map(str::to_owned))
        .unwrap_or_default();
    if reserved != new_key {
        return Err(CoordinatorError::invalid(
            "new_operation_key",
            format!(
                "job {} was already tried again as operation key {reserved:?}; \
                 if that job failed too, try it again instead",
                old.id
            ),
        ));
    }
    let made: i64 = sqlx::query_scalar(include_str!("queries/retry/made.sql"))
        .bind(&old.queue)
        .bind(new_key)
        .bind(&old.queue)
        .bind(new_key)
        .fetch_one(&mut *tx)
        .await
        .map_err(convert_sqlx_err)?;
    Ok(if made != 0 {
        Replay::Made
    } else {
        Replay::NotMade
    })
}

/// An event that links two jobs and changes neither.
fn link_event(
    job: &Job,
    kind: EventKind,
    detail: serde_json::Value,
    now: jobfence_domain::DbTime,
) -> NewEvent<'_> {
    NewEvent {
        job_id: job.id,
        queue: &job.queue,
        attempt: job.attempt,
        kind,
        from_state: None,
        to_state: None,
        current_attempt: job.attempt,
        request_digest: None,
        detail: Some(detail.to_string()),
        created_at: now,
    }
}
