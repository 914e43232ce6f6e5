//! The `jobfence` command line. Every flag can also be set by the
//! `JOBFENCE_*` environment variable named in its help.

use crate::retention_cli::{prune, AbortOnDrop, PruneArgs, RetentionArgs};
use crate::security_cli::{CredentialsArgs, LimitsArgs, SecurityArgs};
use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use jobfence_core::batcher::BatchSettings;
use jobfence_core::long_poll::LongPollSettings;
use jobfence_core::{Coordinator, CoordinatorConfig};
use jobfence_domain::{CoordinatorError, QueuePolicies, QueuePolicy};
use jobfence_operator::{self as admin_cli, Operation};
use jobfence_server::{self as server, OpsOptions, ServeOptions};
use jobfence_store::shards::{Shards, ShardsConfig};
use jobfence_store::{JobStore, PoolSettings};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

/// The database of the project-local MariaDB that `scripts/mariadb` starts.
pub const DEFAULT_DATABASE_URL: &str = "mysql://jobfence:jobfence@127.0.0.1:3307/jobfence";

#[derive(Debug, Parser)]
#[command(
    name = "jobfence",
    version,
    long_version = env!("JOBFENCE_LONG_VERSION"),
    about = "Fenced job coordination over MySQL, served over gRPC"
)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "JOBFENCE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Threads running the async work. 1 (the default) runs everything on
    /// one thread: a coordinator mostly waits for the database, and on a
    /// small machine (or a VM) handing each call between threads costs more
    /// CPU than the call itself. Raise it when that one thread is busy
    /// (its CPU near 100 %).
    #[arg(
        long,
        global = true,
        env = "JOBFENCE_WORKER_THREADS",
        default_value_t = 1
    )]
    pub worker_threads: usize,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

// One value per process, parsed once: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the JobCoordinator gRPC API (with health and reflection).
    Serve(ServeArgs),
    /// Apply the schema migrations and exit.
    Migrate(DatabaseArgs),
    /// Prune finished jobs past their retention once, with their
    /// observations and events, keeping their operation keys (for cron;
    /// `serve` also prunes on an interval). Prints a progress line per
    /// batch; exit status 0 when every database was pruned, 2 when another
    /// coordinator was pruning one (it was left to it), 1 on an error.
    Prune(PruneArgs),
    #[cfg(feature = "tools")]
    /// Serve a fake Stripe-style refund API with fault injection, for the
    /// demo and tests (see docs/fake-provider.md).
    FakeProvider(jobfence_fake_provider::cli::FakeProviderArgs),
    #[cfg(feature = "tools")]
    /// The main job: coordinators behind HAProxy (TLS and tokens on), a
    /// fake provider, Rust, Python and Node refund workers, injected
    /// failures, and a report checked against the provider's ledger (exit
    /// status 1 if the invariant is violated).
    Demo(jobfence_tools::demo::DemoArgs),
    #[cfg(feature = "tools")]
    /// A refund worker: claims refunds and sends them to the provider.
    RefundWorker(jobfence_tools::refund_worker::RefundWorkerArgs),
    /// The operator commands (jobs, stats, events, providers,
    /// queue-policies): the crate jobfence-operator.
    #[command(flatten)]
    Operator(Operation),
    /// Issue credentials: a bearer token and its callers-file line, or a
    /// throw-away development CA with tokens (see docs/security.md).
    Credentials(CredentialsArgs),
    #[cfg(feature = "tools")]
    /// Measure the coordinator against workers running the SQL themselves,
    /// side by side on one database (see docs/benchmarks.md). A flag given
    /// twice takes its last value (scripts/bench passes defaults first).
    #[command(args_override_self = true)]
    Bench(jobfence_tools::bench::BenchArgs),
}

#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// MySQL/MariaDB URL; several, comma-separated, for the nodes of one
    /// Galera cluster in order of preference: the coordinator writes
    /// through the first node that is ready, moves to the next when that
    /// one stops answering or leaves the primary component, and back when
    /// it is synced again (docs/database.md).
    #[arg(long, env = "JOBFENCE_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    pub database_url: String,
    /// Spread queues over several databases: a file listing the databases
    /// (each one URL, or a Galera cluster's node URLs) and which queue
    /// lives on which (see docs/database.md, "Queues on several
    /// databases"). Replaces --database-url.
    #[arg(long, env = "JOBFENCE_SHARDS")]
    pub shards: Option<std::path::PathBuf>,
    /// `wsrep_sync_wait` of every session on a Galera node (ignored
    /// elsewhere): 1 makes every read wait until the node has applied what
    /// the cluster committed before it; 0 turns that off (docs/database.md,
    /// "Reads after writes").
    #[arg(long, env = "JOBFENCE_GALERA_SYNC_WAIT", default_value_t = 1)]
    pub galera_sync_wait: u8,
    /// Most database connections.
    #[arg(long, env = "JOBFENCE_DB_MAX_CONNECTIONS", default_value_t = 32)]
    pub db_max_connections: u32,
    /// How long a call waits for a database connection before it is
    /// answered UNAVAILABLE / DATABASE_UNAVAILABLE (nothing applied): while
    /// the database is down, calls fail this fast instead of hanging.
    #[arg(long, env = "JOBFENCE_DB_ACQUIRE_TIMEOUT", value_parser = humantime::parse_duration, default_value = "1s")]
    pub db_acquire_timeout: Duration,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
    /// Do not prune in this coordinator (another one, or `jobfence prune`
    /// from cron, does it). Pruning is on by default.
    #[arg(long, env = "JOBFENCE_PRUNE_OFF", default_value_t = false)]
    pub prune_off: bool,
    /// Time between two pruning runs of this coordinator (one coordinator
    /// of a database prunes at a time: a database lock decides).
    #[arg(long, env = "JOBFENCE_PRUNE_INTERVAL", value_parser = humantime::parse_duration, default_value = "60s")]
    pub prune_interval: Duration,
    #[command(flatten)]
    pub security: SecurityArgs,
    #[command(flatten)]
    pub limits: LimitsArgs,
    /// Address to listen on for gRPC.
    #[arg(long, env = "JOBFENCE_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Apply migrations before serving.
    #[arg(long, env = "JOBFENCE_MIGRATE", default_value_t = false)]
    pub migrate: bool,
    /// Lease given when a Claim or Takeover names none (e.g. 30s).
    #[arg(long, env = "JOBFENCE_DEFAULT_LEASE", value_parser = humantime::parse_duration, default_value = "30s")]
    pub default_lease: Duration,
    /// Shortest lease a worker may ask for.
    #[arg(long, env = "JOBFENCE_MIN_LEASE", value_parser = humantime::parse_duration, default_value = "1s")]
    pub min_lease: Duration,
    /// Longest lease a worker may ask for.
    #[arg(long, env = "JOBFENCE_MAX_LEASE", value_parser = humantime::parse_duration, default_value = "1h")]
    pub max_lease: Duration,
    /// Most jobs one Claim may take.
    #[arg(long, env = "JOBFENCE_MAX_CLAIM_BATCH", default_value_t = 100)]
    pub max_claim_batch: u32,
    /// Most items one EnqueueBatch may carry.
    #[arg(long, env = "JOBFENCE_MAX_ENQUEUE_BATCH", default_value_t = 1000)]
    pub max_enqueue_batch: usize,
    /// Most calls one database transaction serves: concurrent Completes,
    /// Fails and RenewLeases share a group commit, concurrent Claims of a
    /// queue one claim transaction, concurrent Enqueues one insert.
    #[arg(long, env = "JOBFENCE_BATCH_MAX", default_value_t = 64)]
    pub batch_max: usize,
    /// Most batches of each kind (write, claim, enqueue) running at once;
    /// each holds one database connection.
    #[arg(long, env = "JOBFENCE_BATCH_CONCURRENCY", default_value_t = 2)]
    pub batch_concurrency: usize,
    /// Most calls of each kind waiting for a batch; past it a call is
    /// refused at once with RESOURCE_EXHAUSTED / OVERLOADED.
    #[arg(long, env = "JOBFENCE_MAX_QUEUED_CALLS", default_value_t = 4096)]
    pub max_queued_calls: usize,
    /// Longest `wait` of a long-polling Claim (longer ones are cut to it).
    #[arg(long, env = "JOBFENCE_MAX_CLAIM_WAIT", value_parser = humantime::parse_duration, default_value = "30s")]
    pub max_claim_wait: Duration,
    /// How often a waiting Claim looks again when nothing woke it: the
    /// bound for work enqueued or released through another coordinator.
    #[arg(long, env = "JOBFENCE_CLAIM_POLL_INTERVAL", value_parser = humantime::parse_duration, default_value = "1s")]
    pub claim_poll_interval: Duration,
    /// Most long-polling Claims waiting at once; past it a Claim that
    /// finds nothing answers empty at once.
    #[arg(long, env = "JOBFENCE_MAX_CLAIM_WAITERS", default_value_t = 10_000)]
    pub max_claim_waiters: usize,
    /// Provider idempotency window, from the first dispatch: a resend is
    /// allowed only inside it (Stripe: 24h).
    #[arg(long, env = "JOBFENCE_RESEND_WINDOW", value_parser = humantime::parse_duration, default_value = "24h")]
    pub resend_window: Duration,
    /// Per-queue resend window, QUEUE=DURATION (repeatable; comma-separated in the env).
    #[arg(long, env = "JOBFENCE_QUEUE_RESEND_WINDOW", value_parser = parse_queue_duration, value_delimiter = ',')]
    pub queue_resend_window: Vec<(String, Duration)>,
    /// Most times a job is handed out with EXECUTE before a resend goes to
    /// manual review.
    #[arg(long, env = "JOBFENCE_MAX_DISPATCHES", default_value_t = 3)]
    pub max_dispatches: u32,
    /// Per-queue max dispatches, QUEUE=N (repeatable; comma-separated in the env).
    #[arg(long, env = "JOBFENCE_QUEUE_MAX_DISPATCHES", value_parser = parse_queue_count, value_delimiter = ',')]
    pub queue_max_dispatches: Vec<(String, u32)>,
    /// How often the database is pinged for the health status.
    #[arg(long, env = "JOBFENCE_HEALTH_INTERVAL", value_parser = humantime::parse_duration, default_value = "1s")]
    pub health_interval: Duration,
    /// How long one health check may take before the database counts as
    /// gone (at most --health-interval): health turns NOT_SERVING within
    /// interval + timeout of an outage.
    #[arg(long, env = "JOBFENCE_HEALTH_TIMEOUT", value_parser = humantime::parse_duration, default_value = "1s")]
    pub health_timeout: Duration,
    /// On SIGTERM: how long to report NOT_SERVING before closing the listener.
    #[arg(long, env = "JOBFENCE_DRAIN_DELAY", value_parser = humantime::parse_duration, default_value = "2s")]
    pub drain_delay: Duration,
    /// After the drain delay: how long in-flight calls may take before
    /// their connections are closed anyway.
    #[arg(long, env = "JOBFENCE_SHUTDOWN_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub shutdown_timeout: Duration,
    /// Address for the Prometheus endpoint (`GET /metrics` and `GET
    /// /healthz`, plain HTTP without authentication); off when unset. Keep
    /// it on loopback or a private network (a warning says so otherwise).
    #[arg(long, env = "JOBFENCE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the operator web console (plain HTTP) on this address; off
    /// when unset, 127.0.0.1:9465 when given without one. It has no login
    /// of its own (it acts with --console-token-file when --callers is
    /// given), so only loopback addresses are accepted.
    #[arg(long, env = "JOBFENCE_CONSOLE_LISTEN", num_args = 0..=1, default_missing_value = jobfence_console::DEFAULT_LISTEN)]
    pub console_listen: Option<SocketAddr>,
    /// How often the oldest-pending-age gauges are recomputed from the
    /// database (only with --metrics-listen).
    #[arg(long, env = "JOBFENCE_PENDING_REFRESH_INTERVAL", value_parser = humantime::parse_duration, default_value = "15s")]
    pub pending_refresh_interval: Duration,
    /// How often a caught-up WatchEvents stream looks for new events.
    #[arg(long, env = "JOBFENCE_EVENTS_POLL_INTERVAL", value_parser = humantime::parse_duration, default_value = "250ms")]
    pub events_poll_interval: Duration,
    /// Refuse to serve (exit non-zero) while the database's settings can
    /// lose an acknowledged commit (innodb_flush_log_at_trx_commit other
    /// than 1, sync_binlog other than 1 with the binary log on), instead of
    /// only logging a warning. Checked at start and at every health check.
    #[arg(
        long,
        env = "JOBFENCE_REQUIRE_DURABLE_DATABASE",
        default_value_t = false
    )]
    pub require_durable_database: bool,
    /// Tests only (hidden, and compiled into debug builds only, so a
    /// release binary cannot be started with it): name this API version in
    /// every answer's `jobfence-api-version` header instead of the real
    /// one, to see clients refuse a coordinator of another major version.
    /// It changes nothing else.
    #[cfg(debug_assertions)]
    #[arg(long, hide = true)]
    pub advertise_api_version: Option<String>,
}

fn parse_queue_duration(s: &str) -> Result<(String, Duration), String> {
    let (q, d) = s
        .split_once('=')
        .ok_or("expected QUEUE=DURATION, e.g. refunds=24h")?;
    Ok((
        q.to_owned(),
        humantime::parse_duration(d).map_err(|e| e.to_string())?,
    ))
}

fn parse_queue_count(s: &str) -> Result<(String, u32), String> {
    let (q, n) = s
        .split_once('=')
        .ok_or("expected QUEUE=N, e.g. refunds=5")?;
    Ok((q.to_owned(), n.parse().map_err(|e| format!("{e}"))?))
}

impl ServeArgs {
    /// The coordinator configuration these flags describe.
    pub fn coordinator_config(&self) -> CoordinatorConfig {
        let default = QueuePolicy {
            resend_window: self.resend_window,
            max_dispatches: self.max_dispatches,
        };
        let mut policies = QueuePolicies {
            default,
            ..Default::default()
        };
        for (q, w) in &self.queue_resend_window {
            policies
                .by_queue
                .entry(q.clone())
                .or_insert(default)
                .resend_window = *w;
        }
        for (q, n) in &self.queue_max_dispatches {
            policies
                .by_queue
                .entry(q.clone())
                .or_insert(default)
                .max_dispatches = *n;
        }
        CoordinatorConfig {
            default_lease: self.default_lease,
            min_lease: self.min_lease,
            max_lease: self.max_lease,
            max_claim_batch: self.max_claim_batch,
            max_enqueue_batch: self.max_enqueue_batch,
            policies,
            batching: BatchSettings {
                max_batch: self.batch_max,
                concurrency: self.batch_concurrency,
                queue_capacity: self.max_queued_calls,
            },
            long_poll: LongPollSettings {
                max_wait: self.max_claim_wait,
                poll_interval: self.claim_poll_interval,
                max_waiters: self.max_claim_waiters,
            },
        }
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("JOBFENCE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The databases the flags name: the shards file's, or `--database-url`
/// alone (database 0). Connects lazily; checks nothing yet.
pub fn open_shards(db: &DatabaseArgs) -> anyhow::Result<Shards> {
    let settings = PoolSettings {
        max_connections: db.db_max_connections,
        acquire_timeout: db.db_acquire_timeout,
        galera_sync_wait: db.galera_sync_wait,
    };
    let Some(path) = &db.shards else {
        let urls = split_urls(&db.database_url);
        return Ok(Shards::single(JobStore::open(&urls, &settings)?));
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the shards file {}", path.display()))?;
    let config = ShardsConfig::parse(&text)
        .map_err(|e| anyhow::anyhow!("shards file {}: {e}", path.display()))?;
    let mut stores = std::collections::BTreeMap::new();
    for (n, urls) in config.databases {
        stores.insert(n, JobStore::open(&urls, &settings)?);
    }
    Ok(Shards::new(stores, config.placement))
}

/// A comma-separated URL list.
fn split_urls(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Migrates every database (with `migrate`), then checks each one's number
/// (see `Shards::prepare`: one database alone must be database 0).
///
/// With `serving`, one database used alone that does not answer yet is
/// left to be checked when it does (as before numbers were checked, a
/// coordinator starts while its only database is down): returns true
/// then, for [`OpsOptions::check_shard_numbers`].
async fn prepare(shards: &Shards, migrate: bool, serving: bool) -> anyhow::Result<bool> {
    if migrate {
        for (n, store) in shards.all() {
            store
                .migrate()
                .await
                .with_context(|| format!("applying migrations to database {n}"))?;
        }
        tracing::info!("migrations applied");
    }
    match shards.prepare().await {
        Ok(()) => Ok(false),
        Err(
            e @ (CoordinatorError::DatabaseUnavailable(_)
            | CoordinatorError::TransactionConflict(_)
            | CoordinatorError::CommitOutcomeUnknown(_)),
        ) if serving && !shards.is_sharded() => {
            tracing::warn!(
                error = %e,
                "the database's shard number could not be read now (the database is down or busy): it is checked when it does answer"
            );
            Ok(true)
        }
        Err(e) => Err(anyhow::Error::new(e).context("checking the databases' shard numbers")),
    }
}

impl Cli {
    /// The Tokio runtime the command runs on (see `--worker-threads`).
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        if self.worker_threads <= 1 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(self.worker_threads)
                .enable_all()
                .build()
        }
    }
}

/// Runs the command line; the exit status is the command's answer (the
/// demo exits 1 when its invariant check fails), an error is printed by
/// `main`.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // Operator commands print to stdout and log nothing.
    let operation = match cli.command {
        Command::Operator(op) => op,
        Command::Credentials(a) => return crate::security_cli::run(a).map(|()| ExitCode::SUCCESS),
        server_command => {
            init_tracing(cli.log_format);
            return run_server(server_command).await;
        }
    };
    admin_cli::run(operation, &mut std::io::stdout()).await?;
    Ok(ExitCode::SUCCESS)
}

async fn run_server(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Migrate(db) => {
            let shards = open_shards(&db)?;
            prepare(&shards, true, false).await?;
        }
        Command::Prune(args) => {
            let settings = args.retention.settings(Duration::ZERO)?;
            let shards = open_shards(&args.database)?;
            prepare(&shards, false, false).await?;
            return prune(shards, settings).await;
        }
        Command::Serve(args) => {
            if jobfence_store::PAUSE_POINTS_COMPILED {
                // Not a warning: the test suite's own binary is such a build.
                tracing::info!(
                    "this binary was built with the test kit's pause points (a build of the \
                     whole workspace, `--workspace`, unifies the store's test feature into it); \
                     for production build it alone: cargo build --release --bin jobfence"
                );
            }
            let pruner = args.retention.settings(args.prune_interval)?;
            let security = args.security.security()?;
            let console_token = args.security.console_token()?;
            let limits = args.limits.limits(args.max_claim_wait)?;
            let shards = open_shards(&args.database)?;
            let check_shard_numbers = prepare(&shards, args.migrate, true).await?;
            let listener = tokio::net::TcpListener::bind(args.listen)
                .await
                .with_context(|| format!("binding {}", args.listen))?;
            let metrics_listener = match args.metrics_listen {
                Some(addr) => {
                    if !addr.ip().is_loopback() {
                        tracing::warn!(
                            listen = %addr,
                            "the metrics listener (/metrics, /healthz) is plain HTTP without \
                             authentication and not on loopback: keep it on a private network"
                        );
                    }
                    Some(
                        tokio::net::TcpListener::bind(addr)
                            .await
                            .with_context(|| format!("binding {addr} for /metrics"))?,
                    )
                }
                None => None,
            };
            let mut companions = Vec::new();
            if let Some(addr) = args.console_listen {
                jobfence_console::require_loopback(addr)?;
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding {addr} for the console"))?;
                let identity = jobfence_console::operator::Identity::for_coordinator(
                    security.auth.clone(),
                    console_token,
                )?;
                companions.push(jobfence_console::companion(listener, identity)?);
            }
            let coordinator = Coordinator::over_shards(shards, args.coordinator_config());
            // docs/design.md rule 13: a stored policy wins over the flags; say so
            // where they differ. A database that does not answer yet is
            // not waited for.
            if let Err(e) = coordinator.warn_flags_differ_from_stored().await {
                tracing::warn!(error = %e, "stored queue policies not compared with the flags");
            }
            let pruning = (!args.prune_off).then(|| {
                tracing::info!(
                    jobs = %humantime::format_duration(pruner.retention.jobs),
                    keys = %pruner.retention.keys.map_or("forever".into(), |k| humantime::format_duration(k).to_string()),
                    interval = %humantime::format_duration(pruner.interval),
                    archive_dir = ?pruner.archive_dir,
                    "pruning finished jobs past their retention"
                );
                coordinator.spawn_pruner(pruner)
            });
            let _stop_pruning = pruning.map(AbortOnDrop);
            let options = ServeOptions {
                health_interval: args.health_interval,
                health_timeout: args.health_timeout,
                drain_delay: args.drain_delay,
                shutdown_timeout: args.shutdown_timeout,
            };
            let ops = OpsOptions {
                metrics_listener,
                pending_refresh_interval: args.pending_refresh_interval,
                events_poll_interval: args.events_poll_interval,
                require_durable_database: args.require_durable_database,
                check_shard_numbers,
                security,
                limits,
                reflection: args.security.reflection,
                companions,
                #[cfg(debug_assertions)]
                advertised_api_version: args.advertise_api_version.clone(),
                #[cfg(not(debug_assertions))]
                advertised_api_version: None,
            };
            server::serve_with(
                coordinator,
                listener,
                options,
                ops,
                crate::signal::shutdown_signal(),
            )
            .await?;
        }
        Command::Operator(_) | Command::Credentials(_) => {
            unreachable!("operator commands are run by admin_cli")
        }
        #[cfg(feature = "tools")]
        Command::FakeProvider(args) => args.run(crate::signal::shutdown_signal()).await?,
        #[cfg(feature = "tools")]
        Command::RefundWorker(args) => args.run(crate::signal::shutdown_signal()).await?,
        #[cfg(feature = "tools")]
        Command::Bench(args) => jobfence_tools::bench::run(args).await?,
        #[cfg(feature = "tools")]
        Command::Demo(args) => {
            // The report is printed; a violated invariant is the exit
            // status, returned (not `process::exit`) so that the runtime
            // and the demo's children are dropped and stopped first.
            if !jobfence_tools::demo::run(args, crate::signal::shutdown_signal()).await? {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_commands_are_the_binarys_own() {
        // Flattened from jobfence-operator: parsed as before, with the
        // connection's flags after the subcommand.
        let cli = Cli::try_parse_from([
            "jobfence",
            "jobs",
            "list",
            "--endpoint",
            "127.0.0.1:1",
            "--json",
        ])
        .unwrap();
        match cli.command {
            Command::Operator(Operation::Jobs(a)) => {
                assert_eq!(a.conn.endpoint, "127.0.0.1:1");
                assert!(a.conn.json);
            }
            other => panic!("not jobs: {other:?}"),
        }
        let cli = Cli::try_parse_from(["jobfence", "queue-policy", "list"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Operator(Operation::QueuePolicies(_))
        ));
    }
}
