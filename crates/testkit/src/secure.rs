//! A coordinator served in-process with TLS and the callers file on, over
//! a private database, and clients that present a chosen caller's
//! credential (or none).

use crate::harness::TestDb;
use crate::serve::{Serve, Served};
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::job_events_client::JobEventsClient;
use jobfence_auth::pki::{self, DevCaller, DevFiles};
use jobfence_auth::{Authenticator, Role};
use jobfence_core::Coordinator;
use jobfence_server::limits::Limits;
use jobfence_server::transport::{ServerTls, TlsFiles};
use jobfence_server::{Companion, OpsOptions, Security, ServeOptions};
use jobfence_worker::credentials::{Authorization, BearerToken, Credentials};
use sqlx::mysql::MySqlPool;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The callers every secure test can use.
pub const CALLERS: &[(&str, Role, &str)] = &[
    ("refunds-worker", Role::Worker, "refunds"),
    ("payouts-worker", Role::Worker, "payouts"),
    ("shop", Role::Producer, "refunds"),
    ("alice", Role::Operator, "*"),
    ("bob", Role::Operator, "*"),
    ("hooks", Role::Webhook, "*"),
    ("refunds-reader", Role::EventsReader, "refunds"),
    ("cert-worker", Role::Worker, "refunds"),
];

/// The name of a caller whose token expired.
pub const EXPIRED: &str = "expired-worker";

/// A channel that adds a caller's bearer token.
pub type Authed = InterceptedService<Channel, Authorization>;

/// Writes the test callers' credentials into a fresh temporary directory
/// (with `cert-worker`'s client certificate, and an expired token).
pub fn credentials() -> DevFiles {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "jobfence-security-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let callers: Vec<DevCaller> = CALLERS
        .iter()
        .map(|(name, role, queues)| DevCaller {
            name: (*name).into(),
            role: *role,
            queues: (*queues).into(),
        })
        .collect();
    let files = pki::dev_setup(
        &dir,
        &["localhost", "127.0.0.1"],
        &callers,
        &["cert-worker".to_owned()],
    )
    .expect("dev credentials");
    // A token that expired a minute ago.
    let token = pki::new_token().unwrap();
    pki::write_secret(&files.token(EXPIRED), &token).unwrap();
    let expired = chrono::Utc::now() - chrono::Duration::minutes(1);
    let line = pki::callers_line(EXPIRED, Role::Worker, "refunds", &token, Some(expired));
    let mut text = std::fs::read_to_string(&files.callers).unwrap();
    text.push_str(&line);
    text.push('\n');
    std::fs::write(&files.callers, text).unwrap();
    files
}

/// A coordinator with TLS (mutual, if asked) and authentication.
pub struct Secure {
    pub pool: MySqlPool,
    pub addr: std::net::SocketAddr,
    pub files: DevFiles,
    /// The companion's address, when started with one (the console,
    /// acting as `alice`).
    pub console: Option<std::net::SocketAddr>,
    pub coordinator: Coordinator,
    pub security: Security,
    served: Served,
}

/// Makes the companion a [`Secure`] serves beside gRPC (the console, in
/// the tests that have it), on the listener given, from the server's
/// security and the test callers' files.
pub type MakeCompanion =
    Box<dyn FnOnce(tokio::net::TcpListener, &Security, &DevFiles) -> Companion>;

impl Secure {
    /// Serves over a fresh database; `mutual` requires client certificates.
    pub async fn start(mutual: bool) -> Secure {
        Self::over(TestDb::new().await.pool(), mutual).await
    }

    /// Serves over `pool`'s database (beside another coordinator on it).
    pub async fn over(pool: MySqlPool, mutual: bool) -> Secure {
        Self::serve(pool, mutual, None, Limits::default()).await
    }

    /// Serves over a fresh database, with a companion (the console) on a
    /// loopback port of its own ([`Secure::console`]).
    pub async fn with_companion(make: MakeCompanion) -> Secure {
        Self::serve(
            TestDb::new().await.pool(),
            false,
            Some(make),
            Limits::default(),
        )
        .await
    }

    /// Serves over a fresh database under `limits`.
    pub async fn with_limits(limits: Limits) -> Secure {
        Self::serve(TestDb::new().await.pool(), false, None, limits).await
    }

    async fn serve(
        pool: MySqlPool,
        mutual: bool,
        companion: Option<MakeCompanion>,
        limits: Limits,
    ) -> Secure {
        let files = credentials();
        let security = Security {
            tls: Some(Arc::new(
                ServerTls::load(TlsFiles {
                    cert: files.server_cert.clone(),
                    key: files.server_key.clone(),
                    client_ca: mutual.then(|| files.ca.clone()),
                })
                .unwrap(),
            )),
            auth: Some(Arc::new(Authenticator::from_file(&files.callers).unwrap())),
            reload_on_sighup: false,
        };
        let (companions, console) = match companion {
            Some(make) => {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let a = l.local_addr().unwrap();
                (vec![make(l, &security, &files)], Some(a))
            }
            None => (Vec::new(), None),
        };
        let served = Serve::over(pool.clone())
            .options(ServeOptions {
                shutdown_timeout: Duration::from_secs(5),
                ..crate::test_options()
            })
            .ops(OpsOptions {
                security: security.clone(),
                limits,
                companions,
                ..OpsOptions::default()
            })
            .start()
            .await;
        Secure {
            pool,
            addr: served.addr,
            files,
            console,
            coordinator: served.coordinator.clone(),
            security,
            served,
        }
    }

    /// Rows of providers, queue_policies and policy_changes.
    pub async fn policy_rows(&self) -> (i64, i64, i64) {
        let n = |table: &'static str| {
            let pool = self.pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(&format!("SELECT COUNT(*) FROM {table}"))
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            }
        };
        (
            n("providers").await,
            n("queue_policies").await,
            n("policy_changes").await,
        )
    }

    /// A `refunds` job enqueued and claimed by the refunds worker.
    pub async fn running(&self, key: &str) -> jobfence_api::v1::Job {
        let mut w = self.worker(Some("refunds-worker")).await;
        w.enqueue(jobfence_api::v1::EnqueueRequest {
            queue: "refunds".into(),
            operation_key: key.into(),
            payload: "{}".into(),
            delay: None,
            fairness_key: String::new(),
            priority: 0,
        })
        .await
        .unwrap();
        let mut jobs = w
            .claim(jobfence_api::v1::ClaimRequest {
                queue: "refunds".into(),
                worker_id: "w".into(),
                max_jobs: 1,
                lease: crate::secs(30),
                wait: None,
            })
            .await
            .unwrap()
            .into_inner()
            .jobs;
        assert_eq!(jobs.len(), 1);
        jobs.remove(0).job.unwrap()
    }

    /// The TLS settings and the token of `caller` (`None`: no token).
    pub fn creds(&self, caller: Option<&str>) -> Credentials {
        let token = caller.map(|c| {
            let text = std::fs::read_to_string(self.files.token(c)).unwrap();
            BearerToken::new(text.trim()).unwrap()
        });
        Credentials {
            tls_ca_pem: Some(std::fs::read(&self.files.ca).unwrap()),
            token,
            ..Credentials::default()
        }
    }

    /// A channel presenting `creds`.
    pub async fn channel(&self, creds: &Credentials) -> Authed {
        let channel = creds
            .endpoint(format!("https://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .expect("TLS connection to the coordinator");
        InterceptedService::new(channel, creds.authorization())
    }

    /// The worker service as `caller`.
    pub async fn worker(&self, caller: Option<&str>) -> JobCoordinatorClient<Authed> {
        JobCoordinatorClient::new(self.channel(&self.creds(caller)).await)
    }

    /// The operator service as `caller`.
    pub async fn admin(&self, caller: Option<&str>) -> JobAdminClient<Authed> {
        JobAdminClient::new(self.channel(&self.creds(caller)).await)
    }

    /// The events feed as `caller`.
    pub async fn events(&self, caller: Option<&str>) -> JobEventsClient<Authed> {
        JobEventsClient::new(self.channel(&self.creds(caller)).await)
    }

    /// Rows of jobs, job_events and job_observations.
    pub async fn counts(&self) -> (i64, i64, i64) {
        let n = |table: &'static str| {
            let pool = self.pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(&format!("SELECT COUNT(*) FROM {table}"))
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            }
        };
        (
            n("jobs").await,
            n("job_events").await,
            n("job_observations").await,
        )
    }

    /// `jobfence_auth_refusals_total{reason}` now.
    pub fn refusals(&self, reason: &str) -> u64 {
        let text = self.coordinator.metrics().render();
        let prefix = format!("jobfence_auth_refusals_total{{reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0, |v| v.trim().parse().unwrap())
    }

    /// Rewrites the callers file without `name`'s lines and reloads it.
    pub fn revoke(&self, name: &str) {
        let text = std::fs::read_to_string(&self.files.callers).unwrap();
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| l.split_whitespace().next() != Some(name))
            .collect();
        std::fs::write(&self.files.callers, kept.join("\n") + "\n").unwrap();
        self.security.reload().unwrap();
    }

    /// The environment a worker process of `caller` needs: the address
    /// (https), the CA and the token file, as scripts/serve prints them.
    pub fn client_env(&self, caller: &str) -> Vec<(&'static str, String)> {
        vec![
            ("JOBFENCE_COORDINATOR", format!("https://{}", self.addr)),
            ("JOBFENCE_TLS_CA", self.files.ca.display().to_string()),
            (
                "JOBFENCE_TOKEN_FILE",
                self.files.token(caller).display().to_string(),
            ),
        ]
    }

    /// The client certificate and key of `name` (PEM).
    pub fn client_cert(&self, name: &str) -> (Vec<u8>, Vec<u8>) {
        let (cert, key): (PathBuf, PathBuf) = self.files.client_cert(name);
        (std::fs::read(cert).unwrap(), std::fs::read(key).unwrap())
    }

    pub async fn stop(mut self) {
        self.served.stop().await;
        let _ = std::fs::remove_dir_all(&self.files.dir);
    }
}
