//! Claim throughput on the real database: how many jobs per second N
//! concurrent workers can claim (one at a time) and complete, under READ
//! COMMITTED (what the coordinator runs with) and REPEATABLE READ (InnoDB's
//! default), through the store and through gRPC. Prints the numbers and the
//! ratio; it asserts nothing.
//!
//!     scripts/mariadb start
//!     cargo bench --bench claim_throughput            # defaults: 4000 jobs, 64 workers
//!     JOBFENCE_BENCH_JOBS=10000 JOBFENCE_BENCH_WORKERS=32 cargo bench --bench claim_throughput

use jobfence::coordinator::{Coordinator, CoordinatorConfig};
use jobfence::proto::job_coordinator_client::JobCoordinatorClient;
use jobfence::store::{
    self, ClaimRequest, CompleteRequest, EnqueueRequest, Isolation, JobStore, PoolSettings,
};
use sqlx::mysql::MySqlPool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn fresh(server: &str, db: &str, isolation: Isolation, max: u32) -> JobStore {
    let admin = MySqlPool::connect(&format!("{server}/"))
        .await
        .expect("database reachable (scripts/mariadb start)");
    sqlx::query(&format!("DROP DATABASE IF EXISTS `{db}`"))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query(&format!(
        "CREATE DATABASE `{db}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    ))
    .execute(&admin)
    .await
    .unwrap();
    let settings = PoolSettings {
        max_connections: max,
        isolation,
        ..PoolSettings::default()
    };
    let pool = store::connect(&format!("{server}/{db}"), &settings).unwrap();
    store::MIGRATOR.run(&pool).await.unwrap();
    JobStore::new(pool)
}

async fn fill(store: &JobStore, jobs: u64) {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (store, next) = (store.clone(), next.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return;
                }
                store
                    .enqueue(&EnqueueRequest {
                        queue: "bench".into(),
                        operation_key: format!("op-{i}"),
                        payload: "{}".into(),
                        delay: Duration::ZERO,
                    })
                    .await
                    .unwrap();
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// Workers claim one job and complete it until the queue is empty.
/// Returns (jobs done, Completes rolled back by a lock conflict).
async fn run_store(store: &JobStore, workers: u64) -> (u64, u64) {
    let done = Arc::new(AtomicU64::new(0));
    let conflicts = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (store, done, conflicts) = (store.clone(), done.clone(), conflicts.clone());
        tasks.spawn(async move {
            loop {
                let claimed = store
                    .claim(&ClaimRequest {
                        queue: "bench".into(),
                        worker_id: format!("w{w}"),
                        max_jobs: 1,
                        lease: Duration::from_secs(60),
                        policy: Default::default(),
                    })
                    .await;
                let Ok(claimed) = claimed else { continue };
                let Some(c) = claimed.into_iter().next() else {
                    return;
                };
                let complete = CompleteRequest {
                    job_id: c.job.id,
                    attempt: c.job.attempt,
                    provider_reference: Some("re".into()),
                    result: None,
                };
                // A conflict (deadlock, lock wait timeout) rolled back:
                // sending the same Complete again is safe (a replay is
                // recognised).
                while let Err(e) = store.complete(&complete).await {
                    assert!(
                        matches!(
                            e,
                            jobfence::domain::CoordinatorError::TransactionConflict(_)
                        ),
                        "{e}"
                    );
                    conflicts.fetch_add(1, Ordering::Relaxed);
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    (
        done.load(Ordering::Relaxed),
        conflicts.load(Ordering::Relaxed),
    )
}

/// The same through gRPC, against an in-process coordinator.
async fn run_grpc(store: &JobStore, workers: u64) -> (u64, u64) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let coordinator = Coordinator::new(store.clone(), CoordinatorConfig::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(jobfence::server::serve(
        coordinator,
        listener,
        jobfence::server::ServeOptions {
            drain_delay: Duration::ZERO,
            ..Default::default()
        },
        async {
            let _ = stopped.await;
        },
    ));
    let client = JobCoordinatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (mut c, done) = (client.clone(), done.clone());
        tasks.spawn(async move {
            loop {
                let claimed = c
                    .claim(jobfence::proto::ClaimRequest {
                        queue: "bench".into(),
                        worker_id: format!("w{w}"),
                        max_jobs: 1,
                        lease: None,
                    })
                    .await;
                let Ok(claimed) = claimed else { continue };
                let Some(job) = claimed.into_inner().jobs.into_iter().next() else {
                    return;
                };
                let job = job.job.unwrap();
                c.complete(jobfence::proto::CompleteRequest {
                    job_id: job.job_id,
                    attempt: job.attempt,
                    provider_reference: "re".into(),
                    result: String::new(),
                })
                .await
                .unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let _ = stop.send(());
    let _ = server.await;
    (done.load(Ordering::Relaxed), 0)
}

fn main() {
    let jobs = env_num("JOBFENCE_BENCH_JOBS", 4000);
    let workers = env_num("JOBFENCE_BENCH_WORKERS", 64);
    let base = std::env::var("JOBFENCE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| jobfence::cli::DEFAULT_DATABASE_URL.to_owned());
    let server = base.rsplit_once('/').unwrap().0.to_owned();
    let db = format!("jf_test_{}_bench", std::process::id());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "claim throughput: {jobs} jobs, {workers} concurrent workers, claim 1 + complete each"
    );
    println!(
        "{:<22} {:>8} {:>9} {:>10}",
        "run", "jobs", "seconds", "jobs/s"
    );
    let mut rates = Vec::new();
    for (name, isolation, grpc) in [
        ("store, READ COMMITTED", Isolation::ReadCommitted, false),
        ("store, REPEATABLE READ", Isolation::RepeatableRead, false),
        ("gRPC, READ COMMITTED", Isolation::ReadCommitted, true),
    ] {
        let rate = rt.block_on(async {
            let store = fresh(&server, &db, isolation, workers as u32 + 4).await;
            fill(&store, jobs).await;
            let t = Instant::now();
            let (done, conflicts) = if grpc {
                run_grpc(&store, workers).await
            } else {
                run_store(&store, workers).await
            };
            let secs = t.elapsed().as_secs_f64();
            assert_eq!(done, jobs, "every job claimed and completed exactly once");
            println!(
                "{name:<22} {done:>8} {secs:>9.2} {:>10.0} {conflicts:>10}",
                done as f64 / secs
            );
            store.pool().close().await;
            done as f64 / secs
        });
        rates.push(rate);
    }
    println!(
        "ratio READ COMMITTED / REPEATABLE READ (store): {:.2}x; gRPC / store (READ COMMITTED): {:.2}",
        rates[0] / rates[1],
        rates[2] / rates[0]
    );
    rt.block_on(async {
        if let Ok(admin) = MySqlPool::connect(&format!("{server}/")).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS `{db}`"))
                .execute(&admin)
                .await;
        }
    });
}
