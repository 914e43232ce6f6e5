//! The minimal worker of the README ("Writing a worker"): claims refunds and
//! completes them. `cargo run --example minimal_worker` with a coordinator
//! on `$JOBFENCE_COORDINATOR` (default `http://127.0.0.1:50051`).

use jobfence_worker::{ClaimedJob, Handler, HandlerError, Worker, WorkerClient, WorkerConfig};

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
        .unwrap_or_else(|_| "http://127.0.0.1:50051".to_owned());
    let config = WorkerConfig::new("rust-minimal-1", "refunds");
    let client = WorkerClient::connect(endpoint, config).await?;
    let report = Worker::new(client)
        .run(Refunds, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    println!("{report:?}");
    Ok(())
}
