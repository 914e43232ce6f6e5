//! Issue 8, against a real coordinator with TLS and the callers file on:
//! every caller that may not make a call is refused with the right code
//! and ErrorInfo reason, counted, and writes nothing (the rows of jobs,
//! job_events and job_observations are counted before and after); the
//! same calls with the right credential succeed. Mutual TLS keeps out a
//! client without a certificate, and a revoked token stops working on the
//! reload. The limits of one call (request size, per-caller concurrency,
//! the server-side deadline) hold, typed; tests/cluster/load.rs floods them.

use jobfence_testkit as kit;

use jobfence_api::v1::{
    self as proto, CancelJobRequest, ClaimRequest, CompleteRequest, EnqueueBatchRequest,
    EnqueueRequest, FailDisposition, FailRequest, GetJobRequest, ListEventsRequest,
    ListJobsRequest, ObservationOutcome, ObservationSource, RecordObservationRequest,
    RenewLeaseRequest, Resolution, ResolveManualReviewRequest, TakeoverRequest,
};
use kit::secure::{Secure, EXPIRED};
use kit::{meta, reason, secs};
use tonic::{Code, Status};

fn enqueue(queue: &str, key: &str) -> EnqueueRequest {
    EnqueueRequest {
        queue: queue.into(),
        operation_key: key.into(),
        payload: "{}".into(),
        delay: None,
    }
}

fn claim(queue: &str) -> ClaimRequest {
    ClaimRequest {
        queue: queue.into(),
        worker_id: "w".into(),
        max_jobs: 1,
        lease: secs(30),
        wait: None,
    }
}

fn observation(job_id: u64, source: ObservationSource, key: &str) -> RecordObservationRequest {
    RecordObservationRequest {
        job_id,
        attempt: 0,
        source: source as i32,
        outcome: ObservationOutcome::Succeeded as i32,
        provider_reference: "re_1".into(),
        body: "{}".into(),
        dedup_key: key.into(),
    }
}

/// Asserts the refusal's code and reason; returns it for its metadata.
fn refused<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, why: &str) -> Status {
    let status = result.expect_err("the call must be refused");
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(reason(&status), why, "{status:?}");
    status
}

/// Asserts a QUEUE_NOT_ALLOWED refusal naming the queue `refunds`.
fn denied<T: std::fmt::Debug>(result: Result<T, Status>, what: &str) {
    let status = refused(result, Code::PermissionDenied, "QUEUE_NOT_ALLOWED");
    assert_eq!(meta(&status, "queue"), "refunds", "{what}");
}

#[tokio::test]
async fn no_credential_is_unauthenticated_and_writes_nothing() {
    let s = Secure::start(false).await;
    let before = s.counts().await;
    let mut anon = s.worker(None).await;
    let status = refused(
        anon.enqueue(enqueue("refunds", "k1")).await,
        Code::Unauthenticated,
        "CREDENTIAL_MISSING",
    );
    assert!(!status.message().contains("jft_"));
    refused(
        anon.claim(claim("refunds")).await,
        Code::Unauthenticated,
        "CREDENTIAL_MISSING",
    );
    let mut anon_admin = s.admin(None).await;
    refused(
        anon_admin
            .list_jobs(ListJobsRequest::default())
            .await
            .map(|_| ()),
        Code::Unauthenticated,
        "CREDENTIAL_MISSING",
    );
    assert_eq!(s.counts().await, before);
    assert_eq!(s.refusals("CREDENTIAL_MISSING"), 3);
    // Health and reflection stay open: a load balancer has no credential.
    let channel = s.channel(&s.creds(None)).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await;
    assert!(answer.is_ok(), "{answer:?}");
    s.stop().await;
}

#[tokio::test]
async fn a_tampered_or_expired_token_is_unauthenticated() {
    let s = Secure::start(false).await;
    let before = s.counts().await;
    let mut creds = s.creds(Some("refunds-worker"));
    let real = std::fs::read_to_string(s.files.token("refunds-worker")).unwrap();
    let mut forged = real.trim().to_owned();
    let last = forged.pop().unwrap();
    forged.push(if last == '0' { '1' } else { '0' });
    creds.token = Some(jobfence_worker::BearerToken::new(&forged).unwrap());
    let mut tampered = jobfence_api::v1::job_coordinator_client::JobCoordinatorClient::new(
        s.channel(&creds).await,
    );
    let status = refused(
        tampered.enqueue(enqueue("refunds", "k1")).await,
        Code::Unauthenticated,
        "CREDENTIAL_INVALID",
    );
    assert!(!status.message().contains(&forged) && !format!("{status:?}").contains(&forged));
    let mut expired = s.worker(Some(EXPIRED)).await;
    let status = refused(
        expired.claim(claim("refunds")).await,
        Code::Unauthenticated,
        "CREDENTIAL_EXPIRED",
    );
    assert_eq!(meta(&status, "caller"), EXPIRED);
    // Two authorization headers (a valid one first) are malformed, not
    // "the first wins".
    let shop = std::fs::read_to_string(s.files.token("shop")).unwrap();
    let mut anonymous = s.worker(None).await;
    let mut twice = tonic::Request::new(enqueue("refunds", "k2"));
    for token in [real.trim(), shop.trim()] {
        twice
            .metadata_mut()
            .append("authorization", format!("Bearer {token}").parse().unwrap());
    }
    refused(
        anonymous.enqueue(twice).await,
        Code::Unauthenticated,
        "CREDENTIAL_INVALID",
    );
    assert_eq!(s.counts().await, before);
    assert_eq!(s.refusals("CREDENTIAL_INVALID"), 2);
    assert_eq!(s.refusals("CREDENTIAL_EXPIRED"), 1);
    s.stop().await;
}

#[tokio::test]
async fn a_worker_of_another_queue_cannot_touch_a_job_even_with_its_attempt() {
    let s = Secure::start(false).await;
    let job = s.running("refund-1").await;
    let before = s.counts().await;
    let mut payouts = s.worker(Some("payouts-worker")).await;
    denied(
        payouts
            .complete(CompleteRequest {
                job_id: job.job_id,
                attempt: job.attempt,
                provider_reference: "re_stolen".into(),
                result: String::new(),
                next: None,
            })
            .await,
        "Complete",
    );
    denied(
        payouts
            .fail(FailRequest {
                job_id: job.job_id,
                attempt: job.attempt,
                disposition: FailDisposition::Failed as i32,
                error: "mine now".into(),
                retry_delay: None,
                provider_retry_after: None,
                next: None,
            })
            .await,
        "Fail",
    );
    denied(
        payouts
            .renew_lease(RenewLeaseRequest {
                job_id: job.job_id,
                attempt: job.attempt,
                lease: secs(60),
            })
            .await,
        "RenewLease",
    );
    denied(
        payouts
            .takeover(TakeoverRequest {
                job_id: job.job_id,
                worker_id: "p".into(),
                lease: secs(30),
            })
            .await,
        "Takeover",
    );
    denied(
        payouts
            .record_observation(observation(job.job_id, ObservationSource::Worker, "p1"))
            .await,
        "RecordObservation",
    );
    denied(
        payouts.get_job(GetJobRequest { job_id: job.job_id }).await,
        "GetJob",
    );
    denied(payouts.claim(claim("refunds")).await, "Claim");
    denied(
        payouts.enqueue(enqueue("refunds", "refund-2")).await,
        "Enqueue",
    );
    denied(
        payouts
            .enqueue_batch(EnqueueBatchRequest {
                items: vec![enqueue("payouts", "p-1"), enqueue("refunds", "refund-3")],
            })
            .await,
        "EnqueueBatch",
    );
    // Nothing changed: no row, no event (not even a stale-write event),
    // and the job is still running under the refunds worker's attempt.
    assert_eq!(s.counts().await, before);
    assert_eq!(s.refusals("QUEUE_NOT_ALLOWED"), 9);
    let mut refunds = s.worker(Some("refunds-worker")).await;
    let now = refunds
        .get_job(GetJobRequest { job_id: job.job_id })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(
        (now.state, now.attempt),
        (proto::JobState::Running as i32, job.attempt)
    );
    // Its own queue is open to it.
    payouts.enqueue(enqueue("payouts", "p-1")).await.unwrap();
    // The right worker completes with its attempt.
    let done = refunds
        .complete(CompleteRequest {
            job_id: job.job_id,
            attempt: job.attempt,
            provider_reference: "re_1".into(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.job.unwrap().state, proto::JobState::Succeeded as i32);
    s.stop().await;
}

#[tokio::test]
async fn roles_are_checked_per_method() {
    let s = Secure::start(false).await;
    let job = s.running("refund-1").await;
    let before = s.counts().await;
    // A worker calling JobAdmin.
    let mut as_worker = s.admin(Some("refunds-worker")).await;
    let status = refused(
        as_worker
            .cancel_job(CancelJobRequest {
                job_id: job.job_id,
                attempt: job.attempt,
                operator: "refunds-worker".into(),
                reason: "x".into(),
            })
            .await,
        Code::PermissionDenied,
        "ROLE_NOT_ALLOWED",
    );
    assert_eq!(meta(&status, "required_role"), "operator");
    assert_eq!(meta(&status, "caller"), "refunds-worker");
    // A webhook calling Complete, with the right attempt.
    let mut hook = s.worker(Some("hooks")).await;
    refused(
        hook.complete(CompleteRequest {
            job_id: job.job_id,
            attempt: job.attempt,
            provider_reference: "re_hook".into(),
            result: String::new(),
            next: None,
        })
        .await,
        Code::PermissionDenied,
        "ROLE_NOT_ALLOWED",
    );
    // A webhook reporting as a worker.
    let status = refused(
        hook.record_observation(observation(job.job_id, ObservationSource::Worker, "h0"))
            .await,
        Code::PermissionDenied,
        "ROLE_NOT_ALLOWED",
    );
    assert!(meta(&status, "method").contains("WORKER"));
    // A worker reporting as a webhook or an operator: evidence in manual
    // review must say truly where it came from.
    let mut worker = s.worker(Some("refunds-worker")).await;
    for (source, key) in [
        (ObservationSource::Webhook, "w1"),
        (ObservationSource::Operator, "w2"),
    ] {
        refused(
            worker
                .record_observation(observation(job.job_id, source, key))
                .await,
            Code::PermissionDenied,
            "ROLE_NOT_ALLOWED",
        );
    }
    // A producer claiming; an events reader enqueueing; a reader of
    // refunds reading every queue.
    let mut shop = s.worker(Some("shop")).await;
    refused(
        shop.claim(claim("refunds")).await,
        Code::PermissionDenied,
        "ROLE_NOT_ALLOWED",
    );
    let mut reader = s.worker(Some("refunds-reader")).await;
    refused(
        reader.enqueue(enqueue("refunds", "r1")).await,
        Code::PermissionDenied,
        "ROLE_NOT_ALLOWED",
    );
    let mut feed = s.events(Some("refunds-reader")).await;
    refused(
        feed.list_events(ListEventsRequest::default()).await,
        Code::PermissionDenied,
        "QUEUE_NOT_ALLOWED",
    );
    assert_eq!(s.counts().await, before);
    assert_eq!(s.refusals("ROLE_NOT_ALLOWED"), 7);

    // The same kinds of call with the right credential.
    let recorded = hook
        .record_observation(observation(job.job_id, ObservationSource::Webhook, "h1"))
        .await
        .unwrap()
        .into_inner();
    assert!(!recorded.duplicate);
    let made = shop
        .enqueue(enqueue("refunds", "refund-2"))
        .await
        .unwrap()
        .into_inner();
    assert!(made.created);
    let page = feed
        .list_events(ListEventsRequest {
            queue: "refunds".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!page.events.is_empty());
    let mut alice = s.admin(Some("alice")).await;
    let listed = alice
        .list_jobs(ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.jobs.len(), 2);
    s.stop().await;
}

#[tokio::test]
async fn the_operator_recorded_is_the_credentials_name() {
    let s = Secure::start(false).await;
    let job = s.running("refund-1").await;
    let mut w = s.worker(Some("refunds-worker")).await;
    w.fail(FailRequest {
        job_id: job.job_id,
        attempt: job.attempt,
        disposition: FailDisposition::ManualReview as i32,
        error: "provider says unknown".into(),
        retry_delay: None,
        provider_retry_after: None,
        next: None,
    })
    .await
    .unwrap();
    let before = s.counts().await;
    let resolve = |operator: &str| ResolveManualReviewRequest {
        job_id: job.job_id,
        attempt: job.attempt,
        resolution: Resolution::Succeeded as i32,
        operator: operator.into(),
        reason: "seen in the dashboard".into(),
        provider_reference: "re_1".into(),
        result: String::new(),
        delay: None,
        authorize_resend: false,
    };
    let mut alice = s.admin(Some("alice")).await;
    let status = refused(
        alice.resolve_manual_review(resolve("bob")).await,
        Code::PermissionDenied,
        "OPERATOR_MISMATCH",
    );
    assert_eq!(
        (meta(&status, "caller"), meta(&status, "operator")),
        ("alice".into(), "bob".into())
    );
    assert_eq!(s.counts().await, before);
    assert_eq!(s.refusals("OPERATOR_MISMATCH"), 1);
    // Without a name (or with her own) it is alice's resolution.
    let done = alice
        .resolve_manual_review(resolve(""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.job.unwrap().state, proto::JobState::Succeeded as i32);
    let detail: String = sqlx::query_scalar(
        "SELECT CAST(detail AS CHAR) FROM job_events WHERE job_id = ? AND kind = 'manual_review_resolved'",
    )
    .bind(job.job_id)
    .fetch_one(&s.pool)
    .await
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&detail).unwrap();
    assert_eq!(v["operator"], "alice");
    s.stop().await;
}

#[tokio::test]
async fn a_revoked_token_stops_working_on_reload() {
    let s = Secure::start(false).await;
    let mut w = s.worker(Some("refunds-worker")).await;
    w.enqueue(enqueue("refunds", "k1")).await.unwrap();
    s.revoke("refunds-worker");
    refused(
        w.enqueue(enqueue("refunds", "k2")).await,
        Code::Unauthenticated,
        "CREDENTIAL_INVALID",
    );
    // A broken file is refused whole; the callers in force stay.
    std::fs::write(&s.files.callers, "this is not a callers file\n").unwrap();
    assert!(s.security.reload().is_err());
    // So is an empty one (a file caught half-written would lock out all).
    std::fs::write(&s.files.callers, "# nothing yet\n").unwrap();
    assert!(s.security.reload().is_err());
    let mut shop = s.worker(Some("shop")).await;
    shop.enqueue(enqueue("refunds", "k3")).await.unwrap();
    s.stop().await;
}

/// The TLS files are reloaded without a restart (SIGHUP calls the same
/// reload): after the server's certificate is replaced by one of another
/// CA, new connections need the new CA, and a connection opened before
/// keeps working.
#[tokio::test]
async fn a_new_server_certificate_applies_to_new_connections_on_reload() {
    use jobfence_auth::pki;
    let s = Secure::start(false).await;
    let old_creds = s.creds(Some("refunds-worker"));
    let mut before = s.worker(Some("refunds-worker")).await;
    before.enqueue(enqueue("refunds", "k1")).await.unwrap();

    let other = s.files.dir.join("rotated");
    let new = pki::dev_setup(&other, &["localhost", "127.0.0.1"], &[], &[]).unwrap();
    std::fs::copy(&new.server_cert, &s.files.server_cert).unwrap();
    std::fs::copy(&new.server_key, &s.files.server_key).unwrap();
    s.security.reload().unwrap();

    // A client trusting only the old CA no longer gets through the handshake.
    let stale = old_creds
        .endpoint(format!("https://{}", s.addr))
        .unwrap()
        .connect()
        .await;
    assert!(stale.is_err(), "the old CA still verifies the server");
    // One trusting the new CA does, with the same token.
    let mut creds = s.creds(Some("refunds-worker"));
    creds.tls_ca_pem = Some(std::fs::read(&new.ca).unwrap());
    let mut after = jobfence_api::v1::job_coordinator_client::JobCoordinatorClient::new(
        s.channel(&creds).await,
    );
    after.enqueue(enqueue("refunds", "k2")).await.unwrap();
    // The connection opened before keeps its session.
    before.enqueue(enqueue("refunds", "k3")).await.unwrap();
    s.stop().await;
}

#[tokio::test]
async fn mutual_tls_keeps_out_a_client_without_a_certificate() {
    let s = Secure::start(true).await;
    // No client certificate: the handshake fails, nothing is called.
    let creds = s.creds(Some("refunds-worker"));
    let no_cert = creds
        .endpoint(format!("https://{}", s.addr))
        .unwrap()
        .connect()
        .await;
    let refused_at_handshake = match no_cert {
        Err(_) => true,
        // tonic may report the handshake failure on the first call.
        Ok(channel) => {
            let mut c = jobfence_api::v1::job_coordinator_client::JobCoordinatorClient::new(
                tonic::service::interceptor::InterceptedService::new(
                    channel,
                    creds.authorization(),
                ),
            );
            c.enqueue(enqueue("refunds", "k1")).await.is_err()
        }
    };
    assert!(refused_at_handshake);
    assert_eq!(s.counts().await.0, 0);
    // With its certificate, the certificate's name is the caller: a worker
    // of refunds, without any token.
    let mut with_cert = s.creds(None);
    with_cert.tls_client_pem = Some(s.client_cert("cert-worker"));
    let mut w = jobfence_api::v1::job_coordinator_client::JobCoordinatorClient::new(
        s.channel(&with_cert).await,
    );
    w.enqueue(enqueue("refunds", "k1")).await.unwrap();
    refused(
        w.enqueue(enqueue("payouts", "k2")).await,
        Code::PermissionDenied,
        "QUEUE_NOT_ALLOWED",
    );
    // A token beside the certificate decides who calls.
    with_cert.token = s.creds(Some("shop")).token;
    let mut shop = jobfence_api::v1::job_coordinator_client::JobCoordinatorClient::new(
        s.channel(&with_cert).await,
    );
    refused(
        shop.claim(claim("refunds")).await,
        Code::PermissionDenied,
        "ROLE_NOT_ALLOWED",
    );
    s.stop().await;
}

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

/// Settlement is the operators' (docs/design.md rule 15): a worker's or a
/// producer's import of a provider's report is refused before a line of
/// it is read, and writes nothing; nobody but the import writes a
/// SETTLEMENT observation.
#[tokio::test]
async fn a_settlement_import_is_for_operators_only() {
    use proto::import_settlement_request::Part;
    let s = Secure::start(false).await;
    let job = s.running("refund-1").await;
    let before = s.counts().await;
    let messages = || {
        let header = proto::ImportSettlementHeader {
            provider: "psp".into(),
            period_start: Some(prost_types::Timestamp::default()),
            period_end: Some(prost_types::Timestamp {
                seconds: 4_000_000_000,
                nanos: 0,
            }),
            operator: "x".into(),
            check_only: false,
        };
        let line = proto::SettlementReportLine {
            line: 2,
            fields: [("id", "re_1"), ("merchant_reference", "refund-1")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        };
        tokio_stream::iter([
            proto::ImportSettlementRequest {
                part: Some(Part::Header(header)),
            },
            proto::ImportSettlementRequest {
                part: Some(Part::Lines(proto::SettlementLineBatch {
                    lines: vec![line],
                })),
            },
        ])
    };
    for caller in ["refunds-worker", "shop", "hooks"] {
        let mut admin = s.admin(Some(caller)).await;
        let status = refused(
            admin.import_settlement(messages()).await,
            Code::PermissionDenied,
            "ROLE_NOT_ALLOWED",
        );
        assert_eq!(meta(&status, "required_role"), "operator", "{caller}");
    }
    let mut hook = s.worker(Some("hooks")).await;
    refused(
        hook.record_observation(observation(job.job_id, ObservationSource::Settlement, "s1"))
            .await,
        Code::InvalidArgument,
        "INVALID_REQUEST",
    );
    assert_eq!(s.counts().await, before);
    let lines: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM settlement_lines")
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(lines, 0);
    s.stop().await;
}
