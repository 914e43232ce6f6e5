//! What load balancers and operators see: standard gRPC health following the
//! database, NOT_SERVING while a graceful shutdown drains, and reflection
//! good enough for grpcurl, run against the real `jobfence` binary.

use jobfence_testkit as kit;

use jobfence_api::v1::{CompleteRequest, GetJobRequest};
use jobfence_server::ServeOptions;
use kit::process::{addr_in_file, ServeLog, SERVING_GRPC};
use kit::{reason, Harness, TestDb};
use std::process::Stdio;
use std::time::Duration;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

mod grpcurl;

const SERVICE: &str = "jobfence.v1.JobCoordinator";

async fn health(addr: std::net::SocketAddr) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

/// Follows `Health/Watch` until it reports `want`.
async fn watch_until(
    stream: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
    want: ServingStatus,
) {
    let deadline = tokio::time::sleep(Duration::from_secs(20));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            msg = stream.next() => {
                let msg = msg.expect("watch stream ended").expect("watch stream failed");
                if msg.status == want as i32 {
                    return;
                }
            }
            _ = &mut deadline => panic!("health never became {want:?}"),
        }
    }
}

async fn watch(
    client: &mut HealthClient<Channel>,
    service: &str,
) -> tonic::Streaming<tonic_health::pb::HealthCheckResponse> {
    client
        .watch(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn health_follows_the_database() {
    let (h, proxy) = Harness::start_behind_proxy(ServeOptions {
        health_interval: Duration::from_millis(50),
        health_timeout: Duration::from_millis(50),
        drain_delay: Duration::ZERO,
        shutdown_timeout: Duration::from_secs(10),
    })
    .await;
    let mut hc = health(h.addr).await;
    let mut overall = watch(&mut hc, "").await;
    let mut service = watch(&mut hc, SERVICE).await;
    watch_until(&mut overall, ServingStatus::Serving).await;
    watch_until(&mut service, ServingStatus::Serving).await;

    proxy.cut();
    watch_until(&mut overall, ServingStatus::NotServing).await;
    watch_until(&mut service, ServingStatus::NotServing).await;
    // Calls meanwhile get a retryable, precise status.
    let status = h
        .client
        .clone()
        .get_job(GetJobRequest { job_id: 1 })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(reason(&status), "DATABASE_UNAVAILABLE");

    proxy.restore();
    watch_until(&mut overall, ServingStatus::Serving).await;
    watch_until(&mut service, ServingStatus::Serving).await;
    drop((overall, service));
    h.finish().await;
}

#[tokio::test]
async fn graceful_shutdown_reports_not_serving_and_drains_in_flight_calls() {
    let mut h = Harness::start_with(
        kit::test_config(),
        ServeOptions {
            health_interval: Duration::from_millis(50),
            health_timeout: Duration::from_millis(50),
            drain_delay: Duration::from_millis(100),
            shutdown_timeout: Duration::from_secs(10),
        },
    )
    .await;
    let job = h.enqueue("refunds", "refund-1", "{}").await;
    let a = h.claim_one("refunds", "w").await;
    let mut hc = health(h.addr).await;
    let mut service = watch(&mut hc, SERVICE).await;
    watch_until(&mut service, ServingStatus::Serving).await;

    // A Complete is in flight, holding its row lock, when SIGTERM arrives.
    let mut gate = h.pauses.arm(jobfence_store::PausePoint::WriteAfterLock);
    let mut c = h.another_client().await;
    let in_flight = tokio::spawn(async move {
        c.complete(CompleteRequest {
            job_id: job.job_id,
            attempt: a.attempt,
            provider_reference: "re_1".into(),
            result: String::new(),
            next: None,
        })
        .await
    });
    gate.reached().await;
    let stopping = tokio::spawn(async move {
        h.stop().await;
        h
    });
    watch_until(&mut service, ServingStatus::NotServing).await;
    drop(service); // a watch stream would otherwise keep the server open
    gate.release();
    let done = in_flight
        .await
        .unwrap()
        .expect("the in-flight call completes");
    assert!(!done.into_inner().replayed);
    let h = stopping.await.unwrap();
    assert_eq!(
        h.row(job.job_id).await.state,
        jobfence_domain::JobState::Succeeded
    );
    h.finish().await;
}

/// Serving without TLS or authentication is an explicit choice: without
/// any security flag `serve` refuses to start, saying what is missing;
/// with `--insecure` it serves, and warns at start about both.
#[tokio::test]
async fn serving_without_tls_or_callers_is_an_explicit_choice_warned_about() {
    use tokio::io::AsyncBufReadExt;
    let db = TestDb::new().await;
    let bin = env!("CARGO_BIN_EXE_jobfence");
    let serve = |extra: &[&str]| {
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args(["serve", "--database-url", &db.url])
            .args(["--listen", "127.0.0.1:0"])
            .args(["--drain-delay", "0s"])
            .args(extra)
            .env("JOBFENCE_LOG", "info")
            .env_remove("JOBFENCE_INSECURE")
            .env_remove("JOBFENCE_TLS_CERT")
            .env_remove("JOBFENCE_TLS_KEY")
            .env_remove("JOBFENCE_CALLERS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    };

    let out = tokio::time::timeout(Duration::from_secs(30), serve(&[]).output())
        .await
        .expect("serve without security flags exits")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "refusing to serve without --tls-cert and --tls-key (TLS) and --callers (authentication)"
        ),
        "{stderr}"
    );

    let mut child = serve(&["--insecure"]).spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let (mut no_tls, mut no_auth) = (false, false);
    let mut seen = String::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while !(no_tls && no_auth) {
            let Some(line) = lines.next_line().await.unwrap() else {
                break;
            };
            no_tls |=
                line.contains("WARN") && line.contains("serving gRPC without TLS (--insecure)");
            no_auth |= line.contains("WARN")
                && line.contains("serving gRPC without authentication (--insecure)");
            seen.push_str(&line);
            seen.push('\n');
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no warnings within 30 s:\n{seen}"));
    assert!(no_tls && no_auth, "both warnings at start:\n{seen}");
    let _ = child.kill().await;
}

/// Issuing and revoking a token as docs/security.md says, on the real
/// binary: `jobfence credentials token` prints only the callers-file line
/// (the token goes to its file); the token works once the line is appended
/// and the coordinator got SIGHUP, and stops working once the line is
/// deleted and the coordinator got SIGHUP again. Its refusals are logged
/// without it.
#[tokio::test]
async fn a_token_issued_with_the_cli_works_after_sighup_and_not_after_revocation() {
    use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
    use jobfence_api::v1::EnqueueRequest;
    use jobfence_worker::credentials::{BearerToken, Credentials};
    let db = TestDb::new().await;
    let bin = env!("CARGO_BIN_EXE_jobfence");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("issue-and-revoke");
    let _ = std::fs::remove_dir_all(&dir);
    let out = std::process::Command::new(bin)
        .args(["credentials", "dev"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let callers = dir.join("callers");
    let mut server = tokio::process::Command::new(bin)
        .args(["serve", "--database-url", &db.url])
        .args(["--listen", "127.0.0.1:0"])
        .arg("--tls-cert")
        .arg(dir.join("server.pem"))
        .arg("--tls-key")
        .arg(dir.join("server-key.pem"))
        .arg("--callers")
        .arg(&callers)
        .args(["--drain-delay", "0s"])
        .env("JOBFENCE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("serve.log")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(server.id().unwrap() as i32);
    let addr = addr_in_file(&dir.join("serve.log"), SERVING_GRPC).await;

    let token_file = dir.join("rust-7");
    let out = std::process::Command::new(bin)
        .args([
            "credentials",
            "token",
            "--name",
            "rust-7",
            "--role",
            "worker",
        ])
        .args(["--queues", "refunds", "--token-out"])
        .arg(&token_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    let token = std::fs::read_to_string(&token_file).unwrap();
    let token = token.trim();
    assert!(
        line.starts_with("rust-7") && line.contains("sha256:"),
        "{line}"
    );
    assert!(
        !line.contains(token),
        "the printed line holds the token itself"
    );

    let creds = Credentials {
        tls_ca_pem: Some(std::fs::read(dir.join("ca.pem")).unwrap()),
        token: Some(BearerToken::new(token).unwrap()),
        ..Credentials::default()
    };
    let mut channel = None;
    for _ in 0..200 {
        if let Ok(c) = creds
            .endpoint(format!("https://{addr}"))
            .unwrap()
            .connect()
            .await
        {
            channel = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let channel = channel.expect("the coordinator listens");
    let client = JobCoordinatorClient::new(tonic::service::interceptor::InterceptedService::new(
        channel,
        creds.authorization(),
    ));
    let mut n = 0;
    let mut enqueue = || {
        n += 1;
        let mut client = client.clone();
        async move {
            client
                .enqueue(EnqueueRequest {
                    queue: "refunds".into(),
                    operation_key: format!("refund-{n}"),
                    payload: "{}".into(),
                    delay: None,
                    fairness_key: String::new(),
                    priority: 0,
                })
                .await
        }
    };
    // Not in the callers file in force yet.
    let refused = enqueue().await.unwrap_err();
    assert_eq!(reason(&refused), "CREDENTIAL_INVALID", "{refused:?}");

    // Issue: append the line, SIGHUP. The reload runs when the signal
    // arrives: poll (bounded) until the token is accepted.
    let mut text = std::fs::read_to_string(&callers).unwrap();
    text.push_str(&line);
    std::fs::write(&callers, &text).unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let mut accepted = false;
    for _ in 0..100 {
        match enqueue().await {
            Ok(_) => {
                accepted = true;
                break;
            }
            Err(s) => assert_eq!(reason(&s), "CREDENTIAL_INVALID", "{s:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(accepted, "the issued token never worked after SIGHUP");

    // Revoke: delete its line, SIGHUP.
    let kept: String = text
        .lines()
        .filter(|l| !l.starts_with("rust-7"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&callers, kept).unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let mut revoked = false;
    for _ in 0..100 {
        match enqueue().await {
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(s) => {
                assert_eq!(reason(&s), "CREDENTIAL_INVALID", "{s:?}");
                revoked = true;
                break;
            }
        }
    }
    assert!(revoked, "the revoked token still works after SIGHUP");
    assert!(
        server.try_wait().unwrap().is_none(),
        "SIGHUP does not stop it"
    );
    let _ = server.kill().await;
    // Each refusal was logged, with its reason, never with the token.
    let log = std::fs::read_to_string(dir.join("serve.log")).unwrap();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("call refused")
            && l.contains("CREDENTIAL_INVALID")),
        "{log}"
    );
    assert!(!log.contains(token), "the token was logged:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
