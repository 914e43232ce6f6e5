//! The limits of one call against a real coordinator with TLS and the
//! callers file on (issue 8): request size, per-caller concurrency and the
//! server-side deadline hold, typed; a runner whose claims are refused stops
//! and says why; anonymous reflection streams cannot take the callers' slots;
//! a connection that never makes an authenticated call is closed.

use super::*;

/// Whether a session of `pool`'s database other than the asking one is
/// running a locking read of jobs (the held Complete, behind the test's
/// row lock). The processlist, not `innodb_trx`: InnoDB may list the
/// waiting transaction late, or not while the statement is in its
/// "Statistics" phase.
async fn someone_waits_on_a_lock(pool: &sqlx::MySqlPool) -> bool {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.processlist \
         WHERE DB = DATABASE() AND ID <> CONNECTION_ID() \
         AND INFO LIKE '%FROM jobs FORCE INDEX%FOR UPDATE%'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    n > 0
}

/// The limits of one call, with a deterministic schedule: an oversized
/// request is refused INVALID_REQUEST (typed, not the codec's bare
/// OUT_OF_RANGE) and writes nothing; a call held on a row
/// lock (the test holds it) keeps its caller's only slot, so the caller's
/// next call is refused OVERLOADED at once while another caller still gets
/// in; and the held call is answered DEADLINE_EXCEEDED at the server's
/// `--call-timeout`, well before the database would give up on the lock.
#[tokio::test]
async fn request_size_per_caller_concurrency_and_the_call_timeout_hold() {
    use jobfence_server::limits::Limits;
    use std::time::{Duration, Instant};
    let call_timeout = Duration::from_secs(2);
    let s = Secure::with_limits(Limits {
        max_request_bytes: 16 * 1024,
        max_calls_per_caller: 1,
        call_timeout,
        ..Limits::default()
    })
    .await;

    // 32 KiB of payload is valid (≤ 64 KiB) but above the request limit.
    let before = s.counts().await;
    let mut w = s.worker(Some("refunds-worker")).await;
    let mut big = enqueue("refunds", "too-big");
    big.payload = format!("{{\"pad\":\"{}\"}}", "x".repeat(32 * 1024));
    let status = refused(
        w.enqueue(big).await,
        Code::InvalidArgument,
        "INVALID_REQUEST",
    );
    assert_eq!(meta(&status, "max_request_bytes"), "16384");
    assert_eq!(
        s.counts().await,
        before,
        "an oversized request writes nothing"
    );

    let job = s.running("refund-held").await;
    // Hold the job's row lock: the worker's Complete waits behind it.
    let mut lock = s.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM jobs WHERE id = ? FOR UPDATE")
        .bind(job.job_id)
        .fetch_one(&mut *lock)
        .await
        .unwrap();
    let mut held = s.worker(Some("refunds-worker")).await;
    let started = Instant::now();
    let complete = tokio::spawn(async move {
        let r = held
            .complete(CompleteRequest {
                job_id: job.job_id,
                attempt: job.attempt,
                provider_reference: "re_held".into(),
                result: String::new(),
                next: None,
            })
            .await;
        (r, started.elapsed())
    });
    let mut waited = false;
    for _ in 0..400 {
        if someone_waits_on_a_lock(&s.pool).await {
            waited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if !waited {
        let (result, took) = complete.await.unwrap();
        panic!("the Complete never waited on the row lock: {result:?} after {took:?}");
    }

    // Its caller's one slot is taken: refused at once, nothing applied.
    let mut again = s.worker(Some("refunds-worker")).await;
    // "At once" is the refusal itself: a call queued behind the slot would
    // be admitted once the held call ends, never answered OVERLOADED.
    let refused_at = Instant::now();
    refused(
        again.get_job(GetJobRequest { job_id: job.job_id }).await,
        Code::ResourceExhausted,
        "OVERLOADED",
    );
    println!(
        "limits: the second call of a caller with one slot refused after {:?}",
        refused_at.elapsed()
    );
    // Another caller is not held up by it.
    let mut shop = s.worker(Some("shop")).await;
    shop.get_job(GetJobRequest { job_id: job.job_id })
        .await
        .expect("another caller's call is admitted");

    // The held call ends at the server's deadline, typed, never UNKNOWN.
    // The database's lock wait timeout (10 s) would answer with another
    // status, so DEADLINE_EXCEEDED says which one ended it; the time is
    // printed, and only its lower bound (never before the deadline) holds
    // on any machine.
    let (result, took) = complete.await.unwrap();
    println!("limits: the held call was answered after {took:?} (call timeout {call_timeout:?})");
    let status = result.expect_err("the held call is cut at the call timeout");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(took >= call_timeout, "answered after {took:?}");
    lock.rollback().await.unwrap();
    s.stop().await;
}

/// A handler the refused runners below must never reach.
struct NeverCalled;

impl jobfence_worker::Handler for NeverCalled {
    async fn handle(
        &self,
        job: &mut jobfence_worker::ClaimedJob,
    ) -> Result<(), jobfence_worker::HandlerError> {
        panic!("a refused runner handed out job {}", job.job_id());
    }
}

/// The Rust SDK's runner does not claim forever with a credential that
/// cannot claim: another queue's worker, or a producer, stops at the first
/// refusal, says why in its report, and wrote nothing.
#[tokio::test]
async fn a_runner_whose_claims_are_refused_stops_and_says_why() {
    let s = Secure::start(false).await;
    let mut shop = s.worker(Some("shop")).await;
    shop.enqueue(enqueue("refunds", "r-1")).await.unwrap();
    let before = s.counts().await;
    for (caller, why) in [
        ("payouts-worker", "QUEUE_NOT_ALLOWED"),
        ("shop", "ROLE_NOT_ALLOWED"),
    ] {
        let config = jobfence_worker::WorkerConfig {
            credentials: s.creds(Some(caller)),
            ..jobfence_worker::WorkerConfig::new(caller, "refunds")
        };
        let client = jobfence_worker::WorkerClient::connect(format!("https://{}", s.addr), config)
            .await
            .unwrap();
        let report = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            jobfence_worker::Worker::new(client).run(NeverCalled, std::future::pending()),
        )
        .await
        .unwrap_or_else(|_| panic!("{caller}: the runner kept claiming"));
        let stopped_by = report.stopped_by.clone().unwrap_or_default();
        assert!(stopped_by.contains(why), "{caller}: {report:?}");
        assert_eq!((report.claimed, report.failed_claims), (0, 1), "{report:?}");
    }
    assert_eq!(s.counts().await, before, "a refused claim wrote something");
    s.stop().await;
}

/// Reflection needs no credential, so its streams have a pool of their
/// own: anonymous streams held open are refused OVERLOADED past it, and
/// never take the slots of authenticated callers, even when there are
/// fewer of those than reflection streams.
#[tokio::test]
async fn anonymous_reflection_streams_cannot_take_the_callers_slots() {
    use jobfence_server::limits::{Limits, REFLECTION_CALLS};
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let s = Secure::with_limits(Limits {
        max_calls: 2,
        ..Limits::default()
    })
    .await;
    let channel = s.channel(&s.creds(None)).await;
    let mut held = Vec::new();
    let mut senders = Vec::new();
    for i in 0..=REFLECTION_CALLS {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        })
        .await
        .unwrap();
        let mut client = ServerReflectionClient::new(channel.clone());
        let answer = client
            .server_reflection_info(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await;
        if i < REFLECTION_CALLS {
            let mut stream = answer
                .expect("a reflection stream within the pool")
                .into_inner();
            // Answered once, then held open by the unsent rest.
            stream.message().await.unwrap().expect("the services");
            held.push(stream);
            senders.push(tx);
        } else {
            let status = refused(answer, Code::ResourceExhausted, "OVERLOADED");
            assert_eq!(meta(&status, "limit"), "reflection");
        }
    }
    // Every reflection slot is taken; the two call slots are free.
    let mut w = s.worker(Some("refunds-worker")).await;
    w.enqueue(enqueue("refunds", "k1")).await.unwrap();
    let mut shop = s.worker(Some("shop")).await;
    shop.enqueue(enqueue("refunds", "k2")).await.unwrap();
    drop((held, senders));
    s.stop().await;
}

/// `jobfence_connections_refused_total{reason}` now.
fn connections_closed(s: &Secure, reason: &str) -> u64 {
    let text = s.coordinator.metrics().render();
    let prefix = format!("jobfence_connections_refused_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Connections held open without a credential cannot keep their slots:
/// one that made no authenticated call is closed after
/// `--unauthenticated-connection-timeout`, while a worker's connection,
/// authenticated once, outlives it.
#[tokio::test]
async fn a_connection_without_an_authenticated_call_is_closed() {
    use jobfence_server::limits::Limits;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let timeout = Duration::from_millis(500);
    let s = Secure::with_limits(Limits {
        unauthenticated_connection_timeout: timeout,
        ..Limits::default()
    })
    .await;
    // A worker's connection: authenticated by its first call.
    let mut w = s.worker(Some("refunds-worker")).await;
    w.enqueue(enqueue("refunds", "k1")).await.unwrap();
    // An attacker's: TLS done, then silence.
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for cert in tokio_rustls::rustls::pki_types::CertificateDer::pem_file_iter(&s.files.ca).unwrap()
    {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let mut idle = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .expect("TLS handshake");
    let started = std::time::Instant::now();
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match idle.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => continue, // the server's SETTINGS, then GOAWAY
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the silent connection was never closed");
    assert!(started.elapsed() >= timeout, "closed before its deadline");
    assert_eq!(connections_closed(&s, "unauthenticated_timeout"), 1);
    // Well past the deadline, the worker's connection still serves.
    tokio::time::sleep(timeout * 2).await;
    w.enqueue(enqueue("refunds", "k2")).await.unwrap();
    assert_eq!(connections_closed(&s, "unauthenticated_timeout"), 1);
    s.stop().await;
}
