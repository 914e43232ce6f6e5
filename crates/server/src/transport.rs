//! The gRPC listener's connections: accepted under a connection limit,
//! optionally wrapped in TLS (mutual TLS with `--tls-client-ca`), each
//! labelled with its [`Peer`] for the authentication layer.
//!
//! TLS is done here with rustls directly rather than by tonic's
//! `ServerTlsConfig`, for two things tonic does not offer: the
//! certificate, key and client CA are re-read on SIGHUP
//! ([`ServerTls::reload`]: new connections use the new files, open ones
//! keep theirs), and a connection past `--max-connections` is closed
//! before its handshake costs anything.

use anyhow::Context;
use jobfence_auth::layer::Peer;
use jobfence_metrics::Metrics;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_stream::wrappers::ReceiverStream;

/// The files of the listener's TLS (PEM).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The server's certificate chain (`--tls-cert`).
    pub cert: PathBuf,
    /// Its private key (`--tls-key`).
    pub key: PathBuf,
    /// The CA that signs client certificates (`--tls-client-ca`): set, a
    /// client without a certificate it signed cannot connect.
    pub client_ca: Option<PathBuf>,
}

/// The TLS configuration in force; [`ServerTls::reload`] swaps it.
#[derive(Debug)]
pub struct ServerTls {
    files: TlsFiles,
    config: RwLock<Arc<ServerConfig>>,
}

fn pem_certs(path: &PathBuf) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("reading certificates from {}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in {}", path.display());
    Ok(certs)
}

fn server_config(files: &TlsFiles) -> anyhow::Result<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = pem_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("reading the private key {}", files.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in pem_certs(ca)? {
                roots.add(cert).context("the client CA certificate")?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .context("building the client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("the certificate does not match its key")?;
    // gRPC is HTTP/2 only.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

impl ServerTls {
    /// Reads `files`; errors name the file that is missing or unusable.
    pub fn load(files: TlsFiles) -> anyhow::Result<ServerTls> {
        let config = server_config(&files)?;
        Ok(ServerTls {
            files,
            config: RwLock::new(Arc::new(config)),
        })
    }

    /// Reads the files again and puts them in force for new connections;
    /// on an error the previous configuration stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let config = server_config(&self.files)?;
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        Ok(())
    }

    /// Whether clients must present a certificate (mutual TLS).
    pub fn mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = self
            .config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        tokio_rustls::TlsAcceptor::from(config)
    }
}

/// How connections are admitted.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Open connections at most; one more is closed as soon as it is
    /// accepted (`jobfence_connections_refused_total`).
    pub max_connections: usize,
    /// How long a client has to finish its TLS handshake.
    pub handshake_timeout: Duration,
    /// With authentication on: how long a connection lives without a call
    /// that authenticated; `None` (no authentication) never closes one.
    pub unauthenticated_timeout: Option<Duration>,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// One accepted connection, holding its slot under the connection limit
/// until it closes.
pub struct Conn {
    io: Io,
    peer: Peer,
    _slot: OwnedSemaphorePermit,
    /// Until a call authenticated: when the connection is closed.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    metrics: Metrics,
}

impl Conn {
    fn new(
        io: Io,
        peer: Peer,
        slot: OwnedSemaphorePermit,
        limits: &ConnectionLimits,
        metrics: Metrics,
    ) -> Conn {
        Conn {
            io,
            peer,
            _slot: slot,
            deadline: limits
                .unauthenticated_timeout
                .map(|d| Box::pin(tokio::time::sleep(d))),
            metrics,
        }
    }

    /// An error once the connection outlived its deadline without an
    /// authenticated call (the server then closes it); polled with every
    /// read, which hyper keeps pending on an idle connection.
    fn check_deadline(&mut self, cx: &mut TaskContext<'_>) -> io::Result<()> {
        let Some(deadline) = &mut self.deadline else {
            return Ok(());
        };
        if self
            .peer
            .authenticated
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            self.deadline = None;
            return Ok(());
        }
        if std::future::Future::poll(deadline.as_mut(), cx).is_ready() {
            self.deadline = None;
            self.metrics.connection_refused("unauthenticated_timeout");
            tracing::info!(
                peer = ?self.peer.addr,
                "connection closed: no authenticated call within --unauthenticated-connection-timeout"
            );
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no authenticated call in time",
            ));
        }
        Ok(())
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check_deadline(cx) {
            return Poll::Ready(Err(e));
        }
        match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Accepts connections on `listener` until the returned stream is
/// dropped (the server stops accepting), which closes the listener.
pub fn incoming(
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
    limits: ConnectionLimits,
    metrics: Metrics,
) -> ReceiverStream<io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(64);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, addr) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: do not spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                metrics.connection_refused("max_connections");
                tracing::debug!(peer = %addr, "connection refused: --max-connections reached");
                continue;
            };
            // A gRPC answer is several small writes; with Nagle on, the
            // last can wait for the client's delayed ACK (40 ms).
            let _ = tcp.set_nodelay(true);
            let mut peer = Peer {
                addr: Some(addr),
                ..Peer::default()
            };
            let Some(tls) = &tls else {
                let conn = Conn::new(Io::Plain(tcp), peer, slot, &limits, metrics.clone());
                if tx.send(Ok(conn)).await.is_err() {
                    return;
                }
                continue;
            };
            let (acceptor, tx, metrics) = (tls.acceptor(), tx.clone(), metrics.clone());
            // Handshakes run beside the accept loop: a slow client must not
            // hold up the next one.
            tokio::spawn(async move {
                let stream = match tokio::time::timeout(
                    limits.handshake_timeout,
                    acceptor.accept(tcp),
                )
                .await
                {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        metrics.connection_refused("tls_handshake");
                        tracing::info!(peer = %addr, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        metrics.connection_refused("tls_handshake_timeout");
                        tracing::info!(peer = %addr, "TLS handshake timed out");
                        return;
                    }
                };
                peer.certificate_name = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(|leaf| jobfence_auth::certificate::common_name(leaf.as_ref()));
                let conn = Conn::new(Io::Tls(Box::new(stream)), peer, slot, &limits, metrics);
                let _ = tx.send(Ok(conn)).await;
            });
        }
    });
    ReceiverStream::new(rx)
}
