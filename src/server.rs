//! Assembly: the worker-facing service, standard gRPC health (following the
//! database's reachability), server reflection, and graceful shutdown.

use crate::coordinator::Coordinator;
use crate::grpc::JobCoordinatorService;
use crate::proto::job_coordinator_server::JobCoordinatorServer;
use crate::store::JobStore;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::server::NamedService;
use tonic::transport::Server;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// The health service names we report: "" (the whole server) and the
/// worker-facing service.
const HEALTH_NAMES: [&str; 2] = [
    "",
    <JobCoordinatorServer<JobCoordinatorService> as NamedService>::NAME,
];

/// Serving options.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// How often the database is pinged to decide SERVING / NOT_SERVING.
    pub health_interval: Duration,
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
            drain_delay: Duration::from_secs(2),
            shutdown_timeout: Duration::from_secs(10),
        }
    }
}

async fn set_health(reporter: &HealthReporter, status: ServingStatus) {
    for name in HEALTH_NAMES {
        reporter.set_service_status(name, status).await;
    }
}

/// Pings the database every `interval` and reports SERVING only while it
/// answers; stops when `stop` turns true.
async fn follow_database(
    reporter: HealthReporter,
    store: JobStore,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut last = None;
    loop {
        let status = if store.ping().await {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        if *stop.borrow() {
            return;
        }
        if last != Some(status) {
            tracing::info!(status = %status, "database health changed");
            set_health(&reporter, status).await;
            last = Some(status);
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Serves until `shutdown` completes, then reports NOT_SERVING, waits the
/// drain delay, stops accepting, and lets in-flight RPCs finish (for at
/// most the shutdown timeout).
pub async fn serve(
    coordinator: Coordinator,
    listener: TcpListener,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    set_health(&reporter, ServingStatus::NotServing).await;
    // v1 is the standard; v1alpha too, since grpcurl before 1.9 and many
    // other tools still only ask that one. Both list both.
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
    let watcher = tokio::spawn(follow_database(
        reporter.clone(),
        coordinator.store().clone(),
        options.health_interval,
        stop_rx,
    ));
    let drain = options.drain_delay;
    let (stop_serving, stopped) = tokio::sync::oneshot::channel::<()>();
    tracing::info!(listen = %listener.local_addr()?, "serving jobfence.v1.JobCoordinator");
    let server = Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(JobCoordinatorServer::new(JobCoordinatorService::new(
            coordinator,
        )))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
            let _ = stopped.await;
        });
    tokio::pin!(server);
    tokio::select! {
        done = &mut server => done?,
        _ = shutdown => {
            tracing::info!(drain_delay = ?drain, "shutting down: reporting NOT_SERVING, then draining");
            let _ = stop_tx.send(true);
            let _ = watcher.await;
            set_health(&reporter, ServingStatus::NotServing).await;
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
