//! Helpers for the worker SDK tests, on top of `tests/common`: SDK clients
//! with fast timings, and the database-side levers that make a commit get
//! lost or a retry wait on a row lock, deterministically.
#![allow(dead_code)]

use crate::common::Harness;
use jobfence::proto::{self, GetJobRequest};
use jobfence_worker::{RetryPolicy, WorkerClient, WorkerConfig};
use std::time::Duration;

/// A config with test timings: polls every 20 ms, retries after a few ms.
pub fn config(worker_id: &str, queue: &str) -> WorkerConfig {
    WorkerConfig {
        poll_interval: Duration::from_millis(20),
        rpc_timeout: Duration::from_secs(20),
        retry: RetryPolicy {
            max_tries: 5,
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

pub use crate::common::{kill_the_paused_session, open_transactions};

/// Waits until some session of this test's database is blocked on a row
/// lock (a retried call queued behind a paused one). Polls an observable
/// condition, bounded, instead of sleeping and hoping.
pub async fn wait_for_lock_wait(h: &Harness) {
    for _ in 0..2_000 {
        if open_transactions(h)
            .await
            .iter()
            .any(|(_, state)| state == "LOCK WAIT")
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("no session ever waited on the paused call's row lock");
}

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
/// 本地 Commit 後斷線).
pub struct Proxy {
    pub addr: std::net::SocketAddr,
    swallow: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on an ephemeral loopback port and forwards to `upstream`.
    pub async fn start(upstream: std::net::SocketAddr) -> Proxy {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let swallow = Arc::new(AtomicBool::new(false));
        let (cut, _) = tokio::sync::watch::channel(0u64);
        let (flag, cuts) = (swallow.clone(), cut.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, None, cuts.subscribe()));
                tokio::spawn(pump(sr, cw, Some(flag.clone()), cuts.subscribe()));
            }
        });
        Proxy {
            addr,
            swallow,
            cut,
            accept,
        }
    }

    /// While on, bytes from the coordinator are read and dropped.
    pub fn swallow_responses(&self, on: bool) {
        self.swallow.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Closes every connection open now; new ones are accepted as before.
    pub fn cut(&self) {
        self.cut.send_modify(|g| *g += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    swallow: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    mut cut: tokio::sync::watch::Receiver<u64>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            // A cut wins over bytes already waiting: they must not get through.
            biased;
            _ = cut.changed() => return,
            n = from.read(&mut buf) => {
                let n = match n { Ok(0) | Err(_) => return, Ok(n) => n };
                let dropped = swallow
                    .as_ref()
                    .is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst));
                if !dropped && to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Polls the row until `done` holds (an observable commit), bounded.
pub async fn wait_for_row(
    h: &Harness,
    job_id: u64,
    what: &str,
    done: impl Fn(&jobfence::domain::Job) -> bool,
) {
    for _ in 0..2_000 {
        if done(&h.row(job_id).await) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("job {job_id} never reached: {what}");
}
