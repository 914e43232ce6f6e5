//! Helpers for the worker SDK tests, on top of [`crate::Harness`]: SDK clients
//! with fast timings, and the database-side levers that make a commit get
//! lost or a retry wait on a row lock, deterministically.

use crate::harness::Harness;
use jobfence_api::v1::{self as proto, GetJobRequest};
use jobfence_worker::{RetryPolicy, WorkerClient, WorkerConfig};
use std::time::Duration;

/// A config with test timings: polls every 20 ms, retries after a few ms.
pub fn config(worker_id: &str, queue: &str) -> WorkerConfig {
    WorkerConfig {
        poll_interval: Duration::from_millis(20),
        rpc_timeout: Duration::from_secs(20),
        retry: RetryPolicy {
            budget: Duration::from_secs(2),
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(50),
        },
        shutdown_grace: Duration::from_secs(20),
        ..WorkerConfig::new(worker_id, queue)
    }
}

/// An SDK client to the harness's coordinator.
pub async fn sdk(h: &Harness, config: WorkerConfig) -> WorkerClient {
    WorkerClient::connect(format!("http://{}", h.addr), config)
        .await
        .expect("connect the SDK to the in-process coordinator")
}

/// The job's observations, as GetJob returns them.
pub async fn observations(h: &Harness, job_id: u64) -> Vec<proto::Observation> {
    h.client
        .clone()
        .get_job(GetJobRequest { job_id })
        .await
        .expect("get job")
        .into_inner()
        .observations
}

pub use crate::harness::kill_the_paused_session;

/// Rows of this test's database in `running`, i.e. jobs held by someone.
pub async fn running_rows(pool: &sqlx::MySqlPool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE state = 'running'")
        .fetch_one(pool)
        .await
        .expect("count running jobs")
}

/// A loopback TCP proxy in front of the coordinator that can swallow the
/// coordinator's answers and cut every open connection: the deterministic
/// way to lose a response after the coordinator has committed (the seed's
/// 本地 Commit 後斷線). The relay of the fake network
/// (`jobfence_fake_provider::netcut`), whose `cut` here closes the open
/// connections and keeps accepting new ones.
pub struct Proxy(jobfence_fake_provider::netcut::NetCut);

impl Proxy {
    /// Listens on an ephemeral loopback port and forwards to `upstream`.
    pub async fn start(upstream: std::net::SocketAddr) -> Proxy {
        Proxy(
            jobfence_fake_provider::netcut::NetCut::start(upstream)
                .await
                .unwrap(),
        )
    }

    /// Closes every connection open now; new ones are accepted as before.
    pub fn cut(&self) {
        self.0.close_connections();
    }
}

impl std::ops::Deref for Proxy {
    type Target = jobfence_fake_provider::netcut::NetCut;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// Polls the row until `done` holds (an observable commit), bounded.
pub async fn wait_for_row(
    h: &Harness,
    job_id: u64,
    what: &str,
    done: impl Fn(&jobfence_domain::Job) -> bool,
) {
    for _ in 0..2_000 {
        if done(&h.row(job_id).await) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("job {job_id} never reached: {what}");
}
