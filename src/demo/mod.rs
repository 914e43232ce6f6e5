//! `jobfence demo`: the main job. Starts a coordinator and a fake payment
//! provider, enqueues refunds, runs Rust, Python and Node workers on one
//! queue (one per database with --shards), and
//! makes the seed article's failures happen for real: a worker frozen past
//! its lease and resumed after the takeover, a worker killed mid-request,
//! responses cut after the refund was made, read-after-write lag, 503s, a
//! coordinator restart, and with --galera the database node the
//! coordinators write through killed, and a takeover storm: every
//! coordinator stopped for longer than the lease. The provider has a rate
//! limit, and the queue a provider budget under it (`budget.rs`), so the
//! storm's flood reaches the provider at the budget's pace (`--no-budget`:
//! as fast as the workers go, and the provider answers 429). It ends with a
//! report whose last line is `invariant: OK` or `invariant: VIOLATED (…)`,
//! checked against the provider's own ledger.

mod arrivals;
pub mod budget;
mod chaos;
pub mod coordinators;
pub mod credentials;
mod databases;
pub mod procs;
pub mod report;
mod worker_logs;

use crate::provider::ProviderClient;
use anyhow::{bail, Result};
use arrivals::Arrivals;
use chaos::{chaos_step, Chaos};
use clap::Args;
use coordinators::Coordinators;
use credentials::DemoCredentials;
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
    /// The refunds arrive evenly over this long (`0s`: all at once), so the
    /// failures happen while work flows. 30 s: every failure of the
    /// schedule, the takeover storm included, happens while refunds still
    /// arrive, at a pace (about 67/s) the budget carries with room to spare.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub arrival: Duration,
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
    /// Jobs each Rust and Node worker handles at once (the Python worker
    /// claims 4 and handles them in turn). 16: together the workers can
    /// send well past the provider's limit, which is what a budget is for.
    #[arg(long, default_value_t = 16)]
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
    /// The fake provider's rate limit: requests per second, every endpoint
    /// together, answered 429 past it (its burst: one second's worth, or
    /// more if the workers could otherwise outrun it). 200: the refunds'
    /// own pace (about 80 requests/s with their reconciles and resends,
    /// some 95 budget units/s) takes 60% of the budget of 80% of it, which
    /// leaves room to work off the backlog each failure leaves; and the
    /// workers together can go about twice as fast, so the flood after the
    /// takeover storm meets 429s without a budget.
    #[arg(long, default_value_t = 200.0)]
    pub provider_rate_limit: f64,
    /// Run without the provider budget: the queue dispatches to the
    /// provider as fast as the workers take jobs, and the report counts the
    /// 429s. By default the demo puts a budget of 80% of
    /// --provider-rate-limit on its queue (JobAdmin PutProvider; execute 1
    /// unit, reconcile 2, what the refund workers can spend per hand-out).
    #[arg(long)]
    pub no_budget: bool,
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
    /// Coordinators to run. With more than one they sit behind HAProxy
    /// (installed by scripts/demo), the workers call HAProxy, and the
    /// failures add a rolling restart of every coordinator, a SIGKILL of
    /// one, and the database cut off for a few seconds.
    #[arg(long, default_value_t = 2)]
    pub coordinators: u32,
    /// Run the coordinators without TLS and authentication. By default the
    /// demo makes throw-away credentials (a CA, the coordinators'
    /// certificate, one token per kind of caller) in <work-dir>/credentials
    /// and runs with both on.
    #[arg(long)]
    pub insecure: bool,
    /// The database is a Galera cluster: --database-url lists its nodes,
    /// comma-separated, and the coordinators write through the first. The
    /// failures then include a SIGKILL of that node under load (with
    /// --galera-script), started again afterwards.
    #[arg(long)]
    pub galera: bool,
    /// What kills and restarts a Galera node (`SCRIPT kill 1`, `SCRIPT
    /// restart 1`).
    #[arg(long, default_value = "scripts/galera")]
    pub galera_script: PathBuf,
    /// Spread the refunds over this many databases on the server of
    /// --database-url (the demo database, then `<name>_s1`, …), one queue
    /// on each (`refunds`, `refunds-1`, …), each coordinator given all of
    /// them in a shards file.
    #[arg(long, default_value_t = 1)]
    pub shards: u32,
}

/// The demo's processes.
struct Cluster {
    exe: PathBuf,
    logs: PathBuf,
    provider_url: String,
    coordinators: Coordinators,
    provider: Proc,
    provider_client: ProviderClient,
    /// Jobs the workers can hold at once, all together.
    slots: usize,
    workers: Vec<Proc>,
    lease: Duration,
    /// Jobs each Rust worker (a replacement too) handles at once.
    concurrency: u32,
    credentials: Option<DemoCredentials>,
    /// The queues (one per database), handed to workers in turn
    /// ([`Cluster::queue_for_worker`]).
    queues: Vec<String>,
    /// With --galera: the node control script, and a node restart under
    /// way.
    galera: Option<PathBuf>,
    node_restart: Option<tokio::process::Child>,
}

impl Cluster {
    /// The environment of a worker process of `caller` (its TLS and token).
    fn client_env(&self, caller: &str) -> Vec<(&'static str, String)> {
        self.credentials
            .as_ref()
            .map(|c| c.client_env(caller))
            .unwrap_or_default()
    }

    /// The credentials of `caller` for a client in this process.
    fn client(&self, caller: &str) -> Result<jobfence_worker::Credentials> {
        match &self.credentials {
            Some(c) => c.client(caller),
            None => Ok(jobfence_worker::Credentials::default()),
        }
    }

    /// The queue of the worker at `index` of `workers`: the first two
    /// share the first queue (the first is frozen on the way, and its jobs
    /// need someone to take them over), the others go round the queues
    /// from the second. A queue of its own for each would leave the frozen
    /// worker's queue, or the killed one's, unserved.
    fn queue_for_worker(&self, index: usize) -> String {
        let k = index.saturating_sub(1) % self.queues.len();
        self.queues[k].clone()
    }

    /// The queue for the next worker started.
    fn next_queue(&self) -> String {
        self.queue_for_worker(self.workers.len())
    }

    /// A Rust worker on the next queue in turn.
    fn rust_worker(&self, name: &str, concurrency: u32) -> Result<Proc> {
        self.rust_worker_on(name, concurrency, &self.next_queue())
    }

    /// A Rust worker on `queue` (a replacement takes over its
    /// predecessor's queue, which would otherwise be left without one).
    fn rust_worker_on(&self, name: &str, concurrency: u32, queue: &str) -> Result<Proc> {
        let args: Vec<String> = [
            "refund-worker",
            "--coordinator",
            &format!("http://{}", self.coordinators.addr),
            "--provider",
            &self.provider_url,
            "--worker-id",
            name,
            "--queue",
            queue,
            "--concurrency",
            &concurrency.to_string(),
            "--lease",
            &humantime::format_duration(self.lease).to_string(),
        ]
        .map(String::from)
        .to_vec();
        let env = self.client_env(credentials::RUST_WORKERS);
        Proc::spawn(name, &self.exe, &args, &env, &self.logs)
    }
}

/// The demo's queue (the first of them, with --shards).
const QUEUE: &str = "refunds";

/// The `jobfence serve` flags of every demo coordinator (its addresses
/// and database come from [`Coordinators`]). Behind a load balancer a
/// coordinator drains for a second on SIGTERM (HAProxy takes it out within
/// two checks of 500 ms); alone it has no one to hand its callers to.
fn serve_flags(lease: Duration, window: Duration, balanced: bool) -> Vec<String> {
    [
        "--default-lease",
        &humantime::format_duration(lease).to_string(),
        "--min-lease",
        "1s",
        "--resend-window",
        &humantime::format_duration(window).to_string(),
        "--drain-delay",
        if balanced { "1s" } else { "0s" },
        "--health-interval",
        "200ms",
        "--health-timeout",
        "200ms",
        "--shutdown-timeout",
        "2s",
    ]
    .map(String::from)
    .to_vec()
}

/// Waits (up to 30 s) until the coordinator at `addr` reports SERVING;
/// `credentials` give the TLS to speak (health needs no token).
pub async fn wait_coordinator(
    addr: &str,
    credentials: &jobfence_worker::Credentials,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(ch) = credentials
            .endpoint(format!("http://{addr}"))?
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

/// The Rust workers the demo starts: `--workers`, or with several
/// databases enough for every queue to have one and the first two.
fn rust_workers(args: &DemoArgs, queues: usize) -> u32 {
    if queues > 1 {
        let others = args.python_workers + args.node_workers;
        args.workers
            .max((queues as u32 + 1).saturating_sub(others))
            .max(2)
    } else {
        args.workers
    }
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
    let (databases, pools, queues) = databases::prepare(&args.database_url, args.shards).await?;
    let pool = pools[0].clone();
    let demo_credentials = if args.insecure {
        None
    } else {
        let c = DemoCredentials::create(&args.work_dir.join("credentials"), &queues)?;
        say(&format!(
            "TLS and authentication on; throw-away credentials in {}",
            c.files.dir.display()
        ));
        Some(c)
    };
    let database_durable = report::database_durable(&pool).await;
    say(&format!("database durable: {database_durable}"));
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
    let fleet = budget::Fleet {
        rust: rust_workers(&args, queues.len()),
        python: args.python_workers,
        node: args.node_workers,
        concurrency: args.concurrency,
    };
    let plan = budget::Plan::new(
        args.provider_rate_limit,
        !args.no_budget,
        queues.len() as u32,
        fleet,
    )?;
    provider_args.extend(plan.provider_flags());
    let provider = Proc::spawn("provider", &exe, &provider_args, &[], &logs)?;
    let provider_client = ProviderClient::new(provider_url.parse()?);
    wait_provider(&provider_client).await?;
    let mut first_only = Vec::new();
    if let Some(c) = &console_listen {
        first_only.extend(["--console-listen".to_owned(), c.clone()]);
        if let Some(creds) = &demo_credentials {
            first_only.extend(creds.console_flags());
        }
    }
    let coordinators = Coordinators::start(
        args.coordinators,
        &databases,
        coordinators::Settings {
            credentials: demo_credentials.clone(),
            exe: exe.clone(),
            logs: logs.clone(),
            serve_flags: serve_flags(args.lease, args.resend_window, args.coordinators > 1),
            first_only,
        },
        Some(&metrics_listen),
    )
    .await?;
    let mut cluster = Cluster {
        exe,
        logs: logs.clone(),
        provider_url: provider_url.clone(),
        coordinators,
        provider,
        provider_client: provider_client.clone(),
        slots: fleet.slots() as usize,
        workers: Vec::new(),
        lease: args.lease,
        concurrency: args.concurrency,
        credentials: demo_credentials,
        queues,
        galera: args.galera.then(|| args.galera_script.clone()),
        node_restart: None,
    };
    let serving = cluster
        .coordinators
        .list
        .iter()
        .map(|c| {
            format!(
                "{} {} (metrics http://{}/metrics)",
                c.name, c.grpc, c.metrics
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    say(&if cluster.coordinators.balanced() {
        format!(
            "HAProxy {} in front of {serving}; fake provider {provider_addr}; logs in {}",
            cluster.coordinators.addr,
            logs.display()
        )
    } else {
        format!(
            "{serving}; fake provider {provider_addr}; logs in {}",
            logs.display()
        )
    });
    // The budget goes on before any worker starts: every hand-out is under
    // it from the first.
    plan.put(
        &cluster.coordinators.addr,
        &cluster.client(credentials::CONSOLE)?,
        credentials::CONSOLE,
        &cluster.queues,
    )
    .await?;
    say(&format!(
        "fake provider limit {}; provider budget {}",
        plan.limit_text(),
        plan.budget_text()
    ));
    // On Ctrl-C or SIGTERM, still resume and stop every child (a frozen
    // worker would otherwise stay stopped for ever).
    let python_cmd = args.python.clone().unwrap_or_else(default_python);
    let interrupted = crate::signal::shutdown_signal();
    tokio::pin!(interrupted);
    let outcome = tokio::select! {
        r = run_workload(&mut cluster, &pools, &args, started, &python_cmd) => r,
        _ = &mut interrupted => Err(anyhow::anyhow!("interrupted; stopping the demo's processes")),
    };
    for w in &mut cluster.workers {
        let _ = w.stop(Duration::from_secs(5)).await;
    }
    // What each fault cost the workers: calls that still failed after the
    // clients' own retries, from their logs (now complete).
    let outcome_injected: Vec<String> = match &outcome {
        Ok(happened) => happened
            .iter()
            .filter(|h| h.storm.is_none())
            .map(|h| match h.window {
                Some((from, to)) => format!(
                    "{}; worker calls failed after retries: {}",
                    h.what,
                    worker_logs::failures_between(&logs, from, to, Duration::from_secs(1))
                ),
                None => h.what.clone(),
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    if outcome.is_err() {
        cluster.coordinators.stop().await;
        let _ = cluster.provider.stop(Duration::from_secs(5)).await;
        return outcome.map(|_| false);
    }
    let storm = match &outcome {
        Ok(happened) => happened.iter().find_map(|h| h.storm.clone()),
        Err(_) => None,
    };
    let ledger = provider_client.ledger().await;
    let provider_stats = provider_client.stats().await;
    if console_listen.is_none() {
        cluster.coordinators.stop().await;
    }
    let _ = cluster.provider.stop(Duration::from_secs(5)).await;
    outcome?;
    if let Some(mut restart) = cluster.node_restart.take() {
        say("waiting for the killed Galera node to rejoin");
        let _ = restart.wait().await;
    }
    let mut report = Report::gather_all(&pools, &ledger?).await?;
    report.injected = outcome_injected;
    report.database_durable = database_durable;
    report.storm = storm;
    report.provider = Some(report::ProviderSide {
        limit: plan.limit_text(),
        budget: plan.budget_text(),
        stats: provider_stats?,
    });
    println!("{}", report.render());
    if let Some(console) = &console_listen {
        println!(
            "console: http://{console}/ shows this run (the coordinator stays up for it; \
             Ctrl-C stops it)"
        );
        let _ = std::io::stdout().flush();
        interrupted.await;
        cluster.coordinators.stop().await;
    }
    Ok(report.ok())
}

/// Enqueues the refunds, starts the workers, and drives the run.
async fn run_workload(
    cluster: &mut Cluster,
    pool: &[MySqlPool],
    args: &DemoArgs,
    started: Instant,
    python_cmd: &std::path::Path,
) -> Result<Vec<chaos::Happened>> {
    // Every worker starts first and says so, then the refunds arrive: the
    // workers that boot fastest (or long-poll) would otherwise take them all
    // before the slower ones (Python and Node load their stubs) are up.
    // Spread over several databases, every queue gets a worker, and the
    // first queue two (see `Cluster::queue_for_worker`).
    let rust_workers = rust_workers(args, cluster.queues.len());
    for i in 1..=rust_workers {
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
                cluster.coordinators.addr.clone(),
                "--provider".into(),
                cluster.provider_url.clone(),
                "--worker-id".into(),
                name.clone(),
                "--queue".into(),
                cluster.next_queue(),
                "--lease-seconds".into(),
                args.lease.as_secs().max(1).to_string(),
                "--batch".into(),
                budget::PYTHON_BATCH.to_string(),
            ];
            // The package from its source tree (its dependencies are in
            // the venv scripts/python-env made).
            let mut env = vec![("PYTHONPATH", "python/src".to_owned())];
            env.extend(cluster.client_env(credentials::PYTHON_WORKERS));
            cluster
                .workers
                .push(Proc::spawn(&name, python, &script, &env, &cluster.logs)?);
        }
    }
    for i in 1..=args.node_workers {
        let name = format!("node-{i}");
        let script: Vec<String> = vec![
            "sdk/node/src/refund_worker.js".into(),
            "--coordinator".into(),
            cluster.coordinators.addr.clone(),
            "--provider".into(),
            cluster.provider_url.clone(),
            "--worker-id".into(),
            name.clone(),
            "--queue".into(),
            cluster.next_queue(),
            "--lease-seconds".into(),
            args.lease.as_secs().max(1).to_string(),
            "--concurrency".into(),
            args.concurrency.to_string(),
        ];
        let env = cluster.client_env(credentials::NODE_WORKERS);
        cluster.workers.push(Proc::spawn(
            &name,
            &args.node,
            &script,
            &env,
            &cluster.logs,
        )?);
    }
    wait_workers_started(&mut cluster.workers).await?;
    let mut arrivals = Arrivals::start(
        &cluster.coordinators.addr,
        &cluster.client(credentials::PRODUCER)?,
        args.jobs,
        args.arrival,
        cluster.queues.clone(),
    )?;
    say(&format!(
        "{} refunds arriving over {}",
        args.jobs,
        humantime::format_duration(args.arrival)
    ));
    drive(cluster, pool, args, started, &mut arrivals).await
}

/// Waits (up to 30 s) until every worker's log says it started.
async fn wait_workers_started(workers: &mut [Proc]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    for w in workers {
        loop {
            if let Some(status) = w.exited() {
                let log = std::fs::read_to_string(&w.log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                bail!(
                    "{} exited at start ({status}); the end of its log ({}):\n{}",
                    w.name,
                    w.log.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
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
    pool: &[MySqlPool],
    args: &DemoArgs,
    started: Instant,
    arrivals: &mut Arrivals,
) -> Result<Vec<chaos::Happened>> {
    let mut arrived = false;
    let mut chaos: Vec<Chaos> = match (args.chaos, cluster.coordinators.balanced()) {
        (false, _) => Vec::new(),
        (true, false) if cluster.galera.is_some() => vec![
            Chaos::Pause,
            Chaos::Kill,
            Chaos::KillNode(Duration::from_secs(4)),
        ],
        (true, false) => vec![Chaos::Pause, Chaos::Kill, Chaos::Restart],
        // The rolling restart leads to a coordinator's kill, then to the
        // database outage: one disturbance of the coordinators at a time.
        (true, true) => vec![Chaos::Pause, Chaos::Kill, Chaos::RollingRestart],
    };
    let t0 = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last_line = Instant::now() - Duration::from_secs(10);
    let mut note = String::new();
    let mut injected = Vec::new();
    loop {
        if let Some(status) = cluster.provider.exited() {
            bail!(
                "the provider exited unexpectedly ({status}); see {}",
                cluster.provider.log.display()
            );
        }
        if let Some((name, status, log)) = cluster.coordinators.exited() {
            bail!(
                "{name} exited unexpectedly ({status}); see {}",
                log.display()
            );
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
                Some(happened) => {
                    if tty {
                        eprintln!();
                    }
                    say(&format!(
                        "[{:>4}s] {}",
                        started.elapsed().as_secs(),
                        happened.what
                    ));
                    note = happened.what.clone();
                    chaos.remove(i);
                    chaos.extend(happened.next.clone());
                    injected.push(happened);
                }
            }
        }
        if !arrived && arrivals.done().await? {
            arrived = true;
            if tty {
                eprintln!();
            }
            say(&format!(
                "[{:>4}s] all {} refunds enqueued in {:.1} s ({} EnqueueBatch calls retried)",
                started.elapsed().as_secs(),
                arrivals.total,
                arrivals.took.unwrap_or_default().as_secs_f64(),
                arrivals.retried()
            ));
        }
        let states = report::states_all(pool).await?;
        let mut open =
            states.get("ready").copied().unwrap_or(0) + states.get("running").copied().unwrap_or(0);
        if !arrived {
            open += 1;
        }
        let line = format!(
            "[{:>4}s] {}{}",
            started.elapsed().as_secs(),
            if arrived {
                String::new()
            } else {
                format!("arrived {}/{}  ", arrivals.arrived(), arrivals.total)
            },
            ["ready", "running", "succeeded", "failed", "manual_review"]
                .iter()
                .map(|s| format!("{s} {}", states.get(*s).copied().unwrap_or(0)))
                .collect::<Vec<_>>()
                .join("  ")
        );
        if open == 0 {
            // Nothing left to disturb; a frozen worker still gets resumed
            // by its own step on the next turn, and a storm's end is still
            // measured.
            chaos.retain(|c| matches!(c, Chaos::Resume(_) | Chaos::StormDrain(_)));
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
