//! Retention (docs/design.md rule 14): pruning finished jobs in small batches,
//! keeping their operation keys, and answering for what was pruned.
//!
//! One batch is one short transaction: read up to `batch` candidate ids
//! (terminal jobs past their retention, by `ix_jobs_finished`; a plain
//! read), lock those still terminal with `FOR UPDATE SKIP LOCKED`, copy
//! their identity into `operation_keys` (INSERT … SELECT, idempotent),
//! delete their observations, their events and the job rows (the DELETE
//! re-checks the state), raise the events feed's `events_pruned_through`
//! mark, and COMMIT. A live job (`ready`, `running`, `manual_review`) is
//! never selected and never deleted, whatever its age.
//!
//! Two pruners at once (two coordinators whose `GET_LOCK` does not see
//! each other, as on Galera): SKIP LOCKED gives each batch the rows no
//! other batch holds, and a row another batch already deleted is not
//! there to lock, so each row is deleted once; a pruner never waits for a
//! lock another pruner holds, and a conflict (a Galera certification
//! failure) rolls its batch back whole, to be run again.

use super::archive::{read_rows, ArchivedRows, PruneArchive};
use super::pause::PausePoint;
use super::rows::{get, opt_text, text};
use super::run::{transaction, Body};
use super::{convert_sqlx_err, micros, JobStore};
use jobfence_domain::{CoordinatorError, DbTime, KeyRecord, PruneCounts, Retention};
use sqlx::mysql::MySqlRow;
use sqlx::{Executor, MySqlConnection};
use std::sync::Arc;
use std::time::Duration;

/// The name of the database lock a pruning run holds (`GET_LOCK`), so
/// that one coordinator at a time prunes a database: `jobfence_pruner.`
/// and the schema's name (locks are server-wide; MySQL allows 64
/// characters).
pub const PRUNER_LOCK: &str = "CONCAT('jobfence_pruner.', LEFT(DATABASE(), 48))";

/// Jobs one pruning transaction deletes at most, by default: its locks are
/// held for a few milliseconds.
pub const DEFAULT_PRUNE_BATCH: u32 = 500;

/// After each pruning batch the pruner rests this many times as long as
/// the batch took, by default: its session is busy at most a ninth of the
/// time, so the database's CPU goes to live jobs first (docs/benchmarks.md,
/// "Pruning": at 3, claims ran at 78 % of their rate meanwhile on a 2-core
/// machine). A million rows then take about twelve minutes.
pub const DEFAULT_PRUNE_REST: f64 = 8.0;

/// How a pruning run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneRun {
    /// It ran: what it removed.
    Done(PruneCounts),
    /// Another session holds the pruner's lock: nothing was done.
    LockHeld,
}

/// What the pruning gauges show, read after a run.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RetentionStats {
    /// Key records held in `operation_keys`.
    pub key_records: u64,
    /// Age of the oldest finished job still held (DB clock), if any.
    pub oldest_finished_age: Option<Duration>,
    /// Seconds since the Unix epoch of the last run that finished, if any.
    pub last_run_unix: Option<f64>,
}

/// Hands `lines` to `archive` on a blocking thread (the gzip and the fsync
/// must not stall the async runtime, whose other tasks are the live calls),
/// and waits for it.
async fn write_blocking(
    archive: &Arc<dyn PruneArchive>,
    lines: Vec<Vec<u8>>,
) -> Result<u64, String> {
    let archive = Arc::clone(archive);
    tokio::task::spawn_blocking(move || archive.write_batch(&lines))
        .await
        .unwrap_or_else(|e| Err(format!("the archive's writing thread failed: {e}")))
}

fn id_list(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

pub(crate) fn key_record(row: &MySqlRow) -> Result<KeyRecord, CoordinatorError> {
    Ok(KeyRecord {
        job_id: get(row, "job_id")?,
        queue: text(row, "queue")?,
        operation_key: text(row, "operation_key")?,
        final_state: text(row, "final_state")?
            .parse()
            .map_err(|e| CoordinatorError::Internal(format!("{e}")))?,
        attempt: get(row, "attempt")?,
        dispatch_count: get(row, "dispatch_count")?,
        provider_reference: opt_text(row, "provider_reference")?,
        created_at: get::<DbTime>(row, "created_at")?,
        finished_at: get::<DbTime>(row, "finished_at")?,
        pruned_at: get::<DbTime>(row, "pruned_at")?,
    })
}

/// `sql` with `{pruner_lock}` replaced by [`PRUNER_LOCK`].
fn with_pruner_lock(sql: &str) -> String {
    sql.replace("{pruner_lock}", PRUNER_LOCK)
}

/// Step 2 of a pruning batch: locks the candidates still terminal (SKIP
/// LOCKED: rows another pruner holds are left to it), in id order.
async fn lock_candidates(
    tx: &mut MySqlConnection,
    candidates: &[u64],
) -> Result<Vec<u64>, CoordinatorError> {
    let sql = include_str!("queries/retention/lock_candidates.sql")
        .replace("{ids}", &id_list(candidates));
    let mut locked: Vec<u64> = sqlx::query_scalar(&sql)
        .fetch_all(&mut *tx)
        .await
        .map_err(convert_sqlx_err)?;
    locked.sort_unstable();
    Ok(locked)
}

/// Step 3: the key record of each locked job (docs/design.md rule 14),
/// before the job row goes; how many were new (see record_keys.sql).
async fn record_keys(tx: &mut MySqlConnection, ids: &str) -> Result<u64, CoordinatorError> {
    let keys =
        sqlx::query(&include_str!("queries/retention/record_keys.sql").replace("{ids}", ids))
            .execute(&mut *tx)
            .await
            .map_err(convert_sqlx_err)?;
    Ok(keys.rows_affected())
}

/// What one pruning batch deleted.
struct Deleted {
    observations: u64,
    events: u64,
    jobs: u64,
}

/// Step 4: deletes the locked jobs' observations, events (raising the
/// events feed's mark past them) and rows.
async fn delete_batch(tx: &mut MySqlConnection, ids: &str) -> Result<Deleted, CoordinatorError> {
    let run = |sql: &str| sql.replace("{ids}", ids);
    let observations = sqlx::query(&run(include_str!(
        "queries/retention/delete_observations.sql"
    )))
    .execute(&mut *tx)
    .await
    .map_err(convert_sqlx_err)?
    .rows_affected();
    let last_event: Option<u64> =
        sqlx::query_scalar(&run(include_str!("queries/retention/last_event.sql")))
            .fetch_one(&mut *tx)
            .await
            .map_err(convert_sqlx_err)?;
    let events = sqlx::query(&run(include_str!("queries/retention/delete_events.sql")))
        .execute(&mut *tx)
        .await
        .map_err(convert_sqlx_err)?
        .rows_affected();
    if let Some(last) = last_event {
        sqlx::query(include_str!("queries/retention/mark_events.sql"))
            .bind(last)
            .execute(&mut *tx)
            .await
            .map_err(convert_sqlx_err)?;
    }
    let jobs = sqlx::query(&run(include_str!("queries/retention/delete_jobs.sql")))
        .execute(&mut *tx)
        .await
        .map_err(convert_sqlx_err)?
        .rows_affected();
    Ok(Deleted {
        observations,
        events,
        jobs,
    })
}

/// Step 5: checks that the rows read for the archive are exactly the rows
/// deleted, and writes them (durably) before the batch commits: `(jobs,
/// bytes)` archived. An `Err` rolls the batch back.
async fn archive_batch(
    archive: &Arc<dyn PruneArchive>,
    rows: ArchivedRows,
    deleted: &Deleted,
) -> Result<(u64, u64), CoordinatorError> {
    let Deleted {
        observations,
        events,
        jobs,
    } = *deleted;
    if rows.lines.len() as u64 != jobs || rows.observations != observations || rows.events != events
    {
        return Err(CoordinatorError::Internal(format!(
            "pruning archived {} jobs, {} observations and {} events but deleted \
             {jobs}, {observations} and {events}; batch rolled back",
            rows.lines.len(),
            rows.observations,
            rows.events
        )));
    }
    match write_blocking(archive, rows.lines).await {
        Ok(bytes) => Ok((jobs, bytes)),
        Err(why) => Err(CoordinatorError::Internal(format!(
            "pruning stopped: the archive could not be written ({why}); \
             the batch of {jobs} jobs was rolled back, nothing of it deleted"
        ))),
    }
}

impl JobStore {
    /// One pruning run: takes the database lock [`PRUNER_LOCK`] on a
    /// session of its own (`GET_LOCK(…, 0)`: another coordinator already
    /// pruning makes this run [`PruneRun::LockHeld`] at once), prunes
    /// batches of at most `batch` jobs until none is left, then key records
    /// past their own retention, and records the run's end. `progress` is
    /// called after each batch with the counts so far.
    ///
    /// The lock is not replicated by Galera: coordinators on different
    /// nodes may both run; each row is still pruned once (module docs).
    pub async fn prune(
        &self,
        retention: &Retention,
        batch: u32,
        progress: impl FnMut(&PruneCounts),
    ) -> Result<PruneRun, CoordinatorError> {
        self.prune_paced(retention, batch, 0.0, progress).await
    }

    /// [`prune`](Self::prune), resting after each batch `rest` times as
    /// long as the batch took (0: none; 3: the pruner's session is busy at
    /// most a quarter of the time), so that on a small database server the
    /// pruning leaves most of its CPU to the claims and writes of live
    /// jobs (docs/benchmarks.md, "Pruning").
    pub async fn prune_paced(
        &self,
        retention: &Retention,
        batch: u32,
        rest: f64,
        progress: impl FnMut(&PruneCounts),
    ) -> Result<PruneRun, CoordinatorError> {
        self.prune_archived(retention, batch, rest, None, progress)
            .await
    }

    /// [`prune_paced`](Self::prune_paced), handing each batch's rows to
    /// `archive` (when given) before the batch commits: a write that fails
    /// rolls the batch back and ends the run with the error, so no row is
    /// deleted that the archive does not hold (see [`crate::archive`]).
    /// The write (compression, fsync) runs on a blocking thread, not on
    /// the async runtime, while the batch's transaction waits for it.
    pub async fn prune_archived(
        &self,
        retention: &Retention,
        batch: u32,
        rest: f64,
        archive: Option<Arc<dyn PruneArchive>>,
        mut progress: impl FnMut(&PruneCounts),
    ) -> Result<PruneRun, CoordinatorError> {
        let mut lock = self.pool().acquire().await.map_err(convert_sqlx_err)?;
        // Closed, not returned, when dropped: the server then frees the
        // lock whatever happened to this run.
        lock.close_on_drop();
        let got: Option<i64> = sqlx::query_scalar(&with_pruner_lock(include_str!(
            "queries/retention/lock_pruner.sql"
        )))
        .fetch_one(&mut *lock)
        .await
        .map_err(convert_sqlx_err)?;
        if got != Some(1) {
            return Ok(PruneRun::LockHeld);
        }
        let mut total = PruneCounts::default();
        let rest = if rest.is_finite() { rest.max(0.0) } else { 0.0 };
        loop {
            let took = std::time::Instant::now();
            let (counts, more) = self
                .prune_batch_with(retention, batch, archive.as_ref())
                .await?;
            if more && rest > 0.0 {
                tokio::time::sleep(took.elapsed().mul_f64(rest)).await;
            }
            total.add(counts);
            if counts.jobs > 0 {
                progress(&total);
            }
            if !more {
                break;
            }
        }
        if let Some(keys) = retention.keys {
            loop {
                let n = self.prune_key_records(keys, retention.jobs, batch).await?;
                total.keys_pruned += n;
                if n < u64::from(batch) {
                    break;
                }
                progress(&total);
            }
        }
        sqlx::query(include_str!("queries/retention/mark_run.sql"))
            .execute(&self.pool())
            .await
            .map_err(convert_sqlx_err)?;
        let unlock = with_pruner_lock(include_str!("queries/retention/unlock_pruner.sql"));
        let _ = lock.execute(sqlx::raw_sql(&unlock)).await;
        Ok(PruneRun::Done(total))
    }

    /// One pruning transaction of at most `batch` jobs (see the module
    /// docs), run again on a conflict; also whether more candidates may be
    /// left. Holds no database lock: [`prune`](Self::prune) takes it.
    pub async fn prune_batch(
        &self,
        retention: &Retention,
        batch: u32,
    ) -> Result<(PruneCounts, bool), CoordinatorError> {
        self.prune_batch_with(retention, batch, None).await
    }

    /// [`prune_batch`](Self::prune_batch), writing what it deletes to
    /// `archive` (when given) before its transaction commits.
    async fn prune_batch_with(
        &self,
        retention: &Retention,
        batch: u32,
        archive: Option<&Arc<dyn PruneArchive>>,
    ) -> Result<(PruneCounts, bool), CoordinatorError> {
        let candidates = self.prune_candidates(retention, batch).await?;
        if candidates.is_empty() {
            return Ok((PruneCounts::default(), false));
        }
        let full = candidates.len() as u32 >= batch.max(1);
        self.pause(PausePoint::PruneAfterCandidates).await;
        let counts = transaction!(self, |tx| self.prune_locked(tx, &candidates, archive))?;
        // No batch when every candidate was another pruner's, or gone.
        Ok((counts, full && counts.batches > 0))
    }

    /// Steps 2 to 4 of a pruning batch, in `tx`: locks the candidates
    /// still terminal, archives and deletes them, records their keys.
    async fn prune_locked(
        &self,
        tx: &mut MySqlConnection,
        candidates: &[u64],
        archive: Option<&Arc<dyn PruneArchive>>,
    ) -> Body<PruneCounts> {
        let locked = lock_candidates(tx, candidates).await?;
        if locked.is_empty() {
            // Every candidate is another pruner's now, or gone.
            return Ok(PruneCounts::default());
        }
        self.pause_in(PausePoint::PruneAfterLock, tx).await;
        let ids = id_list(&locked);
        let archived = match archive {
            Some(_) => Some(read_rows(tx, &ids).await?),
            None => None,
        };
        let keys_recorded = record_keys(tx, &ids).await?;
        let deleted = delete_batch(tx, &ids).await?;
        if deleted.jobs != locked.len() as u64 {
            // Cannot happen (the rows are locked and terminal): refuse to
            // commit a batch that did not do what it checked.
            return Err(CoordinatorError::Internal(format!(
                "pruning locked {} jobs but deleted {}",
                locked.len(),
                deleted.jobs
            ))
            .into());
        }
        let written = match (archive, archived) {
            (Some(archive), Some(rows)) => archive_batch(archive, rows, &deleted).await,
            _ => Ok((0, 0)),
        };
        let (archived_jobs, archived_bytes) = match written {
            Ok(written) => written,
            Err(e) => {
                return Err(e.into());
            }
        };
        let counts = PruneCounts {
            batches: 1,
            jobs: deleted.jobs,
            observations: deleted.observations,
            events: deleted.events,
            keys_recorded,
            keys_pruned: 0,
            archived_jobs,
            archived_bytes,
        };
        Ok(counts)
    }

    /// Step 1 of a pruning batch: up to `batch` ids of terminal jobs past
    /// their retention (a plain read, on a connection of its own, returned
    /// before the batch's transaction begins).
    async fn prune_candidates(
        &self,
        retention: &Retention,
        batch: u32,
    ) -> Result<Vec<u64>, CoordinatorError> {
        let default_us = micros(retention.jobs);
        let mut conn = self.pool().acquire().await.map_err(convert_sqlx_err)?;
        let shortest: Option<i64> =
            sqlx::query_scalar(include_str!("queries/retention/shortest.sql"))
                .fetch_one(&mut *conn)
                .await
                .map_err(convert_sqlx_err)?;
        let bound = shortest.map_or(default_us, |s| s.min(default_us));
        sqlx::query_scalar(include_str!("queries/retention/candidates.sql"))
            .bind(bound)
            .bind(default_us)
            .bind(batch.max(1))
            .fetch_all(&mut *conn)
            .await
            .map_err(convert_sqlx_err)
    }

    /// Deletes up to `batch` key records past `keys` (and past their
    /// queue's job retention, `jobs` by default); how many.
    async fn prune_key_records(
        &self,
        keys: Duration,
        jobs: Duration,
        batch: u32,
    ) -> Result<u64, CoordinatorError> {
        let ids: Vec<u64> = sqlx::query_scalar(include_str!("queries/retention/expired_keys.sql"))
            .bind(micros(keys.max(jobs)))
            .bind(micros(jobs))
            .bind(batch.max(1))
            .fetch_all(&self.pool())
            .await
            .map_err(convert_sqlx_err)?;
        if ids.is_empty() {
            return Ok(0);
        }
        let sql =
            include_str!("queries/retention/delete_keys.sql").replace("{ids}", &id_list(&ids));
        let done = sqlx::query(&sql)
            .execute(&self.pool())
            .await
            .map_err(convert_sqlx_err)?;
        Ok(done.rows_affected())
    }

    /// The name of this store's database schema (`DATABASE()`), which
    /// names its archive files.
    pub async fn schema_name(&self) -> Result<String, CoordinatorError> {
        let name: Option<String> =
            sqlx::query_scalar(include_str!("queries/server/schema_name.sql"))
                .fetch_one(&self.pool())
                .await
                .map_err(convert_sqlx_err)?;
        Ok(name.unwrap_or_default())
    }

    /// The key record of job `job_id`, if the job was pruned.
    pub async fn key_record(&self, job_id: u64) -> Result<Option<KeyRecord>, CoordinatorError> {
        let row = sqlx::query(include_str!("queries/retention/key_record.sql"))
            .bind(job_id)
            .fetch_optional(&self.pool())
            .await
            .map_err(convert_sqlx_err)?;
        row.as_ref().map(key_record).transpose()
    }

    /// `JobPruned` with its key record when job `job_id` was pruned;
    /// otherwise `JobNotFound`.
    pub async fn explain_missing(&self, job_id: u64) -> CoordinatorError {
        match self.key_record(job_id).await {
            Ok(Some(record)) => CoordinatorError::JobPruned(Box::new(record)),
            Ok(None) => CoordinatorError::JobNotFound { job_id },
            Err(e) => e,
        }
    }

    /// Every event id up to this one may have been pruned (0: none was).
    pub async fn events_pruned_through(&self) -> Result<u64, CoordinatorError> {
        events_pruned_through(&mut *self.pool().acquire().await.map_err(convert_sqlx_err)?).await
    }

    /// Key records held, the oldest finished job's age and the last run.
    pub async fn retention_stats(&self) -> Result<RetentionStats, CoordinatorError> {
        let pool = self.pool();
        let key_records: i64 =
            sqlx::query_scalar(include_str!("queries/retention/key_records.sql"))
                .fetch_one(&pool)
                .await
                .map_err(convert_sqlx_err)?;
        let oldest: Option<i64> =
            sqlx::query_scalar(include_str!("queries/retention/oldest_finished.sql"))
                .fetch_one(&pool)
                .await
                .map_err(convert_sqlx_err)?;
        let last: Option<i64> = sqlx::query_scalar(include_str!("queries/retention/last_run.sql"))
            .fetch_optional(&pool)
            .await
            .map_err(convert_sqlx_err)?
            .flatten();
        Ok(RetentionStats {
            key_records: key_records.max(0) as u64,
            oldest_finished_age: oldest.map(|us| Duration::from_micros(us.max(0) as u64)),
            last_run_unix: last.map(|us| us as f64 / 1e6),
        })
    }
}

/// The events feed's mark, read on `conn`.
pub(crate) async fn events_pruned_through(
    conn: &mut sqlx::MySqlConnection,
) -> Result<u64, CoordinatorError> {
    let mark: Option<u64> =
        sqlx::query_scalar(include_str!("queries/retention/events_pruned_through.sql"))
            .fetch_optional(conn)
            .await
            .map_err(convert_sqlx_err)?;
    Ok(mark.unwrap_or(0))
}
