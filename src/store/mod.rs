//! MySQL storage: the only layer that sees SQL. Every change is one short
//! transaction (no lock is held across a provider call); every write a
//! worker can cause carries `id + state + attempt` in its WHERE.
//!
//! Where things are:
//! - `enqueue.rs`: Enqueue, idempotent on (queue, operation_key), one or a batch.
//! - `claim.rs`: Claim (scan + inline takeover, coalesced per queue) and
//!   named Takeover.
//! - `writeback.rs`: the fenced writes RenewLease, Complete and Fail, alone
//!   or as a group commit.
//! - `batch.rs`: what batched transactions share: lock by ids, write new
//!   row images fenced row by row (one JSON_TABLE statement per batch).
//! - `observations.rs`: RecordObservation and reads of jobs/observations.
//! - `events.rs`: the `job_events` log (and replay detection).
//! - `events_feed.rs`: the log read by cursor (the outbox feed).
//! - `admin.rs`: operator writes (ResolveManualReview, CancelJob);
//!   `admin/stats.rs`: operator reads and the pending ages of the gauges.
//! - `durability.rs`: the server's durability settings (DESIGN.md rule 9).
//! - `queries/`: the SQL, one file per statement.

mod admin;
mod batch;
mod claim;
mod durability;
mod enqueue;
mod errors;
mod events;
mod events_feed;
mod observations;
pub mod pause;
mod reads;
mod rows;
mod writeback;

use crate::domain::CoordinatorError;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{Executor, MySql, Transaction};
use std::str::FromStr;
use std::time::Duration;

pub use admin::{
    CancelRequest, ListJobsFilter, OldestJob, PendingAges, QueuePending, QueueStats, Resolution,
    ResolveRequest,
};
pub use claim::{ClaimBatch, ClaimRequest, MAX_CLAIM_TRANSACTION_JOBS};
pub use enqueue::EnqueueResult;
pub use errors::convert_sqlx_err;
pub use events_feed::{FeedEvent, FeedPage};
pub use pause::PausePoints;
pub use writeback::{WriteResult, MANUAL_REVIEW_REQUESTED};

/// The schema migrations in `migrations/`, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// How many times a transaction rolled back by a deadlock or lock wait
/// timeout is run again before the conflict is reported.
pub(crate) const CONFLICT_RETRIES: u32 = 3;

/// Connection settings for [`connect`].
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// At most this many connections.
    pub max_connections: u32,
    /// How long a call waits for a free connection before it is reported
    /// as DATABASE_UNAVAILABLE.
    pub acquire_timeout: Duration,
    /// InnoDB lock wait timeout for our sessions, in whole seconds.
    pub lock_wait_timeout_secs: u32,
    /// Isolation level of every session. READ COMMITTED is what the
    /// coordinator runs with; REPEATABLE READ exists to measure why
    /// (`cargo bench --bench claim_throughput`).
    pub isolation: Isolation,
}

/// Transaction isolation level of the pool's sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    ReadCommitted,
    RepeatableRead,
}

impl Isolation {
    fn sql(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            Isolation::RepeatableRead => "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        }
    }
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            max_connections: 32,
            acquire_timeout: Duration::from_secs(5),
            lock_wait_timeout_secs: 10,
            isolation: Isolation::ReadCommitted,
        }
    }
}

/// Opens a pool whose sessions use READ COMMITTED by default (the claim
/// scan with SKIP LOCKED scales far better than under REPEATABLE READ, and
/// every decision is taken on rows read with a locking read anyway). The pool connects
/// lazily, so a coordinator starts even while the database is down.
pub fn connect(url: &str, settings: &PoolSettings) -> Result<MySqlPool, CoordinatorError> {
    let options = MySqlConnectOptions::from_str(url).map_err(|e| {
        CoordinatorError::InvalidArgument(vec![crate::domain::error::FieldViolation::new(
            "database_url",
            e.to_string(),
        )])
    })?;
    let lock_wait = settings.lock_wait_timeout_secs;
    let isolation = settings.isolation.sql();
    Ok(MySqlPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                conn.execute(isolation).await?;
                conn.execute(
                    format!("SET SESSION innodb_lock_wait_timeout = {lock_wait}").as_str(),
                )
                .await?;
                Ok(())
            })
        })
        .connect_lazy_with(options))
}

/// The job store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct JobStore {
    pool: MySqlPool,
    pauses: Option<PausePoints>,
}

impl JobStore {
    /// A store over `pool` (see [`connect`]).
    pub fn new(pool: MySqlPool) -> Self {
        JobStore { pool, pauses: None }
    }

    /// A store that stops at the armed points of `pauses` (tests only).
    pub fn with_pause_points(pool: MySqlPool, pauses: PausePoints) -> Self {
        JobStore {
            pool,
            pauses: Some(pauses),
        }
    }

    /// The underlying pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> Result<(), CoordinatorError> {
        MIGRATOR
            .run(&self.pool)
            .await
            .map_err(|e| CoordinatorError::DatabaseUnavailable(format!("migration failed: {e}")))
    }

    /// True while the database answers a trivial query.
    pub async fn ping(&self) -> bool {
        self.check().await.is_ok()
    }

    /// Like [`ping`](Self::ping), saying why the database does not answer.
    pub async fn check(&self) -> Result<(), String> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn pause(&self, point: &'static str) {
        if let Some(p) = &self.pauses {
            p.pause(point).await;
        }
    }

    async fn begin(&self) -> Result<Transaction<'static, MySql>, CoordinatorError> {
        self.pool.begin().await.map_err(convert_sqlx_err)
    }
}

/// Commits, telling a definite rollback (deadlock, lock wait timeout) from
/// an unknown outcome (DESIGN.md rule 4); see [`errors::convert_commit_err`].
async fn commit(tx: Transaction<'_, MySql>) -> Result<(), CoordinatorError> {
    tx.commit().await.map_err(errors::convert_commit_err)
}

/// Runs `op` again while it reports a transaction conflict (deadlock or
/// lock wait timeout: the server rolled everything back, so running it again
/// cannot apply anything twice).
async fn retry_conflicts<T, F, Fut>(mut op: F) -> Result<T, CoordinatorError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CoordinatorError>>,
{
    let mut tries = 0;
    loop {
        match op().await {
            Err(CoordinatorError::TransactionConflict(why)) if tries < CONFLICT_RETRIES => {
                tries += 1;
                tracing::debug!(tries, why, "transaction conflict, running again");
            }
            other => return other,
        }
    }
}

/// Microseconds in `d`, saturating at `i64::MAX`, for `INTERVAL ? MICROSECOND`.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}
