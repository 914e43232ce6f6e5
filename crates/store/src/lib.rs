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
//! - `durability.rs`: the server's durability settings (docs/design.md rule 9).
//! - `nodes.rs`: Galera sessions, and moving to another node of the
//!   database's list when the current one leaves (`health.rs` decides).
//! - `shards.rs`: several databases, queues placed on them, job ids that
//!   name their database.
//! - `retention.rs`: pruning finished jobs in batches, their key records,
//!   and the answers for pruned jobs and keys (docs/design.md rule 14).
//! - `restore.rs`: the restore fence, run once a database is restored from
//!   a backup (docs/design.md rule 17).
//! - `queries/`: the SQL, one file per statement.

mod admin;
pub mod archive;
mod batch;
mod budget;
mod claim;
mod durability;
mod enqueue;
mod errors;
mod events;
mod events_feed;
mod fairness;
pub mod fleet;
mod health;
mod literal;
mod nodes;
mod observations;
pub mod pacing;
pub mod pause;
mod providers;
pub mod queue_pause;
mod reads;
pub mod restore;
pub mod retention;
pub mod retry;
mod rows;
mod run;
pub mod schema;
pub mod settlement;
pub mod shards;
pub mod trends;
mod tx;
mod waiters;
pub mod workers;
mod writeback;

use jobfence_domain::CoordinatorError;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{Executor, MySql, Transaction};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use claim::handoff::{Handoff, HandoffBatch};
pub use claim::{ClaimBatchOutcome, MAX_CLAIM_TRANSACTION_JOBS};
pub use enqueue::EnqueueResult;
pub use errors::convert_sqlx_err;
pub use health::HealthProbe;
pub use pause::PausePoint;
#[cfg(feature = "testsuite")]
pub use pause::{Armed, PausePoints};
pub use writeback::round::ClaimHalf;
pub use writeback::WriteResult;

/// The schema migrations in `migrations/`, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// Whether this build of the store has pause points (its `testsuite`
/// feature, which only the test kit turns on). A binary built alone
/// (`cargo build --release --bin jobfence`, `cargo install`) has none; a
/// build of the whole workspace unifies the test kit's features into it.
pub const PAUSE_POINTS_COMPILED: bool = cfg!(feature = "testsuite");

/// How many times a transaction rolled back by a deadlock or lock wait
/// timeout is run again before the conflict is reported.
pub(crate) const CONFLICT_RETRIES: u32 = 3;

/// Connection settings for [`connect`] and [`JobStore::open`].
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// At most this many connections.
    pub max_connections: u32,
    /// How long a call waits for a free connection before it is reported
    /// as DATABASE_UNAVAILABLE.
    pub acquire_timeout: Duration,
    /// `wsrep_sync_wait` of every session on a Galera node (`wsrep_on`;
    /// ignored elsewhere): 1 makes each read wait until the node has
    /// applied every transaction the cluster committed before it, so a
    /// decision is never taken on a row another node already changed (see
    /// docs/database.md, "Reads after writes"). 0 turns the wait off.
    pub galera_sync_wait: u8,
    /// The name each session registers under when it connects (table
    /// `coordinator_sessions`, see `fleet.rs`), so newer coordinators tell
    /// this process's sessions from an older coordinator's; None
    /// registers nothing. By default `jobfence pid N`: every process of
    /// this release registers. A session that connects to a database not
    /// migrated that far yet registers nothing (and still connects).
    pub process: Option<String>,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            max_connections: 32,
            acquire_timeout: Duration::from_secs(1),
            galera_sync_wait: 1,
            process: Some(format!("jobfence pid {}", std::process::id())),
        }
    }
}

/// A connection that rested this long or longer is pinged before a call
/// uses it (the pools' idle ones and the batch pool's warm ones, see
/// `tx.rs`): one round trip for a quiet coordinator's call, none under
/// load, and no call fails on a connection the server's `wait_timeout`
/// or a proxy's idle timeout closed while it rested.
pub(crate) const IDLE_CHECK: Duration = Duration::from_secs(1);

/// InnoDB lock wait timeout of every session, in whole seconds: a
/// transaction waits this long for a row lock before it is rolled back
/// (and run again, see [`CONFLICT_RETRIES`]).
const LOCK_WAIT_TIMEOUT_SECS: u32 = 10;

/// What every session of ours runs first (`queries/server/session_setup.sql`:
/// READ COMMITTED, the lock wait timeout, autocommit on or off).
fn session_setup(autocommit: bool) -> String {
    include_str!("queries/server/session_setup.sql")
        .trim_end()
        .replace("{lock_wait_timeout}", &LOCK_WAIT_TIMEOUT_SECS.to_string())
        .replace("{autocommit}", &u8::from(autocommit).to_string())
}

/// A pool of sessions to `node`, connected lazily (see [`PoolSettings`]).
fn lazy_pool(settings: &PoolSettings, autocommit: bool, node: MySqlConnectOptions) -> MySqlPool {
    lazy_pool_with(settings, autocommit, "", node)
}

/// [`lazy_pool`] whose sessions also run `more` (SQL starting with `;`)
/// after their setup.
fn lazy_pool_with(
    settings: &PoolSettings,
    autocommit: bool,
    more: &str,
    node: MySqlConnectOptions,
) -> MySqlPool {
    let setup = format!("{}{more}", session_setup(autocommit));
    let sync_wait = settings.galera_sync_wait;
    let process = settings.process.clone();
    let registrar = node.clone();
    MySqlPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        // No ping before every acquire: that is a round trip per
        // transaction. Only a connection that rested IDLE_CHECK or longer
        // is pinged (and replaced if the server or a proxy closed it
        // meanwhile); one that died within that second fails its first
        // statement, reported DATABASE_UNAVAILABLE (nothing applied) like
        // any lost connection.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for < IDLE_CHECK {
                    return Ok(true);
                }
                // `false`, not the error: the pool then opens another
                // connection without logging a warning for what is routine
                // (the bound on the wait is the acquire timeout's).
                match sqlx::Connection::ping(conn).await {
                    Ok(()) => Ok(true),
                    Err(e) => {
                        tracing::debug!(error = %e, "a pooled connection died while it rested");
                        Ok(false)
                    }
                }
            })
        })
        .after_connect(move |conn, _meta| {
            let setup = setup.clone();
            let process = process.clone();
            let registrar = registrar.clone();
            Box::pin(async move {
                if let Some(name) = process {
                    fleet::sessions::remember(conn, &name, &registrar).await?;
                }
                conn.execute(sqlx::raw_sql(&setup)).await?;
                nodes::galera_session(conn, sync_wait).await?;
                Ok(())
            })
        })
        .connect_lazy_with(node)
}

fn parse_url(url: &str) -> Result<MySqlConnectOptions, CoordinatorError> {
    MySqlConnectOptions::from_str(url).map_err(|e| {
        CoordinatorError::InvalidArgument(vec![jobfence_domain::FieldViolation::new(
            "database_url",
            e.to_string(),
        )])
    })
}

/// Opens a pool of READ COMMITTED sessions (see [`PoolSettings`]). The
/// pool connects lazily, so a coordinator starts even while the database
/// is down.
pub fn connect(url: &str, settings: &PoolSettings) -> Result<MySqlPool, CoordinatorError> {
    Ok(lazy_pool(settings, true, parse_url(url)?))
}

/// The pools of the node a store talks to: READ COMMITTED sessions, and a
/// second pool for the batched transactions whose sessions run with
/// autocommit off, so a transaction starts with its first statement,
/// saving the `BEGIN` round trip of every claim and group commit (see
/// [`tx::Tx`]). Nothing else uses the second pool's sessions.
#[derive(Debug, Clone)]
struct Pools {
    pool: MySqlPool,
    batch: MySqlPool,
    /// The batch pool's connections between transactions (see `tx.rs`).
    warm: Arc<tx::Warm>,
    /// Index into the store's node list.
    node: usize,
}

/// The job store of one database: a single server, a load-balanced
/// address, or the nodes of a Galera cluster, of which it talks to one at
/// a time (see `nodes.rs`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct JobStore {
    /// The current node's pools; replaced whole when the store moves to
    /// another node, or when the database comes back from an outage.
    pools: Arc<RwLock<Pools>>,
    /// Every node this database can be reached through, in order of
    /// preference.
    nodes: Arc<Vec<MySqlConnectOptions>>,
    settings: PoolSettings,
    /// Where tests stop this store's calls (`testsuite` only).
    #[cfg(feature = "testsuite")]
    pauses: Option<PausePoints>,
    conflicts: Arc<ConflictCounts>,
    /// Whether the database is a Galera cluster (its `wsrep_on`), once a
    /// conflict has made the store ask (see
    /// [`JobStore::outage_or_conflict`]).
    galera: Arc<std::sync::OnceLock<bool>>,
    /// The queues whose last claim on this store found a provider (their
    /// claims read the full rules at once; see `claim.rs`).
    provider_queues: Arc<budget::ProviderQueues>,
}

/// A pool's connections, counted now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Connections open.
    pub connections: u64,
    /// Of them, idle.
    pub idle: u64,
    /// Most connections the pool may open.
    pub max_connections: u64,
}

/// Transactions rolled back by the server (deadlock 1213, lock wait timeout
/// 1205; on Galera also a certification failure at COMMIT, reported as
/// 1213), counted by what became of them.
#[derive(Debug, Default)]
struct ConflictCounts {
    retried: AtomicU64,
    reported: AtomicU64,
}

impl JobStore {
    /// A store over `pool` (see [`connect`]): one node.
    pub fn new(pool: MySqlPool) -> Self {
        let options = pool.options();
        let settings = PoolSettings {
            max_connections: options.get_max_connections(),
            acquire_timeout: options.get_acquire_timeout(),
            ..PoolSettings::default()
        };
        let node = (*pool.connect_options()).clone();
        let batch = lazy_pool(&settings, false, node.clone());
        JobStore {
            pools: Arc::new(RwLock::new(Pools {
                pool,
                batch,
                warm: Arc::default(),
                node: 0,
            })),
            nodes: Arc::new(vec![node]),
            settings,
            #[cfg(feature = "testsuite")]
            pauses: None,
            conflicts: Arc::default(),
            galera: Arc::default(),
            provider_queues: Arc::default(),
        }
    }

    /// A store that stops at the armed points of `pauses` (tests only).
    #[cfg(feature = "testsuite")]
    pub fn with_pause_points(pool: MySqlPool, pauses: PausePoints) -> Self {
        Self::new(pool).pausing_at(pauses)
    }

    /// A store over the nodes `urls` (at least one), in order of
    /// preference: it talks to the first one, and its health probe moves it
    /// to another when that one stops answering or leaves the cluster's
    /// primary component (see [`HealthProbe`]). Connects lazily.
    ///
    /// Errors: `InvalidArgument` for a URL that does not parse, or none.
    pub fn open(urls: &[String], settings: &PoolSettings) -> Result<JobStore, CoordinatorError> {
        let nodes = urls
            .iter()
            .map(|u| parse_url(u))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(first) = nodes.first().cloned() else {
            return Err(CoordinatorError::InvalidArgument(vec![
                jobfence_domain::FieldViolation::new("database_url", "names no database"),
            ]));
        };
        let pools = Pools {
            pool: lazy_pool(settings, true, first.clone()),
            batch: lazy_pool(settings, false, first),
            warm: Arc::default(),
            node: 0,
        };
        Ok(JobStore {
            pools: Arc::new(RwLock::new(pools)),
            nodes: Arc::new(nodes),
            settings: settings.clone(),
            #[cfg(feature = "testsuite")]
            pauses: None,
            conflicts: Arc::default(),
            galera: Arc::default(),
            provider_queues: Arc::default(),
        })
    }

    /// This store, stopping at the armed points of `pauses` (tests only).
    #[cfg(feature = "testsuite")]
    pub fn pausing_at(mut self, pauses: PausePoints) -> Self {
        self.pauses = Some(pauses);
        self
    }

    /// This store with the database clock of each of its sessions stopped
    /// at `unix_micros` (microseconds since the Unix epoch, UTC): every
    /// `UTC_TIMESTAMP(6)` it runs returns exactly that instant (`SET
    /// SESSION timestamp`), so a test can put a lease's end on the very
    /// microsecond a claim compares it with (tests only; one node; the
    /// pools are replaced, so call it before the store is used).
    #[cfg(feature = "testsuite")]
    pub fn frozen_clock_at(self, unix_micros: i64) -> Self {
        self.with_session_sql(&format!(
            "; SET SESSION timestamp = {}.{:06}",
            unix_micros.div_euclid(1_000_000),
            unix_micros.rem_euclid(1_000_000)
        ))
    }

    /// This store with `more` (SQL starting with `;`) run by each of its
    /// sessions after their setup, e.g. a shorter
    /// `innodb_lock_wait_timeout` so that a test's lock wait becomes a
    /// conflict within a second (tests only; one node; the pools are
    /// replaced, so call it before the store is used).
    #[cfg(feature = "testsuite")]
    pub fn with_session_sql(self, more: &str) -> Self {
        let node = self.nodes[0].clone();
        let fresh = Pools {
            pool: lazy_pool_with(&self.settings, true, more, node.clone()),
            batch: lazy_pool_with(&self.settings, false, more, node),
            warm: Arc::default(),
            node: 0,
        };
        *self.pools.write().expect("pools lock") = fresh;
        self
    }

    /// The current node's pool (of autocommit sessions).
    pub fn pool(&self) -> MySqlPool {
        self.pools.read().expect("pools lock").pool.clone()
    }

    /// The current node's pool (of autocommit sessions), as counts.
    pub fn pool_stats(&self) -> PoolStats {
        let pool = self.pool();
        PoolStats {
            connections: u64::from(pool.size()),
            idle: pool.num_idle() as u64,
            max_connections: u64::from(pool.options().get_max_connections()),
        }
    }

    /// Which node of the list the store talks to now (0 = the first).
    pub fn current_node(&self) -> usize {
        self.pools.read().expect("pools lock").node
    }

    /// `host:port` of each node, in order.
    pub fn node_addresses(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|o| format!("{}:{}", o.get_host(), o.get_port()))
            .collect()
    }

    /// Transactions the server rolled back as conflicts (deadlock, lock
    /// wait timeout, Galera certification failure) since the store was
    /// made: `(retried, reported)`, where `reported` ones reached the
    /// caller as TRANSACTION_CONFLICT after every retry.
    pub fn conflicts(&self) -> (u64, u64) {
        (
            self.conflicts.retried.load(Ordering::Relaxed),
            self.conflicts.reported.load(Ordering::Relaxed),
        )
    }

    fn count_conflict(&self, retried: bool) {
        let c = if retried {
            &self.conflicts.retried
        } else {
            &self.conflicts.reported
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// True while the database answers a trivial query.
    pub async fn ping(&self) -> bool {
        self.check().await.is_ok()
    }

    /// Like [`ping`](Self::ping), saying why the database does not answer.
    pub async fn check(&self) -> Result<(), String> {
        sqlx::query(include_str!("queries/server/ping.sql"))
            .execute(&self.pool())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// A pause point (see [`PausePoint`]); nothing without `testsuite`.
    async fn pause(&self, point: PausePoint) {
        #[cfg(feature = "testsuite")]
        if let Some(p) = &self.pauses {
            p.pause(point).await;
        }
        #[cfg(not(feature = "testsuite"))]
        let _ = point;
    }

    /// A pause point inside the transaction running on `conn`.
    async fn pause_in(&self, point: PausePoint, conn: &mut sqlx::MySqlConnection) {
        #[cfg(feature = "testsuite")]
        if let Some(p) = &self.pauses {
            p.pause_in(point, conn).await;
        }
        #[cfg(not(feature = "testsuite"))]
        let _ = (point, conn);
    }

    async fn begin(&self) -> Result<Transaction<'static, MySql>, CoordinatorError> {
        self.pool().begin().await.map_err(convert_sqlx_err)
    }

    /// A transaction of the batch pool, begun by its first statement.
    async fn begin_batch(&self) -> Result<tx::Tx, CoordinatorError> {
        let (pool, warm) = {
            let pools = self.pools.read().expect("pools lock");
            (pools.batch.clone(), pools.warm.clone())
        };
        tx::Tx::start(&pool, &warm).await
    }

    /// Replaces the batch pool's connections with new ones: after the
    /// database came back from an outage, the old ones are dead (their
    /// first statement would fail). Transactions running on old
    /// connections finish; the old pool closes once they are returned.
    pub fn renew_batch_connections(&self) {
        let node = self.current_node();
        let fresh = lazy_pool(&self.settings, false, self.nodes[node].clone());
        let (old, old_warm) = {
            let mut pools = self.pools.write().expect("pools lock");
            (
                std::mem::replace(&mut pools.batch, fresh),
                std::mem::take(&mut pools.warm),
            )
        };
        // The warm connections go back to the old pool, which closes them.
        drop(old_warm);
        tokio::spawn(async move { old.close().await });
    }

    /// Moves both pools to node `node`: calls from now on go there; calls
    /// running on the old node's connections finish (or fail) there, and
    /// the old pools close once their connections are returned.
    fn switch_to(&self, node: usize) {
        let options = self.nodes[node].clone();
        let fresh = Pools {
            pool: lazy_pool(&self.settings, true, options.clone()),
            batch: lazy_pool(&self.settings, false, options),
            warm: Arc::default(),
            node,
        };
        let old = std::mem::replace(&mut *self.pools.write().expect("pools lock"), fresh);
        // The warm connections go back to the old batch pool first: it
        // closes once every connection it lent is back.
        drop(old.warm);
        tokio::spawn(async move {
            old.pool.close().await;
            old.batch.close().await;
        });
    }
}

/// Commits, telling a definite rollback (deadlock, lock wait timeout) from
/// an unknown outcome (docs/design.md rule 4); see [`errors::convert_commit_err`].
async fn commit(tx: Transaction<'_, MySql>) -> Result<(), CoordinatorError> {
    tx.commit().await.map_err(errors::convert_commit_err)
}

/// Microseconds in `d`, saturating at `i64::MAX`, for `INTERVAL ? MICROSECOND`.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Column `i` as text, whatever character set the server gives it (SHOW
/// statements answer in the connection's character set or in binary).
fn rows_text(row: &sqlx::mysql::MySqlRow, i: usize) -> Result<String, sqlx::Error> {
    use sqlx::Row;
    let bytes: Option<Vec<u8>> = row.try_get(i)?;
    Ok(String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned())
}
