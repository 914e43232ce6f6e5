//! The restore fence (docs/design.md rule 17; docs/operating.md "Backup
//! and restore"): after a database is restored from a backup, no attempt
//! and no job id handed out since the backup may be handed out again.
//!
//! A backup taken before attempt 5 of a job holds attempt 4; the
//! database it replaces may have handed out 5, 6, … to workers that still
//! hold them. Restored as it is, the next takeover would hand out 5 again
//! and two workers would hold one fencing token. So before any
//! coordinator serves a restored database, `jobfence restore fence`
//! moves every unfinished job (ready, running, manual_review: every state
//! that is not terminal) to the next *restore epoch* of its attempt, and
//! the id counters of `jobs` and `job_events` past every id the lost
//! database may have used.
//!
//! # The epoch
//!
//! An attempt is `epoch · 2^32 + n` ([`EPOCH_STEP`]): the fence adds
//! 2^32 to the attempt, so the epoch (`attempt >> 32`, [`epoch_of`]) goes
//! up by one and `n` is kept. Every attempt the lost database handed out
//! since the backup is below the new one as long as fewer than 2^32
//! claims and takeovers of one job happened between the backup and the
//! restore (each takes a committed transaction and, but for a retry, a
//! lease that ran out). Nothing else changes: claims still add one, the
//! fence still compares whole numbers (`attempt` is `BIGINT UNSIGNED`,
//! `uint64` in the API, opaque to every client), and a job never fenced
//! keeps the attempts it always had. An attempt stays below 2^53, exact
//! in a JavaScript number (the Node client reads `uint64` as one), for
//! 2^21 fences; one that would not is refused ([`ATTEMPT_LIMIT`]).
//!
//! The fence is relative to what the restored rows hold: restoring a
//! backup taken before an earlier restore's fence needs one fence per
//! restore since that backup (running it again is always safe: it only
//! moves the epoch further).
//!
//! # Job and event ids
//!
//! Jobs enqueued since the backup are lost by the restore, but workers
//! may still hold them by id: a new job given the same id would accept a
//! stale worker's write. So the `jobs` and `job_events` counters move
//! [`ID_GAP`] past their largest id (which also keeps an events consumer's
//! cursor below the ids handed out from now on).

use super::batch::db_now;
use super::events::{self, NewEvent};
use super::rows;
use super::run::{transaction, Body};
use super::shards::{range_start, SHARD_SHIFT};
use super::{convert_sqlx_err, micros, JobStore};
use jobfence_domain::{CoordinatorError, DbTime, EventKind, JobState};
use sqlx::MySqlConnection;
use std::time::Duration;

/// What the fence adds to an attempt: one restore epoch, the attempt's
/// bits above the lower 32.
pub const EPOCH_STEP: u64 = 1 << 32;

/// The highest attempt plus one the fence may write: 2^53, the last
/// integer a JavaScript number holds exactly.
pub const ATTEMPT_LIMIT: u64 = 1 << 53;

/// How far past its largest id each id counter (`jobs`, `job_events`)
/// moves: more ids than a database hands out between a backup and its
/// restore. A database's ids span 2^48 ([`SHARD_SHIFT`]), room for 65,535
/// fences.
pub const ID_GAP: u64 = 1 << 32;

/// Jobs per transaction, by default.
pub const DEFAULT_FENCE_BATCH: u32 = 1000;

/// The states the fence moves: every state that is not terminal.
pub const UNFINISHED: [JobState; 3] = [JobState::Ready, JobState::Running, JobState::ManualReview];

/// The restore epoch of an attempt: `attempt >> 32` (0 until a fence).
pub fn epoch_of(attempt: u64) -> u64 {
    attempt / EPOCH_STEP
}

/// The attempt after the fence: `attempt + 2^32`, the next epoch, the
/// same place in it. None at or past [`ATTEMPT_LIMIT`].
pub fn fenced_attempt(attempt: u64) -> Option<u64> {
    attempt
        .checked_add(EPOCH_STEP)
        .filter(|a| *a < ATTEMPT_LIMIT)
}

/// Unfinished jobs counted by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    pub ready: u64,
    pub running: u64,
    pub manual_review: u64,
}

impl StateCounts {
    /// Counts `n` more jobs in `state` (a terminal state is not counted).
    pub fn add(&mut self, state: JobState, n: u64) {
        match state {
            JobState::Ready => self.ready += n,
            JobState::Running => self.running += n,
            JobState::ManualReview => self.manual_review += n,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled => {}
        }
    }

    /// Adds `other`'s counts.
    pub fn add_all(&mut self, other: &StateCounts) {
        self.ready += other.ready;
        self.running += other.running;
        self.manual_review += other.manual_review;
    }

    /// Every job counted.
    pub fn total(&self) -> u64 {
        self.ready + self.running + self.manual_review
    }

    /// `ready N, running N, manual_review N`.
    pub fn describe(&self) -> String {
        format!(
            "ready {}, running {}, manual_review {}",
            self.ready, self.running, self.manual_review
        )
    }
}

/// What [`JobStore::unfinished`] found: the jobs the fence would move.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unfinished {
    pub by_state: StateCounts,
    /// The highest attempt among them (0: none).
    pub highest_attempt: u64,
}

/// One committed batch of [`JobStore::fence_batch`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FencedBatch {
    /// The batch's last job id: the next batch starts after it.
    pub last_id: u64,
    /// Jobs moved, by the state they are in (unchanged by the fence).
    pub by_state: StateCounts,
    /// The highest attempt written.
    pub highest_attempt: u64,
}

/// Where the id counters of one database start after the fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MovedIds {
    /// The next job id.
    pub jobs: u64,
    /// The next event id.
    pub events: u64,
}

/// A coordinator's heartbeat as read now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beat {
    pub name: String,
    /// `last_seen_at` as the database wrote it (text, compared exactly).
    pub seen: String,
    /// How long ago, by the database clock.
    pub ago: Duration,
}

/// A locked job of a batch: id, queue, state, attempt.
type Locked = (u64, String, JobState, u64);

impl JobStore {
    /// The unfinished jobs by state, and their highest attempt. Reads only.
    ///
    /// Errors: `DatabaseUnavailable`.
    pub async fn unfinished(&self) -> Result<Unfinished, CoordinatorError> {
        let found = sqlx::query(include_str!("queries/restore/unfinished.sql"))
            .fetch_all(&self.pool())
            .await
            .map_err(convert_sqlx_err)?;
        let mut out = Unfinished::default();
        for row in &found {
            let state = parse_state(&rows::text(row, "state")?)?;
            out.by_state
                .add(state, rows::get::<i64>(row, "jobs")?.max(0) as u64);
            let highest: u64 = rows::get(row, "highest")?;
            out.highest_attempt = out.highest_attempt.max(highest);
        }
        Ok(out)
    }

    /// The coordinators whose heartbeat was written within `within` (DB
    /// clock). Rows restored from a backup look as fresh as the backup
    /// is young: read twice, a live coordinator's `seen` moves (it writes
    /// one every 5 s at most). Reads only.
    ///
    /// Errors: `DatabaseUnavailable`.
    pub async fn heartbeats(&self, within: Duration) -> Result<Vec<Beat>, CoordinatorError> {
        let found = sqlx::query(include_str!("queries/restore/heartbeats.sql"))
            .bind(micros(within))
            .fetch_all(&self.pool())
            .await
            .map_err(convert_sqlx_err)?;
        found
            .iter()
            .map(|r| {
                Ok(Beat {
                    name: rows::text(r, "name")?,
                    seen: rows::text(r, "seen")?,
                    ago: Duration::from_micros(rows::get::<i64>(r, "ago_us")?.max(0) as u64),
                })
            })
            .collect()
    }

    /// Moves the next `batch` unfinished jobs after job `after` to the
    /// next restore epoch, in one transaction (docs/design.md rule 17):
    /// each attempt + [`EPOCH_STEP`]; a ready job's next action becomes
    /// `reconcile` (rule 5); a running job's lease ends now, so it is open
    /// to takeover, which reconciles first (rules 1 and 5); an event
    /// `restore_fenced` per job, in the same transaction, naming
    /// `operator`. None when no unfinished job is left after `after`.
    /// A transaction conflict is run again.
    ///
    /// Errors: `InvalidArgument` (field `attempt`) when an attempt would
    /// reach [`ATTEMPT_LIMIT`] (nothing of the batch is written);
    /// `DatabaseUnavailable`, `CommitOutcomeUnknown` (running it again is
    /// safe: a batch that did commit is only moved one epoch further).
    pub async fn fence_batch(
        &self,
        after: u64,
        batch: u32,
        operator: &str,
    ) -> Result<Option<FencedBatch>, CoordinatorError> {
        let batch = batch.max(1);
        transaction!(self, |tx| self.fence_batch_in(tx, after, batch, operator))
    }

    async fn fence_batch_in(
        &self,
        tx: &mut MySqlConnection,
        after: u64,
        batch: u32,
        operator: &str,
    ) -> Body<Option<FencedBatch>> {
        let locked = lock_batch(tx, after, batch).await?;
        let (Some(first), Some(last)) = (locked.first(), locked.last()) else {
            return Ok(None);
        };
        let (first, last_id) = (first.0, last.0);
        let mut done = FencedBatch {
            last_id,
            ..FencedBatch::default()
        };
        for (id, _, state, attempt) in &locked {
            let new = fenced_attempt(*attempt).ok_or_else(|| past_limit(*id, *attempt))?;
            done.highest_attempt = done.highest_attempt.max(new);
            done.by_state.add(*state, 1);
        }
        let now = db_now(tx).await?;
        let matched = sqlx::query(include_str!("queries/restore/fence_batch.sql"))
            .bind(EPOCH_STEP)
            .bind(now)
            .bind(now)
            .bind(now)
            .bind(first)
            .bind(last_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        // Matched rows (docs/design.md rule 10): exactly the locked ones.
        if matched != locked.len() as u64 {
            return Err(CoordinatorError::Internal(format!(
                "the restore fence locked {} jobs of ids {first}..={last_id} and matched {matched}",
                locked.len()
            ))
            .into());
        }
        let events: Vec<NewEvent<'_>> = locked
            .iter()
            .map(|job| fence_event(job, operator, now))
            .collect();
        events::append_all(tx, &events).await?;
        Ok(Some(done))
    }

    /// Moves the id counters of `jobs` and `job_events` [`ID_GAP`] past
    /// their largest id (or past the start of database `shard`'s range
    /// when a table is empty). DDL (`ALTER TABLE … AUTO_INCREMENT`), which
    /// commits by itself.
    ///
    /// Errors: `InvalidArgument` (field `id`) when the new counter would
    /// leave the database's range; `DatabaseUnavailable`.
    pub async fn move_ids_past_restore(&self, shard: u32) -> Result<MovedIds, CoordinatorError> {
        let start = range_start(shard);
        let end = range_start(shard + 1).min(ATTEMPT_LIMIT);
        let mut next = [0u64; 2];
        for (slot, table) in next.iter_mut().zip(["jobs", "job_events"]) {
            let sql = include_str!("queries/shards/max_id.sql").replace("{table}", table);
            let max: Option<u64> = sqlx::query_scalar(&sql)
                .fetch_one(&self.pool())
                .await
                .map_err(convert_sqlx_err)?;
            let from = max.unwrap_or(start).max(start) + ID_GAP + 1;
            if from >= end {
                return Err(CoordinatorError::InvalidArgument(vec![
                    jobfence_domain::FieldViolation::new(
                        "id",
                        format!("the {table} ids of database {shard} would pass {end} (its range ends at 2^{SHARD_SHIFT} ids)"),
                    ),
                ]));
            }
            let sql = include_str!("queries/shards/start_ids.sql")
                .replace("{table}", table)
                .replace("{start}", &from.to_string());
            sqlx::raw_sql(&sql)
                .execute(&self.pool())
                .await
                .map_err(convert_sqlx_err)?;
            *slot = from;
        }
        Ok(MovedIds {
            jobs: next[0],
            events: next[1],
        })
    }
}

/// The next `batch` unfinished jobs after `after`, locked.
async fn lock_batch(
    conn: &mut sqlx::MySqlConnection,
    after: u64,
    batch: u32,
) -> Result<Vec<Locked>, CoordinatorError> {
    sqlx::query(include_str!("queries/restore/lock_batch.sql"))
        .bind(after)
        .bind(batch)
        .fetch_all(conn)
        .await
        .map_err(convert_sqlx_err)?
        .iter()
        .map(|r| {
            Ok((
                rows::get(r, "id")?,
                rows::text(r, "queue")?,
                parse_state(&rows::text(r, "state")?)?,
                rows::get(r, "attempt")?,
            ))
        })
        .collect()
}

/// The `restore_fenced` event of one locked job.
fn fence_event<'a>(job: &'a Locked, operator: &str, now: DbTime) -> NewEvent<'a> {
    let (id, queue, state, attempt) = job;
    let new = attempt + EPOCH_STEP;
    let mut detail = serde_json::json!({
        "action": "restore_fence",
        "operator": operator,
        "previous_attempt": attempt,
        "epoch": epoch_of(new),
    });
    if *state == JobState::Running {
        detail["lease"] = "expired".into();
    }
    if *state == JobState::Ready {
        detail["next_action"] = "reconcile".into();
    }
    NewEvent {
        job_id: *id,
        queue,
        attempt: *attempt,
        kind: EventKind::RestoreFenced,
        from_state: Some(*state),
        to_state: None,
        current_attempt: new,
        request_digest: None,
        detail: Some(detail.to_string()),
        created_at: now,
    }
}

fn parse_state(s: &str) -> Result<JobState, CoordinatorError> {
    s.parse()
        .map_err(|e| CoordinatorError::Internal(format!("a job's state: {e}")))
}

fn past_limit(id: u64, attempt: u64) -> CoordinatorError {
    CoordinatorError::InvalidArgument(vec![jobfence_domain::FieldViolation::new(
        "attempt",
        format!("job {id}'s attempt {attempt} would pass 2^53 with another restore epoch; nothing of this batch was written"),
    )])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_moves_the_epoch_and_keeps_the_place_in_it() {
        assert_eq!(fenced_attempt(0), Some(EPOCH_STEP));
        assert_eq!(fenced_attempt(1), Some(EPOCH_STEP + 1));
        assert_eq!(epoch_of(fenced_attempt(7).unwrap()), 1);
        let twice = fenced_attempt(fenced_attempt(7).unwrap()).unwrap();
        assert_eq!((epoch_of(twice), twice % EPOCH_STEP), (2, 7));
        // Above every attempt fewer than 2^32 hand-outs after it reach.
        assert!(fenced_attempt(5).unwrap() > 5 + (EPOCH_STEP - 1));
        assert_eq!(fenced_attempt(ATTEMPT_LIMIT - EPOCH_STEP), None);
        assert!(fenced_attempt(ATTEMPT_LIMIT - EPOCH_STEP - 1).is_some());
    }
}
