//! The drain after SIGTERM as a load balancer sees it, on the real binary:
//! new connections to the gRPC listener and to `/healthz` are answered
//! NOT_SERVING / 503 for the whole drain delay (not refused, not left
//! hanging), calls still routed to it are served, and only then do the
//! listeners close (docs/operating.md "Draining").

use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::EnqueueRequest;
use jobfence_testkit::process::ServeLog;
use jobfence_testkit::TestDb;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// What the log says when SIGTERM starts the drain.
const DRAINING: &str = "shutting down: reporting NOT_SERVING, then draining";

/// A fresh connection's `Health/Check` of the whole server ("" service),
/// as a load balancer's probe makes it: its status name, or the error.
pub async fn grpc_probe(addr: SocketAddr) -> Result<String, String> {
    grpc_probe_tls(addr, None).await
}

/// [`grpc_probe`] over TLS when `ca` (PEM) is given, the server's
/// certificate checked against it for the name `localhost`.
pub async fn grpc_probe_tls(addr: SocketAddr, ca: Option<&[u8]>) -> Result<String, String> {
    let probe = async {
        let endpoint = match ca {
            None => Channel::from_shared(format!("http://{addr}")).unwrap(),
            Some(pem) => Channel::from_shared(format!("https://{addr}"))
                .unwrap()
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(Certificate::from_pem(pem))
                        .domain_name("localhost"),
                )
                .map_err(|e| format!("{e:?}"))?,
        };
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let answer = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map_err(|s| format!("{s:?}"))?;
        Ok(answer.into_inner().status().as_str_name().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(3), probe)
        .await
        .map_err(|_| "no answer within 3 s".to_owned())?
}

/// A fresh connection's `GET path`: the whole answer, or the error.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let get = async {
        let mut tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let request = format!("GET {path} HTTP/1.1\r\nhost: probe\r\nconnection: close\r\n\r\n");
        tcp.write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut answer = String::new();
        tcp.read_to_string(&mut answer)
            .await
            .map_err(|e| e.to_string())?;
        Ok(answer)
    };
    tokio::time::timeout(Duration::from_secs(3), get)
        .await
        .map_err(|_| "no answer within 3 s".to_owned())?
}

/// A fresh connection's `GET /healthz`: the status line's code, or the
/// error.
pub async fn http_probe(addr: SocketAddr) -> Result<u16, String> {
    let answer = http_get(addr, "/healthz").await?;
    answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(format!("not an HTTP answer: {answer:?}"))
}

/// The build as `/metrics` names it: the `jobfence_build_info` line.
pub async fn build_info(metrics: SocketAddr) -> String {
    let page = http_get(metrics, "/metrics").await.unwrap();
    page.lines()
        .find(|l| l.starts_with("jobfence_build_info{"))
        .unwrap_or_else(|| panic!("no jobfence_build_info in /metrics:\n{page}"))
        .to_owned()
}

/// Sends SIGTERM to `child` (serving gRPC on `grpc`, over TLS checked
/// against `ca` when given, and `/healthz` on `metrics`, with a drain
/// delay of several seconds) and checks, while it drains, that a new
/// connection's health check reads NOT_SERVING and `/healthz` 503.
pub async fn sigterm_and_probe(
    child: &tokio::process::Child,
    log: &ServeLog,
    [grpc, metrics]: [SocketAddr; 2],
    ca: Option<&[u8]>,
) {
    assert_eq!(grpc_probe_tls(grpc, ca).await.as_deref(), Ok("SERVING"));
    assert_eq!(http_probe(metrics).await, Ok(200));
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    log.wait_for(DRAINING).await;
    assert_eq!(
        grpc_probe_tls(grpc, ca).await.as_deref(),
        Ok("NOT_SERVING"),
        "a new connection's health check during the drain"
    );
    assert_eq!(
        http_probe(metrics).await,
        Ok(503),
        "a new connection's /healthz during the drain"
    );
}

/// Waits for `child` to exit after its drain: status 0, both listeners
/// closed.
pub async fn stopped_cleanly(child: &mut tokio::process::Child, [grpc, metrics]: [SocketAddr; 2]) {
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the coordinator stops after its drain")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(grpc_probe(grpc).await.unwrap_err().contains("connect"));
    assert!(http_probe(metrics).await.unwrap_err().contains("connect"));
}

/// A call a load balancer still routes to a draining coordinator is
/// served.
async fn a_call_is_served(grpc: SocketAddr) {
    let mut client = JobCoordinatorClient::connect(format!("http://{grpc}"))
        .await
        .expect("the listener accepts during the drain");
    client
        .enqueue(EnqueueRequest {
            queue: "refunds".into(),
            operation_key: "sent-during-the-drain".into(),
            payload: "{}".into(),
            delay: None,
            fairness_key: String::new(),
            priority: 0,
        })
        .await
        .expect("a call during the drain is served");
}

#[tokio::test]
async fn the_build_is_named_and_during_the_drain_new_connections_read_not_serving_and_503() {
    let db = TestDb::new().await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobfence"))
        .args([
            "serve",
            "--insecure",
            "--migrate",
            "--database-url",
            &db.url,
        ])
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--drain-delay", "5s", "--prune-off"])
        .env("JOBFENCE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let log = ServeLog::follow(&mut child);
    let (grpc, metrics) = (log.grpc().await, log.metrics().await);
    log.wait_for("database health changed").await;
    let release = env!("CARGO_PKG_VERSION");
    assert_eq!(
        build_info(metrics).await,
        format!(
            "jobfence_build_info{{api_version=\"{}\",schema_version=\"{}\",version=\"{release}\"}} 1",
            jobfence_api::VERSION,
            jobfence_store::schema::schema_version()
        )
    );
    let first = log.first_line();
    assert!(
        first.contains("jobfence coordinator") && first.contains(release),
        "the first log line names the release: {first}"
    );
    sigterm_and_probe(&child, &log, [grpc, metrics], None).await;
    a_call_is_served(grpc).await;
    stopped_cleanly(&mut child, [grpc, metrics]).await;
}
