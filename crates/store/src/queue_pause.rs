//! A queue paused by an operator, with or without a provider: stored in
//! the queue's `queue_policies` row, which every coordinator's claim
//! reads in its transaction (crates/store/src/budget.rs), so a pause holds
//! on all of them from the next claim on. Each pause and resume is
//! recorded with the provider and policy changes.

use super::providers::{record, tidy};
use super::{rows, JobStore};
use crate::run::{transaction, Failure};
use jobfence_domain::providers::{queue_subject, ChangeBy, PolicyAction};
use jobfence_domain::{CoordinatorError, DbTime};
use serde_json::json;

/// A paused queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuePause {
    pub queue: String,
    pub since: DbTime,
    pub by: String,
    pub reason: String,
}

impl JobStore {
    /// Pauses `queue` (pausing it again keeps its first `since`, and takes
    /// the new operator and reason). Run again on a conflict.
    pub async fn pause_queue(&self, queue: &str, by: &ChangeBy) -> Result<(), CoordinatorError> {
        transaction!(self, |tx| async {
            let reason = super::providers::truncate(&by.reason, 255);
            sqlx::query(include_str!("queries/queue_pause/pause.sql"))
                .bind(queue)
                .bind(&by.operator)
                .bind(reason)
                .bind(&by.operator)
                .bind(&by.operator)
                .bind(reason)
                .bind(&by.operator)
                .execute(&mut *tx)
                .await?;
            let detail = json!({ "paused": true }).to_string();
            record(
                tx,
                &queue_subject(queue),
                PolicyAction::PauseQueue,
                by,
                &detail,
            )
            .await?;
            Ok::<_, Failure>(())
        })
    }

    /// Resumes `queue`; `false` when it was not paused (nothing written).
    pub async fn resume_queue(&self, queue: &str, by: &ChangeBy) -> Result<bool, CoordinatorError> {
        transaction!(self, |tx| async {
            let done = sqlx::query(include_str!("queries/queue_pause/resume.sql"))
                .bind(&by.operator)
                .bind(queue)
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() == 0 {
                return Ok(false);
            }
            let detail = json!({ "paused": false }).to_string();
            record(
                tx,
                &queue_subject(queue),
                PolicyAction::ResumeQueue,
                by,
                &detail,
            )
            .await?;
            tidy(tx, &[queue.to_owned()]).await?;
            Ok(true)
        })
    }

    /// The paused queues, by name.
    pub async fn paused_queues(&self) -> Result<Vec<QueuePause>, CoordinatorError> {
        let found = self
            .fetch_rows(sqlx::query(include_str!("queries/queue_pause/list.sql")))
            .await;
        found?
            .iter()
            .map(|r| {
                Ok(QueuePause {
                    queue: rows::text(r, "queue")?,
                    since: rows::get(r, "paused_at")?,
                    by: rows::opt_text(r, "paused_by")?.unwrap_or_default(),
                    reason: rows::opt_text(r, "pause_reason")?.unwrap_or_default(),
                })
            })
            .collect()
    }
}
