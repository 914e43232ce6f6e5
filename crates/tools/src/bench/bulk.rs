//! The bulk repair phase of `jobfence bench`: `--bulk-jobs` ready jobs of
//! a queue of their own (an incident's refunds to hold back) cancelled
//! with `jobfence jobs bulk cancel --yes` (the CLI: the count with
//! ListJobs, then BulkRepair in batches of `--bulk-batch`) while
//! `--bulk-workers` gRPC workers run every client's loop (each Complete
//! asks for the next job) on the benchmark's queue; against the same
//! rounds with no bulk, in one run. Each batch size given is a run of its
//! own over freshly loaded jobs. Reported: the bulk's jobs per second
//! (the count and the batches, as the operator waits for them), and the
//! workers' jobs per second during it as a share of their rate without.
//! After each run it checks that every loaded job was cancelled once,
//! under the bench's operator name. Then the bulk once more at the first
//! batch size with no workers: its rate alone, and the CPU each process
//! spends per job (the database server, the coordinator, the command),
//! which says where a job's cost is.

use super::db::settle;
use super::procstat;
use super::prune::{round, Loop, Side};
use anyhow::{ensure, Context, Result};
use sqlx::mysql::MySqlPool;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The queue of the jobs cancelled in bulk.
const HELD: &str = "held";

/// What the phase loads and runs.
pub struct Load {
    /// Ready jobs loaded and cancelled, per run.
    pub jobs: u64,
    /// `--batch-size` of each run.
    pub batches: Vec<u16>,
    /// `--max-rate` of each run (at each batch size).
    pub rates: Vec<u32>,
    pub workers: usize,
    /// Jobs per lifecycle round.
    pub round_jobs: u64,
    /// Rounds of the side with no bulk.
    pub rounds: usize,
    /// The `jobfence` binary (its `jobs bulk` is what is timed).
    pub bin: PathBuf,
    /// The longest wait for InnoDB to write back what each load left.
    pub settle: Duration,
    pub coordinator_pid: u32,
    /// The database server's process, when it runs on this machine.
    pub db_pid: Option<u32>,
}

impl Load {
    /// The phase as the flags say.
    pub fn of(args: &super::BenchArgs, coordinator_pid: u32, db_pid: Option<u32>) -> Result<Load> {
        Ok(Load {
            jobs: args.bulk_jobs,
            batches: args.bulk_batch.clone(),
            rates: args.bulk_max_rate.clone(),
            workers: args.bulk_workers,
            round_jobs: args.jobs,
            rounds: args.prune_rounds,
            bin: std::env::current_exe()?,
            settle: Duration::from_secs(args.settle_seconds),
            coordinator_pid,
            db_pid,
        })
    }
}

/// One bulk cancel, the rounds that ran beside it, and the same number of
/// rounds just before it with no bulk (the pair shares the machine's
/// moment: a busy neighbour slows both).
#[derive(Debug)]
pub struct BulkRun {
    pub batch: u16,
    /// Its `--max-rate` (0: flat out).
    pub max_rate: u32,
    /// From the command's start to its end: the count and every batch.
    pub took: Duration,
    /// Batches the coordinator ran again after a conflict.
    pub conflicts_retried: u64,
    pub without: Side,
    pub during: Side,
}

/// What the phase measured.
#[derive(Debug)]
pub struct BulkFigures {
    pub jobs: u64,
    pub workers: usize,
    pub runs: Vec<BulkRun>,
    /// The bulk with no workers, afterwards.
    pub alone: Alone,
}

/// A bulk cancel with nothing else running, at the first batch size and
/// flat out: how long it took, and the CPU per job of each process
/// (`None` where it could not be read: a database on another machine).
#[derive(Debug)]
pub struct Alone {
    pub batch: u16,
    pub took: Duration,
    pub db: Option<Duration>,
    pub coordinator: Option<Duration>,
    pub command: Option<Duration>,
}

/// Runs the phase.
pub async fn run(pool: &MySqlPool, addr: &str, load: Load) -> Result<BulkFigures> {
    let mut runs = Vec::new();
    let each: Vec<(u16, u32)> = load
        .batches
        .iter()
        .flat_map(|&b| load.rates.iter().map(move |&r| (b, r)))
        .collect();
    for (batch, max_rate) in each {
        let run = one_run(pool, addr, &load, batch, max_rate).await?;
        eprintln!(
            "bench: {:<44} {:>8.0} jobs/s ({} jobs cancelled in {:.1} s: {:.0} jobs/s; \
             without the bulk {:.0} jobs/s: claims {:.0} %)",
            format!(
                "lifecycle beside a bulk ({}) N={}",
                run.setting(),
                load.workers
            ),
            run.during.rate(),
            load.jobs,
            run.took.as_secs_f64(),
            run.jobs_per_second(load.jobs),
            run.without.rate(),
            run.ratio() * 100.0
        );
        runs.push(run);
    }
    let alone = alone(pool, addr, &load).await?;
    Ok(BulkFigures {
        jobs: load.jobs,
        workers: load.workers,
        runs,
        alone,
    })
}

/// Loads the jobs, runs the rounds without a bulk (the jobs held), then
/// the bulk cancel with rounds beside it until it ends; checks it.
async fn one_run(
    pool: &MySqlPool,
    addr: &str,
    load: &Load,
    batch: u16,
    max_rate: u32,
) -> Result<BulkRun> {
    load_ready(pool, load.jobs).await?;
    settle(pool, load.settle).await?;
    let mut without = Side::default();
    for _ in 0..load.rounds.max(1) {
        without.add(round(pool, addr, load.workers, load.round_jobs, Loop::NextJob).await?);
    }
    let started = Instant::now();
    let cancelling = tokio::spawn(bulk_cancel(
        load.bin.clone(),
        addr.to_owned(),
        batch,
        max_rate,
    ));
    // Rounds that start while the bulk runs count; the last one may end
    // after it.
    let mut during = Side::default();
    while !cancelling.is_finished() || during.rounds == 0 {
        during.add(round(pool, addr, load.workers, load.round_jobs, Loop::NextJob).await?);
    }
    let summary = cancelling.await??;
    let took = started.elapsed();
    ensure!(
        summary["selected"].as_u64() == Some(load.jobs)
            && summary["applied"].as_u64() == Some(load.jobs),
        "the bulk did not cancel every job: {summary}"
    );
    verify(pool, load.jobs).await?;
    clear(pool).await?;
    Ok(BulkRun {
        batch,
        max_rate,
        took,
        conflicts_retried: summary["conflicts_retried"].as_u64().unwrap_or(0),
        without,
        during,
    })
}

/// The bulk cancel once more, at the first batch size, flat out, with nothing else
/// running: its duration, and the CPU per job of the database server, the
/// coordinator and the command (the command's from the CPU of this
/// process's waited-for children, which it alone adds to meanwhile).
async fn alone(pool: &MySqlPool, addr: &str, load: &Load) -> Result<Alone> {
    let batch = load.batches.first().copied().unwrap_or(500);
    load_ready(pool, load.jobs).await?;
    settle(pool, load.settle).await?;
    let cpu = || {
        (
            load.db_pid.and_then(procstat::cpu_time),
            procstat::cpu_time(load.coordinator_pid),
            procstat::children_cpu(),
        )
    };
    let before = cpu();
    let started = Instant::now();
    let summary = bulk_cancel(load.bin.clone(), addr.to_owned(), batch, 0).await?;
    let took = started.elapsed();
    let after = cpu();
    ensure!(
        summary["applied"].as_u64() == Some(load.jobs),
        "the bulk alone did not cancel every job: {summary}"
    );
    verify(pool, load.jobs).await?;
    clear(pool).await?;
    let per_job = |b: Option<Duration>, a: Option<Duration>| {
        Some(a?.checked_sub(b?)? / u32::try_from(load.jobs.max(1)).unwrap_or(u32::MAX))
    };
    let alone = Alone {
        batch,
        took,
        db: per_job(before.0, after.0),
        coordinator: per_job(before.1, after.1),
        command: per_job(before.2, after.2),
    };
    eprintln!(
        "bench: {:<44} {:>8.0} jobs/s; per job: database {}, coordinator {}, command {}",
        format!("bulk of {batch} alone"),
        load.jobs as f64 / took.as_secs_f64().max(1e-9),
        micros(alone.db),
        micros(alone.coordinator),
        micros(alone.command),
    );
    Ok(alone)
}

/// A per-job CPU time in µs, or `?`.
fn micros(d: Option<Duration>) -> String {
    d.map_or("?".into(), |d| format!("{:.1} µs", d.as_secs_f64() * 1e6))
}

/// Loads `jobs` ready jobs of the held queue, as an Enqueue of each would
/// write them (due now, never claimed, fair round 0), without their
/// `enqueued` events; 10,000 a statement.
async fn load_ready(pool: &MySqlPool, jobs: u64) -> Result<()> {
    let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                  UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                  UNION ALL SELECT 8 UNION ALL SELECT 9)";
    let sql = format!(
        "INSERT INTO jobs (queue, operation_key, request_digest, payload, state, attempt, \
           next_action, run_at, dispatch_count, created_at, updated_at) \
         SELECT ?, CONCAT('held-', ? + k), UNHEX(SHA2(CONCAT('held-', ? + k), 256)), \
           '{{\"amount\":1}}', 'ready', 0, 'execute', UTC_TIMESTAMP(6), 0, \
           UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) \
         FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS k \
               FROM {digits} a, {digits} b, {digits} c, {digits} e) AS seq \
         WHERE k < ? ORDER BY k"
    );
    let mut done = 0;
    while done < jobs {
        let n = (jobs - done).min(10_000);
        sqlx::query(&sql)
            .bind(HELD)
            .bind(done)
            .bind(done)
            .bind(n)
            .execute(pool)
            .await
            .context("loading the jobs to cancel")?;
        done += n;
    }
    Ok(())
}

/// `jobfence jobs bulk cancel` of the held queue; its JSON summary.
async fn bulk_cancel(
    bin: PathBuf,
    addr: String,
    batch: u16,
    max_rate: u32,
) -> Result<serde_json::Value> {
    let out = tokio::process::Command::new(bin)
        .args(["jobs", "bulk", "cancel", "--queue", HELD, "--yes", "--json"])
        .args(["--operator", "bench", "--reason", "the bulk phase"])
        .args(["--batch-size", &batch.to_string(), "--endpoint", &addr])
        .args(["--max-rate", &max_rate.to_string()])
        .env_remove("JOBFENCE_TOKEN_FILE")
        .env_remove("JOBFENCE_TLS_CA")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("running jobfence jobs bulk cancel")?;
    ensure!(
        out.status.success(),
        "jobfence jobs bulk cancel failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).context("reading the bulk's summary")
}

/// Every held job cancelled, with exactly one `cancelled` event each under
/// the bench's name.
async fn verify(pool: &MySqlPool, jobs: u64) -> Result<()> {
    let (cancelled, events, once): (i64, i64, i64) = sqlx::query_as(
        "SELECT \
           (SELECT COUNT(*) FROM jobs WHERE queue = ? AND state = 'cancelled'), \
           (SELECT COUNT(*) FROM job_events WHERE queue = ? AND kind = 'cancelled' \
              AND JSON_VALUE(detail, '$.operator') = 'bench'), \
           (SELECT COUNT(DISTINCT job_id) FROM job_events WHERE queue = ? AND kind = 'cancelled')",
    )
    .bind(HELD)
    .bind(HELD)
    .bind(HELD)
    .fetch_one(pool)
    .await?;
    let jobs = jobs as i64;
    ensure!(
        (cancelled, events, once) == (jobs, jobs, jobs),
        "VIOLATED: {jobs} jobs expected cancelled once; {cancelled} cancelled, {events} events \
         of the bench's, {once} jobs with one"
    );
    Ok(())
}

/// Deletes the held queue's jobs and events (the next run loads its own).
async fn clear(pool: &MySqlPool) -> Result<()> {
    for table in ["job_events", "jobs"] {
        sqlx::query(&format!("DELETE FROM {table} WHERE queue = ?"))
            .bind(HELD)
            .execute(pool)
            .await?;
    }
    Ok(())
}

impl BulkRun {
    /// Its batch size and pace, as a table names them.
    pub fn setting(&self) -> String {
        match self.max_rate {
            0 => format!("batch {}, flat out", self.batch),
            r => format!("batch {}, --max-rate {r}", self.batch),
        }
    }

    /// The workers' rate beside the bulk over their rate just before it.
    pub fn ratio(&self) -> f64 {
        self.during.rate() / self.without.rate().max(1e-9)
    }

    /// Jobs counted and cancelled per second, the count included.
    pub fn jobs_per_second(&self, jobs: u64) -> f64 {
        jobs as f64 / self.took.as_secs_f64().max(1e-9)
    }
}

impl BulkFigures {
    /// For each setting run more than once, the median of its runs' claims
    /// kept and bulk rates, with their ranges (a shared machine's
    /// neighbours move a single pair by tens of per cent).
    fn medians(&self, out: &mut String) {
        let mut settings: Vec<String> = self.runs.iter().map(BulkRun::setting).collect();
        settings.sort();
        settings.dedup();
        for setting in settings {
            let of: Vec<&BulkRun> = self
                .runs
                .iter()
                .filter(|r| r.setting() == setting)
                .collect();
            if of.len() < 2 {
                continue;
            }
            // The middle run's, or the mean of the two middle ones.
            let median = |mut v: Vec<f64>| {
                v.sort_by(f64::total_cmp);
                let n = v.len();
                ((v[(n - 1) / 2] + v[n / 2]) / 2.0, v[0], v[n - 1])
            };
            let kept = median(of.iter().map(|r| r.ratio() * 100.0).collect());
            let rate = median(of.iter().map(|r| r.jobs_per_second(self.jobs)).collect());
            let _ = writeln!(
                out,
                "\n{setting}, {} runs: the bulk {:.0} jobs/s ({:.0}–{:.0}), the claims kept \
                 **{:.0} %** ({:.0}–{:.0} %), medians.",
                of.len(),
                rate.0,
                rate.1,
                rate.2,
                kept.0,
                kept.1,
                kept.2
            );
        }
    }

    /// The section, as Markdown (also printed to the terminal).
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## Repair in bulk\n");
        let _ = writeln!(
            out,
            "{} ready jobs of a queue of their own cancelled with `jobfence jobs bulk cancel \
             --yes` (the count with ListJobs, then BulkRepair in batches, one transaction \
             each) while {} gRPC workers run every client's loop (each Complete asks for the \
             next job) on another queue, in rounds of {} jobs; against as many rounds just \
             before it, the jobs loaded and nobody cancelling. Each batch size and pace \
             (`--max-rate`) is a run of its own over freshly loaded jobs; every job was \
             cancelled once, under the bench's name. Rounds count from the moment the bulk \
             starts until it ends (the last may end after it). Targets: the bulk at 2,000 \
             jobs/s or more, the claims at 85 % or more of their rate without.\n",
            self.jobs,
            self.workers,
            self.runs
                .first()
                .map_or(0, |r| r.without.jobs / r.without.rounds.max(1) as u64),
        );
        let _ = writeln!(
            out,
            "| bulk | bulk s | bulk jobs/s | conflicts run again | claims without | claims beside it | kept | claim p50/p99 ms without / beside |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
        for r in &self.runs {
            let (w, d) = (&r.without, &r.during);
            let _ = writeln!(
                out,
                "| {} | {:.1} | **{:.0}** | {} | {:.0} jobs/s | {:.0} jobs/s | **{:.0} %** | {}/{} / {}/{} |",
                r.setting(),
                r.took.as_secs_f64(),
                r.jobs_per_second(self.jobs),
                r.conflicts_retried,
                w.rate(),
                d.rate(),
                r.ratio() * 100.0,
                w.claim(0.5),
                w.claim(0.99),
                d.claim(0.5),
                d.claim(0.99)
            );
        }
        self.medians(&mut out);
        let a = &self.alone;
        let _ = writeln!(
            out,
            "\nThe same cancel afterwards with no workers, batches of {}, flat out: {:.0} jobs/s; CPU \
             per job: the database server {}, the coordinator {}, the command {}.",
            a.batch,
            self.jobs as f64 / a.took.as_secs_f64().max(1e-9),
            micros(a.db),
            micros(a.coordinator),
            micros(a.command),
        );
        out
    }
}
