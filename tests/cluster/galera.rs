//! jobfence on a real 3-node MariaDB Galera cluster (started once per test
//! run by `scripts/test`, through `scripts/galera`): what the fence needs
//! there and what it does when a node goes.
//!
//! - Two coordinators writing through different nodes: `SELECT … FOR
//!   UPDATE` locks only on its own node, so the race is decided at COMMIT
//!   by certification (or by the winner's write set aborting the loser's
//!   open transaction on its node); the loser gets error 1213, runs again
//!   on fresh rows, and is told what a loser on one server would be told.
//! - Reads after writes across nodes (`wsrep_sync_wait`).
//! - A node that leaves the primary component: UNAVAILABLE, NOT_SERVING,
//!   and the move to the next node of the list (and back).
//! - A node killed under load: nothing acknowledged is lost, and the
//!   commits in flight are reported COMMIT_OUTCOME_UNKNOWN.
//!
//! The tests share one cluster and kill or isolate its nodes, so they run
//! one at a time (`serial`). Races use pause points, not sleeps.

use jobfence_testkit as kit;

use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{
    self as proto, ClaimRequest, CompleteRequest, EnqueueRequest, TakeoverRequest,
};
use jobfence_core::{Coordinator, CoordinatorConfig};
use jobfence_domain::JobState;
use jobfence_store::{self as store, JobStore, PausePoints, PoolSettings};
use kit::reason;
use sqlx::mysql::MySqlPool;
use sqlx::Row;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const Q: &str = "refunds";

/// A refusal's ErrorInfo reason; a status without one (which jobfence
/// never sends on purpose) by its code and message.
fn what(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    match status.get_details_error_info() {
        Some(i) if i.reason != "INTERNAL" && i.reason != "UNKNOWN" => i.reason,
        _ => format!("{:?}: {}", status.code(), status.message()),
    }
}

/// The tests take the cluster one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The node URLs `scripts/galera start` printed (database `jobfence`).
fn node_urls() -> Vec<String> {
    let urls = std::env::var("JOBFENCE_TEST_GALERA_URLS").unwrap_or_else(|_| {
        panic!(
            "JOBFENCE_TEST_GALERA_URLS is not set: run scripts/test, which starts the \
             3-node cluster with scripts/galera start and sets it"
        )
    });
    let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
    assert_eq!(urls.len(), 3, "three node URLs expected: {urls:?}");
    urls
}

fn galera_script(args: &[&str]) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/galera");
    let out = std::process::Command::new(&script)
        .args(args)
        .output()
        .expect("run scripts/galera");
    assert!(
        out.status.success(),
        "scripts/galera {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn node_ready(url: &str) -> bool {
    let Ok(pool) = MySqlPool::connect(url).await else {
        return false;
    };
    let ready = sqlx::query("SHOW GLOBAL STATUS LIKE 'wsrep_local_state_comment'")
        .fetch_optional(&pool)
        .await
        .ok()
        .flatten()
        .map(|r| r.get::<Vec<u8>, _>(1) == b"Synced")
        .unwrap_or(false);
    pool.close().await;
    ready
}

/// Takes the cluster for this test, with every node synced (restarting any
/// that an earlier test left down).
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    let guard = SERIAL.lock().await;
    for url in node_urls() {
        if !node_ready(&url).await {
            // An earlier test that failed half-way may have left a node
            // isolated, or killed.
            if let Ok(p) = MySqlPool::connect(&url).await {
                let _ = sqlx::query("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'")
                    .execute(&p)
                    .await;
                p.close().await;
            }
            galera_script(&["start"]);
            break;
        }
    }
    guard
}

fn with_database(url: &str, db: &str) -> String {
    let (head, _) = url.rsplit_once('/').unwrap();
    format!("{head}/{db}")
}

/// A private, migrated database on the cluster (created through node 1;
/// DDL reaches every node).
struct GaleraDb {
    name: String,
    /// Per node (index 0 = node 1).
    urls: Vec<String>,
    /// Where it was created, and is dropped.
    admin: String,
}

impl GaleraDb {
    async fn new() -> GaleraDb {
        Self::on(node_urls()).await
    }

    /// The same on the single MariaDB server of `scripts/mariadb` (the
    /// tests' JOBFENCE_TEST_DATABASE_URL): the baseline the cluster's
    /// figures are compared with. Every "node" is that server.
    async fn single_server() -> GaleraDb {
        Self::on(vec![kit::base_url()]).await
    }

    async fn on(nodes: Vec<String>) -> GaleraDb {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "jf_test_{}_g{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let admin = MySqlPool::connect(&nodes[0]).await.unwrap();
        sqlx::query(&format!(
            "CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        ))
        .execute(&admin)
        .await
        .unwrap();
        admin.close().await;
        let urls: Vec<String> = nodes.iter().map(|u| with_database(u, &name)).collect();
        let pool = store::connect(&urls[0], &PoolSettings::default()).unwrap();
        store::MIGRATOR.run(&pool).await.expect("migrations apply");
        pool.close().await;
        GaleraDb {
            name,
            urls,
            admin: nodes[0].clone(),
        }
    }

    /// A pool on node `node` (1-based) whose reads wait for the cluster
    /// (wsrep_sync_wait=1): what the test asserts on is what every node
    /// agrees on.
    fn direct(&self, node: usize) -> MySqlPool {
        store::connect(&self.direct_url(node), &PoolSettings::default()).unwrap()
    }

    /// Node `node`'s URL (1-based); on a single server, the server's.
    fn direct_url(&self, node: usize) -> String {
        self.urls[(node - 1).min(self.urls.len() - 1)].clone()
    }

    async fn drop(self) {
        if let Ok(admin) = MySqlPool::connect(&self.admin).await {
            let _ = sqlx::query(&format!("DROP DATABASE `{}`", self.name))
                .execute(&admin)
                .await;
        }
    }
}

/// A coordinator served in-process, writing through `nodes` (1-based, in
/// order of preference).
struct Coord {
    coordinator: Coordinator,
    client: JobCoordinatorClient<Channel>,
    health: HealthClient<Channel>,
    pauses: PausePoints,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn serve(db: &GaleraDb, nodes: &[usize], sync_wait: u8, lease: Duration) -> Coord {
    let urls: Vec<String> = nodes.iter().map(|&n| db.direct_url(n)).collect();
    let settings = PoolSettings {
        galera_sync_wait: sync_wait,
        ..PoolSettings::default()
    };
    let pauses = PausePoints::new();
    let store = JobStore::open(&urls, &settings)
        .unwrap()
        .pausing_at(pauses.clone());
    let config = CoordinatorConfig {
        default_lease: lease,
        min_lease: Duration::from_millis(100),
        ..CoordinatorConfig::default()
    };
    let coordinator = Coordinator::new(store, config);
    let served = kit::serve_in_process(coordinator.clone(), Duration::from_millis(500)).await;
    let channel = served.channel;
    let c = Coord {
        coordinator,
        client: JobCoordinatorClient::new(channel.clone()),
        health: HealthClient::new(channel),
        pauses,
        _stop: served.stop,
    };
    c.until_health(ServingStatus::Serving, Duration::from_secs(20))
        .await;
    c
}

impl Coord {
    async fn status(&self) -> ServingStatus {
        let got = self
            .health
            .clone()
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        ServingStatus::try_from(got).unwrap()
    }

    async fn until_health(&self, want: ServingStatus, within: Duration) {
        let deadline = Instant::now() + within;
        while self.status().await != want {
            assert!(Instant::now() < deadline, "health never became {want:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn enqueue(&self, key: &str) -> proto::Job {
        self.client
            .clone()
            .enqueue(EnqueueRequest {
                queue: Q.into(),
                operation_key: key.into(),
                payload: "{}".into(),
                delay: None,
                fairness_key: String::new(),
                priority: 0,
            })
            .await
            .expect("enqueue")
            .into_inner()
            .job
            .unwrap()
    }

    async fn claim(&self, worker: &str, max: u32) -> Result<Vec<proto::Job>, tonic::Status> {
        Ok(self
            .client
            .clone()
            .claim(ClaimRequest {
                queue: Q.into(),
                worker_id: worker.into(),
                max_jobs: max,
                lease: None,
                wait: None,
            })
            .await?
            .into_inner()
            .jobs
            .into_iter()
            .map(|c| c.job.unwrap())
            .collect())
    }

    async fn complete(&self, job_id: u64, attempt: u64) -> Result<proto::Job, tonic::Status> {
        Ok(self
            .client
            .clone()
            .complete(CompleteRequest {
                job_id,
                attempt,
                provider_reference: format!("re_{job_id}"),
                result: String::new(),
                next: None,
            })
            .await?
            .into_inner()
            .job
            .unwrap())
    }
}

/// `(state, attempt, lease_owner)` of a job, read on `node` after waiting
/// for the cluster.
async fn row(db: &GaleraDb, node: usize, job_id: u64) -> (JobState, u64, Option<String>) {
    let pool = db.direct(node);
    let (job, _) = JobStore::new(pool.clone()).get_job(job_id).await.unwrap();
    pool.close().await;
    (job.state, job.attempt, job.lease_owner)
}

async fn count_events(db: &GaleraDb, job_id: u64, kind: &str) -> i64 {
    let pool = db.direct(3);
    let n: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM job_events WHERE job_id = ? AND kind = ?")
            .bind(job_id)
            .bind(kind)
            .fetch_one(&pool)
            .await
            .unwrap();
    pool.close().await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_race_across_nodes_is_lost_at_commit_and_hands_out_nothing_twice() {
    let _cluster = serial().await;
    let db = GaleraDb::new().await;
    let a = serve(&db, &[1], 1, Duration::from_secs(30)).await;
    let b = serve(&db, &[2], 1, Duration::from_secs(30)).await;
    let job = a.enqueue("refund-1").await;
    // A locks the job on node 1 and writes attempt 1, then stops before
    // COMMIT.
    let mut gate = a.pauses.arm(jobfence_store::PausePoint::ClaimBeforeCommit);
    let claiming = {
        let a_client = a.client.clone();
        tokio::spawn(async move {
            a_client
                .clone()
                .claim(ClaimRequest {
                    queue: Q.into(),
                    worker_id: "worker-a".into(),
                    max_jobs: 1,
                    lease: None,
                    wait: None,
                })
                .await
        })
    };
    gate.reached().await;
    // A's row lock exists only on node 1: B claims the same job through
    // node 2 at once, and commits first.
    let got_b = b.claim("worker-b", 1).await.expect("B's claim");
    assert_eq!(got_b.len(), 1, "node 2 does not see node 1's lock");
    assert_eq!((got_b[0].job_id, got_b[0].attempt), (job.job_id, 1));
    gate.release();
    // A's transaction is aborted (1213: certification, or B's write set
    // aborting it on node 1), run again on the rows as they now are, and
    // finds nothing to hand out.
    let got_a = claiming.await.unwrap().expect("A's claim answers");
    assert!(
        got_a.into_inner().jobs.is_empty(),
        "the loser of the race must hold nothing"
    );
    let (retried, reported) = a.coordinator.store().conflicts();
    assert!(retried >= 1, "A's conflict was counted");
    assert_eq!(reported, 0);
    assert_eq!(
        row(&db, 3, job.job_id).await,
        (JobState::Running, 1, Some("worker-b".into()))
    );
    assert_eq!(count_events(&db, job.job_id, "claimed").await, 1);
    println!(
        "cross-node claim race: the loser's transaction rolled back by Galera {retried} time(s), \
         retried, nothing handed out twice"
    );
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_complete_on_one_node_loses_to_a_takeover_on_another() {
    let _cluster = serial().await;
    let db = GaleraDb::new().await;
    let a = serve(&db, &[1], 1, Duration::from_secs(30)).await;
    let b = serve(&db, &[2], 1, Duration::from_secs(30)).await;
    let job = a.enqueue("refund-1").await;
    let held = a.claim("zombie", 1).await.unwrap().remove(0);
    assert_eq!(held.attempt, 1);
    let direct = db.direct(1);
    sqlx::query(
        "UPDATE jobs SET lease_until = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 1 SECOND) WHERE id = ?",
    )
    .bind(job.job_id)
    .execute(&direct)
    .await
    .unwrap();
    direct.close().await;
    // The zombie's Complete locks the row on node 1 and writes `succeeded`,
    // then stops before COMMIT.
    let mut gate = a.pauses.arm(jobfence_store::PausePoint::WriteBeforeCommit);
    let completing = {
        let a_client = a.client.clone();
        let id = job.job_id;
        tokio::spawn(async move {
            a_client
                .clone()
                .complete(CompleteRequest {
                    job_id: id,
                    attempt: 1,
                    provider_reference: "re_zombie".into(),
                    result: String::new(),
                    next: None,
                })
                .await
        })
    };
    gate.reached().await;
    // Meanwhile a takeover through node 2 commits attempt 2.
    let taken = b
        .client
        .clone()
        .takeover(TakeoverRequest {
            job_id: job.job_id,
            worker_id: "rescuer".into(),
            lease: None,
        })
        .await
        .expect("the takeover through node 2")
        .into_inner()
        .claimed
        .unwrap()
        .job
        .unwrap();
    assert_eq!(taken.attempt, 2);
    gate.release();
    // The zombie's write is aborted by Galera, runs again on the row as it
    // now is (attempt 2), and is refused like any stale write.
    let status = completing
        .await
        .unwrap()
        .expect_err("a stale write is never applied");
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(reason(&status), "ATTEMPT_SUPERSEDED");
    assert!(a.coordinator.store().conflicts().0 >= 1);
    assert_eq!(
        row(&db, 3, job.job_id).await,
        (JobState::Running, 2, Some("rescuer".into()))
    );
    assert_eq!(count_events(&db, job.job_id, "completed").await, 0);
    assert_eq!(
        count_events(&db, job.job_id, "stale_write_rejected").await,
        1
    );
    db.drop().await;
}

/// Runs `statement` on a connection of its own to `url`, and keeps that
/// connection (to hold a lock, or read while one is held). Plain
/// connections: the server's default `wsrep_sync_wait` (0).
async fn session(url: &str, statement: &str) -> sqlx::MySqlConnection {
    use sqlx::{Connection, Executor};
    let mut conn = sqlx::MySqlConnection::connect(url).await.unwrap();
    conn.execute(statement).await.unwrap();
    conn
}

/// Whether a jobfence session on the node of `observer` runs a statement
/// on `db`'s jobs table right now (the statement that waits).
async fn waiting_on_jobs(observer: &mut sqlx::MySqlConnection, db: &str) -> bool {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE DB = ? AND COMMAND NOT IN ('Sleep', 'Daemon') AND INFO LIKE '%FROM jobs%' \
         AND ID <> CONNECTION_ID()",
    )
    .bind(db)
    .fetch_one(observer)
    .await
    .unwrap();
    n > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_through_a_lagging_node_waits_for_the_claim_it_must_see() {
    let _cluster = serial().await;
    let db = GaleraDb::new().await;
    let a = serve(&db, &[1], 1, Duration::from_secs(30)).await;
    let b = serve(&db, &[2], 1, Duration::from_secs(30)).await;
    let b_no_wait = serve(&db, &[2], 0, Duration::from_secs(30)).await;
    let job = a.enqueue("refund-1").await;
    // Wait until node 2 has the job (a read that waits for the cluster).
    row(&db, 2, job.job_id).await;
    // Node 2 stops applying what the others commit: FLUSH TABLES WITH
    // READ LOCK pauses its appliers (a node that lags, made deterministic).
    let mut lock = session(&db.urls[1], "FLUSH TABLES WITH READ LOCK").await;
    let mut observer = session(&db.urls[1], "SELECT 1").await;
    // The claim commits through node 1 (certified; node 2 applies it later).
    let held = a.claim("worker", 1).await.unwrap().remove(0);
    assert_eq!((held.job_id, held.attempt), (job.job_id, 1));
    // Without wsrep_sync_wait node 2 answers from what it has applied: the
    // attempt the worker holds is not there.
    let (stale, _) = b_no_wait
        .coordinator
        .store()
        .get_job(job.job_id)
        .await
        .unwrap();
    assert_eq!(
        (stale.state, stale.attempt),
        (JobState::Ready, 0),
        "node 2 lags: without wsrep_sync_wait it shows the job as it was"
    );
    // With wsrep_sync_wait=1 (the default) a read on node 2 waits until
    // node 2 has applied what the cluster committed before it ...
    let reading = {
        let store = b.coordinator.store().clone();
        let id = job.job_id;
        tokio::spawn(async move { store.get_job(id).await })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !waiting_on_jobs(&mut observer, &db.name).await {
        assert!(
            !reading.is_finished(),
            "the read answered while node 2 had not applied the claim: {:?}",
            reading.await.unwrap().map(|(j, _)| (j.state, j.attempt))
        );
        if Instant::now() > deadline {
            let rows: Vec<String> = sqlx::query_scalar(
                "SELECT CONCAT_WS(' | ', ID, DB, COMMAND, STATE, INFO) \
                 FROM information_schema.PROCESSLIST",
            )
            .fetch_all(&mut observer)
            .await
            .unwrap();
            panic!("the read never reached node 2: {rows:#?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ... which it does once its appliers run again.
    {
        use sqlx::Executor;
        lock.execute("UNLOCK TABLES").await.unwrap();
    }
    let (seen, _) = reading.await.unwrap().unwrap();
    assert_eq!((seen.state, seen.attempt), (JobState::Running, 1));
    // And the worker's Complete through node 2 finds the attempt it holds.
    let done = b
        .complete(held.job_id, held.attempt)
        .await
        .expect("the Complete through node 2 sees attempt 1 and applies");
    assert_eq!(done.attempt, 1);
    assert_eq!(row(&db, 3, job.job_id).await.0, JobState::Succeeded);
    println!(
        "node 2 lagging (appliers paused): a read there without wsrep_sync_wait showed attempt 0; \
         with wsrep_sync_wait=1 it waited for the claim, and the Complete through node 2 applied"
    );
    drop((lock, observer));
    db.drop().await;
}

mod nodes_go;
mod outage;
