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
//! under the bench's operator name.

use super::db::settle;
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
    pub workers: usize,
    /// Jobs per lifecycle round.
    pub round_jobs: u64,
    /// Rounds of the side with no bulk.
    pub rounds: usize,
    /// The `jobfence` binary (its `jobs bulk` is what is timed).
    pub bin: PathBuf,
    /// The longest wait for InnoDB to write back what each load left.
    pub settle: Duration,
}

impl Load {
    /// The phase as the flags say.
    pub fn of(args: &super::BenchArgs) -> Result<Load> {
        Ok(Load {
            jobs: args.bulk_jobs,
            batches: args.bulk_batch.clone(),
            workers: args.bulk_workers,
            round_jobs: args.jobs,
            rounds: args.prune_rounds,
            bin: std::env::current_exe()?,
            settle: Duration::from_secs(args.settle_seconds),
        })
    }
}

/// One bulk cancel and the rounds that ran beside it.
#[derive(Debug)]
pub struct BulkRun {
    pub batch: u16,
    /// From the command's start to its end: the count and every batch.
    pub took: Duration,
    /// Batches the coordinator ran again after a conflict.
    pub conflicts_retried: u64,
    pub during: Side,
}

/// What the phase measured.
#[derive(Debug)]
pub struct BulkFigures {
    pub jobs: u64,
    pub workers: usize,
    pub without: Side,
    pub runs: Vec<BulkRun>,
}

/// Runs the phase.
pub async fn run(pool: &MySqlPool, addr: &str, load: Load) -> Result<BulkFigures> {
    let mut without = Side::default();
    for _ in 0..load.rounds.max(1) {
        without.add(round(pool, addr, load.workers, load.round_jobs, Loop::NextJob).await?);
    }
    eprintln!(
        "bench: {:<44} {:>8.0} jobs/s",
        format!("lifecycle, no bulk N={}", load.workers),
        without.rate()
    );
    let mut runs = Vec::new();
    for &batch in &load.batches {
        load_ready(pool, load.jobs).await?;
        settle(pool, load.settle).await?;
        let started = Instant::now();
        let cancelling = tokio::spawn(bulk_cancel(load.bin.clone(), addr.to_owned(), batch));
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
        let run = BulkRun {
            batch,
            took,
            conflicts_retried: summary["conflicts_retried"].as_u64().unwrap_or(0),
            during,
        };
        eprintln!(
            "bench: {:<44} {:>8.0} jobs/s ({} jobs cancelled in {:.1} s: {:.0} jobs/s, claims {:.0} %)",
            format!("lifecycle beside a bulk of {batch} N={}", load.workers),
            run.during.rate(),
            load.jobs,
            took.as_secs_f64(),
            run.jobs_per_second(load.jobs),
            run.during.rate() / without.rate().max(1e-9) * 100.0
        );
        clear(pool).await?;
        runs.push(run);
    }
    Ok(BulkFigures {
        jobs: load.jobs,
        workers: load.workers,
        without,
        runs,
    })
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
async fn bulk_cancel(bin: PathBuf, addr: String, batch: u16) -> Result<serde_json::Value> {
    let out = tokio::process::Command::new(bin)
        .args(["jobs", "bulk", "cancel", "--queue", HELD, "--yes", "--json"])
        .args(["--operator", "bench", "--reason", "the bulk phase"])
        .args(["--batch-size", &batch.to_string(), "--endpoint", &addr])
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
    /// Jobs counted and cancelled per second, the count included.
    pub fn jobs_per_second(&self, jobs: u64) -> f64 {
        jobs as f64 / self.took.as_secs_f64().max(1e-9)
    }
}

impl BulkFigures {
    /// The section, as Markdown (also printed to the terminal).
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## Repair in bulk\n");
        let _ = writeln!(
            out,
            "{} ready jobs of a queue of their own cancelled with `jobfence jobs bulk cancel \
             --yes` (the count with ListJobs, then BulkRepair in batches, one transaction \
             each) while {} gRPC workers run every client's loop (each Complete asks for the \
             next job) on another queue; against the same rounds of {} jobs with no bulk. \
             Each batch size is a run of its own over freshly loaded jobs; every job was \
             cancelled once, under the bench's name. Targets: the bulk at 2,000 jobs/s or \
             more, the claims at 85 % or more of their rate without.\n",
            self.jobs,
            self.workers,
            self.without.jobs / self.without.rounds.max(1) as u64,
        );
        let _ = writeln!(
            out,
            "| batch | bulk s | bulk jobs/s | conflicts run again | rounds | claims jobs/s | claims × without | claim p50/p99 ms |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
        let w = &self.without;
        let _ = writeln!(
            out,
            "| no bulk | – | – | – | {} | {:.0} | – | {}/{} |",
            w.rounds,
            w.rate(),
            w.claim(0.5),
            w.claim(0.99)
        );
        for r in &self.runs {
            let d = &r.during;
            let _ = writeln!(
                out,
                "| {} | {:.1} | **{:.0}** | {} | {} | {:.0} | **{:.0} %** | {}/{} |",
                r.batch,
                r.took.as_secs_f64(),
                r.jobs_per_second(self.jobs),
                r.conflicts_retried,
                d.rounds,
                d.rate(),
                d.rate() / w.rate().max(1e-9) * 100.0,
                d.claim(0.5),
                d.claim(0.99)
            );
        }
        out
    }
}
