//! The accept loop. It serves each connection itself (instead of
//! `axum::serve`) so that a handler can drop its own connection without a
//! response: the `cut_response` fault.

use super::api::{self, AppState, CutSignal};
use super::client::ProviderClient;
use super::clock::Clock;
use super::faults::FaultInjector;
use super::limit::{ProviderStats, RateLimitConfig, RateLimiter};
use super::state::RefundBook;
use super::ProviderConfig;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::ServiceExt;

/// Serves the fake provider on `listener` until `shutdown` completes; then
/// every open connection is dropped (requests in flight get no answer).
///
/// Errors: an invalid `config` (a probability outside 0..=1), as
/// [`io::ErrorKind::InvalidInput`].
pub async fn serve(
    listener: TcpListener,
    config: ProviderConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    serve_app(listener, Arc::new(app_state(config)?), shutdown).await
}

async fn serve_app(
    listener: TcpListener,
    app: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let router = api::router(app);
    // Dropped on return, which ends every connection task.
    let (_stop_tx, stop_rx) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(serve_connection(stream, router.clone(), stop_rx.clone()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

fn app_state(config: ProviderConfig) -> io::Result<AppState> {
    config
        .validate()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    Ok(AppState {
        book: RefundBook::new(config.settlement(), config.clock.clone(), config.seed),
        faults: FaultInjector::new(config.faults, config.seed),
        limit: RateLimiter::new(config.rate_limit, config.clock.clone()),
    })
}

async fn serve_connection(stream: TcpStream, router: Router, mut stop: watch::Receiver<()>) {
    let cut = CutSignal::default();
    let signal = cut.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(signal.clone());
        router.clone().oneshot(req)
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    // Dropping `conn` closes the socket and drops any handler still running
    // (a hang, a cut, a latency sleep).
    tokio::select! {
        res = conn => {
            if let Err(e) = res {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        () = cut.0.notified() => tracing::debug!("connection cut without a response"),
        _ = stop.changed() => {}
    }
}

/// A provider running in-process on `127.0.0.1`, for tests and the demo.
/// Dropping it stops the provider and drops its open connections.
#[derive(Debug)]
pub struct ProviderHandle {
    addr: SocketAddr,
    clock: Clock,
    app: Arc<AppState>,
    task: JoinHandle<io::Result<()>>,
}

/// Starts a provider with `config` on `127.0.0.1:0` (a free port) and
/// returns once it accepts connections.
///
/// Errors: binding failed, or `config` is invalid
/// ([`io::ErrorKind::InvalidInput`]).
pub async fn spawn(config: ProviderConfig) -> io::Result<ProviderHandle> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let clock = config.clock.clone();
    // Built (and validated) here so a bad config fails the call, not the task.
    let app = Arc::new(app_state(config)?);
    let task = tokio::spawn(serve_app(listener, app.clone(), std::future::pending()));
    Ok(ProviderHandle {
        addr,
        clock,
        app,
        task,
    })
}

impl ProviderHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/`.
    pub fn base_url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// A client for this provider.
    pub fn client(&self) -> ProviderClient {
        ProviderClient::for_addr(self.addr)
    }

    /// The provider's clock; [`Clock::advance`] moves its retention,
    /// settlement, lag and rate limit forward.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// What it counted so far: requests, those refused by the rate limit,
    /// the peak per second (as `GET /_admin/stats`).
    pub fn stats(&self) -> ProviderStats {
        self.app.limit.stats()
    }

    /// Replaces the rate limit (as `PUT /_admin/rate-limit`) and returns
    /// the one in force; the budget starts full again.
    ///
    /// Errors: an invalid limit (see [`RateLimitConfig::validate`]).
    pub fn set_rate_limit(&self, limit: RateLimitConfig) -> Result<RateLimitConfig, String> {
        self.app.limit.set_config(limit)
    }

    /// Stops the provider and waits for its accept loop to end.
    pub async fn shutdown(mut self) {
        self.task.abort();
        // Cancellation is the expected outcome; nothing to report.
        let _ = (&mut self.task).await;
    }
}

impl Drop for ProviderHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}
