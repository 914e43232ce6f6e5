//! The demo's processes: how they are set up before the run (fresh
//! databases, credentials), started (the fake provider, the coordinators;
//! each binds port 0 and the address it got is read from its log), told
//! apart, and asked for the report at the end.

use super::coordinators::{self, Coordinators};
use super::credentials::{self, DemoCredentials};
use super::fairness::FairHandOut;
use super::report::{self, Report};
use super::{budget, chaos, databases, say, worker_logs, DemoArgs};
use crate::procs::{self, Proc};
use anyhow::{bail, Result};
use jobfence_fake_provider::ProviderClient;
use sqlx::mysql::MySqlPool;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The demo's processes.
pub(super) struct Cluster {
    pub(super) exe: PathBuf,
    pub(super) logs: PathBuf,
    pub(super) provider_url: String,
    pub(super) coordinators: Coordinators,
    pub(super) provider: Proc,
    pub(super) provider_client: ProviderClient,
    /// Where the first coordinator serves the console (`--console`).
    pub(super) console: Option<String>,
    /// Jobs the workers can hold at once, all together.
    pub(super) slots: usize,
    pub(super) workers: Vec<Proc>,
    pub(super) lease: Duration,
    /// Jobs each Rust worker (a replacement too) handles at once.
    pub(super) concurrency: u32,
    pub(super) credentials: Option<DemoCredentials>,
    /// The queues (one per database), handed to workers in turn
    /// ([`Cluster::queue_for_worker`]).
    pub(super) queues: Vec<String>,
    /// With --galera: the node control script, and a node restart under
    /// way.
    pub(super) galera: Option<PathBuf>,
    pub(super) node_restart: Option<tokio::process::Child>,
    /// When a worker was frozen (SIGSTOP) and resumed: what its calls
    /// cost is the freeze's, not another fault's that overlapped it.
    pub(super) frozen: Vec<worker_logs::Frozen>,
}

impl Cluster {
    /// The environment of a worker process of `caller` (its TLS and token).
    pub(super) fn client_env(&self, caller: &str) -> Vec<(&'static str, String)> {
        self.credentials
            .as_ref()
            .map(|c| c.client_env(caller))
            .unwrap_or_default()
    }

    /// The credentials of `caller` for a client in this process.
    pub(super) fn client(&self, caller: &str) -> Result<jobfence_worker::Credentials> {
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
    pub(super) fn queue_for_worker(&self, index: usize) -> String {
        let k = index.saturating_sub(1) % self.queues.len();
        self.queues[k].clone()
    }

    /// The queue for the next worker started.
    pub(super) fn next_queue(&self) -> String {
        self.queue_for_worker(self.workers.len())
    }

    /// A Rust worker on the next queue in turn.
    pub(super) fn rust_worker(&self, name: &str, concurrency: u32) -> Result<Proc> {
        self.rust_worker_on(name, concurrency, &self.next_queue())
    }

    /// A Rust worker on `queue` (a replacement takes over its
    /// predecessor's queue, which would otherwise be left without one).
    pub(super) fn rust_worker_on(&self, name: &str, concurrency: u32, queue: &str) -> Result<Proc> {
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

/// The `jobfence serve` flags of every demo coordinator (its addresses
/// and database come from [`Coordinators`]). Behind a load balancer a
/// coordinator drains for a second on SIGTERM (HAProxy takes it out within
/// two checks of 500 ms); alone it has no one to hand its callers to.
pub(super) fn serve_flags(
    lease: Duration,
    window: Duration,
    retention: Duration,
    archive: &std::path::Path,
    balanced: bool,
) -> Vec<String> {
    let retention = humantime::format_duration(retention).to_string();
    let archive = archive.display().to_string();
    [
        "--retention-jobs",
        &retention,
        "--prune-archive-dir",
        &archive,
        "--prune-interval",
        "1s",
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

pub(super) async fn wait_provider(client: &ProviderClient) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.health().await.is_err() {
        if Instant::now() > deadline {
            bail!("the fake provider did not come up within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
/// Where the demo's processes live and listen, decided before any starts.
pub(super) struct Setup {
    /// The running binary (`jobfence`), whose subcommands are the
    /// processes.
    pub(super) exe: PathBuf,
    pub(super) logs: PathBuf,
    /// The coordinators' prune archive (`--prune-archive-dir`), emptied
    /// at start.
    pub(super) archive: PathBuf,
    pub(super) databases: coordinators::Databases,
    pub(super) pools: Vec<MySqlPool>,
    pub(super) queues: Vec<String>,
    pub(super) credentials: Option<DemoCredentials>,
    pub(super) database_durable: String,
}

impl Setup {
    /// Fresh logs, fresh databases and throw-away credentials (unless
    /// `--insecure`).
    pub(super) async fn prepare(args: &DemoArgs) -> Result<Setup> {
        let logs = args.work_dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        for entry in std::fs::read_dir(&logs)? {
            std::fs::remove_file(entry?.path())?;
        }
        let archive = args.work_dir.join("archive");
        std::fs::create_dir_all(&archive)?;
        for entry in std::fs::read_dir(&archive)? {
            std::fs::remove_file(entry?.path())?;
        }
        let archive = std::fs::canonicalize(&archive)?;
        let (databases, pools, queues) =
            databases::prepare(&args.database_url, args.shards).await?;
        let credentials = if args.insecure {
            None
        } else {
            let c = DemoCredentials::create(&args.work_dir.join("credentials"), &queues)?;
            say(&format!(
                "TLS and authentication on; throw-away credentials in {}",
                c.files.dir.display()
            ));
            Some(c)
        };
        let database_durable = report::database_durable(&pools[0]).await;
        say(&format!("database durable: {database_durable}"));
        Ok(Setup {
            exe: std::env::current_exe()?,
            logs,
            archive,
            databases,
            pools,
            queues,
            credentials,
            database_durable,
        })
    }
}

impl Cluster {
    /// Starts the fake provider (with the plan's rate limit) and the
    /// coordinators (behind HAProxy when there are several), and says
    /// where they are.
    pub(super) async fn start(
        args: &DemoArgs,
        setup: &Setup,
        plan: &budget::Plan,
        slots: usize,
    ) -> Result<Cluster> {
        let (provider, provider_addr) = start_provider(args, setup, plan).await?;
        let provider_url = format!("http://{provider_addr}/");
        let provider_client = ProviderClient::new(provider_url.parse()?);
        wait_provider(&provider_client).await?;
        let coordinators = Coordinators::start(
            args.coordinators,
            &setup.databases,
            coordinators::Settings {
                credentials: setup.credentials.clone(),
                exe: setup.exe.clone(),
                logs: setup.logs.clone(),
                serve_flags: serve_flags(
                    args.lease,
                    args.resend_window,
                    args.retention,
                    &setup.archive,
                    args.coordinators > 1,
                ),
                console: args.console,
                first_only: match &setup.credentials {
                    Some(creds) if args.console => creds.console_flags(),
                    _ => Vec::new(),
                },
            },
            args.metrics_listen.as_deref(),
        )
        .await?;
        let cluster = Cluster {
            exe: setup.exe.clone(),
            logs: setup.logs.clone(),
            provider_url,
            console: coordinators.list[0].console.clone(),
            coordinators,
            provider,
            provider_client,
            slots,
            workers: Vec::new(),
            lease: args.lease,
            concurrency: args.concurrency,
            credentials: setup.credentials.clone(),
            queues: setup.queues.clone(),
            galera: args.galera.then(|| args.galera_script.clone()),
            node_restart: None,
            frozen: Vec::new(),
        };
        cluster.announce(&provider_addr.to_string());
        Ok(cluster)
    }

    /// One line: where every process serves, and where the logs are.
    pub(super) fn announce(&self, provider_addr: &str) {
        let serving = self
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
        let logs = self.logs.display();
        say(&if self.coordinators.balanced() {
            format!(
                "HAProxy {} in front of {serving}; fake provider {provider_addr}; logs in {logs}",
                self.coordinators.addr,
            )
        } else {
            format!("{serving}; fake provider {provider_addr}; logs in {logs}")
        });
    }

    /// After the run: the provider's ledger and counts, the processes
    /// stopped (the coordinators kept for the console), and the report.
    pub(super) async fn report(
        &mut self,
        setup: &Setup,
        args: &DemoArgs,
        plan: &budget::Plan,
        happened: &[chaos::Happened],
        bulk: Option<super::arrivals::BulkSent>,
    ) -> Result<Report> {
        // What each fault cost the workers: calls that still failed after
        // the clients' own retries, from their logs (now complete).
        let injected: Vec<String> = happened
            .iter()
            .filter(|h| h.storm.is_none())
            .map(|h| match h.window {
                Some(window) => {
                    let (logs, grace) = (&setup.logs, worker_logs::GRACE);
                    let failed = worker_logs::failures_between(logs, window, grace, &self.frozen);
                    let unclear =
                        worker_logs::unclear_claims_between(logs, window, grace, &self.frozen);
                    format!(
                        "{}; worker calls failed after retries: {failed}; claims left unclear \
                         (holding nothing, taken over after their lease): {unclear}",
                        h.what
                    )
                }
                None => h.what.clone(),
            })
            .map(|line| worker_logs::with_frozen_cost(line, &setup.logs, &self.frozen))
            .collect();
        let storm = happened.iter().find_map(|h| h.storm.clone());
        // The product's own settlement, while the coordinators and the
        // provider still run; the ledger is read after it (the injection
        // makes refunds).
        let settled = super::settle::run(self, args, &args.work_dir).await?;
        let ledger = self.provider_client.ledger().await;
        let provider_stats = self.provider_client.stats().await;
        let calls = self.coordinators.worker_calls().await;
        let workers_seen = super::seen::read(self).await;
        if self.console.is_none() {
            self.coordinators.stop().await;
        }
        let _ = self.provider.stop(Duration::from_secs(5)).await;
        if let Some(mut restart) = self.node_restart.take() {
            say("waiting for the killed Galera node to rejoin");
            let _ = restart.wait().await;
        }
        let mut report = Report::gather_all(&setup.pools, &ledger?).await?;
        let mut archived = super::archive::read(&setup.archive)?;
        report.check_archive(&archived);
        super::fairness::read_tables(&setup.pools, &mut archived.waits).await?;
        let bulk_refunds = args.bulk_refunds.unwrap_or(args.jobs);
        report.fair = Some(FairHandOut::of(&archived.waits, bulk_refunds, bulk));
        report.injected = injected;
        report.database_durable = setup.database_durable.clone();
        report.storm = storm;
        report.add_settlement(settled);
        report.calls = calls;
        report.workers_seen = workers_seen;
        report.provider = Some(report::ProviderSide {
            limit: plan.limit_text(),
            budget: plan.budget_text(),
            stats: provider_stats?,
        });
        Ok(report)
    }
}

/// Starts the fake provider on port 0, with the faults of `args` and the
/// plan's rate limit; the process and the address it printed.
async fn start_provider(
    args: &DemoArgs,
    setup: &Setup,
    plan: &budget::Plan,
) -> Result<(Proc, std::net::SocketAddr)> {
    let mut flags = provider_flags(args);
    flags.extend(plan.provider_flags());
    let mut provider = Proc::spawn("provider", &setup.exe, &flags, &[], &setup.logs)?;
    let addr = provider.listen_addr(procs::PROVIDER_LISTENING).await?;
    Ok((provider, addr))
}

/// The flags of the fake provider: port 0 and the faults of `args`.
fn provider_flags(args: &DemoArgs) -> Vec<String> {
    let mut flags: Vec<String> = vec![
        "fake-provider".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
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
        flags.extend(["--seed".into(), seed.to_string()]);
    }
    flags
}
