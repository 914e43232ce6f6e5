//! `jobfence serve`: its flags, and the coordinator they assemble, step
//! by step: the settings checked first, then the databases, the listeners
//! (gRPC, `/metrics`, the console), the pruner, served until a signal
//! stops it.

use crate::cli::{open_shards, prepare, DatabaseArgs};
use crate::retention_cli::{AbortOnDrop, RetentionArgs};
use crate::security_cli::{LimitsArgs, SecurityArgs};
use anyhow::Context;
use clap::Args;
use jobfence_core::batcher::BatchSettings;
use jobfence_core::long_poll::LongPollSettings;
use jobfence_core::retention::PrunerSettings;
use jobfence_core::{Coordinator, CoordinatorConfig};
use jobfence_domain::{QueuePolicies, QueuePolicy};
use jobfence_server::{self as server, Companion, OpsOptions, Security, ServeOptions};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;

/// The flags of `jobfence serve`.
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
    /// This coordinator's name in the workers view (`jobfence workers`,
    /// the console's Workers page); by default the host and the gRPC port.
    #[arg(long, env = "JOBFENCE_COORDINATOR_NAME")]
    pub coordinator_name: Option<String>,
    /// Apply migrations before serving. Without it a coordinator refuses
    /// to start on a database that lacks one of its migrations (and says
    /// which, and to run `jobfence migrate`).
    #[arg(long, env = "JOBFENCE_MIGRATE", default_value_t = false)]
    pub migrate: bool,
    /// Rolling upgrades: how long no coordinator of an older release may
    /// be seen (by its heartbeat, or its database sessions) before the
    /// newest coordinator brings the data forward that the older one kept
    /// differently (a schema transition's backfill, once; docs/operating.md
    /// "Upgrading").
    #[arg(long, env = "JOBFENCE_UPGRADE_QUIET_PERIOD", value_parser = humantime::parse_duration, default_value = "60s")]
    pub upgrade_quiet_period: Duration,
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
    #[arg(long, env = "JOBFENCE_MAX_CLAIM_BATCH", value_parser = clap::value_parser!(u32).range(1..), default_value_t = 100)]
    pub max_claim_batch: u32,
    /// Most items one EnqueueBatch may carry.
    #[arg(long, env = "JOBFENCE_MAX_ENQUEUE_BATCH", value_parser = crate::cli::at_least_one(), default_value_t = 1000)]
    pub max_enqueue_batch: usize,
    /// Most calls one database transaction serves: concurrent Completes,
    /// Fails and RenewLeases share a group commit, concurrent Claims of a
    /// queue one claim transaction, concurrent Enqueues one insert.
    #[arg(long, env = "JOBFENCE_BATCH_MAX", value_parser = crate::cli::at_least_one(), default_value_t = 64)]
    pub batch_max: usize,
    /// Most batches of each kind (write, claim, enqueue) running at once;
    /// each holds one database connection.
    #[arg(long, env = "JOBFENCE_BATCH_CONCURRENCY", value_parser = crate::cli::at_least_one(), default_value_t = 2)]
    pub batch_concurrency: usize,
    /// Most calls of each kind waiting for a batch; past it a call is
    /// refused at once with RESOURCE_EXHAUSTED / OVERLOADED.
    #[arg(long, env = "JOBFENCE_MAX_QUEUED_CALLS", value_parser = crate::cli::at_least_one(), default_value_t = 4096)]
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
    /// Export every RPC's span over OTLP/gRPC to this collector (e.g.
    /// http://127.0.0.1:4317), and make a call's span a child of the W3C
    /// `traceparent` its caller sent (docs/operating.md "Tracing"). Off
    /// when unset.
    #[arg(long, env = "JOBFENCE_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
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
    /// Checks what `serve` checks before it binds or connects: the
    /// retention, security and limit settings, the console's address, the
    /// database URLs (with `--database-password-file`) and the shards
    /// file. `jobfence config check` runs it too.
    pub fn check(&self) -> anyhow::Result<()> {
        self.retention.settings(self.prune_interval)?;
        self.security.security()?;
        self.security.console_token()?;
        self.limits.limits(self.max_claim_wait)?;
        if let Some(addr) = self.console_listen {
            jobfence_console::require_loopback(addr)?;
        }
        drop(open_shards(&self.database, None)?);
        Ok(())
    }

    /// The coordinator configuration these flags describe.
    pub fn coordinator_config(&self, name: String) -> CoordinatorConfig {
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
            name,
        }
    }

    /// This coordinator's name: `--coordinator-name`, by default the host
    /// and the gRPC port it listens on.
    fn name(&self, port: u16) -> String {
        self.coordinator_name
            .clone()
            .unwrap_or_else(|| format!("{}:{port}", jobfence_core::host_name()))
    }
}

/// `jobfence serve`: checks every setting, opens and prepares the
/// databases, binds the listeners, and serves until a signal stops it (the
/// pruner, if any, stops with it).
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // The first line: what runs (`jobfence_build_info` says it again).
    tracing::info!(
        release = jobfence_store::schema::RELEASE,
        schema_version = jobfence_store::schema::schema_version(),
        api_version = jobfence_api::VERSION,
        "jobfence coordinator"
    );
    note_pause_points();
    let pruner = args.retention.settings(args.prune_interval)?;
    let security = args.security.security()?;
    let console_token = args.security.console_token()?;
    let limits = args.limits.limits(args.max_claim_wait)?;
    // Bound first: by default the coordinator is named by its port.
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let port = listener
        .local_addr()
        .map_or(args.listen.port(), |a| a.port());
    let name = args.name(port);
    // Every listener before the databases: a mistake in one stops the
    // start before `--migrate` changes a schema.
    let metrics_listener = bind_metrics(args.metrics_listen).await?;
    let companions = console(args.console_listen, &security, console_token).await?;
    let shards = open_shards(&args.database, Some(name.clone()))?;
    let check_shard_numbers = prepare(&shards, args.migrate, true).await?;
    let coordinator = Coordinator::over_shards(shards, args.coordinator_config(name));
    // docs/design.md rule 13: a stored policy wins over the flags; say so
    // where they differ. A database that does not answer yet is
    // not waited for.
    if let Err(e) = coordinator.warn_flags_differ_from_stored().await {
        tracing::warn!(error = %e, "stored queue policies not compared with the flags");
    }
    let _stop_pruning = (!args.prune_off).then(|| start_pruning(&coordinator, pruner));
    // The workers view (docs/operating.md "Workers"): what this
    // coordinator saw, written every 5 s.
    let _stop_sightings = AbortOnDrop(coordinator.spawn_worker_sightings());
    // Rolling upgrades (docs/operating.md "Upgrading"): the heartbeat,
    // older coordinators looked for, transitions brought forward.
    let _stop_fleet = AbortOnDrop(coordinator.spawn_fleet(args.upgrade_quiet_period));
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
        trace_context: args.otlp_endpoint.is_some(),
    };
    server::serve_with(
        coordinator,
        listener,
        options,
        ops,
        crate::signal::shutdown_signal(),
    )
    .await?;
    Ok(())
}

/// Says when this binary carries the test kit's pause points.
fn note_pause_points() {
    if jobfence_store::PAUSE_POINTS_COMPILED {
        // Not a warning: the test suite's own binary is such a build.
        tracing::info!(
            "this binary was built with the test kit's pause points (a build of the \
             whole workspace, `--workspace`, unifies the store's test feature into it); \
             for production build it alone: cargo build --release --bin jobfence"
        );
    }
}

/// The `/metrics` listener, if `--metrics-listen` asks for one; a warning
/// when it is not on loopback (it is plain HTTP without authentication).
async fn bind_metrics(listen: Option<SocketAddr>) -> anyhow::Result<Option<TcpListener>> {
    let Some(addr) = listen else {
        return Ok(None);
    };
    if !addr.ip().is_loopback() {
        tracing::warn!(
            listen = %addr,
            "the metrics listener (/metrics, /healthz) is plain HTTP without \
             authentication and not on loopback: keep it on a private network"
        );
    }
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr} for /metrics"))?;
    Ok(Some(listener))
}

/// The operator console as the server's companion, if `--console-listen`
/// asks for it: on loopback only, acting with `--console-token-file` when
/// the coordinator authenticates.
async fn console(
    listen: Option<SocketAddr>,
    security: &Security,
    token: Option<String>,
) -> anyhow::Result<Vec<Companion>> {
    let Some(addr) = listen else {
        return Ok(Vec::new());
    };
    jobfence_console::require_loopback(addr)?;
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr} for the console"))?;
    let identity =
        jobfence_console::operator::Identity::for_coordinator(security.auth.clone(), token)?;
    Ok(vec![jobfence_console::companion(listener, identity)?])
}

/// Starts this coordinator's pruner (docs/design.md rule 14), which stops
/// when the value returned is dropped.
fn start_pruning(coordinator: &Coordinator, pruner: PrunerSettings) -> AbortOnDrop {
    tracing::info!(
        jobs = %humantime::format_duration(pruner.retention.jobs),
        keys = %pruner.retention.keys.map_or("forever".into(), |k| humantime::format_duration(k).to_string()),
        interval = %humantime::format_duration(pruner.interval),
        archive_dir = %pruner
            .archive_dir
            .as_ref()
            .map_or("none".into(), |d| d.display().to_string()),
        "pruning finished jobs past their retention"
    );
    AbortOnDrop(coordinator.spawn_pruner(pruner))
}
