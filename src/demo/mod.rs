//! `jobfence demo`: the main job. Starts a coordinator and a fake payment
//! provider, enqueues refunds, runs Rust, Python and Node workers on one
//! queue, and
//! makes the seed article's failures happen for real: a worker frozen past
//! its lease and resumed after the takeover, a worker killed mid-request,
//! responses cut after the refund was made, read-after-write lag, 503s, a
//! coordinator restart. It ends with a report whose last line is
//! `invariant: OK` or `invariant: VIOLATED (…)`, checked against the
//! provider's own ledger.

mod chaos;
pub mod netcut;
pub mod procs;
pub mod report;

use crate::proto::job_coordinator_client::JobCoordinatorClient;
use crate::proto::EnqueueRequest;
use crate::provider::ProviderClient;
use crate::store::{self, PoolSettings};
use anyhow::{bail, Context, Result};
use chaos::{chaos_step, Chaos};
use clap::Args;
use procs::{free_port, Proc};
use report::Report;
use sqlx::mysql::MySqlPool;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Flags of `jobfence demo`. Durations are humantime (`3s`, `2m`).
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Database for the demo; it is dropped and created anew.
    #[arg(
        long,
        env = "JOBFENCE_DEMO_DATABASE_URL",
        default_value = "mysql://jobfence:jobfence@127.0.0.1:3307/jobfence_demo"
    )]
    pub database_url: String,
    /// Refunds to enqueue.
    #[arg(long, default_value_t = 2000)]
    pub jobs: u32,
    /// Rust refund workers.
    #[arg(long, default_value_t = 3)]
    pub workers: u32,
    /// Python refund workers (need grpcio: scripts/demo installs it).
    #[arg(long, default_value_t = 1)]
    pub python_workers: u32,
    /// Node refund workers (sdk/node; need its packages: scripts/demo runs
    /// `npm ci` there).
    #[arg(long, default_value_t = 1)]
    pub node_workers: u32,
    /// Jobs each worker handles at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: u32,
    /// Lease of every claim.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    pub lease: Duration,
    /// Stop waiting for the jobs to finish after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3m")]
    pub max_duration: Duration,
    /// The coordinator's resend window (keep it at most the provider's
    /// idempotency retention: that is the point).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    pub resend_window: Duration,
    /// How long the provider remembers an idempotency key.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub provider_retention: Duration,
    /// Share of provider responses cut after the refund was made.
    #[arg(long, default_value_t = 0.03)]
    pub fault_cut_response: f64,
    /// Share of lookups that miss refunds younger than 2 s.
    #[arg(long, default_value_t = 0.2)]
    pub fault_lag: f64,
    /// Share of provider requests answered 503 before doing anything.
    #[arg(long, default_value_t = 0.03)]
    pub fault_error_5xx: f64,
    /// Share of provider answers delayed 5 s (past the worker's timeout).
    #[arg(long, default_value_t = 0.01)]
    pub fault_latency: f64,
    /// Share of provider requests never answered.
    #[arg(long, default_value_t = 0.005)]
    pub fault_hang: f64,
    /// Share of refunds that stay pending for a second.
    #[arg(long, default_value_t = 0.1)]
    pub pending_ratio: f64,
    /// Pause, kill and restart processes during the run.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub chaos: bool,
    /// Seed for the provider's faults.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Python interpreter with grpcio (default: .local/venv/bin/python).
    #[arg(long, env = "JOBFENCE_PYTHON")]
    pub python: Option<PathBuf>,
    /// Node executable (default: `node` on the PATH).
    #[arg(long, env = "JOBFENCE_NODE", default_value = "node")]
    pub node: PathBuf,
    /// Where logs go.
    #[arg(long, default_value = ".local/demo")]
    pub work_dir: PathBuf,
    /// Serve the coordinator's Prometheus metrics on this address
    /// (default: a free loopback port, printed at the start).
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Serve the operator web console from the coordinator and keep it up
    /// after the report, with its address printed, until Ctrl-C.
    #[arg(long)]
    pub console: bool,
}

/// The demo's processes.
struct Cluster {
    exe: PathBuf,
    logs: PathBuf,
    db_url: String,
    coordinator_addr: String,
    provider_url: String,
    coordinator: Proc,
    provider: Proc,
    workers: Vec<Proc>,
    lease: Duration,
    resend_window: Duration,
    metrics_listen: Option<String>,
    console_listen: Option<String>,
}

impl Cluster {
    fn coordinator_args(&self) -> Vec<String> {
        coordinator_args(
            &self.db_url,
            &self.coordinator_addr,
            self.lease,
            self.resend_window,
            self.metrics_listen.as_deref(),
            self.console_listen.as_deref(),
        )
    }

    async fn restart_coordinator(&mut self) -> Result<()> {
        self.coordinator.stop(Duration::from_secs(10)).await?;
        let args = self.coordinator_args();
        self.coordinator = Proc::spawn("coordinator", &self.exe, &args, &[], &self.logs)?;
        wait_coordinator(&self.coordinator_addr).await
    }

    fn rust_worker(&self, name: &str, concurrency: u32) -> Result<Proc> {
        let args: Vec<String> = [
            "refund-worker",
            "--coordinator",
            &format!("http://{}", self.coordinator_addr),
            "--provider",
            &self.provider_url,
            "--worker-id",
            name,
            "--queue",
            QUEUE,
            "--concurrency",
            &concurrency.to_string(),
            "--lease",
            &humantime::format_duration(self.lease).to_string(),
        ]
        .map(String::from)
        .to_vec();
        Proc::spawn(name, &self.exe, &args, &[], &self.logs)
    }
}

const QUEUE: &str = "refunds";

fn coordinator_args(
    db_url: &str,
    addr: &str,
    lease: Duration,
    window: Duration,
    metrics: Option<&str>,
    console: Option<&str>,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "serve",
        "--database-url",
        db_url,
        "--listen",
        addr,
        "--default-lease",
        &humantime::format_duration(lease).to_string(),
        "--min-lease",
        "1s",
        "--resend-window",
        &humantime::format_duration(window).to_string(),
        "--drain-delay",
        "0s",
        "--health-interval",
        "200ms",
        "--shutdown-timeout",
        "2s",
    ]
    .map(String::from)
    .to_vec();
    if let Some(m) = metrics {
        args.extend(["--metrics-listen".to_owned(), m.to_owned()]);
    }
    if let Some(c) = console {
        args.extend(["--console-listen".to_owned(), c.to_owned()]);
    }
    args
}

/// Waits (up to 30 s) until the coordinator at `addr` reports SERVING.
pub async fn wait_coordinator(addr: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(ch) = tonic::transport::Channel::from_shared(format!("http://{addr}"))?
            .connect()
            .await
        {
            let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
            let req = tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            };
            if let Ok(r) = health.check(req).await {
                if r.into_inner().status
                    == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
                {
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            bail!("the coordinator at {addr} did not become SERVING within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_provider(client: &ProviderClient) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.health().await.is_err() {
        if Instant::now() > deadline {
            bail!("the fake provider did not come up within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Drops and creates the demo database, and migrates it.
async fn fresh_database(url: &str) -> Result<MySqlPool> {
    let (server, db) = url
        .rsplit_once('/')
        .context("the database URL needs a database name")?;
    if db.is_empty() || !db.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        bail!("demo database name {db:?} must be [A-Za-z0-9_]+");
    }
    let admin = MySqlPool::connect(&format!("{server}/"))
        .await
        .with_context(|| {
            format!("connecting to {server} (is MariaDB running? scripts/demo starts it)")
        })?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS `{db}`"))
        .execute(&admin)
        .await?;
    sqlx::query(&format!(
        "CREATE DATABASE `{db}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    ))
    .execute(&admin)
    .await?;
    admin.close().await;
    let pool = store::connect(url, &PoolSettings::default())?;
    store::MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// Enqueues `n` refunds, 1% of them on payments that fail.
async fn enqueue(addr: &str, n: u32) -> Result<()> {
    let client = JobCoordinatorClient::connect(format!("http://{addr}")).await?;
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in (0..n)
        .collect::<Vec<_>>()
        .chunks(n.div_ceil(8).max(1) as usize)
    {
        let mut c = client.clone();
        let chunk = chunk.to_vec();
        tasks.spawn(async move {
            for i in chunk {
                let payment = if i % 100 == 99 {
                    format!("{}{i:06}", crate::provider::FAILING_PAYMENT_PREFIX)
                } else {
                    format!("pay_{i:06}")
                };
                let amount = 100 + (i as i64 * 37) % 9_900;
                c.enqueue(EnqueueRequest {
                    queue: QUEUE.into(),
                    operation_key: format!("refund-{payment}-{amount}-TWD"),
                    payload: format!(
                        r#"{{"payment_id":"{payment}","amount":{amount},"currency":"TWD"}}"#
                    ),
                    delay: None,
                })
                .await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(())
}

fn default_python() -> PathBuf {
    let venv = PathBuf::from(".local/venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// Runs the demo; the error, if any, says what failed. Returns whether the
/// invariant held.
pub async fn run(args: DemoArgs) -> Result<bool> {
    let started = Instant::now();
    let logs = args.work_dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    for entry in std::fs::read_dir(&logs)? {
        std::fs::remove_file(entry?.path())?;
    }
    let exe = std::env::current_exe()?;
    let pool = fresh_database(&args.database_url).await?;
    let database_durable = report::database_durable(&pool).await;
    say(&format!("database durable: {database_durable}"));
    let coordinator_addr = format!("127.0.0.1:{}", free_port()?);
    let provider_addr = format!("127.0.0.1:{}", free_port()?);
    let provider_url = format!("http://{provider_addr}/");
    let metrics_listen = match &args.metrics_listen {
        Some(m) => m.clone(),
        None => format!("127.0.0.1:{}", free_port()?),
    };
    let console_listen = if args.console {
        Some(format!("127.0.0.1:{}", free_port()?))
    } else {
        None
    };

    let mut provider_args: Vec<String> = vec![
        "fake-provider".into(),
        "--listen".into(),
        provider_addr.clone(),
        "--idempotency-retention".into(),
        humantime::format_duration(args.provider_retention).to_string(),
        "--pending-ratio".into(),
        args.pending_ratio.to_string(),
        "--pending-for".into(),
        "1s".into(),
        "--fault-cut-response".into(),
        args.fault_cut_response.to_string(),
        "--fault-lag".into(),
        args.fault_lag.to_string(),
        "--lag".into(),
        "2s".into(),
        "--fault-error-5xx".into(),
        args.fault_error_5xx.to_string(),
        "--fault-latency".into(),
        args.fault_latency.to_string(),
        "--latency".into(),
        "5s".into(),
        "--fault-hang".into(),
        args.fault_hang.to_string(),
    ];
    if let Some(seed) = args.seed {
        provider_args.extend(["--seed".into(), seed.to_string()]);
    }
    let provider = Proc::spawn("provider", &exe, &provider_args, &[], &logs)?;
    let provider_client = ProviderClient::new(provider_url.parse()?);
    wait_provider(&provider_client).await?;
    let coordinator = Proc::spawn(
        "coordinator",
        &exe,
        &coordinator_args(
            &args.database_url,
            &coordinator_addr,
            args.lease,
            args.resend_window,
            Some(&metrics_listen),
            console_listen.as_deref(),
        ),
        &[],
        &logs,
    )?;
    wait_coordinator(&coordinator_addr).await?;
    let mut cluster = Cluster {
        exe,
        logs: logs.clone(),
        db_url: args.database_url.clone(),
        coordinator_addr: coordinator_addr.clone(),
        provider_url: provider_url.clone(),
        coordinator,
        provider,
        workers: Vec::new(),
        lease: args.lease,
        resend_window: args.resend_window,
        metrics_listen: Some(metrics_listen.clone()),
        console_listen: console_listen.clone(),
    };
    say(&format!(
        "coordinator {coordinator_addr} (metrics http://{metrics_listen}/metrics), \
         fake provider {provider_addr}, logs in {}",
        logs.display()
    ));
    // On Ctrl-C or SIGTERM, still resume and stop every child (a frozen
    // worker would otherwise stay stopped for ever).
    let python_cmd = args.python.clone().unwrap_or_else(default_python);
    let interrupted = crate::server::shutdown_signal();
    tokio::pin!(interrupted);
    let outcome = tokio::select! {
        r = run_workload(&mut cluster, &pool, &args, started, &python_cmd) => r,
        _ = &mut interrupted => Err(anyhow::anyhow!("interrupted; stopping the demo's processes")),
    };
    let outcome_injected = outcome.as_ref().cloned().unwrap_or_default();
    for w in &mut cluster.workers {
        let _ = w.stop(Duration::from_secs(5)).await;
    }
    if outcome.is_err() {
        let _ = cluster.coordinator.stop(Duration::from_secs(10)).await;
        let _ = cluster.provider.stop(Duration::from_secs(5)).await;
        return outcome.map(|_| false);
    }
    let ledger = provider_client.ledger().await;
    if console_listen.is_none() {
        let _ = cluster.coordinator.stop(Duration::from_secs(10)).await;
    }
    let _ = cluster.provider.stop(Duration::from_secs(5)).await;
    outcome?;
    let mut report = Report::gather(&pool, &ledger?).await?;
    report.injected = outcome_injected;
    report.database_durable = database_durable;
    println!("{}", report.render());
    if let Some(console) = &console_listen {
        println!(
            "console: http://{console}/ shows this run (the coordinator stays up for it; \
             Ctrl-C stops it)"
        );
        let _ = std::io::stdout().flush();
        interrupted.await;
        let _ = cluster.coordinator.stop(Duration::from_secs(10)).await;
    }
    Ok(report.ok())
}

/// Enqueues the refunds, starts the workers, and drives the run.
async fn run_workload(
    cluster: &mut Cluster,
    pool: &MySqlPool,
    args: &DemoArgs,
    started: Instant,
    python_cmd: &std::path::Path,
) -> Result<Vec<String>> {
    // Every worker starts first and says so, then the refunds arrive: the
    // workers that boot fastest (or long-poll) would otherwise take them all
    // before the slower ones (Python and Node load their stubs) are up.
    for i in 1..=args.workers {
        let w = cluster.rust_worker(&format!("rust-{i}"), args.concurrency)?;
        cluster.workers.push(w);
    }
    if args.python_workers > 0 {
        let python = python_cmd;
        for i in 1..=args.python_workers {
            let name = format!("python-{i}");
            let script: Vec<String> = vec![
                "-m".into(),
                "jobfence_worker.refund_worker".into(),
                "--coordinator".into(),
                cluster.coordinator_addr.clone(),
                "--provider".into(),
                cluster.provider_url.clone(),
                "--worker-id".into(),
                name.clone(),
                "--queue".into(),
                QUEUE.into(),
                "--lease-seconds".into(),
                args.lease.as_secs().max(1).to_string(),
            ];
            // The package from its source tree (its dependencies are in
            // the venv scripts/python-env made).
            let path = [("PYTHONPATH", "python/src".to_owned())];
            cluster
                .workers
                .push(Proc::spawn(&name, python, &script, &path, &cluster.logs)?);
        }
    }
    for i in 1..=args.node_workers {
        let name = format!("node-{i}");
        let script: Vec<String> = vec![
            "sdk/node/src/refund_worker.js".into(),
            "--coordinator".into(),
            cluster.coordinator_addr.clone(),
            "--provider".into(),
            cluster.provider_url.clone(),
            "--worker-id".into(),
            name.clone(),
            "--queue".into(),
            QUEUE.into(),
            "--lease-seconds".into(),
            args.lease.as_secs().max(1).to_string(),
            "--concurrency".into(),
            args.concurrency.to_string(),
        ];
        cluster
            .workers
            .push(Proc::spawn(&name, &args.node, &script, &[], &cluster.logs)?);
    }
    wait_workers_started(&cluster.workers).await?;
    enqueue(&cluster.coordinator_addr, args.jobs).await?;
    say(&format!("enqueued {} refunds", args.jobs));

    drive(cluster, pool, args, started).await
}

/// Waits (up to 30 s) until every worker's log says it started.
async fn wait_workers_started(workers: &[Proc]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    for w in workers {
        loop {
            let log = std::fs::read_to_string(&w.log).unwrap_or_default();
            if log.contains("refund worker started")
                || log.contains("python refund worker")
                || log.contains("node refund worker")
            {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not start within 30 s; its log is {}",
                    w.name,
                    w.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// Runs the failure schedule and prints progress until every job is
/// finished (or the time is up).
async fn drive(
    cluster: &mut Cluster,
    pool: &MySqlPool,
    args: &DemoArgs,
    started: Instant,
) -> Result<Vec<String>> {
    let mut chaos: Vec<Chaos> = if args.chaos {
        vec![Chaos::Pause, Chaos::Kill, Chaos::Restart]
    } else {
        Vec::new()
    };
    let t0 = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last_line = Instant::now() - Duration::from_secs(10);
    let mut note = String::new();
    let mut injected = Vec::new();
    loop {
        for p in [&mut cluster.coordinator, &mut cluster.provider] {
            if let Some(status) = p.exited() {
                bail!(
                    "{} exited unexpectedly ({status}); see {}",
                    p.name,
                    p.log.display()
                );
            }
        }
        for w in &mut cluster.workers {
            if let Some(status) = w.exited() {
                if !status.success() && !note.contains(&w.name) {
                    note = format!("{} exited ({status}); see {}", w.name, w.log.display());
                }
            }
        }
        let mut i = 0;
        while i < chaos.len() {
            match chaos_step(cluster, pool, chaos[i].clone(), t0.elapsed()).await? {
                None => i += 1,
                Some((done, next)) => {
                    if tty {
                        eprintln!();
                    }
                    say(&format!("[{:>4}s] {done}", started.elapsed().as_secs()));
                    injected.push(done.clone());
                    note = done;
                    chaos.remove(i);
                    chaos.extend(next);
                }
            }
        }
        let states = report::states(pool).await?;
        let open =
            states.get("ready").copied().unwrap_or(0) + states.get("running").copied().unwrap_or(0);
        let line = format!(
            "[{:>4}s] {}",
            started.elapsed().as_secs(),
            ["ready", "running", "succeeded", "failed", "manual_review"]
                .iter()
                .map(|s| format!("{s} {}", states.get(*s).copied().unwrap_or(0)))
                .collect::<Vec<_>>()
                .join("  ")
        );
        if open == 0 {
            // Nothing left to disturb; a frozen worker still gets resumed
            // by its own step on the next turn.
            chaos.retain(|c| matches!(c, Chaos::Resume(_)));
        }
        if tty {
            eprint!("\r{line}  {note:<60}");
        } else if last_line.elapsed() >= Duration::from_secs(2) || open == 0 {
            eprintln!("{line}  {note}");
            last_line = Instant::now();
        }
        let _ = std::io::stderr().flush();
        if open == 0 && chaos.is_empty() {
            if tty {
                eprintln!();
            }
            return Ok(injected);
        }
        if t0.elapsed() > args.max_duration {
            if tty {
                eprintln!();
            }
            if chaos.iter().any(|c| matches!(c, Chaos::Resume(_))) {
                let _ = cluster.workers[0].resume();
            }
            say(&format!(
                "stopping after {}: jobs still open",
                humantime::format_duration(args.max_duration)
            ));
            return Ok(injected);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn say(msg: &str) {
    eprintln!("demo: {msg}");
}
