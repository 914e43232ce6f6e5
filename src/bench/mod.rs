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
//! at the largest N also 2b. the coordinator phase with the queue under a
//! **provider budget far above the load** (what the budget row costs a
//! claim), and once 2c. a **budget below the load** (the hand-out rate the
//! database recorded against the configured one);
//! then once: 4. the **batched direct ceiling** (32 jobs per transaction),
//! 5. **enqueue**: single-row inserts, Enqueue and EnqueueBatch, and
//! optionally 6. the coordinator phase again with a million finished jobs
//! in the table. After every lifecycle phase it checks that every job
//! succeeded exactly once with exactly one completion event, and fails
//! loudly otherwise. It prints the table and, with `--write`, writes it to
//! a Markdown file with the machine, the database settings and the command
//! line. It asserts nothing about the figures: it is a benchmark, not a
//! test.

mod direct;
mod grpc;
pub mod procstat;
mod report;

use crate::demo::procs::{free_port, Proc};
use crate::domain::EnqueueRequest;
use crate::store::{self, JobStore, PoolSettings};
use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use report::{Measured, Phase, Report, Setting};
use sqlx::mysql::MySqlPool;
use sqlx::Row;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Flags of `jobfence bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The database server; the benchmark creates (and drops at the end)
    /// its own database on it, named by --database.
    #[arg(
        long,
        env = "JOBFENCE_BENCH_DATABASE_URL",
        default_value = "mysql://jobfence:jobfence@127.0.0.1:3307/jobfence_bench"
    )]
    pub database_url: String,
    /// Jobs per lifecycle phase.
    #[arg(long, default_value_t = 5000)]
    pub jobs: u64,
    /// Worker counts to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub workers: Vec<usize>,
    /// max_jobs of the batching clients' Claims (phase 3).
    #[arg(long, default_value_t = 16)]
    pub claim_batch: u32,
    /// Jobs per transaction of the batched direct ceiling.
    #[arg(long, default_value_t = 32)]
    pub ceiling_batch: u32,
    /// Connections of the batched direct ceiling.
    #[arg(long, default_value_t = 4)]
    pub ceiling_connections: usize,
    /// Jobs of each enqueue phase.
    #[arg(long, default_value_t = 20_000)]
    pub enqueue_jobs: u64,
    /// Concurrent callers of the single-row insert and Enqueue phases.
    #[arg(long, default_value_t = 16)]
    pub enqueue_callers: usize,
    /// Items per EnqueueBatch call.
    #[arg(long, default_value_t = 500)]
    pub enqueue_batch: u64,
    /// Load this many finished (succeeded) jobs and run the coordinator
    /// phase at the largest worker count again, to see whether claims slow
    /// down as finished rows pile up (0: skip).
    #[arg(long, default_value_t = 0)]
    pub finished_rows: u64,
    /// Units per second of the provider budget below the load (the paced
    /// phase: how close the hand-out rate comes to it); 0 skips both
    /// budget phases.
    #[arg(long, default_value_t = 200.0)]
    pub budget_rate: f64,
    /// How long the paced phase runs, in seconds.
    #[arg(long, default_value_t = 30)]
    pub budget_seconds: u64,
    /// Run every phase this many times, interleaved (direct, coordinator,
    /// batching, direct, …), and report the median run of each.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Write the report (Markdown) to this file, e.g. docs/benchmarks.md.
    #[arg(long)]
    pub write: Option<PathBuf>,
    /// Where the coordinator's log goes.
    #[arg(long, default_value = ".local/bench")]
    pub log_dir: PathBuf,
    /// The coordinator binary (default: this one).
    #[arg(long)]
    pub coordinator_bin: Option<PathBuf>,
    /// Extra flags for `jobfence serve` (repeat, e.g.
    /// `--serve-flag=--batch-concurrency=2`).
    #[arg(long = "serve-flag", allow_hyphen_values = true)]
    pub serve_flags: Vec<String>,
}

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
    let pool = store::connect(
        &args.database_url,
        &PoolSettings {
            max_connections: (max_workers + 8) as u32,
            ..PoolSettings::default()
        },
    )?;
    store::MIGRATOR.run(&pool).await.context("migrations")?;
    let settings = read_settings(&pool).await?;
    let db_pid = db_server_pid(&pool).await;

    std::fs::create_dir_all(&args.log_dir)?;
    let addr = format!("127.0.0.1:{}", free_port()?);
    let metrics_addr = format!("127.0.0.1:{}", free_port()?);
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
        addr.clone(),
        "--db-max-connections".into(),
        "32".into(),
        "--metrics-listen".into(),
        metrics_addr.clone(),
    ];
    serve_args.extend(args.serve_flags.iter().cloned());
    let mut coordinator = Proc::spawn(
        "bench-coordinator",
        &bin,
        &serve_args,
        &[("JOBFENCE_LOG", "warn".into())],
        &args.log_dir,
    )?;
    crate::demo::wait_coordinator(&addr, &Default::default()).await?;
    grpc::warm_up(&addr).await?;
    let coordinator_pid = coordinator.pid().context("the coordinator exited")?;
    let grpc_rtt = grpc::health_round_trip(&addr, 500).await?;
    let db_rtt = direct::db_round_trip(&pool, 500).await?;

    let mut bench = Bench {
        pool: pool.clone(),
        coordinator_pid,
        db_pid,
        metrics_url: Some(format!("http://{metrics_addr}/metrics")),
        measured: Vec::new(),
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
        elapsed,
        round_trips: (grpc_rtt, db_rtt),
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

struct Bench {
    pool: MySqlPool,
    coordinator_pid: u32,
    db_pid: Option<u32>,
    /// The coordinator's `/metrics`.
    metrics_url: Option<String>,
    measured: Vec<Measured>,
}

impl Bench {
    async fn all(&mut self, args: &BenchArgs, addr: &str) -> Result<()> {
        let pool = self.pool.clone();
        let reps = args.repeat.max(1);
        let max_workers = args.workers.iter().copied().max().unwrap_or(1);
        // The phases being compared run one after the other, `reps` times
        // round: drift of a shared machine hits them alike.
        for &n in &args.workers {
            for _ in 0..reps {
                self.lifecycle(Phase::Direct, n, args.jobs, || {
                    direct::lifecycle(&pool, QUEUE, n)
                })
                .await?;
                self.lifecycle(Phase::Coordinator, n, args.jobs, || {
                    grpc::lifecycle(addr, QUEUE, n, 1)
                })
                .await?;
                if n == max_workers && args.budget_rate > 0.0 {
                    // The same phase with the queue under a provider
                    // budget far above the load: what the budget row in
                    // every claim transaction costs.
                    self.with_budget(1_000_000.0, 1_000_000).await?;
                    let measured = self
                        .lifecycle(Phase::CoordinatorBudget, n, args.jobs, || {
                            grpc::lifecycle(addr, QUEUE, n, 1)
                        })
                        .await;
                    self.without_budget().await?;
                    measured?;
                }
                let k = args.claim_batch;
                self.lifecycle(Phase::CoordinatorBatching(k), n, args.jobs, || {
                    grpc::lifecycle(addr, QUEUE, n, k)
                })
                .await?;
            }
        }
        if args.budget_rate > 0.0 {
            self.paced(args, addr, max_workers).await?;
        }
        let (c, b) = (args.ceiling_connections, args.ceiling_batch);
        for _ in 0..reps {
            self.lifecycle(Phase::Ceiling(b), c, args.jobs, || {
                direct::batched(&pool, QUEUE, c, b)
            })
            .await?;
        }

        let (jobs, callers) = (args.enqueue_jobs, args.enqueue_callers);
        let batch_callers = 4;
        for _ in 0..reps {
            self.enqueue(Phase::Inserts, callers, jobs, || {
                direct::inserts(&pool, QUEUE, jobs, callers)
            })
            .await?;
            self.enqueue(Phase::Enqueue, callers, jobs, || {
                grpc::enqueue(addr, QUEUE, jobs, callers, 1)
            })
            .await?;
            self.enqueue(
                Phase::EnqueueBatch(args.enqueue_batch),
                batch_callers,
                jobs,
                || grpc::enqueue(addr, QUEUE, jobs, batch_callers, args.enqueue_batch),
            )
            .await?;
        }

        if args.finished_rows > 0 {
            let n = args.workers.iter().copied().max().unwrap_or(1);
            self.reset().await?;
            load_finished(&self.pool, args.finished_rows).await?;
            for _ in 0..reps {
                self.clear_queue().await?;
                settle(&self.pool).await?;
                self.lifecycle_kept(
                    Phase::CoordinatorFinished(args.finished_rows),
                    n,
                    args.jobs,
                    || grpc::lifecycle(addr, QUEUE, n, 1),
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Puts the benchmark queue under provider [`PROVIDER`] with this
    /// budget.
    async fn with_budget(&self, rate: f64, burst: u32) -> Result<()> {
        use crate::domain::budget::Budget;
        use crate::domain::providers::{ChangeBy, PutProvider};
        JobStore::new(self.pool.clone())
            .put_provider(&PutProvider {
                name: PROVIDER.into(),
                budget: Budget {
                    rate_per_second: rate,
                    burst,
                    max_in_flight: None,
                    execute_cost: 1,
                    reconcile_cost: 1,
                },
                queues: vec![QUEUE.into()],
                by: ChangeBy {
                    operator: "bench".into(),
                    reason: "benchmark phase".into(),
                },
            })
            .await?;
        // A fresh budget: its whole burst, from now.
        sqlx::query("UPDATE providers SET tat = UTC_TIMESTAMP(6) WHERE name = ?")
            .bind(PROVIDER)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Takes the benchmark queue out of every budget.
    async fn without_budget(&self) -> Result<()> {
        use crate::domain::providers::ChangeBy;
        let store = JobStore::new(self.pool.clone());
        if store.get_provider(PROVIDER).await?.is_some() {
            store
                .delete_provider(
                    PROVIDER,
                    &ChangeBy {
                        operator: "bench".into(),
                        reason: "benchmark phase over".into(),
                    },
                )
                .await?;
        }
        Ok(())
    }

    /// The paced phase: a budget below the load, `workers` long-polling
    /// workers for `--budget-seconds`, and the hand-out rate the database
    /// recorded (the `claimed` events, DB clock) after the initial burst.
    /// Checked: no job was handed out or completed twice.
    async fn paced(&mut self, args: &BenchArgs, addr: &str, workers: usize) -> Result<()> {
        let rate = args.budget_rate;
        let burst = ((rate / 10.0).ceil() as u32).max(1);
        let seconds = args.budget_seconds.max(1);
        for _ in 0..args.repeat.max(1) {
            self.reset().await?;
            let jobs = (rate * (seconds + 5) as f64) as u64 + u64::from(burst);
            fill(&self.pool, jobs).await?;
            self.with_budget(rate, burst).await?;
            let phase = Phase::BudgetPaced {
                rate_milli: (rate * 1000.0) as u64,
                burst,
            };
            let label = format!("{} N={workers}", phase.name());
            eprint!("bench: {label:<44} ");
            let until = Instant::now() + Duration::from_secs(seconds);
            let measured = self
                .measure(phase, workers, || {
                    grpc::lifecycle_until(addr, QUEUE, workers, 1, Some(until))
                })
                .await;
            self.without_budget().await?;
            let mut measured = measured?;
            let (handed, span) = handed_out(&self.pool).await?;
            ensure!(
                handed > u64::from(burst),
                "{label}: only {handed} jobs handed out"
            );
            // The pace after the burst, by the database clock.
            measured.run.jobs = handed - u64::from(burst);
            measured.run.elapsed = span;
            eprintln!(
                "{:>8.1} hand-outs/s against a budget of {rate}/s (burst {burst}; checked: none twice)",
                measured.rate()
            );
            self.measured.push(measured);
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
        for t in ["job_observations", "job_events", "jobs"] {
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
    /// ready jobs, checked afterwards.
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
        fill(&self.pool, jobs).await?;
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
        let mut out = BatchCounts::default();
        for line in text.lines() {
            for (i, pipeline) in BatchCounts::PIPELINES.iter().enumerate() {
                let label = format!("{{pipeline=\"{pipeline}\"}}");
                let value = |name: &str| {
                    line.strip_prefix(&format!("jobfence_batch_size_{name}{label} "))
                        .and_then(|v| v.trim().parse::<f64>().ok())
                };
                if let Some(v) = value("sum") {
                    out.calls[i] = v;
                }
                if let Some(v) = value("count") {
                    out.batches[i] = v;
                }
            }
            // Server-side time of the worker RPCs, whatever their code.
            for (i, method) in ["Claim", "Complete"].iter().enumerate() {
                if !line.contains(&format!("method=\"{method}\"")) {
                    continue;
                }
                let v = || {
                    line.rsplit_once(' ')
                        .and_then(|(_, v)| v.parse::<f64>().ok())
                };
                if line.starts_with("jobfence_rpc_duration_seconds_sum{") {
                    out.rpc_seconds[i] += v().unwrap_or(0.0);
                } else if line.starts_with("jobfence_rpc_duration_seconds_count{") {
                    out.rpc_calls[i] += v().unwrap_or(0.0);
                }
            }
        }
        out
    }
}

/// Calls and transactions of the coordinator's batching pipelines.
#[derive(Debug, Default, Clone, Copy)]
pub struct BatchCounts {
    /// Calls, per pipeline (see [`BatchCounts::PIPELINES`]).
    pub calls: [f64; 3],
    /// Batches (transactions), per pipeline.
    pub batches: [f64; 3],
    /// Seconds the server spent answering Claim and Complete.
    pub rpc_seconds: [f64; 2],
    /// Claim and Complete calls answered.
    pub rpc_calls: [f64; 2],
}

impl BatchCounts {
    pub const PIPELINES: [&'static str; 3] = ["claim", "write", "enqueue"];

    fn since(&self, before: &BatchCounts) -> BatchCounts {
        let mut out = *self;
        for i in 0..3 {
            out.calls[i] -= before.calls[i];
            out.batches[i] -= before.batches[i];
        }
        for i in 0..2 {
            out.rpc_seconds[i] -= before.rpc_seconds[i];
            out.rpc_calls[i] -= before.rpc_calls[i];
        }
        out
    }

    /// Mean server-side time of Claim (0) or Complete (1), if called.
    pub fn server_mean(&self, i: usize) -> Option<Duration> {
        (self.rpc_calls[i] > 0.0)
            .then(|| Duration::from_secs_f64(self.rpc_seconds[i] / self.rpc_calls[i]))
    }

    /// Mean calls per batch of a pipeline, if it ran.
    pub fn mean(&self, pipeline: &str) -> Option<f64> {
        let i = Self::PIPELINES.iter().position(|p| *p == pipeline)?;
        (self.batches[i] > 0.0).then(|| self.calls[i] / self.batches[i])
    }
}

/// Server counters of the database (statements, redo log fsyncs).
#[derive(Debug, Default, Clone, Copy)]
pub struct DbStatus {
    /// Statements clients sent (`Questions`).
    pub statements: u64,
    /// Data and redo log fsyncs (`Innodb_data_fsyncs`).
    pub fsyncs: u64,
}

impl DbStatus {
    fn since(&self, before: &DbStatus) -> DbStatus {
        DbStatus {
            statements: self.statements.saturating_sub(before.statements),
            fsyncs: self.fsyncs.saturating_sub(before.fsyncs),
        }
    }
}

async fn db_status(pool: &MySqlPool) -> Result<DbStatus> {
    let rows = sqlx::query(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Innodb_data_fsyncs')",
    )
    .fetch_all(pool)
    .await?;
    let mut out = DbStatus::default();
    for row in rows {
        let name: String = row.try_get::<String, _>(0).or_else(|_| {
            row.try_get::<Vec<u8>, _>(0)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        })?;
        let value: String = row.try_get::<String, _>(1).or_else(|_| {
            row.try_get::<Vec<u8>, _>(1)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        })?;
        let value: u64 = value.parse().unwrap_or(0);
        match name.as_str() {
            "Questions" => out.statements = value,
            "Innodb_data_fsyncs" => out.fsyncs = value,
            _ => {}
        }
    }
    Ok(out)
}

/// The queue every phase uses.
const QUEUE: &str = "bench";

/// The provider of the budget phases.
const PROVIDER: &str = "bench-provider";

/// How many jobs the paced phase handed out, and the time from the first
/// hand-out to the last (DB clock); fails if a job was handed out or
/// completed more than once.
async fn handed_out(pool: &MySqlPool) -> Result<(u64, Duration)> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS handed,            CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), MAX(created_at)) AS SIGNED) AS span_us,            (SELECT COUNT(*) FROM (SELECT job_id FROM job_events WHERE queue = ? AND kind IN ('claimed', 'completed')               GROUP BY job_id, kind HAVING COUNT(*) > 1) AS twice) AS twice          FROM job_events WHERE queue = ? AND kind = 'claimed'",
    )
    .bind(QUEUE)
    .bind(QUEUE)
    .fetch_one(pool)
    .await?;
    let (handed, span_us, twice): (i64, Option<i64>, i64) =
        (row.get("handed"), row.get("span_us"), row.get("twice"));
    ensure!(
        twice == 0,
        "VIOLATED: {twice} jobs handed out or completed twice"
    );
    Ok((
        handed.max(0) as u64,
        Duration::from_micros(span_us.unwrap_or(0).max(1) as u64),
    ))
}

/// Enqueues `jobs` ready jobs (not timed).
async fn fill(pool: &MySqlPool, jobs: u64) -> Result<()> {
    let store = JobStore::new(pool.clone());
    let mut i = 0;
    while i < jobs {
        let items: Vec<EnqueueRequest> = (i..(i + 1000).min(jobs))
            .map(|k| EnqueueRequest {
                queue: QUEUE.into(),
                operation_key: format!("job-{k}"),
                payload: format!("{{\"amount\":{k}}}"),
                delay: Duration::ZERO,
            })
            .collect();
        for r in store.enqueue_batch(&items).await? {
            ensure!(r?.created, "a fresh key was not created");
        }
        i += 1000;
    }
    Ok(())
}

/// Every job of the queue succeeded exactly once, with exactly one
/// completion event each.
async fn verify(pool: &MySqlPool, jobs: u64) -> Result<()> {
    let row = sqlx::query(
        "SELECT \
           (SELECT COUNT(*) FROM jobs WHERE queue = ?) AS total, \
           (SELECT COUNT(*) FROM jobs WHERE queue = ? AND state = 'succeeded' AND attempt = 1) AS succeeded, \
           (SELECT COUNT(*) FROM job_events WHERE queue = ? AND kind = 'completed') AS completions, \
           (SELECT COUNT(*) FROM (SELECT job_id FROM job_events WHERE queue = ? AND kind = 'completed' \
              GROUP BY job_id HAVING COUNT(*) <> 1) AS twice) AS twice",
    )
    .bind(QUEUE)
    .bind(QUEUE)
    .bind(QUEUE)
    .bind(QUEUE)
    .fetch_one(pool)
    .await?;
    let (total, succeeded, completions, twice): (i64, i64, i64, i64) = (
        row.get("total"),
        row.get("succeeded"),
        row.get("completions"),
        row.get("twice"),
    );
    let jobs = jobs as i64;
    if total != jobs || succeeded != jobs || completions != jobs || twice != 0 {
        bail!(
            "VIOLATED: {jobs} jobs expected; {total} in the table, {succeeded} succeeded at attempt 1, \
             {completions} completion events, {twice} jobs with other than one completion"
        );
    }
    Ok(())
}

/// Loads `rows` succeeded jobs of another queue (with a completion event
/// each), as a table that has run for a while would hold.
async fn load_finished(pool: &MySqlPool, rows: u64) -> Result<()> {
    let started = Instant::now();
    let chunk = 10_000u64;
    let mut done = 0;
    while done < rows {
        let n = chunk.min(rows - done);
        let mut tx = pool.begin().await?;
        let (last,): (Option<u64>,) = sqlx::query_as("SELECT MAX(id) FROM jobs")
            .fetch_one(&mut *tx)
            .await?;
        // Rows 0..n from four digits (no recursive CTE: MariaDB stops
        // those at 1000 iterations by default, MySQL at 1000 levels).
        let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                      UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                      UNION ALL SELECT 8 UNION ALL SELECT 9)";
        let sql = format!(
            "INSERT INTO jobs (queue, operation_key, request_digest, payload, state, attempt, \
               next_action, run_at, dispatch_count, provider_reference, created_at, updated_at, finished_at) \
             SELECT 'archive', CONCAT('done-', ? + k), UNHEX(SHA2(CONCAT('done-', ? + k), 256)), \
               '{{\"amount\":1}}', 'succeeded', 1, 'execute', UTC_TIMESTAMP(6), 1, 're_old', \
               UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) \
             FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS k \
                   FROM {digits} a, {digits} b, {digits} c, {digits} e) AS seq \
             WHERE k < ?"
        );
        sqlx::query(&sql)
            .bind(done)
            .bind(done)
            .bind(n)
            .execute(&mut *tx)
            .await
            .context("loading finished jobs")?;
        sqlx::query(
            "INSERT INTO job_events (job_id, queue, attempt, kind, from_state, to_state, \
               current_attempt, detail, created_at) \
             SELECT id, queue, 1, 'completed', 'running', 'succeeded', 1, 're_old', UTC_TIMESTAMP(6) \
             FROM jobs WHERE id > ? AND queue = 'archive'",
        )
        .bind(last.unwrap_or(0))
        .execute(&mut *tx)
        .await
        .context("loading their events")?;
        tx.commit().await?;
        done += n;
        eprint!("\rbench: loading finished jobs {done}/{rows}");
    }
    eprintln!(" ({:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}

/// Waits (at most 2 minutes) until InnoDB has written back the pages a
/// bulk load dirtied and purged the rows it deleted: the phase after it
/// measures claims on a large table, not the background writes of the
/// load competing with them for this machine's two cores.
async fn settle(pool: &MySqlPool) -> Result<()> {
    let started = Instant::now();
    let (mut dirty, mut history) = (0u64, 0u64);
    while started.elapsed() < Duration::from_secs(120) {
        let (name, value): (String, String) =
            sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'")
                .fetch_one(pool)
                .await?;
        debug_assert_eq!(name, "Innodb_buffer_pool_pages_dirty");
        dirty = value.parse().unwrap_or(0);
        let (h,): (i64,) = sqlx::query_as(
            "SELECT CAST(COUNT AS SIGNED) FROM information_schema.INNODB_METRICS \
             WHERE NAME = 'trx_rseg_history_len'",
        )
        .fetch_optional(pool)
        .await?
        .unwrap_or((0,));
        history = h.max(0) as u64;
        // 1000 pages of 16 KiB: 16 MiB left to write.
        if dirty < 1000 && history < 1000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "bench: waited {:.0} s for InnoDB to settle (dirty pages {dirty}, purge history {history})",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The settings the figures depend on.
async fn read_settings(pool: &MySqlPool) -> Result<Vec<Setting>> {
    let row = sqlx::query(
        "SELECT VERSION() AS version, \
           CAST(@@GLOBAL.innodb_flush_log_at_trx_commit AS CHAR) AS flush, \
           CAST(@@GLOBAL.sync_binlog AS CHAR) AS sync_binlog, \
           CAST(@@GLOBAL.log_bin AS CHAR) AS log_bin, \
           CAST(@@GLOBAL.innodb_buffer_pool_size DIV 1048576 AS CHAR) AS buffer_pool_mib",
    )
    .fetch_one(pool)
    .await?;
    let text = |c: &str| -> String {
        row.try_get::<Vec<u8>, _>(c)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .or_else(|_| row.try_get::<String, _>(c))
            .unwrap_or_else(|_| "?".into())
    };
    // MySQL 8 names it transaction_isolation; MariaDB 10.11 tx_isolation.
    let mut isolation = "?".to_owned();
    for var in ["transaction_isolation", "tx_isolation"] {
        let sql = format!("SELECT CAST(@@SESSION.{var} AS CHAR) AS i");
        if let Ok(r) = sqlx::query(&sql).fetch_one(pool).await {
            if let Ok(b) = r.try_get::<Vec<u8>, _>("i") {
                isolation = String::from_utf8_lossy(&b).into_owned();
                break;
            }
        }
    }
    Ok(vec![
        Setting("database", text("version")),
        Setting("innodb_flush_log_at_trx_commit", text("flush")),
        Setting(
            "log_bin / sync_binlog",
            format!("{} / {}", text("log_bin"), text("sync_binlog")),
        ),
        Setting(
            "innodb_buffer_pool_size",
            format!("{} MiB", text("buffer_pool_mib")),
        ),
        Setting("isolation (coordinator and direct)", isolation),
    ])
}

/// The database server's process id, when it runs on this machine and
/// says where its pid file is.
async fn db_server_pid(pool: &MySqlPool) -> Option<u32> {
    let row = sqlx::query("SELECT CAST(@@GLOBAL.pid_file AS CHAR) AS f")
        .fetch_one(pool)
        .await
        .ok()?;
    let file: String = row
        .try_get::<Vec<u8>, _>("f")
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .ok()?;
    let pid: u32 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    procstat::cpu_time(pid).map(|_| pid)
}
