//! The demo's throw-away credentials, made at the start of every run: a
//! CA, the coordinators' certificate, and one bearer token per kind of
//! caller, each with the narrowest role that does its work (the Rust,
//! Python, Node and Go workers: `worker` of the demo's queues; the producer:
//! `producer` of the same; the console: `operator`). Every process gets
//! only its own token, by file, through the environment variables every
//! client reads (`JOBFENCE_TLS_CA`, `JOBFENCE_TOKEN_FILE`).

use anyhow::{Context, Result};
use jobfence_auth::pki::{self, DevCaller, DevFiles};
use jobfence_auth::Role;
use jobfence_worker::credentials::{env, BearerToken, Credentials};
use std::path::{Path, PathBuf};

/// The callers of the demo, by name.
pub const RUST_WORKERS: &str = "rust-workers";
/// See [`RUST_WORKERS`].
pub const PYTHON_WORKERS: &str = "python-workers";
/// See [`RUST_WORKERS`].
pub const NODE_WORKERS: &str = "node-workers";
/// See [`RUST_WORKERS`].
pub const GO_WORKERS: &str = "go-workers";
/// The producer (its refunds arrive with EnqueueBatch).
pub const PRODUCER: &str = "producer";
/// The console's operator.
pub const CONSOLE: &str = "console-operator";

/// The files of one run's credentials.
#[derive(Debug, Clone)]
pub struct DemoCredentials {
    /// CA, server certificate, tokens and callers file.
    pub files: DevFiles,
    /// The server certificate and key in one file, as HAProxy's `crt`
    /// wants them.
    pub haproxy_pem: PathBuf,
}

impl DemoCredentials {
    /// Writes a fresh set into `dir`; workers and the producer are scoped
    /// to `queues` (the demo's queues, one per database).
    pub fn create(dir: &Path, queues: &[String]) -> Result<DemoCredentials> {
        let queues = queues.join(",");
        let callers: Vec<DevCaller> = [
            (RUST_WORKERS, Role::Worker, queues.as_str()),
            (PYTHON_WORKERS, Role::Worker, &queues),
            (NODE_WORKERS, Role::Worker, &queues),
            (GO_WORKERS, Role::Worker, &queues),
            (PRODUCER, Role::Producer, &queues),
            (CONSOLE, Role::Operator, "*"),
        ]
        .into_iter()
        .map(|(name, role, queues)| DevCaller {
            name: name.into(),
            role,
            queues: queues.into(),
        })
        .collect();
        // Absolute paths: HAProxy and the workers run from elsewhere.
        std::fs::create_dir_all(dir)?;
        let dir = std::fs::canonicalize(dir)?;
        let files = pki::dev_setup(&dir, &["localhost", "127.0.0.1"], &callers, &[])
            .context("making the demo's credentials")?;
        let haproxy_pem = dir.join("haproxy.pem");
        let pem = std::fs::read_to_string(&files.server_cert)?
            + &std::fs::read_to_string(&files.server_key)?;
        pki::write_secret(&haproxy_pem, &pem)?;
        Ok(DemoCredentials { files, haproxy_pem })
    }

    /// The `jobfence serve` flags of every coordinator: TLS and the
    /// callers file.
    pub fn serve_flags(&self) -> Vec<String> {
        let p = |p: &Path| p.display().to_string();
        vec![
            "--tls-cert".into(),
            p(&self.files.server_cert),
            "--tls-key".into(),
            p(&self.files.server_key),
            "--callers".into(),
            p(&self.files.callers),
        ]
    }

    /// The flag giving the console its operator token.
    pub fn console_flags(&self) -> Vec<String> {
        vec![
            "--console-token-file".into(),
            self.files.token(CONSOLE).display().to_string(),
        ]
    }

    /// The environment of a worker process of `caller`.
    pub fn client_env(&self, caller: &str) -> Vec<(&'static str, String)> {
        vec![
            (env::TLS_CA, self.files.ca.display().to_string()),
            (
                env::TOKEN_FILE,
                self.files.token(caller).display().to_string(),
            ),
        ]
    }

    /// The credentials of `caller`, for a client in this process.
    pub fn client(&self, caller: &str) -> Result<Credentials> {
        let token = jobfence_operator::read_token(&self.files.token(caller))?;
        Ok(Credentials {
            tls_ca_pem: Some(std::fs::read(&self.files.ca)?),
            token: Some(BearerToken::new(&token)?),
            ..Credentials::default()
        })
    }

    /// What HAProxy needs to terminate TLS and re-encrypt to the
    /// coordinators.
    pub fn haproxy(&self) -> super::coordinators::HaproxyTls {
        super::coordinators::HaproxyTls {
            frontend_pem: self.haproxy_pem.clone(),
            ca: self.files.ca.clone(),
        }
    }
}
