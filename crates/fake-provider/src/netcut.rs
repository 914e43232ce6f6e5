//! A loopback TCP relay that fakes the network's failures, the way the
//! fake provider fakes a provider's: put in front of the database (or of a
//! coordinator), it can cut every connection and refuse new ones (a
//! network partition, a database restart), close the open connections
//! only, or swallow the answers (a response lost after the other side
//! acted on the request). The demo and the tests use it; what it relays to
//! is never touched.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// 0: off; else 1 + the close generation when swallowing started (see
    /// [`swallow_responses`](Self::swallow_responses)).
    swallowing: Arc<AtomicU64>,
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
        let swallowing = Arc::new(AtomicU64::new(0));
        let (closes, _) = watch::channel(0u64);
        let accept = {
            let (refusing, swallowing, closes) =
                (refusing.clone(), swallowing.clone(), closes.clone());
            tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    if refusing.load(Ordering::SeqCst) {
                        continue; // dropped: the connection is refused at once
                    }
                    // Watched from before the connect: a cut while it is
                    // under way closes this connection too.
                    let mut closed = closes.subscribe();
                    let born = *closed.borrow_and_update();
                    let Ok(outbound) = TcpStream::connect(upstream).await else {
                        continue;
                    };
                    if refusing.load(Ordering::SeqCst) || *closes.borrow() != born {
                        continue; // cut while connecting: both sides dropped
                    }
                    let (ir, iw) = inbound.into_split();
                    let (or, ow) = outbound.into_split();
                    tokio::spawn(pump(ir, ow, None, closed.clone()));
                    tokio::spawn(pump(or, iw, Some((swallowing.clone(), born)), closed));
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
    /// upstream acted on a request and its answer never arrives. It holds
    /// for the connections open when it was turned on and those accepted
    /// until the next [`close_connections`](Self::close_connections) (or
    /// [`cut`](Self::cut)), never for one accepted after that: a client
    /// that reconnects at once after a close, before swallowing is turned
    /// off, must not lose the new connection's answers (its handshake
    /// would hang).
    pub fn swallow_responses(&self, on: bool) {
        let since = if on { 1 + *self.closes.borrow() } else { 0 };
        self.swallowing.store(since, Ordering::SeqCst);
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
    swallow: Option<(Arc<AtomicU64>, u64)>,
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
                // Swallowed if it is on and this connection was accepted
                // no later than the close generation it was turned on in.
                let dropped = swallow.as_ref().is_some_and(|(s, born)| {
                    let since = s.load(Ordering::SeqCst);
                    since != 0 && *born < since
                });
                if !dropped && to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An upstream that echoes what it reads.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream, what: &[u8]) -> Vec<u8> {
        s.write_all(what).await.unwrap();
        let mut got = vec![0u8; what.len()];
        // Bounded only so that a swallowed answer fails the test instead
        // of hanging it; loopback answers in microseconds.
        tokio::time::timeout(Duration::from_secs(30), s.read_exact(&mut got))
            .await
            .expect("the answer got through")
            .unwrap();
        got
    }

    #[tokio::test]
    async fn a_connection_made_after_a_close_is_not_swallowed() {
        let relay = NetCut::start(echo().await).await.unwrap();
        let mut before = TcpStream::connect(relay.addr).await.unwrap();
        assert_eq!(round_trip(&mut before, b"up").await, b"up");
        // Answers are lost, the open connections closed, and the client
        // reconnects at once, before swallowing is turned off.
        relay.swallow_responses(true);
        relay.close_connections();
        let mut after = TcpStream::connect(relay.addr).await.unwrap();
        assert_eq!(round_trip(&mut after, b"ping").await, b"ping");
    }
}
