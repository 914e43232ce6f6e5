//! `jobfence bench`: how much faster (or slower) going through the
//! coordinator is than workers running the SQL themselves, measured side by
//! side in one run against the same database.
//!
//! Phases, for each worker count N:
//! 1. **direct**: N connections run the article's lifecycle themselves;
//! 2. **coordinator**: `jobfence serve` as its own process, N gRPC workers
//!    doing Claim(max_jobs=1) then Complete;
//! 3. **coordinator, batching clients**: the same with Claim(max_jobs=K);
//!
//! at the largest N also 2a. the next job on Complete over jobs enqueued
//! across `--fairness-keys` fairness keys (beside the same loop without
//! keys); at every N also 2b. the direct lifecycle and the coordinator phases
//! (Claim(1), and the next job on Complete) with the queue under a
//! **provider budget far above the load** (what the budget row costs a
//! claim, the direct workers keeping it in their own SQL), and once 2c. a **budget below the load** (the hand-out rate the
//! database recorded against the configured one);
//! then once: 4. the **batched direct ceiling** (32 jobs per transaction),
//! 5. **enqueue**: single-row inserts, Enqueue and EnqueueBatch, 5b. the
//! database work of one claim with 1,000 and with `--key-backlog` ready
//! jobs of one fairness key (with `--compare-reference-index`, the
//! next-job loop and Enqueue each also run without the provider
//! reference's index, right after their ordinary phase), and
//! optionally 6. the coordinator phase again with a million finished jobs
//! in the table, and 7. a bulk cancel of `--bulk-jobs` jobs beside
//! `--bulk-workers` workers (`bulk.rs`). After every lifecycle phase it checks that every job
//! succeeded exactly once with exactly one completion event, and fails
//! loudly otherwise. It prints the table and, with `--write`, writes it to
//! a Markdown file with the machine, the database settings and the command
//! line. It asserts nothing about the figures: it is a benchmark, not a
//! test.

mod args;
mod backlog;
mod budget;
mod bulk;
mod db;
mod direct;
mod grpc;
pub mod procstat;
mod prune;
mod reference;
mod report;
mod settle;
mod sightings;
mod targets;

use crate::procs::{self, Proc};
use anyhow::{ensure, Context, Result};
pub use args::BenchArgs;
use db::*;
use jobfence_store::{self as store, PoolSettings};
use report::{Measured, Phase, Report};
use sqlx::mysql::MySqlPool;
use std::time::{Duration, Instant};

/// What one timed run of workers did.
#[derive(Debug, Default)]
pub struct PhaseRun {
    pub jobs: u64,
    pub elapsed: Duration,
    pub latencies: Latencies,
}

/// Per-call latencies of a phase (`claim` also holds enqueue calls).
#[derive(Debug, Default)]
pub struct Latencies {
    pub claim: Vec<Duration>,
    pub complete: Vec<Duration>,
}

/// Runs the benchmark; `Err` if a phase failed or its check did not hold.
pub async fn run(args: BenchArgs) -> Result<()> {
    let started = Instant::now();
    let (admin, db, pool) = fresh_database(&args).await?;
    let settings = read_settings(&pool).await?;
    let db_pid = db_server_pid(&pool).await;
    let (mut coordinator, addr, metrics_addr) = start_coordinator(&args).await?;
    grpc::warm_up(&addr).await?;
    let coordinator_pid = coordinator.pid().context("the coordinator exited")?;
    let grpc_rtt = grpc::health_round_trip(&addr, 500).await?;
    let db_rtt = direct::db_round_trip(&pool, 500).await?;
    let sightings_ns = tokio::task::spawn_blocking(sightings::ns_per_call).await?;

    let mut bench = Bench {
        pool: pool.clone(),
        coordinator_pid,
        db_pid,
        metrics_url: Some(format!("http://{metrics_addr}/metrics")),
        measured: Vec::new(),
        backlog: None,
        pruning: None,
        settlement: None,
        bulk: None,
    };
    let result = bench.all(&args, &addr).await;
    let _ = coordinator.stop(Duration::from_secs(5)).await;
    let elapsed = started.elapsed();
    pool.close().await;
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS `{db}`"))
        .execute(&admin)
        .await;
    result?;

    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: procstat::machine(),
        settings,
        args: &args,
        measured: bench.measured,
        backlog: bench.backlog,
        pruning: bench.pruning,
        settlement: bench.settlement,
        bulk: bench.bulk,
        elapsed,
        round_trips: (grpc_rtt, db_rtt),
        sightings_ns,
    };
    println!();
    print!("{}", report.text());
    if let Some(path) = &args.write {
        std::fs::write(path, report.markdown())
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The benchmark's own database, created afresh with the schema: a
/// connection to its server (to drop it at the end), its name, and a
/// pool for the phases.
async fn fresh_database(args: &BenchArgs) -> Result<(MySqlPool, String, MySqlPool)> {
    let (server, db) = args
        .database_url
        .rsplit_once('/')
        .context("--database-url needs a database name")?;
    ensure!(!db.is_empty(), "--database-url needs a database name");
    let admin = MySqlPool::connect(&format!("{server}/"))
        .await
        .with_context(|| format!("connecting to {server} (scripts/mariadb start?)"))?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS `{db}`"))
        .execute(&admin)
        .await?;
    sqlx::query(&format!(
        "CREATE DATABASE `{db}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    ))
    .execute(&admin)
    .await?;
    let max_workers = args.workers.iter().copied().max().unwrap_or(1);
    let settings = PoolSettings {
        max_connections: (max_workers + 8) as u32,
        ..PoolSettings::default()
    };
    let migrating = store::connect(&args.database_url, &settings)?;
    store::MIGRATOR
        .run(&migrating)
        .await
        .context("migrations")?;
    migrating.close().await;
    // Opened once the schema is there, its sessions register as this
    // process's: the coordinator never takes the direct workers for an
    // older coordinator (which would make its claims read every job's
    // observations; docs/operating.md "Upgrading").
    let pool = store::connect(&args.database_url, &settings)?;
    Ok((admin, db.to_owned(), pool))
}

/// `jobfence serve` as its own process, on port 0; once it serves, the
/// process, its gRPC address and its metrics address, read from its log.
async fn start_coordinator(args: &BenchArgs) -> Result<(Proc, String, String)> {
    std::fs::create_dir_all(&args.log_dir)?;
    let bin = match &args.coordinator_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?,
    };
    // Cleartext and open, like the direct SQL it is compared with
    // (docs/benchmarks.md).
    let mut serve_args: Vec<String> = vec![
        "serve".into(),
        "--insecure".into(),
        "--database-url".into(),
        args.database_url.clone(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--db-max-connections".into(),
        "32".into(),
        "--metrics-listen".into(),
        "127.0.0.1:0".into(),
        // The pruning phase prunes itself, measured; nothing else may.
        "--prune-off".into(),
    ];
    serve_args.extend(args.serve_flags.iter().cloned());
    let mut coordinator = Proc::spawn(
        "bench-coordinator",
        &bin,
        &serve_args,
        // Warnings only, but the lines that say where it listens.
        &[("JOBFENCE_LOG", procs::serve_log_filter("warn"))],
        &args.log_dir,
    )?;
    let addr = coordinator.listen_addr(procs::SERVING_GRPC).await?;
    let metrics = coordinator.listen_addr(procs::SERVING_METRICS).await?;
    procs::wait_coordinator(&addr.to_string(), &Default::default()).await?;
    wait_until_settled(&metrics.to_string()).await;
    Ok((coordinator, addr.to_string(), metrics.to_string()))
}

/// Waits (at most 30 s) until the coordinator keeps no older behaviour
/// for a rolling upgrade (`jobfence_schema_transition_open` all 0; a
/// coordinator that starts alone brings its flags forward within its
/// first checks, docs/operating.md "Upgrading"), so that no phase measures
/// that start. A coordinator without the series (an earlier build given by
/// `--coordinator-bin`) is not waited for.
async fn wait_until_settled(metrics: &str) {
    let url = format!("http://{metrics}/metrics");
    for _ in 0..120 {
        let Ok(text) = async { reqwest::get(&url).await?.text().await }.await else {
            return;
        };
        let open: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("jobfence_schema_transition_open{"))
            .collect();
        if open.is_empty() || open.iter().all(|l| l.ends_with(" 0")) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

struct Bench {
    pool: MySqlPool,
    coordinator_pid: u32,
    db_pid: Option<u32>,
    /// The coordinator's `/metrics`.
    metrics_url: Option<String>,
    measured: Vec<Measured>,
    /// The backlog phase, when it ran (`--key-backlog`).
    backlog: Option<backlog::BacklogFigures>,
    /// The pruning phase, when it ran (`--prune-rows`).
    pruning: Option<prune::PruneFigures>,
    /// The settlement phase, when it ran (`--settle-lines`).
    settlement: Option<settle::SettleFigures>,
    /// The bulk repair phase, when it ran (`--bulk-jobs`).
    bulk: Option<bulk::BulkFigures>,
}

impl Bench {
    /// Every phase, in order (see the module's documentation).
    async fn all(&mut self, args: &BenchArgs, addr: &str) -> Result<()> {
        let max_workers = args.workers.iter().copied().max().unwrap_or(1);
        self.compared(args, addr).await?;
        if args.budget_rate > 0.0 {
            self.paced(args, addr, max_workers).await?;
        }
        self.ceiling(args).await?;
        self.enqueues(args, addr).await?;
        if args.key_backlog > 0 {
            self.reset().await?;
            self.backlog = Some(backlog::run(&self.pool, args).await?);
        }
        if args.finished_rows > 0 {
            self.finished_rows(args, addr, max_workers).await?;
        }
        if args.prune_rows > 0 {
            self.reset().await?;
            self.pruning = Some(
                prune::run(
                    &self.pool,
                    addr,
                    prune::Load {
                        rows: args.prune_rows,
                        workers: max_workers,
                        jobs: args.jobs,
                        rounds: args.prune_rounds,
                        rest: args.prune_rest,
                        settle: Duration::from_secs(args.settle_seconds),
                    },
                )
                .await?,
            );
        }
        if args.settle_lines > 0 {
            self.reset().await?;
            let load = settle::Load::of(args, max_workers, self.coordinator_pid, self.db_pid)?;
            self.settlement = Some(settle::run(&self.pool, addr, load).await?);
        }
        if args.bulk_jobs > 0 {
            self.reset().await?;
            let load = bulk::Load::of(args, self.coordinator_pid, self.db_pid)?;
            self.bulk = Some(bulk::run(&self.pool, addr, load).await?);
        }
        Ok(())
    }

    /// The phases being compared, for each worker count: direct, the
    /// coordinator (also under a budget far above the load; at the most
    /// workers the next-job loop also over jobs with fairness keys), and
    /// the coordinator with batching clients. They run one
    /// after the other, `--repeat` times round: drift of a shared machine
    /// hits them alike.
    async fn compared(&mut self, args: &BenchArgs, addr: &str) -> Result<()> {
        let pool = self.pool.clone();
        let max_workers = args.workers.iter().copied().max().unwrap_or(1);
        for &n in &args.workers {
            for _ in 0..args.repeat.max(1) {
                self.lifecycle(Phase::Direct, n, args.jobs, || {
                    direct::lifecycle(&pool, QUEUE, n, None)
                })
                .await?;
                self.lifecycle(Phase::Coordinator, n, args.jobs, || {
                    grpc::lifecycle(addr, QUEUE, n, 1, args.jobs)
                })
                .await?;
                self.lifecycle(Phase::CoordinatorNext, n, args.jobs, || {
                    grpc::lifecycle_next(addr, QUEUE, n, args.jobs)
                })
                .await?;
                self.next_without_reference_index(args, addr, n).await?;
                let keys = args.fairness_keys;
                if keys > 0 && n == max_workers {
                    self.lifecycle(Phase::CoordinatorNextKeyed(keys), n, args.jobs, || {
                        grpc::lifecycle_next(addr, QUEUE, n, args.jobs)
                    })
                    .await?;
                }
                if args.budget_rate > 0.0 {
                    self.far_budget(args, addr, n).await?;
                }
                let k = args.claim_batch;
                self.lifecycle(Phase::CoordinatorBatching(k), n, args.jobs, || {
                    grpc::lifecycle(addr, QUEUE, n, k, args.jobs)
                })
                .await?;
            }
        }
        Ok(())
    }

    /// The batched direct ceiling.
    async fn ceiling(&mut self, args: &BenchArgs) -> Result<()> {
        let pool = self.pool.clone();
        let (c, b) = (args.ceiling_connections, args.ceiling_batch);
        for _ in 0..args.repeat.max(1) {
            self.lifecycle(Phase::Ceiling(b), c, args.jobs, || {
                direct::batched(&pool, QUEUE, c, b)
            })
            .await?;
        }
        Ok(())
    }

    /// Enqueue: direct single-row inserts, the Enqueue RPC and
    /// EnqueueBatch.
    async fn enqueues(&mut self, args: &BenchArgs, addr: &str) -> Result<()> {
        let pool = self.pool.clone();
        let (jobs, callers) = (args.enqueue_jobs, args.enqueue_callers);
        let batch_callers = 4;
        for _ in 0..args.repeat.max(1) {
            self.enqueue(Phase::Inserts, callers, jobs, || {
                direct::inserts(&pool, QUEUE, jobs, callers)
            })
            .await?;
            self.enqueue(Phase::Enqueue, callers, jobs, || {
                grpc::enqueue(addr, QUEUE, jobs, callers, 1)
            })
            .await?;
            self.enqueue_without_reference_index(args, addr).await?;
            self.enqueue(
                Phase::EnqueueBatch(args.enqueue_batch),
                batch_callers,
                jobs,
                || grpc::enqueue(addr, QUEUE, jobs, batch_callers, args.enqueue_batch),
            )
            .await?;
        }
        Ok(())
    }

    /// The coordinator phase again, with `--finished-rows` finished jobs
    /// in the table.
    async fn finished_rows(&mut self, args: &BenchArgs, addr: &str, n: usize) -> Result<()> {
        self.reset().await?;
        load_finished(&self.pool, args.finished_rows, 0).await?;
        for _ in 0..args.repeat.max(1) {
            self.clear_queue().await?;
            settle(&self.pool, Duration::from_secs(args.settle_seconds)).await?;
            self.lifecycle_kept(
                Phase::CoordinatorFinished(args.finished_rows),
                n,
                args.jobs,
                || grpc::lifecycle(addr, QUEUE, n, 1, args.jobs),
            )
            .await?;
        }
        Ok(())
    }

    /// Removes the benchmark queue's jobs and events, keeping the rest
    /// (the finished rows of the archive queue).
    async fn clear_queue(&self) -> Result<()> {
        sqlx::query("DELETE FROM job_events WHERE queue = ?")
            .bind(QUEUE)
            .execute(&self.pool)
            .await?;
        sqlx::query("DELETE FROM jobs WHERE queue = ?")
            .bind(QUEUE)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Empties the tables (the coordinator keeps its connections).
    async fn reset(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        sqlx::query("SET FOREIGN_KEY_CHECKS = 0")
            .execute(&mut *conn)
            .await?;
        for t in ["job_observations", "job_events", "jobs", "fairness_keys"] {
            sqlx::query(&format!("TRUNCATE TABLE {t}"))
                .execute(&mut *conn)
                .await?;
        }
        sqlx::query("SET FOREIGN_KEY_CHECKS = 1")
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    async fn lifecycle<F, Fut>(
        &mut self,
        phase: Phase,
        workers: usize,
        jobs: u64,
        run: F,
    ) -> Result<()>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<PhaseRun>>,
    {
        self.reset().await?;
        self.lifecycle_kept(phase, workers, jobs, run).await
    }

    /// A lifecycle phase over what the table holds now plus `jobs` fresh
    /// ready jobs (with a keyed phase's fairness keys, round-robin),
    /// checked afterwards.
    async fn lifecycle_kept<F, Fut>(
        &mut self,
        phase: Phase,
        workers: usize,
        jobs: u64,
        run: F,
    ) -> Result<()>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<PhaseRun>>,
    {
        match phase {
            Phase::CoordinatorNextKeyed(keys) => {
                fill_keyed(&self.pool, QUEUE, 0..jobs, |k| Some(fairness_key(k % keys))).await?
            }
            _ => fill(&self.pool, jobs).await?,
        }
        let label = format!("{} N={workers}", phase.name());
        eprint!("bench: {label:<44} ");
        let measured = self.measure(phase, workers, run).await?;
        verify(&self.pool, jobs)
            .await
            .with_context(|| format!("check after {label}"))?;
        eprintln!(
            "{:>8.0} jobs/s  (checked: {jobs} jobs succeeded once, one completion event each)",
            measured.rate()
        );
        self.measured.push(measured);
        Ok(())
    }

    async fn enqueue<F, Fut>(
        &mut self,
        phase: Phase,
        callers: usize,
        jobs: u64,
        run: F,
    ) -> Result<()>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<PhaseRun>>,
    {
        self.reset().await?;
        let label = format!("{} callers={callers}", phase.name());
        eprint!("bench: {label:<44} ");
        let measured = self.measure(phase, callers, run).await?;
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM jobs WHERE state = 'ready'")
            .fetch_one(&self.pool)
            .await?;
        ensure!(
            n as u64 == jobs,
            "{label}: {n} jobs in the table, expected {jobs}"
        );
        eprintln!(
            "{:>8.0} jobs/s  (checked: {jobs} jobs in the table)",
            measured.rate()
        );
        self.measured.push(measured);
        Ok(())
    }

    async fn measure<F, Fut>(&self, phase: Phase, workers: usize, run: F) -> Result<Measured>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<PhaseRun>>,
    {
        let coord = self.coordinator_pid;
        procstat::reset_peak_rss(coord);
        let status = db_status(&self.pool).await?;
        let batches = self.batches().await;
        let own = std::process::id();
        let own_cpu = procstat::cpu_time(own);
        let coord_cpu = procstat::cpu_time(coord);
        let db_cpu = self.db_pid.and_then(procstat::cpu_time);
        let run = run().await?;
        let db_cpu_after = self.db_pid.and_then(procstat::cpu_time);
        let coord_cpu_after = procstat::cpu_time(coord);
        let own_cpu = match (own_cpu, procstat::cpu_time(own)) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        let status = db_status(&self.pool).await?.since(&status);
        let batches = self.batches().await.since(&batches);
        let coord_cpu = match (coord_cpu, coord_cpu_after) {
            (Some(a), Some(b)) if phase.uses_coordinator() => Some(b.saturating_sub(a)),
            _ => None,
        };
        let db_cpu = match (db_cpu, db_cpu_after) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        Ok(Measured {
            phase,
            workers,
            coord_rss: phase
                .uses_coordinator()
                .then(|| procstat::peak_rss(coord))
                .flatten(),
            coord_cpu,
            db_cpu,
            load_cpu: own_cpu,
            status,
            batches: phase.uses_coordinator().then_some(batches),
            run,
        })
    }

    /// The coordinator's batch-size histogram sums and counts, per
    /// pipeline, scraped from its `/metrics`.
    async fn batches(&self) -> BatchCounts {
        let Some(url) = &self.metrics_url else {
            return BatchCounts::default();
        };
        let Ok(text) = async { reqwest::get(url).await?.text().await }.await else {
            return BatchCounts::default();
        };
        BatchCounts::parse(&text)
    }
}

/// The queue every phase uses.
const QUEUE: &str = "bench";

/// The provider of the budget phases.
const PROVIDER: &str = "bench-provider";

/// The `k`-th fairness key of the keyed phases.
fn fairness_key(k: u64) -> String {
    format!("merchant-{k:05}")
}
