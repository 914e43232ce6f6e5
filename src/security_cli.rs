//! The command line of security: `jobfence serve`'s TLS, authentication
//! and limit flags, and `jobfence credentials` (issuing tokens, and a
//! throw-away development CA). docs/security.md explains each.

use clap::{Args, Subcommand};
use jobfence_auth::pki::{self, DevCaller};
use jobfence_auth::{Authenticator, Role};
use jobfence_server::limits::Limits;
use jobfence_server::transport::{ServerTls, TlsFiles};
use jobfence_server::Security;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// TLS and authentication of `jobfence serve`. Serving without either
/// takes `--insecure`.
#[derive(Debug, Args)]
pub struct SecurityArgs {
    /// The gRPC listener's TLS certificate chain (PEM); with --tls-key.
    /// Re-read on SIGHUP.
    #[arg(long, env = "JOBFENCE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "JOBFENCE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM): mutual TLS. A
    /// certificate's subject common name names its caller in the callers
    /// file.
    #[arg(long, env = "JOBFENCE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// The callers file: who may call, with which roles on which queues
    /// (hashed bearer tokens, certificate names). Re-read on SIGHUP.
    #[arg(long, env = "JOBFENCE_CALLERS")]
    pub callers: Option<PathBuf>,
    /// Serve without TLS and/or without authentication. Without this,
    /// `serve` refuses to start unless both --tls-cert/--tls-key and
    /// --callers are given.
    #[arg(long, env = "JOBFENCE_INSECURE", default_value_t = false)]
    pub insecure: bool,
    /// Serve gRPC reflection (it needs no credential, like health).
    #[arg(long, env = "JOBFENCE_REFLECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub reflection: bool,
    /// The operator token the console acts with (required for
    /// --console-listen when --callers is given).
    #[arg(long, env = "JOBFENCE_CONSOLE_TOKEN_FILE")]
    pub console_token_file: Option<PathBuf>,
}

impl SecurityArgs {
    /// The listener's security, or why the flags do not add up.
    pub fn security(&self) -> anyhow::Result<Security> {
        if !self.insecure {
            let mut missing = Vec::new();
            if self.tls_cert.is_none() {
                missing.push("--tls-cert and --tls-key (TLS)");
            }
            if self.callers.is_none() {
                missing.push("--callers (authentication)");
            }
            if !missing.is_empty() {
                anyhow::bail!(
                    "refusing to serve without {}: give them, or choose --insecure explicitly \
                     (see docs/security.md; scripts/serve makes throw-away credentials)",
                    missing.join(" and ")
                );
            }
        }
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(Arc::new(ServerTls::load(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
            })?)),
            _ => None,
        };
        let auth = match &self.callers {
            Some(path) => Some(Arc::new(Authenticator::from_file(path)?)),
            None => None,
        };
        Ok(Security {
            tls,
            auth,
            reload_on_sighup: true,
        })
    }

    /// The console's operator token, read from --console-token-file.
    pub fn console_token(&self) -> anyhow::Result<Option<String>> {
        self.console_token_file
            .as_ref()
            .map(|p| read_token(p))
            .transpose()
    }
}

pub use jobfence_operator::read_token;

/// The limits of `jobfence serve` (see `server::limits::Limits`).
#[derive(Debug, Args)]
pub struct LimitsArgs {
    /// Largest request message (e.g. 4MiB, 512KiB); larger ones are refused
    /// INVALID_ARGUMENT / INVALID_REQUEST, unread by any handler.
    #[arg(long, env = "JOBFENCE_MAX_REQUEST_SIZE", value_parser = parse_bytes, default_value = "4MiB")]
    pub max_request_size: usize,
    /// Open gRPC connections at most; more are closed at accept.
    #[arg(long, env = "JOBFENCE_MAX_CONNECTIONS", value_parser = crate::cli::at_least_one(), default_value_t = 1024)]
    pub max_connections: usize,
    /// Calls one connection may have open at once (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS; clients queue past it).
    #[arg(
        long,
        env = "JOBFENCE_MAX_STREAMS_PER_CONNECTION", value_parser = clap::value_parser!(u32).range(1..),
        default_value_t = 128
    )]
    pub max_streams_per_connection: u32,
    /// Calls in flight in all (streams while open, long-polling Claims
    /// while they wait); past it a call is refused at once with
    /// RESOURCE_EXHAUSTED / OVERLOADED.
    #[arg(long, env = "JOBFENCE_MAX_CONCURRENT_CALLS", value_parser = crate::cli::at_least_one(), default_value_t = 1024)]
    pub max_concurrent_calls: usize,
    /// Calls in flight of one authenticated caller; past it, as above.
    #[arg(long, env = "JOBFENCE_MAX_CALLS_PER_CALLER", value_parser = crate::cli::at_least_one(), default_value_t = 256)]
    pub max_calls_per_caller: usize,
    /// The server-side deadline of one call (answered DEADLINE_EXCEEDED
    /// past it); must exceed --max-claim-wait.
    #[arg(long, env = "JOBFENCE_CALL_TIMEOUT", value_parser = humantime::parse_duration, default_value = "60s")]
    pub call_timeout: Duration,
    /// How long a client has to finish its TLS handshake.
    #[arg(long, env = "JOBFENCE_TLS_HANDSHAKE_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub tls_handshake_timeout: Duration,
    /// With a callers file: how long a connection may stay open before a
    /// call on it authenticated (health checks and reflection do not
    /// count); then it is closed.
    #[arg(long, env = "JOBFENCE_UNAUTHENTICATED_CONNECTION_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub unauthenticated_connection_timeout: Duration,
}

impl LimitsArgs {
    /// The limits; `max_claim_wait` must fit in the call timeout.
    pub fn limits(&self, max_claim_wait: Duration) -> anyhow::Result<Limits> {
        anyhow::ensure!(
            self.call_timeout > max_claim_wait + Duration::from_secs(1),
            "--call-timeout ({}) must exceed --max-claim-wait ({}) by more than a second",
            humantime::format_duration(self.call_timeout),
            humantime::format_duration(max_claim_wait)
        );
        anyhow::ensure!(
            self.max_connections > 0 && self.max_concurrent_calls > 0,
            "--max-connections and --max-concurrent-calls must be positive"
        );
        Ok(Limits {
            max_request_bytes: self.max_request_size,
            max_connections: self.max_connections,
            max_streams_per_connection: self.max_streams_per_connection,
            max_calls: self.max_concurrent_calls,
            max_calls_per_caller: self.max_calls_per_caller,
            call_timeout: self.call_timeout,
            handshake_timeout: self.tls_handshake_timeout,
            unauthenticated_connection_timeout: self.unauthenticated_connection_timeout,
        })
    }
}

/// `4MiB`, `512KiB`, `1000` (bytes).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: usize = digits.parse().map_err(|_| format!("{s:?} is not a size"))?;
    let scale = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(format!("unknown unit {other:?} (B, KiB, MiB, GiB)")),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// `jobfence credentials …`
#[derive(Debug, Args)]
pub struct CredentialsArgs {
    /// What to issue.
    #[command(subcommand)]
    pub command: CredentialsCommand,
}

/// The `credentials` subcommands.
#[derive(Debug, Subcommand)]
pub enum CredentialsCommand {
    /// Issue a bearer token: writes it to --token-out (mode 0600) and
    /// prints the callers-file line that grants it (its SHA-256 only);
    /// append that line to the callers file and send SIGHUP.
    Token {
        /// The caller's name (the operator recorded, for an operator).
        #[arg(long)]
        name: String,
        /// worker, producer, operator, events-reader or webhook.
        #[arg(long)]
        role: Role,
        /// `*` or comma-separated queues (an operator's is `*`).
        #[arg(long, default_value = "*")]
        queues: String,
        /// When the token stops working (RFC 3339), e.g. 2027-01-31T00:00:00Z.
        #[arg(long)]
        expires: Option<chrono::DateTime<chrono::Utc>>,
        /// Where the token goes.
        #[arg(long)]
        token_out: PathBuf,
    },
    /// Write throw-away development credentials into DIR: a CA (`ca.pem`),
    /// a server certificate for --host (`server.pem`, `server-key.pem`), a
    /// token per --caller (`tokens/NAME`), client certificates
    /// (`clients/NAME.pem`, `clients/NAME-key.pem`) and the callers file
    /// (`callers`). For scripts/serve, scripts/demo and tests only.
    Dev {
        /// The directory (created; previous files replaced).
        dir: PathBuf,
        /// Names and addresses of the server certificate (repeatable).
        #[arg(long = "host", default_values_t = ["localhost".to_owned(), "127.0.0.1".to_owned()])]
        hosts: Vec<String>,
        /// NAME:ROLE:QUEUES, e.g. rust-1:worker:refunds (repeatable).
        /// Without any: the callers of scripts/serve and docs/api.md
        /// ([`DEV_CALLERS`], with a client certificate for `worker`).
        #[arg(long = "caller")]
        callers: Vec<DevCaller>,
        /// Also a client certificate for this caller name (repeatable).
        #[arg(long = "client-cert")]
        client_certs: Vec<String>,
    },
}

/// The callers `jobfence credentials dev` makes when given none: those of
/// `scripts/serve` and the grpcurl examples of docs/api.md.
pub const DEV_CALLERS: [&str; 5] = [
    "worker:worker:refunds",
    "producer:producer:refunds",
    "operator:operator:*",
    "operator:events-reader:*",
    "webhook:webhook:*",
];

/// Runs `jobfence credentials …`.
pub fn run(args: CredentialsArgs) -> anyhow::Result<()> {
    match args.command {
        CredentialsCommand::Token {
            name,
            role,
            queues,
            expires,
            token_out,
        } => {
            let token = pki::new_token()?;
            let line = pki::callers_line(&name, role, &queues, &token, expires);
            // The line must parse as the server will read it.
            jobfence_auth::Callers::parse(&line)?;
            pki::write_secret(&token_out, &format!("{token}\n"))?;
            println!("{line}");
            Ok(())
        }
        CredentialsCommand::Dev {
            dir,
            hosts,
            callers,
            client_certs,
        } => {
            let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
            let (callers, client_certs) = if callers.is_empty() {
                let defaults = DEV_CALLERS
                    .iter()
                    .map(|c| c.parse().map_err(anyhow::Error::msg))
                    .collect::<anyhow::Result<Vec<DevCaller>>>()?;
                (defaults, vec!["worker".to_owned()])
            } else {
                (callers, client_certs)
            };
            let files = pki::dev_setup(&dir, &hosts, &callers, &client_certs)?;
            println!("{}", files.dir.display());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_bytes("4MiB"), Ok(4 << 20));
        assert_eq!(parse_bytes("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert!(parse_bytes("4MB").is_err());
        assert!(parse_bytes("lots").is_err());
    }

    #[test]
    fn serving_without_tls_or_callers_takes_insecure() {
        let args = SecurityArgs {
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            callers: None,
            insecure: false,
            reflection: true,
            console_token_file: None,
        };
        let refused = args.security().unwrap_err().to_string();
        assert!(refused.contains("--insecure") && refused.contains("--callers"));
        let insecure = SecurityArgs {
            insecure: true,
            ..args
        };
        let s = insecure.security().unwrap();
        assert!(s.tls.is_none() && s.auth.is_none());
    }
}
