//! Queues spread over several databases (sharding by queue), each database
//! a single server or a Galera cluster ([`JobStore`]).
//!
//! - **Placement**: a queue lives on exactly one database, chosen by the
//!   shards file (`--shards`): an exact queue name, else the longest
//!   matching prefix, else the default. Enqueue and Claim go to the
//!   queue's database; nothing about a job ever spans two databases, so
//!   every rule of docs/design.md holds per database unchanged.
//! - **Job ids name their database**: database `k` hands out job ids and
//!   event ids in `[k·2^48 + 1, (k+1)·2^48)` (its tables' AUTO_INCREMENT
//!   starts there, set once by [`JobStore::ensure_shard`]), so a write, a
//!   GetJob or an operator call is routed by `id >> 48` without a lookup
//!   table and without asking every database. At most [`MAX_SHARDS`]
//!   databases keep every id below 2^53, exact in a JavaScript number.
//!   A database used alone is database 0: its ids are the ones it always
//!   had.
//! - **Reads across databases** (ListJobs, QueueStats, pending ages) ask
//!   each database and merge; the events feed keeps one cursor per
//!   database (an event id names its database too).
//! - Moving a queue to another database is not supported: its jobs would
//!   stay where they are, reachable by id, while new ones go elsewhere.

use super::JobStore;
use jobfence_domain::admin::{ListJobsFilter, PendingAges, QueueStats};
use jobfence_domain::FieldViolation;
use jobfence_domain::{CoordinatorError, Job};
use std::collections::BTreeMap;

/// Bits of an id below its database number.
pub const SHARD_SHIFT: u32 = 48;

/// Most databases: ids stay below 2^53 (JavaScript's exact integers).
pub const MAX_SHARDS: u32 = 32;

/// The database an id (job or event) was handed out by.
pub fn shard_of(id: u64) -> u32 {
    (id >> SHARD_SHIFT) as u32
}

/// The first id of database `shard`'s range, minus one: where its
/// AUTO_INCREMENT starts from, and the events feed cursor that reads the
/// database from its beginning.
pub fn range_start(shard: u32) -> u64 {
    u64::from(shard) << SHARD_SHIFT
}

/// Where each queue lives: an exact name first, then the longest matching
/// prefix, then the default (if any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    exact: BTreeMap<String, u32>,
    prefixes: Vec<(String, u32)>,
    default: Option<u32>,
}

impl Placement {
    /// Every queue on database `shard`.
    pub fn everything_on(shard: u32) -> Placement {
        Placement {
            default: Some(shard),
            ..Placement::default()
        }
    }

    /// The database of `queue`, if the placement names one.
    pub fn shard_for(&self, queue: &str) -> Option<u32> {
        if let Some(&s) = self.exact.get(queue) {
            return Some(s);
        }
        self.prefixes
            .iter()
            .filter(|(p, _)| queue.starts_with(p.as_str()))
            .max_by_key(|(p, _)| p.len())
            .map(|&(_, s)| s)
            .or(self.default)
    }

    fn shards_named(&self) -> impl Iterator<Item = u32> + '_ {
        self.exact
            .values()
            .copied()
            .chain(self.prefixes.iter().map(|(_, s)| *s))
            .chain(self.default)
    }
}

/// The shards file: the databases by number, each a list of node URLs
/// (one for a single server), and the placement of queues.
///
/// ```text
/// # comments and blank lines are ignored
/// database 0 mysql://u:p@10.0.0.1:3306/jobfence,mysql://u:p@10.0.0.2:3306/jobfence
/// database 1 mysql://u:p@10.0.1.1:3306/jobfence
/// queue refunds 0           # this queue exactly
/// prefix payouts- 1         # every queue whose name starts with payouts-
/// default 0                 # every other queue (optional)
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardsConfig {
    /// Node URLs of each database, in order of preference.
    pub databases: BTreeMap<u32, Vec<String>>,
    /// Where queues live.
    pub placement: Placement,
}

impl ShardsConfig {
    /// Parses the shards file (see the type's docs).
    ///
    /// Errors: a line that does not parse (with its number), a database
    /// number of [`MAX_SHARDS`] or more, a database, a queue, a prefix or
    /// the default given twice (with both lines: the last one would
    /// silently win), a placement naming a database the file does not
    /// list, or no database at all.
    pub fn parse(text: &str) -> Result<ShardsConfig, String> {
        let mut databases = BTreeMap::new();
        let mut placement = Placement::default();
        // The line that gave each thing, to name it when it is given again.
        let mut given: BTreeMap<String, usize> = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let at = |what: &str| format!("line {}: {what}: {line}", n + 1);
            let words: Vec<&str> = line.split_whitespace().collect();
            let shard = |w: &str| -> Result<u32, String> {
                let s: u32 = w.parse().map_err(|_| at("not a database number"))?;
                if s >= MAX_SHARDS {
                    return Err(at(&format!(
                        "database numbers go from 0 to {}",
                        MAX_SHARDS - 1
                    )));
                }
                Ok(s)
            };
            let mut once = |what: String| match given.get(&what) {
                Some(first) => Err(at(&format!("{what} is given on line {first} already"))),
                None => {
                    given.insert(what, n + 1);
                    Ok(())
                }
            };
            match words.as_slice() {
                ["database", s, urls] => {
                    let s = shard(s)?;
                    once(format!("database {s}"))?;
                    let urls: Vec<String> = urls
                        .split(',')
                        .filter(|u| !u.is_empty())
                        .map(str::to_owned)
                        .collect();
                    databases.insert(s, urls);
                }
                ["queue", q, s] => {
                    let s = shard(s)?;
                    once(format!("queue {q}"))?;
                    placement.exact.insert((*q).to_owned(), s);
                }
                ["prefix", p, s] => {
                    let s = shard(s)?;
                    once(format!("prefix {p}"))?;
                    placement.prefixes.push(((*p).to_owned(), s));
                }
                ["default", s] => {
                    let s = shard(s)?;
                    once("default".to_owned())?;
                    placement.default = Some(s);
                }
                _ => {
                    return Err(at(
                        "expected `database N URL[,URL…]`, `queue NAME N`, `prefix TEXT N` or `default N`",
                    ))
                }
            }
        }
        if databases.is_empty() {
            return Err("no database given (`database N URL[,URL…]`)".to_owned());
        }
        if let Some(s) = placement
            .shards_named()
            .find(|s| !databases.contains_key(s))
        {
            return Err(format!(
                "queues are placed on database {s}, which is not listed"
            ));
        }
        Ok(ShardsConfig {
            databases,
            placement,
        })
    }
}

/// The databases of a coordinator and where its queues live. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct Shards {
    /// By ascending database number.
    stores: Vec<(u32, JobStore)>,
    placement: Placement,
    /// False for one database used alone: every id is its own.
    sharded: bool,
}

impl Shards {
    /// One database used alone (database 0): every queue and every id is
    /// its own ([`prepare`](Self::prepare) checks that it is not another
    /// shard).
    pub fn single(store: JobStore) -> Shards {
        Shards {
            stores: vec![(0, store)],
            placement: Placement::everything_on(0),
            sharded: false,
        }
    }

    /// Several databases, by number, and the placement of queues (which
    /// must name only these numbers).
    pub fn new(stores: BTreeMap<u32, JobStore>, placement: Placement) -> Shards {
        Shards {
            stores: stores.into_iter().collect(),
            placement,
            sharded: true,
        }
    }

    /// Every database: `(number, store)`, by ascending number.
    pub fn all(&self) -> &[(u32, JobStore)] {
        &self.stores
    }

    /// The store at `index` of [`all`](Self::all).
    pub fn at(&self, index: usize) -> &JobStore {
        &self.stores[index].1
    }

    /// True when ids carry their database number (a shards file).
    pub fn is_sharded(&self) -> bool {
        self.sharded
    }

    /// The index (into [`all`](Self::all)) of the database of `queue`.
    ///
    /// Errors: `InvalidArgument` on `queue` when the placement puts it
    /// nowhere (a shards file without `default`).
    pub fn index_for_queue(&self, queue: &str) -> Result<usize, CoordinatorError> {
        self.placement
            .shard_for(queue)
            .and_then(|s| self.stores.iter().position(|(n, _)| *n == s))
            .ok_or_else(|| {
                CoordinatorError::InvalidArgument(vec![FieldViolation::new(
                    "queue",
                    format!("queue {queue:?} is placed on no database (see the shards file)"),
                )])
            })
    }

    /// The index of the database that handed out `id` (a job or event id).
    ///
    /// Errors: `JobNotFound` when no database of this coordinator has that
    /// number.
    pub fn index_for_id(&self, id: u64) -> Result<usize, CoordinatorError> {
        if !self.sharded {
            return Ok(0);
        }
        let shard = shard_of(id);
        self.stores
            .iter()
            .position(|(n, _)| *n == shard)
            .ok_or(CoordinatorError::JobNotFound { job_id: id })
    }

    /// The store of the database that handed out job `job_id`.
    pub fn for_job(&self, job_id: u64) -> Result<&JobStore, CoordinatorError> {
        Ok(self.at(self.index_for_id(job_id)?))
    }

    /// Holds each database's applied migrations against this binary's
    /// (see `schema.rs`): a coordinator never serves a schema it does not
    /// know. Logs a migration `jobfence migrate` would repair.
    ///
    /// Errors: `InvalidArgument` (field `schema`) naming the database and
    /// what to run; `DatabaseUnavailable` when one cannot be reached.
    pub async fn check_schemas(&self) -> Result<(), CoordinatorError> {
        for (n, store) in &self.stores {
            let check = store.check_schema().await?;
            if let Some(why) = check.refusal(&format!("database {n}")) {
                return Err(crate::schema::schema_refused(why));
            }
            for m in &check.repairable {
                tracing::warn!(database = n, migration = %m, "a migration was applied from a file edited after its release (comments only): `jobfence migrate` records the restored file's checksum");
            }
        }
        Ok(())
    }

    /// Checks (and on first use, records) each database's number; see
    /// [`JobStore::ensure_shard`]. When one database is refused, none is
    /// given a number. One database used alone must be database 0: it is
    /// recorded as 0 the first time, so a shards file cannot later list it
    /// under another number.
    ///
    /// Errors: `InvalidArgument` for a database that cannot have its
    /// number (alone: one recorded as another shard, which belongs in the
    /// shards file that lists it); `DatabaseUnavailable` when one cannot be
    /// reached.
    pub async fn prepare(&self) -> Result<(), CoordinatorError> {
        self.check_schemas().await?;
        if !self.sharded {
            let store = &self.stores[0].1;
            return store.number(0, true).await?.map_err(refuse_alone);
        }
        // Every database is checked before any is given its number, so a
        // refused start records nothing anywhere. `ensure_shard` checks
        // again, under the lock.
        for (n, store) in &self.stores {
            store.check_shard(*n).await?;
        }
        for (n, store) in &self.stores {
            store.ensure_shard(*n).await?;
        }
        Ok(())
    }

    /// ListJobs across the databases: by ascending id (each database's
    /// jobs oldest first, the databases one after the other), so the page
    /// token (the last id) continues in the right database.
    pub async fn list_jobs(&self, filter: &ListJobsFilter) -> Result<Vec<Job>, CoordinatorError> {
        let mut jobs = Vec::new();
        for (n, store) in &self.stores {
            let room = filter.limit as usize - jobs.len();
            if room == 0 {
                break;
            }
            if self.sharded && range_start(n + 1) <= filter.after_id {
                continue;
            }
            let mut f = filter.clone();
            f.limit = room as u32;
            jobs.extend(store.list_jobs(&f).await?);
        }
        Ok(jobs)
    }

    /// QueueStats of every database, merged by queue.
    pub async fn queue_stats(
        &self,
        queue: Option<&str>,
        window: std::time::Duration,
    ) -> Result<Vec<QueueStats>, CoordinatorError> {
        let mut merged: BTreeMap<String, QueueStats> = BTreeMap::new();
        for (_, store) in &self.stores {
            for s in store.queue_stats(queue, window).await? {
                match merged.get_mut(&s.queue) {
                    None => {
                        merged.insert(s.queue.clone(), s);
                    }
                    // A queue found on two databases (its placement was
                    // changed): add them up.
                    Some(m) => {
                        for (state, n) in s.counts {
                            match m.counts.iter_mut().find(|(st, _)| *st == state) {
                                Some((_, total)) => *total += n,
                                None => m.counts.push((state, n)),
                            }
                        }
                        merge_pending(&mut m.pending, s.pending);
                        m.takeovers += s.takeovers;
                        m.stale_write_rejections += s.stale_write_rejections;
                    }
                }
            }
        }
        Ok(merged.into_values().collect())
    }

    /// The pending ages of every database, merged by queue (the oldest
    /// wins).
    pub async fn pending_ages(&self) -> Result<PendingAges, CoordinatorError> {
        let mut all = PendingAges::default();
        for (_, store) in &self.stores {
            for (q, p) in store.pending_ages().await?.queues {
                merge_pending(all.queues.entry(q).or_default(), p);
            }
        }
        Ok(all)
    }
}

fn merge_pending(
    into: &mut jobfence_domain::admin::QueuePending,
    other: jobfence_domain::admin::QueuePending,
) {
    for (mine, theirs) in into.oldest.iter_mut().zip(other.oldest) {
        if let Some(t) = theirs {
            if mine.is_none_or(|m| t.age > m.age) {
                *mine = Some(t);
            }
        }
    }
    into.unfinished = into.unfinished.max(other.unfinished);
}

/// Why a database cannot be given a number.
enum Refusal {
    /// Its `jobfence_shard` table records another number.
    RecordedAs(u32),
    /// `table` holds an id outside the number's range.
    OutOfRange { table: &'static str, id: u64 },
}

impl JobStore {
    /// Makes this database shard `shard`: records the number the first
    /// time (table `jobfence_shard`) and starts the AUTO_INCREMENT of
    /// `jobs` and `job_events` at [`range_start`]`(shard) + 1`, so every id
    /// it hands out names it. Run at start, before any call is served.
    ///
    /// The checks and the recording are one transaction (the row locked):
    /// a refused database is left as it was.
    ///
    /// Errors: `InvalidArgument` when the database was recorded as another
    /// shard, or holds ids outside this shard's range (it was used alone,
    /// or as another shard): routing by id would send calls elsewhere.
    /// `DatabaseUnavailable` when it cannot be reached.
    pub async fn ensure_shard(&self, shard: u32) -> Result<(), CoordinatorError> {
        self.number(shard, true)
            .await?
            .map_err(|r| refuse_shard(shard, r))
    }

    /// The checks of [`ensure_shard`](Self::ensure_shard), writing nothing.
    async fn check_shard(&self, shard: u32) -> Result<(), CoordinatorError> {
        self.number(shard, false)
            .await?
            .map_err(|r| refuse_shard(shard, r))
    }

    /// Checks that this database can be shard `shard` (its recorded number,
    /// the largest id of each table) and, with `record`, records the number
    /// in the same transaction, the row locked, and moves the
    /// AUTO_INCREMENT of its empty tables into the range. Nothing is
    /// written when a check fails.
    async fn number(
        &self,
        shard: u32,
        record: bool,
    ) -> Result<Result<(), Refusal>, CoordinatorError> {
        use super::convert_sqlx_err;
        let (low, high) = (range_start(shard), range_start(shard + 1));
        loop {
            let mut tx = self.begin().await?;
            let recorded: Option<u32> =
                sqlx::query_scalar(include_str!("queries/shards/lock_number.sql"))
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(convert_sqlx_err)?;
            if let Some(r) = recorded.filter(|r| *r != shard) {
                return Ok(Err(Refusal::RecordedAs(r)));
            }
            let mut empty = Vec::new();
            for table in ["jobs", "job_events", "policy_changes"] {
                let sql = include_str!("queries/shards/max_id.sql").replace("{table}", table);
                let max: Option<u64> = sqlx::query_scalar(&sql)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(convert_sqlx_err)?;
                match max {
                    Some(id) if id >= high || (id < low && shard > 0) => {
                        return Ok(Err(Refusal::OutOfRange { table, id }));
                    }
                    Some(_) => {}
                    None => empty.push(table),
                }
            }
            if !record {
                return Ok(Ok(()));
            }
            if recorded.is_none() {
                let inserted = sqlx::query(include_str!("queries/shards/record_number.sql"))
                    .bind(shard)
                    .execute(&mut *tx)
                    .await
                    .map_err(convert_sqlx_err)?
                    .rows_affected();
                if inserted == 0 {
                    // Another coordinator recorded a number since the
                    // SELECT (no row to lock then): look again.
                    continue;
                }
            }
            super::commit(tx).await?;
            // Empty: start its ids in this shard's range. AUTO_INCREMENT
            // never goes below the largest id, and InnoDB keeps the counter
            // across restarts (MariaDB 10.2+, MySQL 8.0+). DDL commits by
            // itself, hence after the transaction; a start that stops
            // between the two sets it the next time (the table is still
            // empty).
            if shard > 0 {
                for table in empty {
                    let sql = include_str!("queries/shards/start_ids.sql")
                        .replace("{table}", table)
                        .replace("{start}", &(low + 1).to_string());
                    sqlx::raw_sql(&sql)
                        .execute(&self.pool())
                        .await
                        .map_err(convert_sqlx_err)?;
                }
            }
            return Ok(Ok(()));
        }
    }
}

/// The refusal of a database used alone (database 0).
fn refuse_alone(why: Refusal) -> CoordinatorError {
    let why = match why {
        Refusal::RecordedAs(r) => format!(
            "the database is shard {r} of a shards file (recorded in its jobfence_shard \
             table), and a database used alone is shard 0: its new jobs would get shard {r}'s \
             ids on queues the shards file may place on another database. Start this \
             coordinator with the shards file that lists it (--shards FILE) instead of \
             --database-url"
        ),
        Refusal::OutOfRange { table, id } => format!(
            "the database holds {table} id {id}, outside the range of a database used alone \
             (shard 0: ids below {}): it was used as shard {} of a shards file. Start this \
             coordinator with that file (--shards FILE) instead of --database-url",
            range_start(1),
            shard_of(id)
        ),
    };
    CoordinatorError::InvalidArgument(vec![FieldViolation::new("database_url", why)])
}

/// The refusal of a database given as shard `shard` of a shards file.
fn refuse_shard(shard: u32, why: Refusal) -> CoordinatorError {
    let why = match why {
        Refusal::RecordedAs(r) => {
            format!("the database given as shard {shard} is shard {r}")
        }
        Refusal::OutOfRange { table, id } => format!(
            "the database given as shard {shard} holds {table} id {id}, outside its range {}..{}",
            range_start(shard),
            range_start(shard + 1)
        ),
    };
    CoordinatorError::InvalidArgument(vec![FieldViolation::new("shards", why)])
}

#[cfg(test)]
mod tests;
