//! What the gRPC listener does about who may reach it: TLS (mutual with a
//! client CA), the callers file, and their reload on SIGHUP. The pieces
//! live in `transport` (TLS) and `jobfence_auth` (callers, roles, the
//! authentication layer); this is how `serve` holds them together.

use super::transport::ServerTls;
use jobfence_auth::Authenticator;
use std::sync::Arc;

/// TLS and authentication of the gRPC listener. The default is neither:
/// an explicit choice (`jobfence serve --insecure`), warned about at start.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// TLS on the listener; `None` serves cleartext HTTP/2.
    pub tls: Option<Arc<ServerTls>>,
    /// The callers file; `None` lets every caller call everything.
    pub auth: Option<Arc<Authenticator>>,
    /// Re-read the TLS files and the callers file on SIGHUP (the command
    /// line sets it; an embedded server calls [`Security::reload`]).
    pub reload_on_sighup: bool,
}

impl Security {
    /// No TLS, no authentication.
    pub fn insecure() -> Self {
        Security::default()
    }

    /// Re-reads the TLS files and the callers file. Each is replaced only
    /// if it loads: a broken file leaves the previous one in force, and
    /// the error says which.
    pub fn reload(&self) -> anyhow::Result<()> {
        let mut errors = Vec::new();
        if let Some(tls) = &self.tls {
            match tls.reload() {
                Ok(()) => tracing::info!("TLS certificate, key and client CA reloaded"),
                Err(e) => errors.push(format!("TLS files: {e:#}")),
            }
        }
        if let Some(auth) = &self.auth {
            match auth.reload() {
                Ok((tokens, certificates)) => {
                    tracing::info!(tokens, certificates, "callers file reloaded")
                }
                Err(e) => errors.push(format!("callers file: {e:#}")),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("kept the previous configuration for: {}", errors.join("; "))
        }
    }

    /// Logs what the listener does at start, and warns about what it does
    /// not.
    pub(super) fn announce(&self) {
        match &self.tls {
            Some(tls) if tls.mutual() => {
                tracing::info!("TLS on, with client certificates required (mutual TLS)")
            }
            Some(_) => tracing::info!("TLS on"),
            None => tracing::warn!(
                "serving gRPC without TLS (--insecure): calls, payloads and bearer tokens \
                 cross the network in cleartext"
            ),
        }
        match &self.auth {
            Some(auth) => {
                let (tokens, certificates) = auth.callers().counts();
                tracing::info!(tokens, certificates, "callers authenticated");
            }
            None => tracing::warn!(
                "serving gRPC without authentication (--insecure): anyone who reaches the \
                 listener can enqueue, claim, complete and resolve any job under any name"
            ),
        }
    }

    /// Reloads on every SIGHUP until the process ends.
    pub(super) fn spawn_sighup_reload(&self) {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let security = self.clone();
            match signal(SignalKind::hangup()) {
                Ok(mut hup) => {
                    tokio::spawn(async move {
                        while hup.recv().await.is_some() {
                            if let Err(e) = security.reload() {
                                tracing::error!(error = %e, "reload on SIGHUP failed");
                            }
                        }
                    });
                }
                Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP; no reload"),
            }
        }
    }
}
