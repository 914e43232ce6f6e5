//! Where the coordinator is and how to reach it: the flags every command
//! group shares, the token file, TLS, and the authenticated channel.

use anyhow::Context;
use clap::Args;
use jobfence_worker::credentials::{Authorization, BearerToken, Credentials};
use std::path::PathBuf;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Where the coordinator is, and how to print. The flags are global to
/// their command group, so `jobfence jobs list --endpoint …` works as well
/// as `jobfence jobs --endpoint … list` and `jobfence stats --endpoint …`;
/// `jobfence --endpoint … stats` too ([`crate::hoist_connection_flags`]).
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The coordinator's gRPC address (the clients read the same
    /// variable; the old JOBFENCE_ENDPOINT still works, with a warning).
    #[arg(
        long,
        global = true,
        env = "JOBFENCE_COORDINATOR",
        default_value = "http://127.0.0.1:50051"
    )]
    pub endpoint: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true, env = "JOBFENCE_JSON", default_value_t = false)]
    pub json: bool,
    /// The CA certificate (PEM) that signed the coordinator's: speak TLS.
    #[arg(long, global = true, env = "JOBFENCE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM), for mutual TLS; with --tls-client-key.
    #[arg(
        long,
        global = true,
        env = "JOBFENCE_TLS_CLIENT_CERT",
        requires = "tls_client_key"
    )]
    pub tls_client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long,
        global = true,
        env = "JOBFENCE_TLS_CLIENT_KEY",
        requires = "tls_client_cert"
    )]
    pub tls_client_key: Option<PathBuf>,
    /// A file whose first line is your bearer token (an operator's for
    /// `jobs`, `stats`, `providers`, `queue-policies` and `settlement`, an
    /// events-reader's for `events`, a producer's for `jobs enqueue`).
    #[arg(long, global = true, env = "JOBFENCE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

/// A token file: its first line, trimmed.
pub fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the token file {}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_owned();
    anyhow::ensure!(
        !token.is_empty(),
        "the token file {} is empty",
        path.display()
    );
    Ok(token)
}

/// A channel to the coordinator, authenticated as the flags say.
pub(crate) type Authed = InterceptedService<Channel, Authorization>;

fn read(path: &PathBuf) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// The TLS settings and token of `conn`.
fn credentials(conn: &Connection) -> anyhow::Result<Credentials> {
    let mut c = Credentials::default();
    if let Some(ca) = &conn.tls_ca {
        c.tls_ca_pem = Some(read(ca)?);
    }
    if let (Some(cert), Some(key)) = (&conn.tls_client_cert, &conn.tls_client_key) {
        c.tls_client_pem = Some((read(cert)?, read(key)?));
    }
    if let Some(file) = &conn.token_file {
        let token = read_token(file)?;
        c.token = Some(BearerToken::new(&token)?);
    }
    Ok(c)
}

/// Connects to the coordinator `conn` names, with its TLS and its token.
pub(crate) async fn channel(conn: &Connection) -> anyhow::Result<Authed> {
    let creds = credentials(conn)?;
    if conn.endpoint.starts_with("https://") && creds.tls_ca_pem.is_none() {
        anyhow::bail!(
            "{} is TLS: give the coordinator's CA certificate with --tls-ca or JOBFENCE_TLS_CA",
            conn.endpoint
        );
    }
    if creds.token.is_some() && creds.tls_ca_pem.is_none() {
        eprintln!(
            "jobfence: warning: sending the bearer token without TLS to {} \
             (give --tls-ca or JOBFENCE_TLS_CA for a coordinator with TLS)",
            conn.endpoint
        );
    }
    let channel = creds
        .endpoint(with_scheme(&conn.endpoint))
        .with_context(|| format!("bad endpoint {}", conn.endpoint))?
        .connect()
        .await
        .with_context(|| format!("connecting to {}", conn.endpoint))?;
    Ok(InterceptedService::new(channel, creds.authorization()))
}

/// `host:port` is taken as `http://host:port`, as the server prints it.
fn with_scheme(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    }
}
