//! The one way a test starts a coordinator in its own process: [`Serve`],
//! a builder over `jobfence_server::serve_with`. Every harness of this
//! crate ([`crate::Harness`], [`crate::ops::Coord`],
//! [`crate::secure::Secure`], [`crate::serve_in_process`]) is built with
//! it. Its listeners bind port 0 and read the port back, so no two tests
//! ever race for one.

use jobfence_core::{Coordinator, CoordinatorConfig};
use jobfence_server::{OpsOptions, ServeOptions};
use jobfence_store::shards::Shards;
use jobfence_store::{JobStore, PausePoints};
use sqlx::mysql::MySqlPool;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Lease bounds for tests: a lease may be as short as 100 ms.
pub fn test_config() -> CoordinatorConfig {
    CoordinatorConfig {
        min_lease: Duration::from_millis(100),
        ..CoordinatorConfig::default()
    }
}

/// Health every 100 ms (a 100 ms timeout), no drain delay, and 10 s for
/// in-flight calls at shutdown.
pub fn test_options() -> ServeOptions {
    ServeOptions {
        health_interval: Duration::from_millis(100),
        health_timeout: Duration::from_millis(100),
        drain_delay: Duration::ZERO,
        shutdown_timeout: Duration::from_secs(10),
    }
}

/// What the coordinator serves over.
enum Over {
    /// One database, by pool (a store is made, with the pause points).
    Pool(MySqlPool),
    /// Stores made by the test (several databases, a Galera cluster).
    Shards(Shards),
    /// A coordinator made by the test.
    Coordinator(Coordinator),
}

/// A coordinator to serve, as configured so far.
pub struct Serve {
    over: Over,
    config: CoordinatorConfig,
    options: ServeOptions,
    ops: OpsOptions,
    pauses: PausePoints,
    metrics: bool,
    frozen_at: Option<i64>,
    session_sql: Option<String>,
}

impl Serve {
    /// A coordinator over `pool`'s database, with [`test_config`] and
    /// [`test_options`], whose store stops at the pause points armed in
    /// [`Served::pauses`].
    pub fn over(pool: MySqlPool) -> Serve {
        Self::with(Over::Pool(pool))
    }

    /// A coordinator over stores the test made (several databases).
    pub fn over_shards(shards: Shards) -> Serve {
        Self::with(Over::Shards(shards))
    }

    /// Serves a coordinator the test made.
    pub fn coordinator(coordinator: Coordinator) -> Serve {
        Self::with(Over::Coordinator(coordinator))
    }

    fn with(over: Over) -> Serve {
        Serve {
            over,
            config: test_config(),
            options: test_options(),
            ops: OpsOptions::default(),
            pauses: PausePoints::new(),
            metrics: false,
            frozen_at: None,
            session_sql: None,
        }
    }

    /// The coordinator's configuration (ignored for [`Serve::coordinator`]).
    pub fn config(mut self, config: CoordinatorConfig) -> Serve {
        self.config = config;
        self
    }

    /// Health, drain and shutdown timings.
    pub fn options(mut self, options: ServeOptions) -> Serve {
        self.options = options;
        self
    }

    /// The operator side: security, limits, companions, intervals (its
    /// metrics listener is [`Serve::metrics`]'s).
    pub fn ops(mut self, ops: OpsOptions) -> Serve {
        self.ops = ops;
        self
    }

    /// Serves `GET /metrics` too, on a port of its own
    /// ([`Served::metrics_addr`]).
    pub fn metrics(mut self) -> Serve {
        self.metrics = true;
        self
    }

    /// Stops the database clock of the store's sessions at `unix_micros`
    /// (see `JobStore::frozen_clock_at`; [`Serve::over`] only).
    pub fn clock_frozen_at(mut self, unix_micros: i64) -> Serve {
        self.frozen_at = Some(unix_micros);
        self
    }

    /// Has every session of the store run `more` (SQL starting with `;`)
    /// after its setup (see `JobStore::with_session_sql`; [`Serve::over`]
    /// only, not with [`Serve::clock_frozen_at`]).
    pub fn session_sql(mut self, more: &str) -> Serve {
        self.session_sql = Some(more.to_owned());
        self
    }

    /// Starts serving on a loopback port of the system's choosing; the
    /// server runs until [`Served::stop`] (or until it is dropped).
    pub async fn start(self) -> Served {
        let coordinator = match self.over {
            Over::Pool(pool) => {
                let store = JobStore::with_pause_points(pool, self.pauses.clone());
                let store = match (self.frozen_at, &self.session_sql) {
                    (Some(t), _) => store.frozen_clock_at(t),
                    (None, Some(more)) => store.with_session_sql(more),
                    (None, None) => store,
                };
                Coordinator::new(store, self.config)
            }
            Over::Shards(shards) => Coordinator::over_shards(shards, self.config),
            Over::Coordinator(c) => c,
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut ops = self.ops;
        let mut metrics_addr = None;
        if self.metrics {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            metrics_addr = Some(l.local_addr().unwrap());
            ops.metrics_listener = Some(l);
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(jobfence_server::serve_with(
            coordinator.clone(),
            listener,
            self.options,
            ops,
            async {
                let _ = stopped.await;
            },
        ));
        Served {
            coordinator,
            addr,
            metrics_addr,
            pauses: self.pauses,
            stop: Some(stop),
            server: Some(server),
        }
    }
}

/// A coordinator served in this process.
pub struct Served {
    /// The served coordinator (shares its pipelines and metrics).
    pub coordinator: Coordinator,
    /// Its gRPC address (plain HTTP/2, or TLS when the ops say so).
    pub addr: SocketAddr,
    /// Its `/metrics` address, when asked for.
    pub metrics_addr: Option<SocketAddr>,
    /// The pause points of its store ([`Serve::over`] only).
    pub pauses: PausePoints,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Served {
    /// `http://` and the address.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the server (graceful, as on SIGTERM) and waits for it; panics
    /// if it failed.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(s) = self.server.take() {
            s.await.unwrap().unwrap();
        }
    }

    /// The channel that stops the server when sent to or dropped (for a
    /// harness that lets the server run until it is dropped).
    pub fn detach(mut self) -> (Coordinator, SocketAddr, oneshot::Sender<()>) {
        let stop = self.stop.take().expect("not stopped yet");
        self.server.take();
        (self.coordinator.clone(), self.addr, stop)
    }
}
