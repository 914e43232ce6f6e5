//! The gRPC server of a coordinator, assembled: the worker-facing service,
//! the operator service and the events feed ([`grpc`], the adapters),
//! standard gRPC health (following the database's reachability,
//! [`health`]), the database's durability (warned about, or required),
//! server reflection, the layers every call passes (RPC latency,
//! authentication, admission under the concurrency limits), the listener's
//! TLS, the optional `/metrics` endpoint with its pending-age refresher,
//! and graceful shutdown.
//!
//! - [`grpc`]: tonic adapters: proto ⇄ domain, errors → status.
//! - [`transport`]: accepting connections, TLS, the connection limit.
//! - [`limits`]: the concurrency limits and the server-side deadline.
//! - [`security`]: TLS and the callers file together, and their reload.
//! - [`metrics_http`], [`rpc_metrics`]: `GET /metrics` and `/healthz`, and
//!   the RPC latency layer.
//! - [`trace_context`]: a call's span in its caller's trace (W3C
//!   `traceparent`), when spans are exported.
//!
//! What else a process serves beside gRPC (the operator console) is a
//! [`Companion`]: this crate does not know it, and neither do the tests
//! that do not serve one.

pub mod api_version;
pub mod grpc;
mod health;
pub mod limits;
pub mod metrics_http;
pub mod rpc_metrics;
pub mod security;
pub mod trace_context;
pub mod transport;

use crate::api_version::ApiVersionLayer;
use crate::grpc::{JobAdminService, JobCoordinatorService, JobEventsService};
use crate::rpc_metrics::RpcMetricsLayer;
use crate::trace_context::TraceContextLayer;
use health::{DatabaseFollower, Health};
use jobfence_api::v1::job_admin_server::JobAdminServer;
use jobfence_api::v1::job_coordinator_server::JobCoordinatorServer;
use jobfence_api::v1::job_events_server::JobEventsServer;
use jobfence_auth::AuthLayer;
use jobfence_core::{gauges, Coordinator};
use jobfence_metrics::Metrics;
use jobfence_store::shards::Shards;
use limits::{AdmissionLayer, Limits};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tonic::transport::Server;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::ServingStatus;
use transport::ConnectionLimits;

pub use security::Security;

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

/// A future that completes when the server stops serving (a shutdown, or
/// a refusal to serve): what a [`Companion`] waits on to stop with it.
pub type Stop = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A service a process serves beside the gRPC listener (the operator
/// console is one): started by [`serve_with`] with the coordinator once
/// the server is assembled, and told to stop ([`Stop`]) when the server
/// stops. It logs its own errors. Only types of core and std appear in
/// it, so a companion's crate need not depend on this one.
pub type Companion =
    Box<dyn FnOnce(Coordinator, Stop) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A [`Stop`] of the server's stop signal.
fn stop_of(stop: &watch::Receiver<bool>) -> Stop {
    let mut stop = stop.clone();
    Box::pin(async move {
        let _ = stop.wait_for(|s| *s).await;
    })
}

/// The operator side of serving: metrics, the events feed, what to do
/// about a database that can lose an acknowledged commit, security and
/// limits, and the companions served beside gRPC.
pub struct OpsOptions {
    /// Where to serve `GET /metrics` (plain HTTP); `None` for no endpoint
    /// (and no pending-age refresher).
    pub metrics_listener: Option<TcpListener>,
    /// How often the pending-age gauges are recomputed from the database.
    pub pending_refresh_interval: Duration,
    /// How often a caught-up WatchEvents looks for new events.
    pub events_poll_interval: Duration,
    /// Refuse to serve, rather than only warn, while the database's settings
    /// can lose an acknowledged commit (docs/design.md rule 9): [`serve_with`]
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
    /// Served beside gRPC and stopped with it (the operator console).
    pub companions: Vec<Companion>,
    /// The API version named in every answer's `jobfence-api-version`
    /// header; `None` for [`jobfence_api::VERSION`]. Another one only to
    /// test that clients refuse a coordinator of another major version
    /// (`serve --advertise-api-version`, hidden).
    pub advertised_api_version: Option<String>,
    /// Read each call's W3C `traceparent` and make its span a child of
    /// the caller's ([`trace_context`]); for a process that exports its
    /// spans (`serve --otlp-endpoint`). Off: no header is read.
    pub trace_context: bool,
}

impl std::fmt::Debug for OpsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpsOptions")
            .field("metrics_listener", &self.metrics_listener)
            .field("pending_refresh_interval", &self.pending_refresh_interval)
            .field("events_poll_interval", &self.events_poll_interval)
            .field("require_durable_database", &self.require_durable_database)
            .field("check_shard_numbers", &self.check_shard_numbers)
            .field("security", &self.security)
            .field("limits", &self.limits)
            .field("reflection", &self.reflection)
            .field("companions", &self.companions.len())
            .field("advertised_api_version", &self.advertised_api_version)
            .field("trace_context", &self.trace_context)
            .finish()
    }
}

impl Default for OpsOptions {
    fn default() -> Self {
        OpsOptions {
            metrics_listener: None,
            pending_refresh_interval: Duration::from_secs(15),
            events_poll_interval: Duration::from_millis(250),
            require_durable_database: false,
            check_shard_numbers: false,
            security: Security::default(),
            limits: Limits::default(),
            reflection: true,
            companions: Vec::new(),
            advertised_api_version: None,
            trace_context: false,
        }
    }
}

/// Recomputes the pending-age, provider and settlement gauges every
/// `interval`, and
/// the retention gauges at most once a minute, until `stop`.
async fn refresh_pending(
    shards: Shards,
    metrics: Metrics,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut retention_read: Option<std::time::Instant> = None;
    loop {
        // Errors are counted and logged inside; the next tick tries again.
        let _ = gauges::refresh_pending_all(&shards, &metrics).await;
        gauges::refresh_providers(&shards, &metrics).await;
        jobfence_core::settlement::gauges::refresh_settlement(&shards, &metrics).await;
        // Also when this coordinator does not prune (`--prune-off`, cron):
        // the last run is the database's. At most once a minute (it counts
        // the key records).
        if retention_read.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            gauges::refresh_retention(&shards, &metrics).await;
            retention_read = Some(std::time::Instant::now());
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.changed() => return,
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
/// shutdown is not held open by a stream that never ends; the companions
/// are told to stop at the same moment.
pub async fn serve_with(
    coordinator: Coordinator,
    listener: TcpListener,
    options: ServeOptions,
    mut ops: OpsOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let health = Health {
        reporter,
        mirror: watch::channel(ServingStatus::NotServing).0,
    };
    health.set(ServingStatus::NotServing).await;
    let (stop_tx, stop_rx) = watch::channel(false);
    // The listeners beside gRPC (`/metrics` and `/healthz`, the
    // companions) close with the gRPC listener, after the drain: a load
    // balancer probing `/healthz` reads 503 meanwhile, not a refusal.
    let (close_tx, close_rx) = watch::channel(false);
    let follower = DatabaseFollower::new(
        &coordinator,
        health.clone(),
        &options,
        &ops,
        stop_rx.clone(),
    );
    let watcher = follower
        .start(&options, ops.require_durable_database)
        .await?;
    start_operator_side(&coordinator, &health, [&stop_rx, &close_rx], &mut ops)?;
    let events = JobEventsService::new(
        coordinator.clone(),
        ops.events_poll_interval,
        stop_rx.clone(),
    );
    tracing::info!(
        listen = %listener.local_addr()?,
        "serving jobfence.v1.JobCoordinator, JobAdmin and JobEvents"
    );
    ops.security.announce();
    if ops.security.reload_on_sighup {
        ops.security.spawn_sighup_reload();
    }
    let (stop_serving, stopped) = oneshot::channel::<()>();
    let server = grpc_server(
        &coordinator,
        listener,
        &ops.security,
        ops.limits,
        ops.reflection,
        GrpcServices {
            health: health_service,
            events,
            api_version: ApiVersionLayer::new(
                ops.advertised_api_version
                    .as_deref()
                    .unwrap_or(jobfence_api::VERSION),
            )?,
            trace_context: ops.trace_context.then(TraceContextLayer::new),
        },
        async {
            let _ = stopped.await;
        },
    )?;
    Shutdown {
        coordinator,
        health,
        options,
        stop_tx,
        close_tx,
        stop_serving,
        watcher,
    }
    .run(server, shutdown)
    .await?;
    tracing::info!("stopped");
    Ok(())
}

/// Starts what serves the operators beside the gRPC services: the metrics
/// endpoint (when `ops` has its listener) and the companions (taken out of
/// `ops`). `[stop, close]`: the background work (the pending-age refresh)
/// ends at `stop`, when the drain starts; the listeners at `close`, with
/// the gRPC listener.
fn start_operator_side(
    coordinator: &Coordinator,
    health: &Health,
    [stop, close]: [&watch::Receiver<bool>; 2],
    ops: &mut OpsOptions,
) -> anyhow::Result<()> {
    if let Some(listener) = ops.metrics_listener.take() {
        serve_metrics(
            listener,
            coordinator,
            health,
            [stop, close],
            ops.pending_refresh_interval,
        )?;
    }
    for companion in std::mem::take(&mut ops.companions) {
        tokio::spawn(companion(coordinator.clone(), stop_of(close)));
    }
    Ok(())
}

/// Serves `GET /metrics` and `/healthz` on `listener` until `close`, and
/// refreshes the pending-age gauges every `interval` until `stop`.
fn serve_metrics(
    listener: TcpListener,
    coordinator: &Coordinator,
    health: &Health,
    [stop, close]: [&watch::Receiver<bool>; 2],
    interval: Duration,
) -> anyhow::Result<()> {
    tracing::info!(listen = %listener.local_addr()?, "serving /metrics");
    let (metrics, shards) = (coordinator.metrics(), coordinator.shards());
    tokio::spawn(metrics_http::serve(
        listener,
        metrics.clone(),
        shards.clone(),
        health.mirror.subscribe(),
        stop_of(close),
    ));
    tokio::spawn(refresh_pending(
        shards.clone(),
        metrics.clone(),
        interval,
        stop.clone(),
    ));
    Ok(())
}

/// The services besides the coordinator's own two: health (`H` is
/// tonic-health's unnamed service) and the events feed; and the API
/// version every answer names.
struct GrpcServices<H> {
    health: HealthServer<H>,
    events: JobEventsService,
    api_version: ApiVersionLayer,
    /// The caller's trace context made current, when spans are exported.
    trace_context: Option<TraceContextLayer>,
}

/// Reflection v1 and v1alpha (grpcurl before 1.9 and many other tools,
/// the grpcurl PyPI ships among them, still only ask v1alpha; both list
/// both), over every descriptor a client may need: jobfence's, health's,
/// the error details' (so grpcurl can print the ErrorInfo of a refusal)
/// and reflection's own.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .include_reflection_service(false)
        .register_encoded_file_descriptor_set(jobfence_api::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
}

/// The gRPC server over `listener`, serving until `stopped`: the layers
/// every call passes, outermost first (the caller's trace context, when
/// spans are exported; every answer names the API version; every call is
/// timed, refusals included; then authenticated; then admitted under the
/// concurrency limits), and every service.
fn grpc_server<H: tonic_health::pb::health_server::Health>(
    coordinator: &Coordinator,
    listener: TcpListener,
    security: &Security,
    limits: Limits,
    reflection_on: bool,
    services: GrpcServices<H>,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<impl Future<Output = Result<(), tonic::transport::Error>>> {
    let metrics = coordinator.metrics().clone();
    let (reflection_v1, reflection_v1alpha) = if reflection_on {
        (
            Some(reflection().build_v1()?),
            Some(reflection().build_v1alpha()?),
        )
    } else {
        (None, None)
    };
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
    Ok(Server::builder()
        .max_concurrent_streams(limits.max_streams_per_connection)
        .layer(tower::util::option_layer(services.trace_context))
        .layer(services.api_version)
        .layer(RpcMetricsLayer::new(metrics.clone()))
        .layer(AuthLayer::new(security.auth.clone(), metrics.clone()))
        .layer(AdmissionLayer::new(limits, metrics))
        .add_service(services.health)
        .add_optional_service(reflection_v1)
        .add_optional_service(reflection_v1alpha)
        .add_service(
            JobAdminServer::new(JobAdminService::new(coordinator.clone()))
                .max_decoding_message_size(max_request),
        )
        .add_service(JobEventsServer::new(services.events).max_decoding_message_size(max_request))
        .add_service(
            JobCoordinatorServer::new(JobCoordinatorService::new(coordinator.clone()))
                .max_decoding_message_size(max_request),
        )
        .serve_with_incoming_shutdown(incoming, stopped))
}

/// What stopping takes: the drain, the follower, the companions, the
/// listener.
struct Shutdown {
    coordinator: Coordinator,
    health: Health,
    options: ServeOptions,
    stop_tx: watch::Sender<bool>,
    close_tx: watch::Sender<bool>,
    stop_serving: oneshot::Sender<()>,
    watcher: health::Watcher,
}

impl Shutdown {
    /// Runs `server` until `shutdown` completes (then drains: NOT_SERVING,
    /// the drain delay, in-flight calls for at most the shutdown timeout)
    /// or the database follower refuses to serve (then stops at once and
    /// returns its error).
    async fn run(
        self,
        server: impl Future<Output = Result<(), tonic::transport::Error>>,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let Shutdown {
            coordinator,
            health,
            options,
            stop_tx,
            close_tx,
            stop_serving,
            watcher,
        } = self;
        let health::Watcher {
            task: watcher,
            mut refused,
        } = watcher;
        tokio::pin!(server);
        tokio::select! {
            done = &mut server => done?,
            Ok(why) = &mut refused => {
                tracing::error!(error = %why, "refusing to serve; stopping");
                let _ = stop_tx.send(true);
                let _ = close_tx.send(true);
                health.set(ServingStatus::NotServing).await;
                let _ = stop_serving.send(());
                let _ = tokio::time::timeout(options.shutdown_timeout, &mut server).await;
                return Err(why);
            }
            _ = shutdown => {
                let drain = options.drain_delay;
                tracing::info!(drain_delay = ?drain, "shutting down: reporting NOT_SERVING, then draining");
                // Long-polling Claims answer empty now and no Claim waits from
                // here on: callers go back to the load balancer at once.
                coordinator.drain();
                health.set(ServingStatus::NotServing).await;
                let _ = stop_tx.send(true);
                // The server keeps accepting and answering while the drain
                // runs: health probes read NOT_SERVING (gRPC) and 503
                // (`/healthz`), calls still routed here are served.
                let draining = async {
                    let _ = watcher.await;
                    // The follower may have set SERVING in its last check.
                    health.set(ServingStatus::NotServing).await;
                    tokio::time::sleep(drain).await;
                };
                tokio::select! {
                    done = &mut server => return Ok(done?),
                    () = draining => {}
                }
                let _ = close_tx.send(true);
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
        Ok(())
    }
}
