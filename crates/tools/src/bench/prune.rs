//! The pruning phase of `jobfence bench` (issue 19): `--prune-rows`
//! finished jobs past their retention (each with a completion event) are
//! pruned by `JobStore::prune` in batches while N gRPC workers run the
//! lifecycle, against the same lifecycle with those rows held and nobody
//! pruning. Reported: claim throughput and claim p50/p99 of both, how long
//! pruning took, and the tables' data and index sizes before and after
//! (information_schema, after ANALYZE TABLE).

use super::db::{fill, load_finished, settle, verify};
use super::{grpc, Latencies, QUEUE};
use anyhow::{ensure, Result};
use jobfence_domain::{PruneCounts, Retention};
use jobfence_store::retention::{PruneRun, DEFAULT_PRUNE_BATCH};
use jobfence_store::JobStore;
use sqlx::mysql::MySqlPool;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// The tables whose sizes are reported.
const TABLES: [&str; 4] = ["jobs", "job_events", "job_observations", "operation_keys"];

/// One table's size (bytes, InnoDB's estimate after ANALYZE TABLE).
#[derive(Debug, Clone)]
pub struct TableSize {
    pub table: String,
    pub rows: u64,
    pub data: u64,
    pub index: u64,
    pub free: u64,
}

/// Lifecycle rounds of one side of the comparison.
#[derive(Debug, Default)]
pub struct Side {
    pub jobs: u64,
    pub elapsed: Duration,
    pub rounds: usize,
    pub latencies: Latencies,
}

impl Side {
    pub(super) fn add(&mut self, run: super::PhaseRun) {
        self.jobs += run.jobs;
        self.elapsed += run.elapsed;
        self.rounds += 1;
        self.latencies.claim.extend(run.latencies.claim);
        self.latencies.complete.extend(run.latencies.complete);
    }

    /// Adds the rounds of `other`.
    pub(super) fn merge(&mut self, other: Side) {
        self.jobs += other.jobs;
        self.elapsed += other.elapsed;
        self.rounds += other.rounds;
        self.latencies.claim.extend(other.latencies.claim);
        self.latencies.complete.extend(other.latencies.complete);
    }

    /// Jobs claimed and completed per second.
    pub fn rate(&self) -> f64 {
        self.jobs as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub(super) fn claim(&self, p: f64) -> String {
        super::report::ms(super::report::percentile(&self.latencies.claim, p))
    }

    /// The Markdown table of two sides compared (rounds, jobs, jobs/s,
    /// claim p50/p99), each row named.
    pub(super) fn table(out: &mut String, rows: [(&str, &Side); 2]) {
        use std::fmt::Write as _;
        let _ = writeln!(
            out,
            "| lifecycle | rounds | jobs | jobs/s | claim p50/p99 ms |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|");
        for (name, s) in rows {
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {:.0} | {}/{} |",
                s.rounds,
                s.jobs,
                s.rate(),
                s.claim(0.5),
                s.claim(0.99)
            );
        }
    }
}

/// What the pruning phase measured.
#[derive(Debug)]
pub struct PruneFigures {
    pub rows: u64,
    pub workers: usize,
    pub batch: u32,
    /// The pruner's rest after each batch (times its duration).
    pub rest: f64,
    pub without: Side,
    pub during: Side,
    pub counts: PruneCounts,
    pub pruning: Duration,
    pub before: Vec<TableSize>,
    pub after: Vec<TableSize>,
}

/// What the phase prunes and runs.
pub struct Load {
    /// Finished rows loaded and pruned.
    pub rows: u64,
    /// gRPC workers of the lifecycle.
    pub workers: usize,
    /// Jobs per lifecycle round.
    pub jobs: u64,
    /// Rounds of the no-pruning side.
    pub rounds: usize,
    /// The pruner's rest after each batch (times its duration).
    pub rest: f64,
    /// The longest wait for InnoDB to settle before and after (see
    /// `settle`).
    pub settle: Duration,
}

/// Runs the phase; the tables are left as pruning left them.
pub async fn run(pool: &MySqlPool, addr: &str, load: Load) -> Result<PruneFigures> {
    let Load {
        rows,
        workers,
        jobs,
        rounds,
        rest,
        settle: settle_limit,
    } = load;
    load_finished(pool, rows, 40).await?;
    settle(pool, settle_limit).await?;
    let before = sizes(pool).await?;
    let rounds = rounds.max(1);

    let mut without = Side::default();
    for _ in 0..rounds {
        without.add(round(pool, addr, workers, jobs, Loop::ClaimThenComplete).await?);
    }
    eprintln!(
        "bench: {:<44} {:>8.0} jobs/s, claim p99 {} ms",
        format!("lifecycle, {rows} finished rows held N={workers}"),
        without.rate(),
        without.claim(0.99)
    );

    let retention = Retention {
        jobs: Duration::from_secs(30 * 86_400),
        keys: None,
    };
    let store = JobStore::new(pool.clone());
    let started = Instant::now();
    let pruner = tokio::spawn(async move {
        let run = store
            .prune_paced(&retention, DEFAULT_PRUNE_BATCH, rest, |_| {})
            .await;
        (run, started.elapsed())
    });
    // Rounds that start while pruning runs count; the last one may end
    // after it (said in the report, with how long pruning took).
    let mut during = Side::default();
    while !pruner.is_finished() || during.rounds == 0 {
        during.add(round(pool, addr, workers, jobs, Loop::ClaimThenComplete).await?);
    }
    let (run, pruning) = pruner.await?;
    let counts = match run? {
        PruneRun::Done(c) => c,
        PruneRun::LockHeld => anyhow::bail!("the pruner's lock was held by another session"),
    };
    ensure!(
        counts.jobs == rows,
        "pruned {} jobs, expected {rows}",
        counts.jobs
    );
    eprintln!(
        "bench: {:<44} {:>8.0} jobs/s, claim p99 {} ms ({} rows pruned in {:.0} s, {} batches)",
        format!("lifecycle while pruning N={workers}"),
        during.rate(),
        during.claim(0.99),
        counts.jobs,
        pruning.as_secs_f64(),
        counts.batches
    );
    settle(pool, settle_limit).await?;
    let after = sizes(pool).await?;
    Ok(PruneFigures {
        rows,
        workers,
        batch: DEFAULT_PRUNE_BATCH,
        rest,
        without,
        during,
        counts,
        pruning,
        before,
        after,
    })
}

/// The workers' loop in a lifecycle round.
#[derive(Clone, Copy)]
pub(super) enum Loop {
    /// Claim(1), then Complete: the loop the pruning phase has always
    /// measured.
    ClaimThenComplete,
    /// Every client's run loop: each Complete asks for the worker's next
    /// job (docs/design.md rule 16).
    NextJob,
}

/// One lifecycle round on a fresh benchmark queue, checked.
pub(super) async fn round(
    pool: &MySqlPool,
    addr: &str,
    workers: usize,
    jobs: u64,
    loop_: Loop,
) -> Result<super::PhaseRun> {
    for table in ["job_events", "jobs"] {
        clear(pool, table).await?;
    }
    fill(pool, jobs).await?;
    let run = match loop_ {
        Loop::ClaimThenComplete => grpc::lifecycle(addr, QUEUE, workers, 1, jobs).await?,
        Loop::NextJob => grpc::lifecycle_next(addr, QUEUE, workers, jobs).await?,
    };
    verify(pool, jobs).await?;
    Ok(run)
}

/// Deletes the benchmark queue's rows of `table`. The pruner may be
/// deleting other rows of the table meanwhile: a deadlock or a lock wait
/// between the two (InnoDB's next-key locks) rolls this statement back,
/// and it is run again, as the coordinator runs its own transactions
/// again.
async fn clear(pool: &MySqlPool, table: &str) -> Result<()> {
    let sql = format!("DELETE FROM {table} WHERE queue = ?");
    let mut tries = 0;
    loop {
        match sqlx::query(&sql).bind(QUEUE).execute(pool).await {
            Ok(_) => return Ok(()),
            Err(sqlx::Error::Database(e))
                if tries < 5
                    && e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                        .is_some_and(|m| matches!(m.number(), 1213 | 1205)) =>
            {
                tries += 1;
                eprintln!("bench: clearing {table} met a lock conflict ({e}); running it again");
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn sizes(pool: &MySqlPool) -> Result<Vec<TableSize>> {
    let mut out = Vec::new();
    for t in TABLES {
        sqlx::raw_sql(&format!("ANALYZE TABLE {t}"))
            .execute(pool)
            .await?;
        let (rows, data, index, free): (u64, u64, u64, u64) = sqlx::query_as(
            "SELECT CAST(TABLE_ROWS AS UNSIGNED), CAST(DATA_LENGTH AS UNSIGNED), \
             CAST(INDEX_LENGTH AS UNSIGNED), CAST(DATA_FREE AS UNSIGNED) \
             FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
        )
        .bind(t)
        .fetch_one(pool)
        .await?;
        out.push(TableSize {
            table: t.into(),
            rows,
            data,
            index,
            free,
        });
    }
    Ok(out)
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1024.0 * 1024.0))
}

impl PruneFigures {
    /// Throughput during pruning as a share of the same phase without it.
    pub fn ratio(&self) -> f64 {
        self.during.rate() / self.without.rate().max(1e-9)
    }

    /// The section, as Markdown (also printed to the terminal).
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## Pruning\n");
        let _ = writeln!(
            out,
            "{} finished jobs (one completion event each) finished 40 days ago are pruned with a \
             30-day retention by `JobStore::prune` (what `jobfence serve` and `jobfence prune` \
             run; batches of {} jobs, one short transaction each, resting {} times as long as \
             each batch took after it, as `--prune-rest` does by default) while {} gRPC workers run \
             Claim(1) then Complete on another queue; against the same rounds of {} jobs with \
             those rows held and nobody pruning (the coordinator runs with `--prune-off`). \
             Rounds count from the moment pruning starts until it ends (the last round may \
             end after it). Pruning took {:.0} s ({} batches: {} jobs, {} events, {} key records \
             written).\n",
            self.rows,
            self.batch,
            self.rest,
            self.workers,
            self.without.jobs / self.without.rounds.max(1) as u64,
            self.pruning.as_secs_f64(),
            self.counts.batches,
            self.counts.jobs,
            self.counts.events,
            self.counts.keys_recorded,
        );
        Side::table(
            &mut out,
            [
                ("rows held, no pruning", &self.without),
                ("while pruning", &self.during),
            ],
        );
        let _ = writeln!(
            out,
            "\nClaim throughput while pruning: {:.0} % of the same phase without it (target: at least 85 %).\n",
            self.ratio() * 100.0
        );
        let _ = writeln!(
            out,
            "| table | rows before | data MiB before | index MiB before | rows after | data MiB after | index MiB after | free MiB after |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
        for (b, a) in self.before.iter().zip(&self.after) {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                b.table,
                b.rows,
                mib(b.data),
                mib(b.index),
                a.rows,
                mib(a.data),
                mib(a.index),
                mib(a.free)
            );
        }
        let _ = writeln!(
            out,
            "\nSizes are InnoDB's (information_schema.TABLES after ANALYZE TABLE; rows are its \
             estimate). Deleted pages go back to the tablespace's free space (*free*), not to the \
             file system: the file shrinks only with `OPTIMIZE TABLE` (a table rebuild)."
        );
        out
    }
}
