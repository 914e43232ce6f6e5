//! RecordObservation: evidence about a job (a provider response, a
//! webhook), accepted from any attempt including stale ones (docs/design.md
//! rule 7). It never changes the job (only its `has_observations` flag,
//! which tells claims to read them); the current holder or the reconciler
//! reads it and decides.

use super::errors::{error_number, is_unique_violation};
use super::pause::PausePoint;
use super::{convert_sqlx_err, reads, rows, JobStore};
use crate::run::{transaction, Body};
use jobfence_domain::{CoordinatorError, Observation, QueueScope, RecordObservation};
use sqlx::MySqlConnection;

/// MySQL's "foreign key constraint fails" on insert: the job does not exist.
const NO_REFERENCED_ROW: u16 = 1452;

impl JobStore {
    /// Appends an observation, de-duplicated on (job, dedup_key). Returns it
    /// and whether it already existed. `JobNotFound` for an unknown job;
    /// `QueueNotAllowed` (nothing written) when `scope` does not cover the
    /// job's queue.
    pub async fn record_observation(
        &self,
        req: &RecordObservation,
        scope: &QueueScope,
    ) -> Result<(Observation, bool), CoordinatorError> {
        transaction!(self, |tx| self.record_in(tx, req, scope))
    }

    async fn record_in(
        &self,
        tx: &mut MySqlConnection,
        req: &RecordObservation,
        scope: &QueueScope,
    ) -> Body<(Observation, bool)> {
        // The job's row first, before any row of ours: the same order as
        // the pruner (job row, then its observations). The insert's
        // foreign-key check takes a lock on it anyway, but only after the
        // new row is in the table, where a pruner holding the job and
        // deleting its observations would wait for it: a deadlock.
        let row = sqlx::query(include_str!("queries/observations/lock_job.sql"))
            .bind(req.job_id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(CoordinatorError::JobNotFound { job_id: req.job_id })?;
        self.pause_in(PausePoint::ObservationAfterLock, tx).await;
        scope.check(&rows::text(&row, "queue")?, Some(req.job_id))?;
        let inserted = sqlx::query(include_str!("queries/observations/insert.sql"))
            .bind(req.job_id)
            .bind(req.attempt)
            .bind(req.source.as_str())
            .bind(req.outcome.as_str())
            .bind(req.provider_reference.as_deref())
            .bind(&req.body)
            .bind(&req.dedup_key)
            .execute(&mut *tx)
            .await;
        let duplicate = match inserted {
            Ok(_) => false,
            Err(e) if is_unique_violation(&e) => true,
            Err(e) if error_number(&e) == Some(NO_REFERENCED_ROW) => {
                return Err(CoordinatorError::JobNotFound { job_id: req.job_id }.into())
            }
            Err(e) => return Err(convert_sqlx_err(e).into()),
        };
        // A job's first observation sets its flag (claims read the
        // observations of the jobs they hand out only when it is set). A
        // repeat sets it too when it is not set: an observation recorded
        // by a coordinator older than the flag left it unset.
        if rows::get::<i64>(&row, "has_observations")? == 0 {
            sqlx::query(include_str!("queries/observations/flag_job.sql"))
                .bind(req.job_id)
                .execute(&mut *tx)
                .await?;
        }
        if !duplicate {
            sqlx::query(include_str!("queries/observations/event.sql"))
                .bind(req.attempt)
                .bind(format!("{} {}", req.source.as_str(), req.outcome.as_str()))
                .bind(req.job_id)
                .execute(&mut *tx)
                .await?;
        }
        let observation = reads::observation_by_key(tx, req.job_id, &req.dedup_key)
            .await?
            .ok_or_else(|| {
                CoordinatorError::TransactionConflict("observation vanished; retrying".into())
            })?;
        Ok((observation, duplicate))
    }
}
