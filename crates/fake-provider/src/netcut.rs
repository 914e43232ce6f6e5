//! A loopback TCP relay that fakes the network's failures, the way the
//! fake provider fakes a provider's: put in front of the database (or of a
//! coordinator), it can cut every connection and refuse new ones (a
//! network partition, a database restart), close the open connections
//! only, or swallow the answers (a response lost after the other side
//! acted on the request). The demo and the tests use it; what it relays to
//! is never touched.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The relay (see the module docs). Stops relaying when dropped.
#[derive(Debug)]
pub struct NetCut {
    /// Where to connect instead of the upstream.
    pub addr: SocketAddr,
    /// Where connections are relayed to.
    pub upstream: SocketAddr,
    refusing: Arc<AtomicBool>,
    swallowing: Arc<AtomicBool>,
    /// Bumped to close every open connection.
    closes: watch::Sender<u64>,
    accept: JoinHandle<()>,
}

impl NetCut {
    /// Relays connections to 127.0.0.1:<a port of the system's choosing>
    /// (read back into [`addr`](Self::addr)) on to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<NetCut> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let refusing = Arc::new(AtomicBool::new(false));
        let swallowing = Arc::new(AtomicBool::new(false));
        let (closes, _) = watch::channel(0u64);
        let accept = {
            let (refusing, swallowing, closes) =
                (refusing.clone(), swallowing.clone(), closes.clone());
            tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    if refusing.load(Ordering::SeqCst) {
                        continue; // dropped: the connection is refused at once
                    }
                    let Ok(outbound) = TcpStream::connect(upstream).await else {
                        continue;
                    };
                    let (ir, iw) = inbound.into_split();
                    let (or, ow) = outbound.into_split();
                    tokio::spawn(pump(ir, ow, None, closes.subscribe()));
                    tokio::spawn(pump(or, iw, Some(swallowing.clone()), closes.subscribe()));
                }
            })
        };
        Ok(NetCut {
            addr,
            upstream,
            refusing,
            swallowing,
            closes,
            accept,
        })
    }

    /// Closes every relayed connection and refuses new ones, until
    /// [`restore`](Self::restore).
    pub fn cut(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        self.close_connections();
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }

    /// Closes every connection open now; new ones are accepted as before.
    pub fn close_connections(&self) {
        self.closes.send_modify(|n| *n += 1);
    }

    /// While on, bytes from the upstream are read and dropped: the
    /// upstream acted on a request and its answer never arrives.
    pub fn swallow_responses(&self, on: bool) {
        self.swallowing.store(on, Ordering::SeqCst);
    }
}

impl Drop for NetCut {
    fn drop(&mut self) {
        self.accept.abort();
        self.close_connections();
    }
}

/// Copies `from` to `to` until either ends or the connections are closed.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    swallow: Option<Arc<AtomicBool>>,
    mut closes: watch::Receiver<u64>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            // A close wins over bytes already waiting: they must not get
            // through.
            biased;
            _ = closes.changed() => return,
            n = from.read(&mut buf) => {
                let n = match n { Ok(0) | Err(_) => return, Ok(n) => n };
                let dropped = swallow.as_ref().is_some_and(|s| s.load(Ordering::SeqCst));
                if !dropped && to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
