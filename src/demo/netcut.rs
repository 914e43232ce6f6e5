//! A loopback TCP relay that can be cut and restored: put in front of the
//! database, it makes the database unreachable for whoever connects through
//! it (its open connections are closed, new ones refused), the way a
//! network partition or a database restart looks from a coordinator. The
//! demo and the tests use it; the database itself is never touched.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The relay (see the module docs). Stops relaying when dropped.
#[derive(Debug)]
pub struct NetCut {
    /// Where to connect instead of the upstream.
    pub addr: SocketAddr,
    /// Where connections are relayed to.
    pub upstream: SocketAddr,
    cut: Arc<AtomicBool>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl NetCut {
    /// Relays connections to 127.0.0.1:<free port> on to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<NetCut> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let links: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = {
            let (cut, links) = (cut.clone(), links.clone());
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if cut.load(Ordering::SeqCst) {
                        continue; // dropped: the connection is refused at once
                    }
                    let link = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    let mut links = links.lock().expect("relay links poisoned");
                    links.retain(|l| !l.is_finished());
                    links.push(link);
                }
            })
        };
        Ok(NetCut {
            addr,
            upstream,
            cut,
            links,
            accept,
        })
    }

    /// Closes every relayed connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for link in self.links.lock().expect("relay links poisoned").drain(..) {
            link.abort();
        }
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for NetCut {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
