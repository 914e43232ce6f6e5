//! The one place every call is authenticated: a tower layer in front of
//! every gRPC service. It reads the `authorization` metadata and the
//! connection's verified client certificate, finds the caller in the
//! callers file, checks the method against the caller's roles, and hands
//! the [`Caller`] to the handlers as a request extension (with the
//! `authorization` metadata removed, so no handler can log it). Health
//! and reflection pass without a credential.
//!
//! A refused call is answered here, before its request body is read:
//! UNAUTHENTICATED (`CREDENTIAL_MISSING`, `CREDENTIAL_INVALID`,
//! `CREDENTIAL_EXPIRED`) or PERMISSION_DENIED (`ROLE_NOT_ALLOWED`), counted
//! in `jobfence_auth_refusals_total{reason}` and logged with the caller's
//! name (when known) and the peer address, never the credential.

use super::{Action, Authenticator, Caller, Refusal};
use jobfence_metrics::Metrics;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// What the server knows of a connection, set on every request by the
/// transport (the server's `transport.rs`).
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// The client's address.
    pub addr: Option<SocketAddr>,
    /// The subject common name of the client certificate, verified against
    /// `--tls-client-ca` during the TLS handshake.
    pub certificate_name: Option<String>,
    /// Set by the first call on this connection that authenticated: until
    /// then the connection lives at most
    /// `--unauthenticated-connection-timeout` (see `server::transport`).
    pub authenticated: Arc<std::sync::atomic::AtomicBool>,
}

/// Authenticates and checks the roles of every call (see the module docs).
#[derive(Debug, Clone)]
pub struct AuthLayer {
    auth: Option<Arc<Authenticator>>,
    metrics: Metrics,
}

impl AuthLayer {
    /// Authenticates against `auth` (`None`: lets every call through,
    /// without a [`Caller`]); counts refusals in `metrics`.
    pub fn new(auth: Option<Arc<Authenticator>>, metrics: Metrics) -> Self {
        AuthLayer { auth, metrics }
    }
}

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Auth {
            inner,
            auth: self.auth.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// The gRPC method (`/package.Service/Method`) of an authenticated call,
/// in its extensions: a refusal decided later by the handler logs it.
#[derive(Debug, Clone)]
pub struct CalledMethod(pub String);

/// The service [`AuthLayer`] wraps around.
#[derive(Debug, Clone)]
pub struct Auth<S> {
    inner: S,
    auth: Option<Arc<Authenticator>>,
    metrics: Metrics,
}

/// Counts and logs a refusal, never with the credential. Used for every
/// refusal for who the caller is, here and in the handlers.
pub fn refuse(metrics: &Metrics, refusal: &Refusal, method: &str, peer: Option<&Peer>) {
    let (_, reason) = crate::refusal::refusal_code_and_reason(refusal);
    metrics.auth_refusal(reason);
    let addr = peer.and_then(|p| p.addr).map(|a| a.to_string());
    tracing::warn!(
        reason,
        method,
        peer = addr.as_deref().unwrap_or(""),
        error = %refusal,
        "call refused"
    );
}

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for Auth<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Default + Send + 'static,
    ReqBody: Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<ReqBody>) -> Self::Future {
        let action = Action::of_method(req.uri().path());
        let Some(auth) = self.auth.as_ref().filter(|_| action != Action::Open) else {
            return Box::pin(self.inner.call(req));
        };
        let peer = req.extensions().get::<Peer>().cloned();
        let peer = peer.as_ref();
        // Two authorization headers are malformed, not "the first wins":
        // an empty value makes the call CREDENTIAL_INVALID.
        let mut authorization = req.headers().get_all(http::header::AUTHORIZATION).iter();
        let presented = match (authorization.next(), authorization.next()) {
            (Some(one), None) => Some(one.as_bytes()),
            (None, _) => None,
            (Some(_), Some(_)) => Some(&b""[..]),
        };
        let checked = auth
            .authenticate(presented, peer.and_then(|p| p.certificate_name.as_deref()))
            .and_then(|caller| permit(caller, action, req.uri().path()));
        match checked {
            Ok(caller) => {
                if let Some(p) = peer {
                    p.authenticated
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                req.headers_mut().remove(http::header::AUTHORIZATION);
                req.extensions_mut().insert(Arc::new(caller));
                let method = CalledMethod(req.uri().path().to_owned());
                req.extensions_mut().insert(method);
                Box::pin(self.inner.call(req))
            }
            Err(refusal) => {
                refuse(&self.metrics, &refusal, req.uri().path(), peer);
                let status = tonic::Status::from(&refusal);
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

/// The method check: the caller must hold a role allowing `action`.
fn permit(caller: Caller, action: Action, method: &str) -> Result<Caller, Refusal> {
    if caller.may(action) {
        Ok(caller)
    } else {
        Err(Refusal::RoleNotAllowed {
            roles: caller.roles(),
            caller: caller.name,
            method: method.to_owned(),
            required: action.required_roles(),
        })
    }
}
