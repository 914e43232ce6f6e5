//! The operator web console (`jobfence serve --console-listen`): server-
//! rendered pages over the same coordinator calls as the gRPC `JobAdmin`
//! and `JobEvents` services (the server's `grpc::job_admin`), so a person on
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
//! The console serves loopback addresses only ([`require_loopback`]): it
//! has no login of its own. When the coordinator authenticates, it acts
//! with one operator credential, checked on every request, and records
//! that credential's name; without authentication the operator names
//! themselves in each form (see [`operator`]).

pub mod csrf;
pub mod forms;
pub mod history;
pub mod operator;
pub mod pages;
pub mod timeline;
pub mod view;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use jobfence_core::Coordinator;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use tokio::net::TcpListener;

/// The address `--console-listen` uses when given without one.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9465";

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct Console {
    coordinator: Coordinator,
    identity: operator::Identity,
}

impl Console {
    /// A console over `coordinator`, where operators type their names
    /// (a coordinator without authentication).
    pub fn new(coordinator: Coordinator) -> Self {
        Self::with_identity(coordinator, operator::Identity::Typed)
    }

    /// A console over `coordinator` that knows its operator by `identity`.
    pub fn with_identity(coordinator: Coordinator, identity: operator::Identity) -> Self {
        Console {
            coordinator,
            identity,
        }
    }

    /// What the resolution form shows of the operator.
    pub fn operator_field(&self, headers: &HeaderMap) -> operator::OperatorField {
        match self.identity.credential() {
            Some(Ok(op)) => operator::OperatorField::Fixed(op.name),
            _ => operator::OperatorField::Typed(operator::remembered(headers)),
        }
    }
}

/// Refuses an address that is not loopback: the console has no login of
/// its own (it acts with one credential, or under typed names), so it must
/// not be reachable from another machine.
pub fn require_loopback(addr: SocketAddr) -> anyhow::Result<()> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        anyhow::bail!(
            "refusing to serve the console on {addr}: it has no login of its own, so it \
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

/// True when a request's `Host` names the loopback interface (`localhost`,
/// `127.0.0.0/8` or `[::1]`, with any port). The console listens on
/// loopback only; a request naming another host reached it through a
/// name that resolves to 127.0.0.1 (DNS rebinding): that page's origin is
/// not ours, however "same-origin" its own requests look.
pub fn host_is_loopback(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, _)) => ip,
            None => return false,
        }
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Refuses (421 Misdirected Request) a request whose `Host` is not a
/// loopback name ([`host_is_loopback`]): the defence against DNS
/// rebinding, before any page or form is served.
async fn require_loopback_host(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    match host {
        Some(h) if host_is_loopback(h) => next.run(request).await,
        _ => {
            tracing::warn!(host = ?host, "console refused a request for another host (DNS rebinding?)");
            (
                StatusCode::MISDIRECTED_REQUEST,
                "The console answers only requests addressed to localhost or a loopback address.\n",
            )
                .into_response()
        }
    }
}

/// With an operator credential, every request first checks it: a revoked,
/// expired or role-less token stops the console (403) until it is fixed.
async fn require_credential(
    axum::extract::State(console): axum::extract::State<Console>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match console.identity.credential() {
        Some(Err(refusal)) => {
            tracing::warn!(error = %refusal, "console refused: its credential is not accepted");
            (
                StatusCode::FORBIDDEN,
                format!("The console's operator credential is not accepted: {refusal}.\n"),
            )
                .into_response()
        }
        Some(Ok(op)) => view::ACTING_AS.scope(op.name, next.run(request)).await,
        None => next.run(request).await,
    }
}

/// Every route of the console.
pub fn router(console: Console) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/queues") }))
        .route("/queues", get(pages::queues::page))
        .route("/queues/live", get(pages::queues::live))
        .route("/workers", get(pages::workers::page))
        .route("/workers/live", get(pages::workers::live))
        .route("/jobs", get(pages::jobs::page))
        .route("/jobs/bulk", get(pages::bulk::page).post(pages::bulk::post))
        .route("/jobs/{id}", get(pages::job::page))
        .route("/jobs/{id}/resolve", post(pages::resolve::post))
        .route("/jobs/{id}/cancel", post(pages::cancel::post))
        .route("/review", get(pages::review::page))
        .route(
            "/providers",
            get(pages::providers::page).post(pages::providers::create),
        )
        .route("/providers/{name}/pause", post(pages::providers::pause))
        .route("/providers/{name}/resume", post(pages::providers::resume))
        .route("/providers/{name}/budget", post(pages::providers::budget))
        .route("/events", get(pages::events::page))
        .route("/settlement", get(pages::settlement::page))
        .route(
            "/settlement/exceptions/{id}",
            post(pages::exception_act::post),
        )
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
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            require_credential,
        ))
        .layer(axum::middleware::from_fn(require_loopback_host))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(console)
}

/// A task the server runs, and the future that tells it to stop.
type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The console as a companion of the gRPC server (the server's
/// `Companion`, spelled with core's and std's types so that this crate
/// does not depend on the server): served on `listener` over the server's
/// coordinator, acting as `identity`, and stopped with the server. The
/// listener must be on loopback (checked now).
pub fn companion(
    listener: TcpListener,
    identity: operator::Identity,
) -> anyhow::Result<Box<dyn FnOnce(Coordinator, Task) -> Task + Send>> {
    require_loopback(listener.local_addr()?)?;
    Ok(Box::new(move |coordinator, stop| {
        Box::pin(async move {
            if let Err(e) = serve(listener, coordinator, identity, stop).await {
                tracing::error!(error = %e, "operator console stopped");
            }
        })
    }))
}

/// Serves the console on `listener` until `shutdown` completes, then lets
/// the requests in flight finish.
pub async fn serve(
    listener: TcpListener,
    coordinator: Coordinator,
    identity: operator::Identity,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    require_loopback(addr)?;
    match identity.credential() {
        None => tracing::warn!(
            listen = %addr,
            "serving the operator console without authentication: anyone who can reach its \
             address can resolve parked jobs under any operator name"
        ),
        Some(Ok(op)) => tracing::info!(
            listen = %addr,
            operator = %op.name,
            "serving the operator console: it acts as this operator for anyone who can reach \
             its loopback address"
        ),
        Some(Err(refusal)) => {
            anyhow::bail!("the console's operator credential is not accepted: {refusal}")
        }
    }
    axum::serve(
        listener,
        router(Console::with_identity(coordinator, identity)),
    )
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
        assert!(refused.to_string().contains("no login"));
        assert!(require_loopback("192.0.2.7:9465".parse().unwrap()).is_err());
    }
}
