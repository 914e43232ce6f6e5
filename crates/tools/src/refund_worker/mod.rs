//! `jobfence refund-worker`: a refund worker on the worker SDK. It claims
//! refund jobs, sends each to the provider with its operation_key as the
//! idempotency key (or reconciles first after a takeover), and writes back
//! through the job handle. See [`handler`] for the protocol.

pub mod handler;

use anyhow::Context;
use clap::Args;
use handler::{RefundHandler, RefundTimings};
use jobfence_fake_provider::ProviderClient;
use jobfence_worker::{Credentials, Worker, WorkerClient, WorkerConfig};
use std::time::Duration;

/// Flags of `jobfence refund-worker`. Durations are humantime (`3s`).
#[derive(Debug, Args)]
pub struct RefundWorkerArgs {
    /// The coordinator's gRPC endpoint. TLS and the bearer token come from
    /// JOBFENCE_TLS_CA, JOBFENCE_TLS_CLIENT_CERT/_KEY and
    /// JOBFENCE_TOKEN_FILE (see docs/workers.md).
    #[arg(
        long,
        env = "JOBFENCE_COORDINATOR",
        default_value = "http://127.0.0.1:50051"
    )]
    pub coordinator: String,
    /// The payment provider's base URL.
    #[arg(
        long,
        env = "JOBFENCE_PROVIDER_URL",
        default_value = "http://127.0.0.1:8099/"
    )]
    pub provider: String,
    /// This worker's name (lease owner, observation keys).
    #[arg(long, env = "JOBFENCE_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Queue to work.
    #[arg(long, env = "JOBFENCE_QUEUE", default_value = "refunds")]
    pub queue: String,
    /// Jobs handled at once (and so at most held).
    #[arg(long, env = "JOBFENCE_CONCURRENCY", default_value_t = 8)]
    pub concurrency: u32,
    /// Lease asked for on every claim.
    #[arg(long, env = "JOBFENCE_LEASE", value_parser = humantime::parse_duration, default_value = "30s")]
    pub lease: Duration,
    /// How long one provider call may take before its outcome is unknown.
    #[arg(long, env = "JOBFENCE_PROVIDER_TIMEOUT", value_parser = humantime::parse_duration, default_value = "2s")]
    pub provider_timeout: Duration,
}

impl RefundWorkerArgs {
    /// Runs until `shutdown` completes (the binary passes SIGTERM or
    /// Ctrl-C), then finishes the jobs in flight.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
        let config = WorkerConfig {
            max_in_flight: self.concurrency,
            lease: self.lease,
            poll_interval: Duration::from_millis(200),
            rpc_timeout: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(10),
            release_delay: Duration::from_secs(1),
            credentials: Credentials::from_env()?,
            ..WorkerConfig::new(
                self.worker_id
                    .unwrap_or_else(|| format!("refund-worker-{}", std::process::id())),
                self.queue,
            )
        };
        let client = WorkerClient::connect(self.coordinator.clone(), config)
            .await
            .with_context(|| format!("connecting to the coordinator at {}", self.coordinator))?;
        let provider = ProviderClient::new(
            self.provider
                .parse()
                .with_context(|| format!("bad provider URL {}", self.provider))?,
        );
        let handler = RefundHandler::new(
            provider,
            RefundTimings {
                provider_timeout: self.provider_timeout,
                ..RefundTimings::default()
            },
        );
        tracing::info!(coordinator = %self.coordinator, provider = %self.provider, "refund worker started");
        let report = Worker::new(client).run(handler, shutdown).await;
        tracing::info!(?report, "refund worker stopped");
        Ok(())
    }
}
