//! The operator web console (`jobfence serve --console-listen`): server-
//! rendered pages over the same coordinator calls as the gRPC `JobAdmin`
//! and `JobEvents` services (`crate::grpc::job_admin`), so a person on
//! call answers "what is stuck, what happened to this refund, and what do
//! I do now" in a few clicks.
//!
//! Layers, top down: [`pages`] (one module per page: its axum handler and
//! its view) → [`forms`] (query strings and form posts turned into domain
//! calls, with a message for every bad field) → the [`Coordinator`]. The
//! console never sees SQL. Cross-cutting pieces: [`csrf`] (every form
//! post), [`operator`] (who acts), [`timeline`] (an event told as a
//! sentence), [`history`] (the queue trends behind the sparklines),
//! [`view`] (the page shell, formatting and charts).
//!
//! There is no authentication yet (issue 8): the console serves loopback
//! addresses only ([`require_loopback`]), and the operator names
//! themselves in each form, recorded exactly as `JobAdmin` records the
//! `operator` field of a request.

pub mod csrf;
pub mod forms;
pub mod history;
pub mod operator;
pub mod pages;
pub mod timeline;
pub mod view;

use crate::coordinator::Coordinator;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;

/// The address `--console-listen` uses when given without one.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9465";

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct Console {
    coordinator: Coordinator,
    history: Arc<Mutex<history::History>>,
}

impl Console {
    /// A console over `coordinator`.
    pub fn new(coordinator: Coordinator) -> Self {
        Console {
            coordinator,
            history: Arc::new(Mutex::new(history::History::default())),
        }
    }
}

/// Refuses an address that is not loopback: until operators authenticate
/// (issue 8), anyone who reaches the console can resolve parked jobs under
/// any name, so it must not be reachable from another machine.
pub fn require_loopback(addr: SocketAddr) -> anyhow::Result<()> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        anyhow::bail!(
            "refusing to serve the console on {addr}: it has no authentication yet, so it \
             listens on loopback addresses only (e.g. {DEFAULT_LISTEN}); reach it through an \
             SSH tunnel"
        )
    }
}

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("max-age=300"),
            ),
        ],
        body,
    )
        .into_response()
}

/// Headers on every answer: pages are never cached (they show live state),
/// never framed, and may run only the console's own script, so even a
/// rendering bug could not execute a `<script>` from a payload.
async fn security_headers(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// Every route of the console.
pub fn router(console: Console) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/queues") }))
        .route("/queues", get(pages::queues::page))
        .route("/queues/live", get(pages::queues::live))
        .route("/jobs", get(pages::jobs::page))
        .route("/jobs/{id}", get(pages::job::page))
        .route("/jobs/{id}/resolve", post(pages::resolve::post))
        .route("/review", get(pages::review::page))
        .route("/events", get(pages::events::page))
        .route("/events/live", get(pages::events::live))
        .route(
            "/static/console.css",
            get(|| async { asset("text/css; charset=utf-8", CSS) }),
        )
        .route(
            "/static/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", JS) }),
        )
        .fallback(pages::not_found)
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(console)
}

/// Serves the console on `listener` until `shutdown` completes, then lets
/// the requests in flight finish.
pub async fn serve(
    listener: TcpListener,
    coordinator: Coordinator,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    require_loopback(addr)?;
    tracing::warn!(
        listen = %addr,
        "serving the operator console without authentication: anyone who can reach its \
         address can resolve parked jobs under any operator name"
    );
    axum::serve(listener, router(Console::new(coordinator)))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_addresses_are_served() {
        assert!(require_loopback("127.0.0.1:9465".parse().unwrap()).is_ok());
        assert!(require_loopback("[::1]:9465".parse().unwrap()).is_ok());
        let refused = require_loopback("0.0.0.0:9465".parse().unwrap()).unwrap_err();
        assert!(refused.to_string().contains("no authentication"));
        assert!(require_loopback("192.0.2.7:9465".parse().unwrap()).is_err());
    }
}
