//! Test harness: a fresh database per test on the real MariaDB started by
//! `scripts/mariadb`, the coordinator served in-process on an ephemeral
//! loopback port, and a gRPC client to it.
#![allow(dead_code)]

pub mod proxy;

use jobfence::coordinator::{Coordinator, CoordinatorConfig};
use jobfence::domain::Job;
use jobfence::proto::job_coordinator_client::JobCoordinatorClient;
use jobfence::proto::{self, ClaimRequest, EnqueueRequest};
use jobfence::server::{self, ServeOptions};
use jobfence::store::{self, JobStore, PausePoints, PoolSettings};
use sqlx::mysql::MySqlPool;
use sqlx::Row;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tonic::transport::Channel;
use tonic_types::StatusExt;

/// The admin URL tests create their databases through.
pub fn base_url() -> String {
    std::env::var("JOBFENCE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| jobfence::cli::DEFAULT_DATABASE_URL.to_owned())
}

fn with_database(url: &str, db: &str) -> String {
    let (head, _) = url.rsplit_once('/').expect("database URL has a path");
    format!("{head}/{db}")
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
        let pool = store::connect(&db.url, &PoolSettings::default()).unwrap();
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
        let admin = MySqlPool::connect(&base_url()).await.unwrap_or_else(|e| {
            panic!(
                "cannot reach the test database at {} ({e}); run scripts/test, which starts it",
                base_url()
            )
        });
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
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub fn test_config() -> CoordinatorConfig {
    CoordinatorConfig {
        min_lease: Duration::from_millis(100),
        ..CoordinatorConfig::default()
    }
}

impl Harness {
    pub async fn start() -> Harness {
        Self::start_with(
            test_config(),
            ServeOptions {
                health_interval: Duration::from_millis(100),
                health_timeout: Duration::from_millis(100),
                drain_delay: Duration::ZERO,
                shutdown_timeout: Duration::from_secs(10),
            },
        )
        .await
    }

    pub async fn start_with(config: CoordinatorConfig, options: ServeOptions) -> Harness {
        let db = TestDb::new().await;
        let pool = db.pool();
        Self::serve(db, pool.clone(), pool, config, options).await
    }

    /// A coordinator whose database connections go through a proxy the
    /// test can cut; `Harness::pool` stays direct.
    pub async fn start_behind_proxy(options: ServeOptions) -> (Harness, proxy::Proxy) {
        let db = TestDb::new().await;
        let direct = db.pool();
        let upstream = url_host_port(&db.url);
        let proxy = proxy::Proxy::start(upstream)
            .await
            .expect("start the relay");
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
        let pauses = PausePoints::new();
        let store = JobStore::with_pause_points(store_pool, pauses.clone());
        let coordinator = Coordinator::new(store, config);
        let served = coordinator.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(server::serve(served, listener, options, async {
            let _ = rx.await;
        }));
        let client = JobCoordinatorClient::connect(format!("http://{addr}"))
            .await
            .expect("connect to in-process coordinator");
        Harness {
            db,
            pool,
            pauses,
            client,
            addr,
            coordinator,
            shutdown: Some(tx),
            server: Some(server),
        }
    }

    /// A second coordinator on the same database (another replica), served
    /// until the returned handle is dropped.
    pub async fn replica(&self, config: CoordinatorConfig) -> Replica {
        let store = JobStore::new(self.db.pool());
        let coordinator = Coordinator::new(store, config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let served = coordinator.clone();
        tokio::spawn(server::serve(
            served,
            listener,
            ServeOptions {
                drain_delay: Duration::ZERO,
                ..ServeOptions::default()
            },
            async {
                let _ = rx.await;
            },
        ));
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
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(s) = self.server.take() {
            s.await.unwrap().unwrap();
        }
    }

    pub async fn enqueue(&self, queue: &str, key: &str, payload: &str) -> proto::Job {
        self.client
            .clone()
            .enqueue(EnqueueRequest {
                queue: queue.into(),
                operation_key: key.into(),
                payload: payload.into(),
                delay: None,
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
        if let Ok(admin) = MySqlPool::connect(&base_url()).await {
            let _ = sqlx::query(&format!("DROP DATABASE `{}`", self.db.name))
                .execute(&admin)
                .await;
        }
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server::serve(
        coordinator,
        listener,
        ServeOptions {
            health_interval: Duration::from_millis(100),
            health_timeout,
            drain_delay: Duration::ZERO,
            shutdown_timeout: Duration::from_secs(5),
        },
        async {
            let _ = stopped.await;
        },
    ));
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

/// Open InnoDB transactions of sessions using this test's database (other
/// tests run on the same server), other than the asking one.
pub async fn open_transactions(h: &Harness) -> Vec<(u64, String)> {
    sqlx::query(
        "SELECT CAST(t.trx_mysql_thread_id AS UNSIGNED) AS id, CAST(t.trx_state AS CHAR) AS state \
         FROM information_schema.innodb_trx t \
         JOIN information_schema.processlist p ON p.ID = t.trx_mysql_thread_id \
         WHERE p.DB = ? AND t.trx_mysql_thread_id <> CONNECTION_ID()",
    )
    .bind(&h.db.name)
    .fetch_all(&h.pool)
    .await
    .expect("read information_schema.innodb_trx")
    .into_iter()
    .map(|r| (r.get::<u64, _>("id"), r.get::<String, _>("state")))
    .collect()
}

/// Kills the database session of the transaction paused at `gate` (a
/// `claim.before_commit` or `write.before_commit` point that was
/// reached). Its COMMIT, when released, then meets a dead connection: the
/// coordinator cannot know whether it committed (it did not: the kill
/// rolled it back).
pub async fn kill_the_paused_session(h: &Harness, gate: &jobfence::store::Armed) {
    let id = gate
        .connection_id()
        .expect("the pause point was reached inside a transaction");
    sqlx::query(&format!("KILL CONNECTION {id}"))
        .execute(&h.pool)
        .await
        .expect("kill the paused session");
}

/// What a shortened `jobfence demo` printed.
pub struct DemoRun {
    /// The final report (stdout).
    pub report: String,
    /// Its progress lines (stderr), for failure messages.
    pub progress: String,
}

/// Runs `jobfence demo` with Rust workers only, 200 refunds, the default
/// failures and `args` (the database among them; a flag given there
/// replaces the default of the same flag here), and checks it ended with
/// `invariant: OK`.
pub async fn run_short_demo(name: &str, args: &[&str]) -> DemoRun {
    let work = std::env::temp_dir().join(format!("jobfence-demo-{}-{name}", std::process::id()));
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    for (flag, value) in [
        ("--jobs", "200"),
        ("--workers", "2"),
        ("--python-workers", "0"),
        ("--node-workers", "0"),
        ("--max-duration", "150s"),
        ("--seed", "7"),
        ("--work-dir", work.to_str().unwrap()),
    ] {
        if !args.contains(&flag) {
            all.extend([flag.to_owned(), value.to_owned()]);
        }
    }
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobfence"))
        .arg("demo")
        .args(&all)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run jobfence demo");
    let run = DemoRun {
        report: String::from_utf8_lossy(&out.stdout).into_owned(),
        progress: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(out.status.success(), "demo failed\n{}", run.context());
    assert_eq!(
        run.report.trim_end().lines().last(),
        Some("invariant: OK"),
        "{}",
        run.context()
    );
    run
}

impl DemoRun {
    /// The report and the progress, for a failure message.
    pub fn context(&self) -> String {
        format!("report:\n{}\nprogress:\n{}", self.report, self.progress)
    }

    /// The report's line `label` (`provider 429s`, `takeover storm`, …),
    /// without its label.
    pub fn line(&self, label: &str) -> String {
        report_line(&self.report, label)
            .unwrap_or_else(|| panic!("no {label:?} line\n{}", self.context()))
    }

    /// The numbers on the report's line `label`, in order (`0 of 594
    /// requests` is [0, 594]).
    pub fn numbers(&self, label: &str) -> Vec<u64> {
        numbers(&self.line(label))
    }
}

/// The demo report's line `label`, without its label.
pub fn report_line(report: &str, label: &str) -> Option<String> {
    report.lines().find_map(|l| {
        l.trim_start()
            .strip_prefix(label)
            .filter(|rest| rest.starts_with("  "))
            .map(|rest| rest.trim().to_owned())
    })
}

/// The whole numbers in `text`, in order (a decimal point ends one).
pub fn numbers(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect()
}
