//! Workers seen across coordinators (docs/operating.md "Workers"): each
//! coordinator writes what it saw of its workers every few seconds into
//! `worker_sightings` (one row per worker and coordinator, one statement
//! per write), and reads every coordinator's rows back with the running
//! jobs each worker holds. Nothing here is on a worker call's path.

use super::{micros, rows, JobStore};
use crate::run::{transaction, Failure};
use jobfence_domain::CoordinatorError;
use std::time::Duration;

/// How long a sighting is kept after its last call.
pub const SIGHTINGS_KEPT: Duration = Duration::from_secs(24 * 3600);

/// What one coordinator saw of one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighting {
    pub worker_id: String,
    /// The coordinator that served it (its `--coordinator-name`).
    pub coordinator: String,
    /// The client and its version (from the calls' user-agent).
    pub client: String,
    /// The queue of its latest call.
    pub queue: String,
    /// Since its first call to this coordinator.
    pub first_seen_ago: Duration,
    /// Since its latest call to this coordinator.
    pub last_call_ago: Duration,
    /// Its calls to this coordinator in the minute before the write.
    pub calls_last_minute: u32,
}

/// A running job and its lease, as a worker holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldJob {
    /// The lease's owner (the worker_id of the Claim or Takeover).
    pub worker_id: String,
    pub job_id: u64,
    pub queue: String,
    pub attempt: u64,
    /// Time left on the lease, in microseconds; negative once it expired
    /// (the job then waits for a takeover).
    pub lease_left_us: i64,
}

impl JobStore {
    /// Writes `seen` (one coordinator's sightings, any order) in one
    /// statement, and forgets sightings a day past their last call. Run
    /// again on a conflict (a lock wait behind another coordinator's
    /// forget, or a reader's lock); counted like every conflict.
    pub async fn record_sightings(&self, seen: &[Sighting]) -> Result<(), CoordinatorError> {
        if seen.is_empty() {
            return Ok(());
        }
        let mut seen = seen.to_vec();
        seen.sort_by(|a, b| a.worker_id.cmp(&b.worker_id));
        let row = "(?, ?, ?, ?, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND, \
                   UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND, ?)";
        let sql = include_str!("queries/workers/record.sql")
            .replace("{rows}", &vec![row; seen.len()].join(", "));
        transaction!(self, |tx| async {
            let mut q = sqlx::query(&sql);
            for s in &seen {
                q = q
                    .bind(&s.worker_id)
                    .bind(&s.coordinator)
                    .bind(&s.client)
                    .bind(&s.queue)
                    .bind(micros(s.first_seen_ago))
                    .bind(micros(s.last_call_ago))
                    .bind(s.calls_last_minute);
            }
            q.execute(&mut *tx).await?;
            sqlx::query(include_str!("queries/workers/forget.sql"))
                .bind(micros(SIGHTINGS_KEPT))
                .execute(&mut *tx)
                .await?;
            Ok::<_, Failure>(())
        })
    }

    /// Every coordinator's sightings whose last call is at most `within`
    /// old, by worker_id then latest call first.
    pub async fn sightings(&self, within: Duration) -> Result<Vec<Sighting>, CoordinatorError> {
        let found = self
            .fetch_rows(sqlx::query(include_str!("queries/workers/list.sql")).bind(micros(within)))
            .await?;
        let ago = |us: i64| Duration::from_micros(u64::try_from(us).unwrap_or(0));
        found
            .iter()
            .map(|r| {
                Ok(Sighting {
                    worker_id: rows::text(r, "worker_id")?,
                    coordinator: rows::text(r, "coordinator")?,
                    client: rows::text(r, "client")?,
                    queue: rows::text(r, "queue")?,
                    first_seen_ago: ago(rows::get(r, "first_seen_us")?),
                    last_call_ago: ago(rows::get(r, "last_call_us")?),
                    calls_last_minute: rows::get(r, "calls_last_minute")?,
                })
            })
            .collect()
    }

    /// The running jobs of this database (every queue), by lease owner.
    pub async fn held_jobs(&self) -> Result<Vec<HeldJob>, CoordinatorError> {
        let q = sqlx::query(include_str!("queries/workers/held.sql"));
        let found = self.fetch_rows(q).await?;
        found
            .iter()
            .map(|r| {
                Ok(HeldJob {
                    worker_id: rows::opt_text(r, "lease_owner")?.unwrap_or_default(),
                    job_id: rows::get(r, "id")?,
                    queue: rows::text(r, "queue")?,
                    attempt: rows::get(r, "attempt")?,
                    lease_left_us: rows::get::<Option<i64>>(r, "lease_left_us")?.unwrap_or(0),
                })
            })
            .collect()
    }
}
