//! Ports for processes a test starts. A `jobfence serve` child listens on
//! port 0 (`--listen 127.0.0.1:0`, `--metrics-listen 127.0.0.1:0`) and
//! logs the address it got; [`ServeLog`] (stderr piped) or
//! [`addr_in_file`] (stderr to a file) reads it back, so no test picks a
//! port another process may take first (`jobfence fake-provider` prints
//! `listening on ADDR`, Prometheus logs `msg="Listening on" address=ADDR`).
//! Only the programs that cannot bind port 0 get one from [`free_port`]:
//! MariaDB and HAProxy.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;

/// The log message of a coordinator's gRPC listener (with `listen=`).
pub const SERVING_GRPC: &str = "serving jobfence.v1.JobCoordinator, JobAdmin and JobEvents";
/// The log message of a coordinator's `/metrics` listener.
pub const SERVING_METRICS: &str = "serving /metrics";

/// A loopback port that was free a moment ago, for a program that cannot
/// bind port 0 and say which port it got: mariadbd (`--port=0` means its
/// default port, 3306) and HAProxy (2.6 refuses `bind 127.0.0.1:0`:
/// "invalid port '0'"). Another process may take it before the program
/// does: use it for nothing else.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `listen` address of a log line whose message is `message`, in the
/// text format (`… message listen=127.0.0.1:4242`) or JSON
/// (`"fields":{"message":…,"listen":"127.0.0.1:4242"}`).
fn listen_of(line: &str, message: &str) -> Option<SocketAddr> {
    if !line.contains(message) {
        return None;
    }
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
        return v["fields"]["listen"].as_str()?.parse().ok();
    }
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("listen="))
        .and_then(|a| a.trim_matches('"').parse().ok())
}

/// The stderr of a `jobfence serve` child, collected line by line (text or
/// JSON), with the addresses it logged. It is read until the child exits,
/// even once this is dropped, so the pipe never fills.
#[derive(Debug)]
pub struct ServeLog {
    lines: Arc<Mutex<Vec<String>>>,
}

impl ServeLog {
    /// Collects `child`'s stderr, which must be piped.
    pub fn follow(child: &mut tokio::process::Child) -> ServeLog {
        let stderr = child.stderr.take().expect("the child's stderr is piped");
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = lines.clone();
        tokio::spawn(async move {
            let mut read = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = read.next_line().await {
                sink.lock().unwrap().push(line);
            }
        });
        ServeLog { lines }
    }

    /// Every line so far.
    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits (up to 30 s) for the address logged with `message`.
    pub async fn addr(&self, message: &str) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(a) = self.lines().iter().find_map(|l| listen_of(l, message)) {
                return a;
            }
            assert!(
                Instant::now() < deadline,
                "no {message:?} in the log within 30 s:\n{}",
                self.lines().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The first line logged (empty before there is one).
    pub fn first_line(&self) -> String {
        self.lines
            .lock()
            .unwrap()
            .first()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits (up to 30 s) for a line containing `message`.
    pub async fn wait_for(&self, message: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.lines().iter().any(|l| l.contains(message)) {
            assert!(
                Instant::now() < deadline,
                "no {message:?} in the log within 30 s:\n{}",
                self.lines().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Where the child serves gRPC.
    pub async fn grpc(&self) -> SocketAddr {
        self.addr(SERVING_GRPC).await
    }

    /// Where the child serves `/metrics`.
    pub async fn metrics(&self) -> SocketAddr {
        self.addr(SERVING_METRICS).await
    }
}

/// Waits (up to 30 s) for the address logged with `message` in the log
/// file `path` (a child whose stderr goes to a file).
pub async fn addr_in_file(path: &Path, message: &str) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(a) = text.lines().find_map(|l| listen_of(l, message)) {
            return a;
        }
        assert!(
            Instant::now() < deadline,
            "no {message:?} in {} within 30 s:\n{text}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `jobfence` binary cargo built beside the running test binary
/// (`target/<profile>/jobfence`; a test of the root package, which builds
/// it, may call this).
pub fn jobfence_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test> → target/<profile>/jobfence
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("jobfence"))
        .expect("a test binary under target/");
    assert!(
        bin.is_file(),
        "{} not built: run the root package's tests (cargo test -p jobfence)",
        bin.display()
    );
    bin
}

/// `name` on PATH or in the sbin/bin directories, as `scripts/mariadb`
/// looks.
pub fn find_bin(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(
            ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"]
                .iter()
                .map(PathBuf::from),
        )
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} not found: run scripts/test, which installs it"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listen_address_is_read_from_either_log_format() {
        let text = "2026-12-01T15:30:45.755Z  INFO jobfence_server: serving jobfence.v1.JobCoordinator, JobAdmin and JobEvents listen=127.0.0.1:41234";
        assert_eq!(
            listen_of(text, SERVING_GRPC),
            Some("127.0.0.1:41234".parse().unwrap())
        );
        let json = r#"{"timestamp":"…","level":"INFO","fields":{"message":"serving /metrics","listen":"127.0.0.1:9464"},"target":"jobfence_server"}"#;
        assert_eq!(
            listen_of(json, SERVING_METRICS),
            Some("127.0.0.1:9464".parse().unwrap())
        );
        assert_eq!(listen_of(json, SERVING_GRPC), None);
    }
}
