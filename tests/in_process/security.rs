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

mod credentials;
mod limits;

fn enqueue(queue: &str, key: &str) -> EnqueueRequest {
    EnqueueRequest {
        queue: queue.into(),
        operation_key: key.into(),
        payload: "{}".into(),
        delay: None,
        fairness_key: String::new(),
        priority: 0,
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
            period_start: Some(prost_types::Timestamp {
                seconds: 946_684_800, // 2000-01-01
                nanos: 0,
            }),
            period_end: Some(prost_types::Timestamp {
                seconds: 1_700_000_000, // 2023-11-14
                nanos: 0,
            }),
            operator: "x".into(),
            check_only: false,
            allow_empty: false,
            import_id: String::new(),
        };
        let line = proto::SettlementReportLine {
            line: 2,
            fields: [("id", "re_1"), ("merchant_reference", "refund-1")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            unreadable: Default::default(),
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
