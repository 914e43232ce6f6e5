//! The harness most tests use: a fresh database per test on the real
//! MariaDB started by `scripts/mariadb`, a coordinator served in-process
//! ([`crate::Serve`]) on a loopback port of the system's choosing, and a
//! gRPC client to it; with the helpers tests share (reasons, waits, the
//! database-side levers).

pub use crate::serve::test_config;
use crate::serve::{test_options, Serve, Served};
use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{self as proto, ClaimRequest, EnqueueRequest};
use jobfence_core::{Coordinator, CoordinatorConfig};
use jobfence_domain::Job;
use jobfence_fake_provider::netcut::NetCut;
use jobfence_server::ServeOptions;
use jobfence_store::{self as store, JobStore, PausePoints, PoolSettings};
use sqlx::mysql::MySqlPool;
use sqlx::Row;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tonic::transport::Channel;
use tonic_types::StatusExt;

/// The database of the project-local MariaDB that `scripts/mariadb`
/// starts (the binary's default `--database-url`).
pub const DEFAULT_DATABASE_URL: &str = "mysql://jobfence:jobfence@127.0.0.1:3307/jobfence";

/// The admin URL tests create their databases through
/// (`JOBFENCE_TEST_DATABASE_URL`, which scripts/test sets).
pub fn base_url() -> String {
    std::env::var("JOBFENCE_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned())
}

/// The root of the repository (for scripts, docs and the clients' sources).
pub fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn with_database(url: &str, db: &str) -> String {
    let (head, _) = url.rsplit_once('/').expect("database URL has a path");
    format!("{head}/{db}")
}

/// A connection to the test server for creating and dropping databases.
///
/// A connection can fail for a moment on a loaded machine (a handshake
/// cut short, every server thread busy); that is not the test's failure, so
/// any error but a refused login is tried again, with a growing pause, for
/// up to two minutes; then the panic names every error seen.
pub async fn connect_admin() -> MySqlPool {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut pause = Duration::from_millis(100);
    let mut seen = Vec::new();
    loop {
        match MySqlPool::connect(&base_url()).await {
            Ok(pool) => return pool,
            Err(e) => {
                let refused_login = matches!(&e, sqlx::Error::Database(db)
                    if db.code().as_deref() == Some("28000"));
                seen.push(e.to_string());
                if refused_login || std::time::Instant::now() >= deadline {
                    panic!(
                        "cannot reach the test database at {}; run scripts/test, which starts it. \
                         Errors, oldest first: {seen:?}",
                        base_url()
                    );
                }
                eprintln!("test database not reached ({e}); trying again in {pause:?}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// A private database, migrated.
pub struct TestDb {
    pub name: String,
    pub url: String,
}

impl TestDb {
    /// A private, migrated database.
    pub async fn new() -> TestDb {
        let db = Self::empty().await;
        // A loaded machine (two test binaries and a build at once) can keep
        // a connection waiting for longer than a coordinator's 1 s.
        let settings = PoolSettings {
            acquire_timeout: Duration::from_secs(30),
            ..PoolSettings::default()
        };
        let pool = store::connect(&db.url, &settings).unwrap();
        store::MIGRATOR.run(&pool).await.expect("migrations apply");
        pool.close().await;
        db
    }

    /// A private database without the schema.
    pub async fn empty() -> TestDb {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "jf_test_{}_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        let admin = connect_admin().await;
        sqlx::query(&format!(
            "CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        ))
        .execute(&admin)
        .await
        .expect("create test database");
        admin.close().await;
        let url = with_database(&base_url(), &name);
        TestDb { name, url }
    }

    /// A pool through the production connect path (READ COMMITTED sessions).
    pub fn pool(&self) -> MySqlPool {
        store::connect(&self.url, &PoolSettings::default()).unwrap()
    }
}

/// A running coordinator over a private database.
pub struct Harness {
    pub db: TestDb,
    pub pool: MySqlPool,
    pub pauses: PausePoints,
    pub client: JobCoordinatorClient<Channel>,
    pub addr: std::net::SocketAddr,
    /// The served coordinator (shares its pipelines and metrics).
    pub coordinator: Coordinator,
    served: crate::Served,
}

impl Harness {
    /// A coordinator with [`test_config`] and [`crate::test_options`] over
    /// a fresh database.
    pub async fn start() -> Harness {
        Self::start_with(test_config(), test_options()).await
    }

    /// [`Harness::start`] with this configuration and these timings.
    pub async fn start_with(config: CoordinatorConfig, options: ServeOptions) -> Harness {
        let db = TestDb::new().await;
        let pool = db.pool();
        Self::serve(db, pool.clone(), pool, config, options).await
    }

    /// [`Harness::start`] whose coordinator sees the database clock
    /// stopped at `unix_micros` (microseconds since the Unix epoch, UTC):
    /// every `UTC_TIMESTAMP(6)` of its sessions is that instant, so a test
    /// can place a lease's end exactly on the claim's clock.
    /// `Harness::pool` keeps the real clock.
    pub async fn start_frozen_at(unix_micros: i64) -> Harness {
        let db = TestDb::new().await;
        let pool = db.pool();
        let served = Serve::over(pool.clone())
            .clock_frozen_at(unix_micros)
            .start()
            .await;
        Self::around(db, pool, served).await
    }

    /// [`Harness::start`] whose store sessions wait at most `secs` seconds
    /// for a row lock (`innodb_lock_wait_timeout`; the coordinator's own
    /// default is 10 s): a call stuck behind a paused one becomes a lock
    /// wait timeout, 1205, soon. `Harness::pool` keeps the server's default.
    pub async fn start_with_lock_wait(secs: u32) -> Harness {
        Self::start_with_session_sql(&format!("; SET SESSION innodb_lock_wait_timeout = {secs}"))
            .await
    }

    /// [`Harness::start`] whose store sessions each run `more` (SQL
    /// starting with `;`) after their setup, e.g. a short `wait_timeout`.
    /// `Harness::pool` keeps the server's defaults.
    pub async fn start_with_session_sql(more: &str) -> Harness {
        let db = TestDb::new().await;
        let pool = db.pool();
        let served = Serve::over(pool.clone()).session_sql(more).start().await;
        Self::around(db, pool, served).await
    }

    /// A coordinator whose database connections go through a proxy the
    /// test can cut; `Harness::pool` stays direct.
    pub async fn start_behind_proxy(options: ServeOptions) -> (Harness, NetCut) {
        let db = TestDb::new().await;
        let direct = db.pool();
        let upstream = url_host_port(&db.url);
        let proxy = NetCut::start(upstream).await.expect("start the relay");
        let via = db
            .url
            .replace(&upstream.to_string(), &proxy.addr.to_string());
        let settings = PoolSettings {
            acquire_timeout: Duration::from_secs(1),
            ..PoolSettings::default()
        };
        let store_pool = store::connect(&via, &settings).unwrap();
        let h = Self::serve(db, direct, store_pool, test_config(), options).await;
        (h, proxy)
    }

    async fn serve(
        db: TestDb,
        pool: MySqlPool,
        store_pool: MySqlPool,
        config: CoordinatorConfig,
        options: ServeOptions,
    ) -> Harness {
        let served = Serve::over(store_pool)
            .config(config)
            .options(options)
            .start()
            .await;
        Self::around(db, pool, served).await
    }

    async fn around(db: TestDb, pool: MySqlPool, served: Served) -> Harness {
        let client = JobCoordinatorClient::connect(served.url())
            .await
            .expect("connect to in-process coordinator");
        Harness {
            db,
            pool,
            pauses: served.pauses.clone(),
            client,
            addr: served.addr,
            coordinator: served.coordinator.clone(),
            served,
        }
    }

    /// A second coordinator on the same database (another replica), served
    /// until the returned handle is dropped.
    pub async fn replica(&self, config: CoordinatorConfig) -> Replica {
        let served = Serve::over(self.db.pool())
            .config(config)
            .options(ServeOptions {
                drain_delay: Duration::ZERO,
                ..ServeOptions::default()
            })
            .start()
            .await;
        let (coordinator, addr, tx) = served.detach();
        let client = JobCoordinatorClient::connect(format!("http://{addr}"))
            .await
            .expect("connect to the replica");
        Replica {
            client,
            coordinator,
            _stop: tx,
        }
    }

    /// A second, independent client (another worker).
    pub async fn another_client(&self) -> JobCoordinatorClient<Channel> {
        JobCoordinatorClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap()
    }

    /// Stops the server (graceful) and waits for it.
    pub async fn stop(&mut self) {
        self.served.stop().await;
    }

    pub async fn enqueue(&self, queue: &str, key: &str, payload: &str) -> proto::Job {
        self.client
            .clone()
            .enqueue(EnqueueRequest {
                queue: queue.into(),
                operation_key: key.into(),
                payload: payload.into(),
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

    pub async fn claim(&self, queue: &str, worker: &str, max: u32) -> Vec<proto::ClaimedJob> {
        self.client
            .clone()
            .claim(ClaimRequest {
                queue: queue.into(),
                worker_id: worker.into(),
                max_jobs: max,
                lease: None,
                wait: None,
            })
            .await
            .expect("claim")
            .into_inner()
            .jobs
    }

    /// Claims exactly one job and returns it.
    pub async fn claim_one(&self, queue: &str, worker: &str) -> proto::Job {
        let mut jobs = self.claim(queue, worker, 1).await;
        assert_eq!(jobs.len(), 1, "expected one claimable job in {queue}");
        jobs.remove(0).job.unwrap()
    }

    /// Enqueues one job, claims it as `worker-a` and parks it in manual
    /// review (a worker's Fail asking for it); the job as parked.
    pub async fn parked(&self, queue: &str, key: &str) -> proto::Job {
        let job = self.enqueue(queue, key, "{}").await;
        let claimed = self.claim_one(queue, "worker-a").await;
        assert_eq!(claimed.job_id, job.job_id, "the only ready job");
        self.client
            .clone()
            .fail(proto::FailRequest {
                job_id: job.job_id,
                attempt: claimed.attempt,
                disposition: proto::FailDisposition::ManualReview as i32,
                error: "provider says unknown".into(),
                retry_delay: None,
                provider_retry_after: None,
                next: None,
            })
            .await
            .expect("the Fail parks the job")
            .into_inner()
            .job
            .expect("the parked job")
    }

    /// Gives `queue` to provider `name` with a budget of `rate` units a
    /// second and `burst` (JobAdmin.PutProvider, as the operator "alice").
    pub async fn put_budget(&self, name: &str, queue: &str, rate: f64, burst: u32) {
        self.put_budget_capped(name, queue, (rate, burst), None)
            .await;
    }

    /// [`put_budget`](Self::put_budget) with `(rate, burst)` and a cap of
    /// `max_in_flight` jobs in flight (`None`: no cap).
    pub async fn put_budget_capped(
        &self,
        name: &str,
        queue: &str,
        (rate, burst): (f64, u32),
        max_in_flight: Option<u32>,
    ) {
        jobfence_api::v1::job_admin_client::JobAdminClient::connect(format!(
            "http://{}",
            self.addr
        ))
        .await
        .unwrap()
        .put_provider(proto::PutProviderRequest {
            name: name.into(),
            budget: Some(proto::ProviderBudget {
                rate_per_second: rate,
                burst,
                max_in_flight,
                execute_cost: None,
                reconcile_cost: None,
                key_share: None,
                max_in_flight_per_key: None,
            }),
            queues: vec![queue.into()],
            operator: "alice".into(),
            reason: "the provider's published limit".into(),
        })
        .await
        .expect("put provider");
    }

    /// Makes a lease expire by editing the test data (the DB clock is not touched).
    pub async fn force_lease_expired(&self, job_id: u64) {
        let done = sqlx::query(
            "UPDATE jobs SET lease_until = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 1 SECOND) WHERE id = ? AND state = 'running'",
        )
        .bind(job_id)
        .execute(&self.pool)
        .await
        .unwrap();
        assert_eq!(done.rows_affected(), 1, "job {job_id} is running");
    }

    /// The row as stored, read directly.
    pub async fn row(&self, job_id: u64) -> Job {
        JobStore::new(self.pool.clone())
            .get_job(job_id)
            .await
            .unwrap()
            .0
    }

    /// `(kind, attempt, current_attempt)` of every event of the job, in order.
    pub async fn events(&self, job_id: u64) -> Vec<(String, u64, u64)> {
        sqlx::query("SELECT CAST(kind AS CHAR) AS kind, attempt, current_attempt FROM job_events WHERE job_id = ? ORDER BY id")
            .bind(job_id)
            .fetch_all(&self.pool)
            .await
            .unwrap()
            .into_iter()
            .map(|r| {
                let kind: Vec<u8> = r.get("kind");
                (String::from_utf8(kind).unwrap(), r.get("attempt"), r.get("current_attempt"))
            })
            .collect()
    }

    pub async fn count_events(&self, job_id: u64, kind: &str) -> usize {
        self.events(job_id)
            .await
            .iter()
            .filter(|e| e.0 == kind)
            .count()
    }

    pub async fn finish(mut self) {
        self.stop().await;
        self.pool.close().await;
        let admin = connect_admin().await;
        let _ = sqlx::query(&format!("DROP DATABASE `{}`", self.db.name))
            .execute(&admin)
            .await;
    }
}

/// Another coordinator over a harness's database.
pub struct Replica {
    pub client: JobCoordinatorClient<Channel>,
    pub coordinator: Coordinator,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Serves `coordinator` over gRPC on a loopback port in this process,
/// with health checks every 100 ms, until the returned `stop` is sent or
/// dropped; `channel` is connected to it.
pub async fn serve_in_process(coordinator: Coordinator, health_timeout: Duration) -> InProcess {
    let served = Serve::coordinator(coordinator)
        .options(ServeOptions {
            health_interval: Duration::from_millis(100),
            health_timeout,
            drain_delay: Duration::ZERO,
            shutdown_timeout: Duration::from_secs(5),
        })
        .start()
        .await;
    let (_, addr, stop) = served.detach();
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    InProcess { channel, stop }
}

/// A coordinator of [`serve_in_process`].
pub struct InProcess {
    pub channel: Channel,
    pub stop: tokio::sync::oneshot::Sender<()>,
}

/// `host:port` of a database URL (numeric loopback address expected).
pub fn url_host_port(url: &str) -> std::net::SocketAddr {
    let after_at = url.rsplit_once('@').map(|(_, r)| r).unwrap_or(url);
    let host_port = after_at.split('/').next().unwrap();
    host_port
        .parse()
        .expect("test database URL uses 127.0.0.1:PORT")
}

/// The ErrorInfo reason of a status (domain must be "jobfence").
pub fn reason(status: &tonic::Status) -> String {
    let info = status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("status without ErrorInfo: {status:?}"));
    assert_eq!(info.domain, "jobfence");
    info.reason
}

/// One ErrorInfo metadata value.
pub fn meta(status: &tonic::Status, key: &str) -> String {
    status
        .get_details_error_info()
        .and_then(|i| i.metadata.get(key).cloned())
        .unwrap_or_else(|| panic!("no ErrorInfo metadata {key} in {status:?}"))
}

pub fn secs(s: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: s,
        nanos: 0,
    })
}

/// Waits (yielding, no sleeps) until `ready` holds; panics after 10 s.
pub async fn until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// How many calls of `pipeline` (`write`, `claim`, `enqueue`, `long_poll`)
/// wait now.
pub fn waiting(c: &Coordinator, pipeline: &str) -> usize {
    c.waiting()
        .iter()
        .find(|(p, _)| *p == pipeline)
        .map(|(_, n)| *n)
        .unwrap_or(0)
}

/// Kills the database session of the transaction paused at `gate` (a
/// `ClaimBeforeCommit`, `WriteBeforeCommit`, `TakeoverBeforeCommit` or
/// `EnqueueBeforeCommit` point that was reached). Its COMMIT, when released, then meets a dead connection: the
/// coordinator cannot know whether it committed (it did not: the kill
/// rolled it back).
pub async fn kill_the_paused_session(h: &Harness, gate: &jobfence_store::Armed) {
    let id = gate
        .connection_id()
        .expect("the pause point was reached inside a transaction");
    sqlx::query(&format!("KILL CONNECTION {id}"))
        .execute(&h.pool)
        .await
        .expect("kill the paused session");
}
