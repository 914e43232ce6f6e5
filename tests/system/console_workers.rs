//! The workers scene of the console's browser test (console_browser.rs):
//! what the coordinator saw of the traffic's workers, one worker more
//! holding a payout's lease for ten minutes (live), and one that stopped
//! calling ten minutes ago on a queue whose job now waits for nobody
//! (stale; the queue card's "no live worker" banner).

use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{ClaimRequest, EnqueueRequest};
use jobfence_core::Coordinator;
use sqlx::mysql::MySqlPool;

/// Sets the scene on the coordinator at `addr` (whose record
/// `coordinator` writes) and its database `pool`.
pub async fn scene(addr: std::net::SocketAddr, pool: &MySqlPool, coordinator: &Coordinator) {
    coordinator.write_sightings().await.unwrap();
    sqlx::query(
        "INSERT INTO worker_sightings (worker_id, coordinator, client, queue, first_seen_at, \
         last_call_at, calls_last_minute) VALUES ('node-7', 'coordinator-2', \
         'jobfence-node/0.1.0', 'chargebacks', UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, \
         UTC_TIMESTAMP(6) - INTERVAL 10 MINUTE, 0)",
    )
    .execute(pool)
    .await
    .unwrap();
    let mut client = JobCoordinatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    client
        .enqueue(EnqueueRequest {
            queue: "chargebacks".into(),
            operation_key: "chargeback-cb_1".into(),
            payload: r#"{"chargeback":"cb_1","amount":700}"#.into(),
            delay: None,
            fairness_key: String::new(),
            priority: 0,
        })
        .await
        .unwrap();
    let held = client
        .claim(ClaimRequest {
            queue: "payouts".into(),
            worker_id: "go-1".into(),
            max_jobs: 1,
            lease: jobfence_testkit::secs(600),
            wait: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.jobs.len(), 1, "a payout for go-1 to hold");
    coordinator.write_sightings().await.unwrap();
}
