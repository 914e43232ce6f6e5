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
mod health;
mod literal;
mod observations;
pub mod pause;
mod reads;
mod rows;
mod tx;
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
pub use health::HealthProbe;
pub use pause::{Armed, PausePoints};
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
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            max_connections: 32,
            acquire_timeout: Duration::from_secs(1),
        }
    }
}

/// InnoDB lock wait timeout of every session, in whole seconds: a
/// transaction waits this long for a row lock before it is rolled back
/// (and run again, see [`CONFLICT_RETRIES`]).
const LOCK_WAIT_TIMEOUT_SECS: u32 = 10;

/// What every session of ours runs first. READ COMMITTED: the claim scan
/// with SKIP LOCKED scales far better than under REPEATABLE READ (whose
/// next-key locks make concurrent claims and completes wait on each other),
/// and every decision is taken on rows read with a locking read anyway.
fn session_setup(autocommit: bool) -> String {
    format!(
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
         SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_TIMEOUT_SECS}; \
         SET SESSION autocommit = {}",
        u8::from(autocommit)
    )
}

fn pool_options(
    max_connections: u32,
    acquire_timeout: Duration,
    autocommit: bool,
) -> MySqlPoolOptions {
    let setup = session_setup(autocommit);
    MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        // No ping before every acquire: that is a round trip per
        // transaction. A connection that died while idle fails its first
        // statement instead, which is reported DATABASE_UNAVAILABLE (nothing
        // applied) like any lost connection.
        .test_before_acquire(false)
        .after_connect(move |conn, _meta| {
            let setup = setup.clone();
            Box::pin(async move {
                conn.execute(sqlx::raw_sql(&setup)).await?;
                Ok(())
            })
        })
}

/// Opens a pool of READ COMMITTED sessions (see [`PoolSettings`]). The
/// pool connects lazily, so a coordinator starts even while the database
/// is down.
pub fn connect(url: &str, settings: &PoolSettings) -> Result<MySqlPool, CoordinatorError> {
    let options = MySqlConnectOptions::from_str(url).map_err(|e| {
        CoordinatorError::InvalidArgument(vec![crate::domain::error::FieldViolation::new(
            "database_url",
            e.to_string(),
        )])
    })?;
    Ok(
        pool_options(settings.max_connections, settings.acquire_timeout, true)
            .connect_lazy_with(options),
    )
}

/// A second pool to the same database for the batched transactions, whose
/// sessions run with autocommit off: a transaction starts with its first
/// statement, saving the `BEGIN` round trip of every claim and group commit
/// (see [`tx::Tx`]). Nothing else uses these sessions.
fn batch_pool_for(pool: &MySqlPool) -> MySqlPool {
    let options = pool.options();
    pool_options(
        options.get_max_connections(),
        options.get_acquire_timeout(),
        false,
    )
    .connect_lazy_with((*pool.connect_options()).clone())
}

/// The job store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct JobStore {
    pool: MySqlPool,
    /// Autocommit-off sessions for the batched transactions; replaced
    /// whole when the database comes back from an outage.
    batch_pool: std::sync::Arc<std::sync::RwLock<MySqlPool>>,
    pauses: Option<PausePoints>,
}

impl JobStore {
    /// A store over `pool` (see [`connect`]).
    pub fn new(pool: MySqlPool) -> Self {
        JobStore {
            batch_pool: std::sync::Arc::new(std::sync::RwLock::new(batch_pool_for(&pool))),
            pool,
            pauses: None,
        }
    }

    /// A store that stops at the armed points of `pauses` (tests only).
    pub fn with_pause_points(pool: MySqlPool, pauses: PausePoints) -> Self {
        JobStore {
            batch_pool: std::sync::Arc::new(std::sync::RwLock::new(batch_pool_for(&pool))),
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

    /// A pause point inside the transaction running on `conn`.
    async fn pause_in(&self, point: &'static str, conn: &mut sqlx::MySqlConnection) {
        if let Some(p) = &self.pauses {
            p.pause_in(point, conn).await;
        }
    }

    async fn begin(&self) -> Result<Transaction<'static, MySql>, CoordinatorError> {
        self.pool.begin().await.map_err(convert_sqlx_err)
    }

    /// A transaction of the batch pool, begun by its first statement.
    async fn begin_batch(&self) -> Result<tx::Tx, CoordinatorError> {
        let pool = self.batch_pool.read().expect("batch pool lock").clone();
        tx::Tx::start(&pool).await
    }

    /// Replaces the batch pool's connections with new ones: after the
    /// database came back from an outage, the old ones are dead (their
    /// first statement would fail). Transactions running on old
    /// connections finish; the old pool closes once they are returned.
    pub fn renew_batch_connections(&self) {
        let fresh = batch_pool_for(&self.pool);
        let old = std::mem::replace(
            &mut *self.batch_pool.write().expect("batch pool lock"),
            fresh,
        );
        tokio::spawn(async move { old.close().await });
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
