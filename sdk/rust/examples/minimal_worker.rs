//! The minimal worker of docs/workers.md ("The clients"): claims refunds and
//! completes them. `cargo run --example minimal_worker` with a coordinator
//! on `$JOBFENCE_COORDINATOR` (default `https://127.0.0.1:50051`), and the
//! TLS and token variables scripts/serve prints (`JOBFENCE_TLS_CA`,
//! `JOBFENCE_TOKEN_FILE`).

use jobfence_worker::{
    ClaimedJob, Credentials, Handler, HandlerError, Worker, WorkerClient, WorkerConfig,
};

struct Refunds;

impl Handler for Refunds {
    async fn handle(&self, job: &mut ClaimedJob) -> Result<(), HandlerError> {
        // Call the provider with job.operation_key() as the idempotency key
        // (ask it what happened first when job.next_action() is Reconcile).
        job.complete(&format!("re_{}", job.job_id()), "{}").await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoint = std::env::var("JOBFENCE_COORDINATOR")
        .unwrap_or_else(|_| "https://127.0.0.1:50051".to_owned());
    let config = WorkerConfig {
        // TLS and the bearer token: JOBFENCE_TLS_CA, JOBFENCE_TOKEN_FILE.
        credentials: Credentials::from_env()?,
        ..WorkerConfig::new("rust-minimal-1", "refunds")
    };
    let client = WorkerClient::connect(endpoint, config).await?;
    let report = Worker::new(client)
        .run(Refunds, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    println!("{report:?}");
    Ok(())
}
