//! How a worker reaches a coordinator that runs with TLS and
//! authentication: the CA to trust, an optional client certificate
//! (mutual TLS), and a bearer token sent as `authorization: Bearer …`
//! metadata on every call. [`Credentials::from_env`] reads the same
//! environment variables as every jobfence client (Python, Node, the
//! `jobfence` command line).

use crate::error::ConnectError;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

/// The user-agent this client sends first (`jobfence-rust/VERSION`): the
/// coordinator's workers view names a worker's client by it.
pub const USER_AGENT: &str = concat!("jobfence-rust/", env!("CARGO_PKG_VERSION"));

/// The environment variables [`Credentials::from_env`] reads.
pub mod env {
    /// Path of the CA certificate (PEM) that signed the coordinator's:
    /// set, the client speaks TLS.
    pub const TLS_CA: &str = "JOBFENCE_TLS_CA";
    /// Path of a client certificate (PEM), for mutual TLS; with
    /// [`TLS_CLIENT_KEY`].
    pub const TLS_CLIENT_CERT: &str = "JOBFENCE_TLS_CLIENT_CERT";
    /// Path of the client certificate's private key (PEM).
    pub const TLS_CLIENT_KEY: &str = "JOBFENCE_TLS_CLIENT_KEY";
    /// Path of a file whose first line is the bearer token.
    pub const TOKEN_FILE: &str = "JOBFENCE_TOKEN_FILE";
    /// The bearer token itself (prefer [`TOKEN_FILE`]: an environment is
    /// easier to leak than a file of mode 0600).
    pub const TOKEN: &str = "JOBFENCE_TOKEN";
}

/// A bearer token. Its `Debug` never shows it.
#[derive(Clone)]
pub struct BearerToken(MetadataValue<Ascii>);

impl BearerToken {
    /// `token` as an `authorization: Bearer <token>` value; errors on a
    /// token that is not printable ASCII.
    pub fn new(token: &str) -> Result<Self, ConnectError> {
        let token = token.trim();
        if token.is_empty() {
            return Err(ConnectError::Credentials(
                "the bearer token is empty".into(),
            ));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ConnectError::Credentials(
                "the bearer token is not printable ASCII".into(),
            ));
        }
        format!("Bearer {token}")
            .parse()
            .map(BearerToken)
            .map_err(|_| {
                ConnectError::Credentials("the bearer token is not printable ASCII".into())
            })
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

/// TLS settings and a bearer token. The default is none of them (a
/// coordinator run with `--insecure`).
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// The CA certificate (PEM) that signed the coordinator's; set, the
    /// client speaks TLS (an `http://` endpoint is upgraded to `https://`).
    pub tls_ca_pem: Option<Vec<u8>>,
    /// A client certificate and its private key (PEM), for mutual TLS.
    pub tls_client_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the coordinator's certificate must carry, when it is not
    /// the endpoint's host.
    pub tls_server_name: Option<String>,
    /// Sent as `authorization: Bearer <token>` on every call.
    pub token: Option<BearerToken>,
}

fn read(var: &str, path: &str) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path).map_err(|e| ConnectError::Credentials(format!("{var}={path}: {e}")))
}

impl Credentials {
    /// Reads the [`env`] variables: `JOBFENCE_TLS_CA`,
    /// `JOBFENCE_TLS_CLIENT_CERT` + `JOBFENCE_TLS_CLIENT_KEY`, and
    /// `JOBFENCE_TOKEN_FILE` (or `JOBFENCE_TOKEN`). Unset variables leave
    /// their part out; a named file that cannot be read is an error.
    pub fn from_env() -> Result<Credentials, ConnectError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mut c = Credentials::default();
        if let Some(path) = var(env::TLS_CA) {
            c.tls_ca_pem = Some(read(env::TLS_CA, &path)?);
        }
        match (var(env::TLS_CLIENT_CERT), var(env::TLS_CLIENT_KEY)) {
            (Some(cert), Some(key)) => {
                c.tls_client_pem = Some((
                    read(env::TLS_CLIENT_CERT, &cert)?,
                    read(env::TLS_CLIENT_KEY, &key)?,
                ))
            }
            (None, None) => {}
            _ => {
                return Err(ConnectError::Credentials(format!(
                    "set both {} and {}, or neither",
                    env::TLS_CLIENT_CERT,
                    env::TLS_CLIENT_KEY
                )))
            }
        }
        if let Some(path) = var(env::TOKEN_FILE) {
            let text = String::from_utf8(read(env::TOKEN_FILE, &path)?)
                .map_err(|_| ConnectError::Credentials(format!("{path} is not UTF-8")))?;
            c.token = Some(BearerToken::new(text.lines().next().unwrap_or(""))?);
        } else if let Some(token) = var(env::TOKEN) {
            c.token = Some(BearerToken::new(&token)?);
        }
        Ok(c)
    }

    /// Whether the client speaks TLS.
    pub fn tls(&self) -> bool {
        self.tls_ca_pem.is_some()
    }

    /// An endpoint for `uri` with these TLS settings, naming this client
    /// in its user-agent ([`USER_AGENT`], what the coordinator's workers
    /// view shows) (`http://` becomes
    /// `https://` when a CA is set: tonic would otherwise send the token
    /// in cleartext to a URI that says so).
    pub fn endpoint(&self, uri: impl Into<String>) -> Result<Endpoint, ConnectError> {
        let mut uri: String = uri.into();
        let Some(ca) = &self.tls_ca_pem else {
            if uri.starts_with("https://") {
                return Err(ConnectError::Credentials(format!(
                    "{uri} is TLS, and no CA to check the coordinator's certificate was given: \
                     set JOBFENCE_TLS_CA (or Credentials::tls_ca_pem) to its CA's PEM file, \
                     or use http:// for a coordinator run with --insecure"
                )));
            }
            return Ok(Endpoint::from_shared(uri)?.user_agent(USER_AGENT)?);
        };
        if let Some(rest) = uri.strip_prefix("http://") {
            uri = format!("https://{rest}");
        } else if !uri.contains("://") {
            uri = format!("https://{uri}");
        }
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some((cert, key)) = &self.tls_client_pem {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.tls_server_name {
            tls = tls.domain_name(name.clone());
        }
        Ok(Endpoint::from_shared(uri)?
            .user_agent(USER_AGENT)?
            .tls_config(tls)?)
    }

    /// The interceptor that adds the bearer token to every call.
    pub fn authorization(&self) -> Authorization {
        Authorization(self.token.clone())
    }
}

/// Adds `authorization: Bearer <token>` to every call of a client made
/// `with_interceptor` (nothing without a token), and, with the cargo
/// feature `otel`, the caller's `traceparent` (nothing outside a trace).
#[derive(Debug, Clone, Default)]
pub struct Authorization(Option<BearerToken>);

impl Interceptor for Authorization {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(BearerToken(value)) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        crate::trace::inject(request.metadata_mut());
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_never_shows_in_debug() {
        let c = Credentials {
            token: Some(BearerToken::new("jft_secret").unwrap()),
            ..Credentials::default()
        };
        assert!(!format!("{c:?}").contains("jft_secret"));
        assert!(BearerToken::new(" ").is_err());
        assert!(BearerToken::new("tok\u{e9}n").is_err());
    }

    #[test]
    fn the_interceptor_adds_the_bearer_token() {
        let mut with = Credentials {
            token: Some(BearerToken::new("t1").unwrap()),
            ..Credentials::default()
        }
        .authorization();
        let req = with.call(Request::new(())).unwrap();
        assert_eq!(req.metadata().get("authorization").unwrap(), "Bearer t1");
        let req = Credentials::default()
            .authorization()
            .call(Request::new(()))
            .unwrap();
        assert!(req.metadata().get("authorization").is_none());
    }

    #[test]
    fn without_a_ca_the_endpoint_stays_as_given() {
        let plain = Credentials::default()
            .endpoint("http://127.0.0.1:50051")
            .unwrap();
        assert_eq!(plain.uri().scheme_str(), Some("http"));
    }
}
