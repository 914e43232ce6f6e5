//! A coordinator served in-process with TLS and the callers file on, over
//! a private database, and clients that present a chosen caller's
//! credential (or none).
#![allow(dead_code)]

use crate::common::{test_config, TestDb};
use jobfence::auth::pki::{self, DevCaller, DevFiles};
use jobfence::auth::{Authenticator, Role};
use jobfence::coordinator::Coordinator;
use jobfence::proto::job_admin_client::JobAdminClient;
use jobfence::proto::job_coordinator_client::JobCoordinatorClient;
use jobfence::proto::job_events_client::JobEventsClient;
use jobfence::server::limits::Limits;
use jobfence::server::transport::{ServerTls, TlsFiles};
use jobfence::server::{self, OpsOptions, Security, ServeOptions};
use jobfence::store::JobStore;
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
    /// The console's address, when started with one (acting as `alice`).
    pub console: Option<std::net::SocketAddr>,
    pub coordinator: Coordinator,
    pub security: Security,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Secure {
    /// Serves over a fresh database; `mutual` requires client certificates.
    pub async fn start(mutual: bool) -> Secure {
        Self::over(TestDb::new().await.pool(), mutual).await
    }

    /// Serves over `pool`'s database (beside another coordinator on it).
    pub async fn over(pool: MySqlPool, mutual: bool) -> Secure {
        Self::serve(pool, mutual, false, Limits::default()).await
    }

    /// Serves over a fresh database, with the console acting as `alice`.
    pub async fn with_console() -> Secure {
        Self::serve(TestDb::new().await.pool(), false, true, Limits::default()).await
    }

    /// Serves over a fresh database under `limits`.
    pub async fn with_limits(limits: Limits) -> Secure {
        Self::serve(TestDb::new().await.pool(), false, false, limits).await
    }

    async fn serve(pool: MySqlPool, mutual: bool, console: bool, limits: Limits) -> Secure {
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
        let coordinator = Coordinator::new(JobStore::new(pool.clone()), test_config());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (companions, console_addr) = if console {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let a = l.local_addr().unwrap();
            let token = std::fs::read_to_string(files.token("alice")).unwrap();
            let identity = jobfence::console::operator::Identity::for_coordinator(
                security.auth.clone(),
                Some(token.trim().to_owned()),
            )
            .unwrap();
            (
                vec![jobfence::console::companion(l, identity).unwrap()],
                Some(a),
            )
        } else {
            (Vec::new(), None)
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(server::serve_with(
            coordinator.clone(),
            listener,
            ServeOptions {
                health_interval: Duration::from_millis(100),
                health_timeout: Duration::from_millis(100),
                drain_delay: Duration::ZERO,
                shutdown_timeout: Duration::from_secs(5),
            },
            OpsOptions {
                security: security.clone(),
                limits,
                companions,
                ..OpsOptions::default()
            },
            async {
                let _ = rx.await;
            },
        ));
        Secure {
            pool,
            addr,
            files,
            console: console_addr,
            coordinator,
            security,
            stop: Some(tx),
            server: Some(server),
        }
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
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(s) = self.server.take() {
            s.await.unwrap().unwrap();
        }
        let _ = std::fs::remove_dir_all(&self.files.dir);
    }
}
